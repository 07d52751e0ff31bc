"""Layouts computed on meta tensors: the ``(shape, stride, dtype)`` an ATen step returns for
given input layouts, as torch's meta kernels say (with the corrections :data:`META_RULES_VERSION`
names), memoized per process and kept across builds (:func:`meta_layout_cache`). The tactic
lowering and the graph planner both predict layouts with it."""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

import torch

from ascendc_pack_runtime.tensor_meta import dtype_name, torch_dtype

from ascendc_pack.cache import atomic_write_text, stable_hash
from ascendc_pack.frontend.executor import resolve_op
from ascendc_pack.ir.program import AtenStep, Ref

log = logging.getLogger("ascendc_pack")


_META_MEMO: dict[str, list | None] = {}
"""Outputs of :func:`_meta_outputs` by :func:`_meta_key`: a pure function of the op, the input
layouts and the other arguments, so one process answers each question once (and
:func:`meta_layout_cache` keeps the answers across builds)."""


META_RULES_VERSION = 2
"""Changes with the corrections :func:`meta_layouts` applies to torch's meta kernels (the kept
answers of older rules are not reused)."""


def meta_layouts(step: AtenStep, layout_of) -> list[tuple] | None:
    """Output ``(shape, stride, dtype)`` of ``step`` computed by torch on meta tensors whose
    layouts ``layout_of(name)`` gives (``(shape, stride, dtype)``); None if that fails."""
    key = _meta_key(step, layout_of)
    if key not in _META_MEMO:
        _META_MEMO[key] = _meta_outputs(step, layout_of)
    outs = _META_MEMO[key]
    if outs is None:
        return None
    if not step.multi:
        outs = outs[:1]
    if len(outs) != len(step.outputs) or any(o is None for o in outs):
        return None
    return list(outs)


def _meta_key(step: AtenStep, layout_of) -> str:
    def norm(a):
        if isinstance(a, Ref):
            shape, stride, dtype = layout_of(a.name)
            return ("T", tuple(shape), tuple(stride), str(dtype))
        if isinstance(a, (list, tuple)):
            return [norm(x) for x in a]
        return (type(a).__name__, repr(a))

    return repr((step.op, norm(list(step.args)), sorted((k, norm(v)) for k, v in step.kwargs.items())))


def _meta_outputs(step: AtenStep, layout_of) -> list | None:
    """Every output of the op on meta tensors (None for a non-tensor), or None if it fails."""

    def conv(a):
        if isinstance(a, Ref):
            shape, stride, dtype = layout_of(a.name)
            return torch.empty_strided(shape, stride, dtype=torch_dtype(dtype), device="meta")
        if isinstance(a, list):
            return [conv(x) for x in a]
        return a

    kwargs = {k: (torch.device("meta") if k == "device" and v is not None else conv(v))
              for k, v in step.kwargs.items()}
    try:
        out = resolve_op(step.op)(*conv(step.args), **kwargs)
    except Exception as e:  # noqa: BLE001 - any failure means "layout unknown"
        log.debug("meta execution of %s failed (%s); its layout is checked at run time", step.op, e)
        return None
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    if step.op == "aten.convolution.default":
        outs = [_cpu_convolution_layout(conv(step.args[0]), conv(step.args[1]), outs[0])]
    return [(tuple(o.shape), tuple(o.stride()), dtype_name(o.dtype)) if isinstance(o, torch.Tensor) else None
            for o in outs]


def _cpu_convolution_layout(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """ATen's meta convolution returns NCHW; the CPU kernels return channels_last when the input or
    the weight suggests it (ATen's ``mkldnn_conv_use_channels_last`` / thnn rule, checked against
    the CPU kernels in tests/test_graph_compile.py)."""
    cl = torch.channels_last

    def suggests_cl(t: torch.Tensor) -> bool:
        return t.dim() == 4 and t.is_contiguous(memory_format=cl) and not t.is_contiguous()

    if out.dim() == 4 and (suggests_cl(x) or suggests_cl(weight)):
        return out.contiguous(memory_format=cl)
    return out


@contextlib.contextmanager
def meta_layout_cache(cache_dir: Path | str):
    """Keep :func:`meta_layouts`' answers in ``<cache_dir>/ascendc/meta_layouts/<torch>.json``
    across builds: some meta kernels (torch's reference implementations, e.g. of ``mean``) import
    ``torch._dynamo`` on their first call, about 1.4 s that a warm rebuild would spend on it."""
    path = Path(cache_dir) / "ascendc" / "meta_layouts" / \
        f"{stable_hash(torch.__version__, torch.version.git_version, META_RULES_VERSION)[:16]}.json"
    try:
        stored = json.loads(path.read_text())
        for key, outs in stored.items():
            _META_MEMO.setdefault(key, None if outs is None else
                                  [None if o is None else (tuple(o[0]), tuple(o[1]), o[2]) for o in outs])
    except FileNotFoundError:
        stored = {}
    except (OSError, ValueError, TypeError, IndexError, AttributeError) as exc:
        log.warning("meta layout cache %s is unusable (%s); computing layouts again", path, exc)
        stored = {}
    try:
        yield
    finally:
        if set(_META_MEMO) - set(stored):
            atomic_write_text(path, json.dumps(_META_MEMO))


__all__ = ["meta_layouts", "meta_layout_cache", "META_RULES_VERSION"]
