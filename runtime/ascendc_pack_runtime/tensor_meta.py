"""Dtype names and tensor-layout helpers shared by the compiler and the runtime (one home).

The compiler (``ascendc_pack``) imports these; the runtime uses them too, so a dtype name or a
layout rule means the same thing on both sides of the bundle contract.
"""

from __future__ import annotations

import math

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16,
    "int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
    "complex64": torch.complex64, "complex128": torch.complex128,
}
"""Every dtype a Program value, a bundle input/output or a weight may have, by name."""

SCALAR_TYPES: dict[str, str] = {
    "float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
    "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
    "bool": "Bool", "complex64": "ComplexFloat", "complex128": "ComplexDouble",
}
"""dtype name -> ``c10::ScalarType`` enumerator name (for generated C++)."""


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    """``"float32"`` -> ``torch.float32``; ValueError naming the supported ones otherwise."""
    try:
        return DTYPES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unsupported dtype {name!r}; supported: {sorted(DTYPES)}") from None


def itemsize(name: str) -> int:
    """Bytes per element of a dtype name."""
    return torch_dtype(name).itemsize


def _symbolic(x) -> bool:
    """A size or stride that is an expression over dynamic dims (the compiler's dynamic-shape
    plans, ``ascendc_pack.ir.symbolic``), not an integer: kept as it is, never converted."""
    return hasattr(x, "free_symbols") and not getattr(x, "is_number", True)


def contiguous_strides(shape) -> tuple[int, ...]:
    """Row-major strides of ``shape`` (size-0 dims count as 1, as torch does)."""
    out, acc = [], 1
    for s in reversed(tuple(shape)):
        out.append(acc)
        acc *= s if _symbolic(s) else max(int(s), 1)   # a dynamic dim is never 0
    return tuple(reversed(out))


def significant_strides(shape, stride) -> tuple[int, ...]:
    """The strides that matter: a dim of size 1 may have any stride, so it reads as 0."""
    return tuple((st if _symbolic(st) else int(st)) if n != 1 else 0 for n, st in zip(shape, stride))


def same_layout(shape_a, stride_a, shape_b, stride_b) -> bool:
    """True when two (shape, stride) layouts address the same elements in the same order."""
    return tuple(shape_a) == tuple(shape_b) and \
        significant_strides(shape_a, stride_a) == significant_strides(shape_b, stride_b)


def span_elems(shape, stride) -> int:
    """Elements from the first to one past the last addressed element (0 for an empty tensor)."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * abs(st) for s, st in zip(shape, stride))


def is_dense(shape, stride) -> bool:
    """Non-overlapping and dense: a permutation of a contiguous layout (size-1 dims ignored)."""
    shape, stride = tuple(shape), tuple(stride)
    if any(s == 0 for s in shape):
        return stride == contiguous_strides(shape)
    dims = sorted(((st, n) for n, st in zip(shape, stride) if n != 1), key=_stride_order)
    expected = 1
    for st, n in dims:
        if st != expected:
            return False
        expected *= n
    return True


def _stride_order(dim: tuple):
    """Sort key of a (stride, size) pair; a dynamic stride sorts by its value where every dynamic
    dim is large (its order for every size a dynamic plan runs: such strides are products of
    sizes), and ``is_dense`` then checks the products exactly."""
    st, n = dim
    if _symbolic(st) or _symbolic(n):
        st, n = (x.subs({s: 1 << 20 for s in x.free_symbols}) if _symbolic(x) else x for x in (st, n))
    return (int(st), int(n))


def numel(shape) -> int:
    """Number of elements of ``shape``."""
    return math.prod(s if _symbolic(s) else int(s) for s in shape)
