"""The operators the fuser understands, and how each becomes C.

Three tables drive fusion and code generation:

* ``VIEW_OPS`` - views folded into the index math of loads (never run as code);
* ``POINTWISE`` - elementwise ops: a C expression per op, written over the compute type;
* ``REDUCTIONS`` - reductions with their identity and combine step.

Everything else stays an ATen call. Compute types: float32/float16/bfloat16 compute in
``float`` (rounded back where the graph's dtype is 16-bit), float64 in ``double``, integers in
their own width, bool in ``bool``.
"""

from __future__ import annotations

import math

# storage C type per dtype (16-bit floats are stored as raw bits)
STORAGE_TYPE = {
    "float32": "float", "float64": "double", "float16": "uint16_t", "bfloat16": "uint16_t",
    "int64": "int64_t", "int32": "int32_t", "int16": "int16_t", "int8": "int8_t",
    "uint8": "uint8_t", "bool": "uint8_t",
}
# bytes of each storage C type
STORAGE_BYTES = {"uint16_t": 2, "uint8_t": 1, "int8_t": 1, "int16_t": 2, "int32_t": 4, "float": 4, "double": 8,
                 "int64_t": 8}
# compute C type per dtype
COMPUTE_TYPE = {
    "float32": "float", "float64": "double", "float16": "float", "bfloat16": "float",
    "int64": "int64_t", "int32": "int32_t", "int16": "int32_t", "int8": "int32_t",
    "uint8": "int32_t", "bool": "ap_bool",
}
BOOL_CTYPE = "ap_bool"  # int32_t in kernels: a 1-byte bool in a float loop blocks vectorization
FLOAT_DTYPES = {"float32", "float64", "float16", "bfloat16"}
SUPPORTED_DTYPES = set(STORAGE_TYPE)

# views: op -> kind (the fuser computes strides for loads and dim maps for intermediates)
VIEW_OPS = {
    "aten.view.default": "reshape", "aten._unsafe_view.default": "reshape",
    "aten.reshape.default": "reshape", "aten.permute.default": "permute",
    "aten.expand.default": "expand", "aten.unsqueeze.default": "unsqueeze",
    "aten.squeeze.dims": "squeeze", "aten.squeeze.dim": "squeeze", "aten.squeeze.default": "squeeze",
    "aten.slice.Tensor": "slice", "aten.select.int": "select", "aten.alias.default": "alias",
    "aten.t.default": "permute", "aten.transpose.int": "permute",
}

# pointwise ops: canonical name and C template over compute-type operands {a},{b},{c}
UNARY = {
    "neg": "(-{a})", "abs": "({a} < 0 ? -{a} : {a})", "exp": "ap_exp({a})", "log": "ap_log({a})",
    "log1p": "ap_log1p({a})", "expm1": "ap_expm1({a})", "sqrt": "ap_sqrt({a})",
    "rsqrt": "(1 / ap_sqrt({a}))", "reciprocal": "(1 / {a})", "tanh": "ap_tanh({a})",
    "sigmoid": "ap_sigmoid({a})", "erf": "ap_erf({a})", "relu": "({a} < 0 ? 0 : {a})",
    "sign": "({a} > 0 ? 1 : ({a} < 0 ? -1 : 0))", "floor": "ap_floor({a})",
    "ceil": "ap_ceil({a})", "round": "ap_nearbyint({a})", "trunc": "ap_trunc({a})",
    "sin": "ap_sin({a})", "cos": "ap_cos({a})", "logical_not": "(!{a})",
    "bitwise_not": "(~{a})", "bool_not": "(!{a})", "isnan": "({a} != {a})",
    "isinf": "(ap_fabs({a}) == INFINITY)", "identity": "{a}", "exp2": "ap_exp({a} * 0.6931471805599453f)",
    "square": "({a} * {a})",
}
BINARY = {
    "add": "({a} + {b})", "sub": "({a} - {b})", "mul": "({a} * {b})", "div": "({a} / {b})",
    "div_trunc": "ap_trunc({a} / {b})", "div_floor": "ap_div_floor({a}, {b})",
    "maximum": "(({a} > {b} || {a} != {a}) ? {a} : {b})",
    "minimum": "(({a} < {b} || {a} != {a}) ? {a} : {b})",
    "pow": "ap_pow({a}, {b})", "eq": "({a} == {b})", "ne": "({a} != {b})", "lt": "({a} < {b})",
    "le": "({a} <= {b})", "gt": "({a} > {b})", "ge": "({a} >= {b})",
    "logical_and": "({a} && {b})", "logical_or": "({a} || {b})", "logical_xor": "({a} != {b})",
    "bitwise_and": "({a} & {b})", "bitwise_or": "({a} | {b})", "bitwise_xor": "({a} ^ {b})",
    "clamp_lo": "({a} < {b} ? {b} : {a})", "clamp_hi": "({a} > {b} ? {b} : {a})",
    "atan2": "ap_atan2({a}, {b})", "fmod": "ap_fmod({a}, {b})",
}
TERNARY = {"where": "({a} ? {b} : {c})"}
PREDICATES = {"isnan", "isinf"}  # bool result computed from the operand in its own type
ROUNDING = {"floor", "ceil", "round", "trunc"}  # identity on integers
COMPARISONS = {"eq", "ne", "lt", "le", "gt", "ge"}
LOGICAL = {"logical_and", "logical_or", "logical_xor", "logical_not"}
FLOAT_ONLY = {"exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "floor", "ceil",
              "round", "trunc", "sin", "cos", "isnan", "isinf", "pow", "div", "div_trunc", "div_floor",
              "reciprocal", "atan2", "fmod", "exp2"}

# aten op -> (canonical pointwise name, arity of tensor-or-scalar operands)
ATEN_POINTWISE = {
    "aten.neg.default": "neg", "aten.abs.default": "abs", "aten.exp.default": "exp",
    "aten.log.default": "log", "aten.log1p.default": "log1p", "aten.expm1.default": "expm1",
    "aten.sqrt.default": "sqrt", "aten.rsqrt.default": "rsqrt", "aten.reciprocal.default": "reciprocal",
    "aten.tanh.default": "tanh", "aten.sigmoid.default": "sigmoid", "aten.erf.default": "erf",
    "aten.relu.default": "relu", "aten.sign.default": "sign", "aten.sgn.default": "sign",
    "aten.floor.default": "floor", "aten.ceil.default": "ceil", "aten.round.default": "round",
    "aten.trunc.default": "trunc", "aten.sin.default": "sin", "aten.cos.default": "cos",
    "aten.logical_not.default": "logical_not", "aten.bitwise_not.default": "bitwise_not",
    "aten.isnan.default": "isnan", "aten.isinf.default": "isinf", "aten.exp2.default": "exp2",
    "aten.clone.default": "identity", "aten.alias_copy.default": "identity",
    "aten.lift_fresh_copy.default": "identity",
    "aten.add.Tensor": "add", "aten.add.Scalar": "add", "aten.sub.Tensor": "sub", "aten.sub.Scalar": "sub",
    "aten.rsub.Scalar": "rsub", "aten.rsub.Tensor": "rsub",
    "aten.mul.Tensor": "mul", "aten.mul.Scalar": "mul", "aten.div.Tensor": "div", "aten.div.Scalar": "div",
    "aten.div.Tensor_mode": "div_mode", "aten.div.Scalar_mode": "div_mode",
    "aten.maximum.default": "maximum", "aten.minimum.default": "minimum",
    "aten.pow.Tensor_Scalar": "pow", "aten.pow.Tensor_Tensor": "pow", "aten.pow.Scalar": "pow",
    "aten.eq.Tensor": "eq", "aten.eq.Scalar": "eq", "aten.ne.Tensor": "ne", "aten.ne.Scalar": "ne",
    "aten.lt.Tensor": "lt", "aten.lt.Scalar": "lt", "aten.le.Tensor": "le", "aten.le.Scalar": "le",
    "aten.gt.Tensor": "gt", "aten.gt.Scalar": "gt", "aten.ge.Tensor": "ge", "aten.ge.Scalar": "ge",
    "aten.logical_and.default": "logical_and", "aten.logical_or.default": "logical_or",
    "aten.logical_xor.default": "logical_xor", "aten.bitwise_and.Tensor": "bitwise_and",
    "aten.bitwise_or.Tensor": "bitwise_or", "aten.bitwise_xor.Tensor": "bitwise_xor",
    "aten.bitwise_and.Scalar": "bitwise_and", "aten.bitwise_or.Scalar": "bitwise_or",
    "aten.where.self": "where", "aten.clamp.default": "clamp", "aten.clamp.Tensor": "clamp",
    "aten.atan2.default": "atan2", "aten.fmod.Tensor": "fmod", "aten.fmod.Scalar": "fmod",
    "aten._to_copy.default": "cast", "prims.convert_element_type.default": "cast",
    "aten.full.default": "full", "aten.full_like.default": "full", "aten.scalar_tensor.default": "full",
    "aten.zeros_like.default": "full", "aten.ones_like.default": "full",
}

# reductions: canonical name -> (identity per kind, combine template over acc {x} and value {v})
ATEN_REDUCTIONS = {
    "aten.sum.dim_IntList": "sum", "aten.sum.default": "sum", "aten.mean.dim": "mean",
    "aten.mean.default": "mean", "aten.amax.default": "amax", "aten.amin.default": "amin",
    "aten.prod.dim_int": "prod", "aten.prod.default": "prod", "aten.any.dim": "any",
    "aten.any.dims": "any", "aten.any.default": "any", "aten.all.dim": "all", "aten.all.dims": "all",
    "aten.all.default": "all",
}
REDUCE_COMBINE = {
    "sum": "{x} + {v}", "mean": "{x} + {v}", "prod": "{x} * {v}",
    "amax": "(({v} > {x} || {v} != {v}) ? {v} : {x})",
    "amin": "(({v} < {x} || {v} != {v}) ? {v} : {x})",
    "any": "({x} || {v})", "all": "({x} && {v})",
}


def reduce_identity(kind: str, ctype: str) -> str:
    """C literal of the identity element of a reduction in ``ctype``."""
    if kind in ("sum", "mean"):
        return "0"
    if kind == "prod":
        return "1"
    if kind == "any":
        return "0"
    if kind == "all":
        return "1"
    if ctype in ("float", "double"):
        return "-INFINITY" if kind == "amax" else "INFINITY"
    bits = {"int64_t": 64, "int32_t": 32, BOOL_CTYPE: 32}[ctype]
    return f"INT{bits}_MIN" if kind == "amax" else f"INT{bits}_MAX"


def c_literal(value, ctype: str) -> str:
    """A Python scalar as a C literal of ``ctype`` (non-finite floats included)."""
    if ctype in ("bool", "ap_bool"):
        return "1" if value else "0"
    if ctype in ("float", "double"):
        v = float(value)
        if math.isnan(v):
            return "NAN"
        if math.isinf(v):
            return "INFINITY" if v > 0 else "-INFINITY"
        text = repr(v) if ctype == "double" else f"{v!r}f"
        return text if "e" in text or "." in text or "n" in text else text.replace("f", ".0f")
    if isinstance(value, float):
        value = int(value)
    return f"(({ctype}){int(value)}LL)" if ctype != "int32_t" else f"((int32_t){int(value)})"


def reduce_dims(step, rank: int) -> set[int]:
    """The dims an ATen reduction step (``ATEN_REDUCTIONS``) reduces, for an input of ``rank``."""
    op = step.op
    if op.endswith(".default") and op not in ("aten.amax.default", "aten.amin.default"):
        return set(range(rank))
    dims = step.args[1] if len(step.args) > 1 else step.kwargs.get("dim")
    if dims is None or (isinstance(dims, list) and len(dims) == 0):
        return set(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return {d % rank for d in dims}


def reduce_keepdim(step) -> bool:
    """Whether an ATen reduction step keeps the reduced dims (as size 1)."""
    op = step.op
    if op.endswith(".default") and op not in ("aten.amax.default", "aten.amin.default"):
        return False
    if len(step.args) > 2 and isinstance(step.args[2], bool):
        return step.args[2]
    return bool(step.kwargs.get("keepdim", False))
