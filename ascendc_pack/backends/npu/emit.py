"""Lower spec ops to AscendC Vector instructions (count forms) over float32 UB tensors.

An :class:`OpEmitter` writes the C++ statements computing one node into a :class:`Scope`: a
*tile* scope (the nodes that vary over the inner range, ``n`` valid elements of a tile, ``np``
padded to a whole 256-byte repeat) or a *row* scope (one value per row, held in a 64-float row
slot, count 1). An operand is a vector (``V``: a UB tensor expression) or a scalar (``S``: a
float expression: a constant, or a row value read by the scalar unit for a tile op).

Every value is float32 (see :mod:`ascendc_pack.backends.npu.layout`); booleans are 0.0/1.0. Instruction
choices that matter for parity with eager PyTorch:

* division, reciprocal and rsqrt use ``Div`` (the device's ``Reciprocal``/``Rsqrt`` are
  approximate, about 1e-4 relative, outside float32 tolerances); bfloat16 results use them;
* subtraction of a scalar is ``Adds(x, -s)`` (exact), of a tensor from a scalar
  ``Adds(Muls(x, -1), s)`` (exact);
* comparisons produce a bit mask with ``Compare``/``CompareScalar`` (``Compares`` from CANN 9.0) over whole
  repeats (``np``) and
  ``Select`` turns it into 0.0/1.0; ``where`` selects with the mask;
* ``tanh`` = 1 - 2 / (exp(2x) + 1), ``sigmoid`` = 1 / (1 + exp(-x)), ``erf`` = Abramowitz-Stegun
  7.1.26 (absolute error <= 1.5e-7) with the sign restored by ``Select``;
* a result whose dtype is float16/bfloat16 is rounded with a Cast round trip
  (``Round16``: overflow gives +-inf, as torch, not the Cast's saturation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ascendc_pack.ir.fusion import ConstNode, KernelSpec
from ascendc_pack.ir.ops import c_literal
from ascendc_pack.backends.npu.layout import BOOL_BITWISE

SCALAR_COMPARE = "@CMPS@"
"""The tensor-vs-scalar comparison, named at render time for the target CANN release
(:func:`ascendc_pack.backends.npu.api.scalar_compare`: ``CompareScalar`` in 8.x, ``Compares`` from 9.0)."""
HALF_LIMIT = {"float16": "65520.0f", "bfloat16": "3.3961775e38f"}
"""|x| at and above which a float rounds to infinity in the 16-bit dtype (round to nearest even)."""
ROUND16_TYPE = {"float16": "half", "bfloat16": "bfloat16_t"}
CMP = {"eq": "EQ", "ne": "NE", "lt": "LT", "le": "LE", "gt": "GT", "ge": "GE"}
MIRROR = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}
# ops whose result is exact (representable in the operands' 16-bit dtype): no rounding needed
EXACT_OPS = {"neg", "abs", "relu", "maximum", "minimum", "clamp_lo", "clamp_hi", "identity", "where", "floor",
             "ceil", "round", "trunc", "cast"}
ERF_P = 0.3275911
ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def flit(value) -> str:
    """A float literal in kernel C++ (non-finite values through the kernel's AP_INF / AP_NAN)."""
    text = c_literal(value, "float")
    return {"INFINITY": "AP_INF", "-INFINITY": "(-AP_INF)", "NAN": "AP_NAN"}.get(text, text)


@dataclass
class Operand:
    kind: str   # "V" (UB tensor) or "S" (scalar)
    expr: str


@dataclass
class Scope:
    """Where statements go: ``count``/``pad`` are the C++ element counts of its instructions;
    ``temp()`` hands out a float UB tensor (``give`` returns it)."""

    kind: str                      # "tile" | "row"
    count: str
    pad: str
    lines: list[str] = field(default_factory=list)
    take_temp: object = None       # () -> str
    give_temp: object = None       # (str) -> None

    def temp(self) -> str:
        return self.take_temp()

    def give(self, expr: str) -> None:
        self.give_temp(expr)

    def emit(self, line: str) -> None:
        self.lines.append(line)


def _representable(value: float, dtype: str) -> bool:
    t = torch.tensor(float(value), dtype=torch.float32)
    return math.isnan(value) or float(t.to(getattr(torch, dtype)).float()) == float(t)


class OpEmitter:
    """Writes the instructions of op nodes. ``operand(scope, id)`` resolves an argument."""

    def __init__(self, spec: KernelSpec, operand):
        self.spec = spec
        self.nodes = spec.nodes
        self.operand = operand
        self.uses = {"ones": False, "pinf": False, "ninf": False, "half": False, "mask": 0}

    # helpers --------------------------------------------------------------------------------
    def vec(self, sc: Scope, o: Operand, temps: list[str]) -> str:
        """``o`` as a UB tensor (a scalar is Duplicate'd into a temp)."""
        if o.kind == "V":
            return o.expr
        t = sc.temp()
        temps.append(t)
        sc.emit(f"Duplicate({t}, {o.expr}, {sc.count});")
        return t

    def ones(self) -> str:
        self.uses["ones"] = True
        return "ones_"

    def mask(self, k: int = 0) -> str:
        self.uses["mask"] = max(self.uses["mask"], k + 1)
        return f"mask{k}_"

    def to_bool(self, sc: Scope, dst: str, o: Operand, temps) -> str:
        """0.0/1.0 of ``o != 0`` into dst."""
        v = self.vec(sc, o, temps)
        sc.emit(f"{SCALAR_COMPARE}({self.mask()}, {v}, 0.0f, CMPMODE::NE, {sc.pad});")
        sc.emit(f"Select({dst}, {self.mask()}, {self.ones()}, 0.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, {sc.pad});")
        return dst

    def as_bool(self, sc: Scope, aid: int, temps) -> Operand:
        o = self.operand(sc, aid)
        if self.nodes[aid].dtype == "bool":
            return o
        if o.kind == "S":
            return Operand("S", f"(({o.expr}) != 0.0f ? 1.0f : 0.0f)")
        t = sc.temp()
        temps.append(t)
        return Operand("V", self.to_bool(sc, t, o, temps))

    def mask_to_float(self, sc: Scope, dst: str, k: int = 0) -> None:
        sc.emit(f"Select({dst}, {self.mask(k)}, {self.ones()}, 0.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, {sc.pad});")

    def round16(self, sc: Scope, dst: str, dtype: str) -> None:
        """Round dst (float) to ``dtype`` and back; +-inf on overflow (torch's cast)."""
        self.uses.update(pinf=True, ninf=True, half=True)
        self.mask(1)
        sc.emit(f"Round16<{ROUND16_TYPE[dtype]}>({dst}, {HALF_LIMIT[dtype]}, {sc.count}, {sc.pad});")

    def needs_rounding(self, nid: int) -> bool:
        n = self.nodes[nid]
        if n.dtype not in ROUND16_TYPE:
            return False
        if getattr(n, "op", None) not in EXACT_OPS:
            return True
        for a in n.args:
            arg = self.nodes[a]
            if isinstance(arg, ConstNode):
                if not _representable(float(arg.number), n.dtype):
                    return True
            elif arg.dtype != n.dtype and not (n.op == "where" and a == n.args[0]):
                return True
        return False

    # ops ------------------------------------------------------------------------------------
    def emit(self, sc: Scope, nid: int, dst: str) -> str:
        """Compute op node ``nid`` into ``dst``; returns the tensor holding the result (dst, or
        the operand itself for an identity)."""
        n = self.nodes[nid]
        op = BOOL_BITWISE.get(n.op, n.op) if self.nodes[n.args[0]].dtype == "bool" else n.op
        temps: list[str] = []
        out = self._op(sc, n, op, dst, temps)
        for t in temps:
            sc.give(t)
        if out == dst and self.needs_rounding(nid):
            self.round16(sc, dst, n.dtype)
        return out

    def _op(self, sc: Scope, n, op: str, dst: str, temps: list[str]) -> str:
        c = sc.count
        args = [self.operand(sc, a) for a in n.args]
        a = args[0]
        if op in ("identity", "cast"):
            src = self.nodes[n.args[0]]
            if n.dtype == "bool" and src.dtype != "bool":
                return self.to_bool(sc, dst, a, temps)
            if a.kind == "V" and not (n.dtype in ROUND16_TYPE and self.needs_rounding(n.id)):
                return a.expr
            sc.emit(f"Muls({dst}, {self.vec(sc, a, temps)}, 1.0f, {c});" if a.kind == "V"
                    else f"Duplicate({dst}, {a.expr}, {c});")
            return dst
        unary = {"abs": "Abs", "exp": "Exp", "log": "Ln", "sqrt": "Sqrt", "relu": "Relu"}
        if op in unary:
            sc.emit(f"{unary[op]}({dst}, {self.vec(sc, a, temps)}, {c});")
            return dst
        if op == "neg":
            sc.emit(f"Muls({dst}, {self.vec(sc, a, temps)}, -1.0f, {c});")
            return dst
        if op == "square":
            v = self.vec(sc, a, temps)
            sc.emit(f"Mul({dst}, {v}, {v}, {c});")
            return dst
        if op in ("reciprocal", "rsqrt"):
            return self._recip(sc, n, op, dst, self.vec(sc, a, temps))
        if op in ("floor", "ceil", "round", "trunc"):
            mode = {"floor": "CAST_FLOOR", "ceil": "CAST_CEIL", "round": "CAST_RINT", "trunc": "CAST_TRUNC"}[op]
            sc.emit(f"Cast({dst}, {self.vec(sc, a, temps)}, RoundMode::{mode}, {c});")
            return dst
        if op == "exp2":
            sc.emit(f"Muls({dst}, {self.vec(sc, a, temps)}, 0.6931471805599453f, {c});")
            sc.emit(f"Exp({dst}, {dst}, {c});")
            return dst
        if op == "sigmoid":
            sc.emit(f"Muls({dst}, {self.vec(sc, a, temps)}, -1.0f, {c});")
            sc.emit(f"Exp({dst}, {dst}, {c});")
            sc.emit(f"Adds({dst}, {dst}, 1.0f, {c});")
            sc.emit(f"Div({dst}, {self.ones()}, {dst}, {c});")
            return dst
        if op == "tanh":
            sc.emit(f"Muls({dst}, {self.vec(sc, a, temps)}, 2.0f, {c});")
            for line in (f"Exp({dst}, {dst}, {c});", f"Adds({dst}, {dst}, 1.0f, {c});",
                         f"Div({dst}, {self.ones()}, {dst}, {c});", f"Muls({dst}, {dst}, -2.0f, {c});",
                         f"Adds({dst}, {dst}, 1.0f, {c});"):
                sc.emit(line)
            return dst
        if op == "erf":
            return self._erf(sc, dst, self.vec(sc, a, temps), temps)
        if op in ("isnan", "isinf"):
            v = self.vec(sc, a, temps)
            if op == "isnan":
                sc.emit(f"Compare({self.mask()}, {v}, {v}, CMPMODE::NE, {sc.pad});")
            else:
                t = sc.temp()
                temps.append(t)
                sc.emit(f"Abs({t}, {v}, {c});")
                sc.emit(f"{SCALAR_COMPARE}({self.mask()}, {t}, AP_INF, CMPMODE::EQ, {sc.pad});")
            self.mask_to_float(sc, dst)
            return dst
        if op in ("logical_not", "bool_not"):
            b = self.as_bool(sc, n.args[0], temps)
            sc.emit(f"Muls({dst}, {self.vec(sc, b, temps)}, -1.0f, {c});")
            sc.emit(f"Adds({dst}, {dst}, 1.0f, {c});")
            return dst
        if op in ("logical_and", "logical_or", "logical_xor"):
            x, y = (self.vec(sc, self.as_bool(sc, i, temps), temps) for i in n.args)
            fn = {"logical_and": "Mul", "logical_or": "Max", "logical_xor": "Sub"}[op]
            sc.emit(f"{fn}({dst}, {x}, {y}, {c});")
            if op == "logical_xor":
                sc.emit(f"Abs({dst}, {dst}, {c});")
            return dst
        if op == "where":
            return self._where(sc, n, dst, args, temps)
        if op in CMP:
            return self._compare(sc, op, dst, args, temps)
        if op == "pow":
            return self._pow(sc, n, dst, a, temps)
        if op == "div_trunc":
            sc.emit(f"Div({dst}, {self.vec(sc, a, temps)}, {self.vec(sc, args[1], temps)}, {c});")
            if n.dtype in ROUND16_TYPE:  # torch rounds the quotient to the 16-bit dtype first
                self.round16(sc, dst, n.dtype)
            sc.emit(f"Cast({dst}, {dst}, RoundMode::CAST_TRUNC, {c});")
            return dst
        return self._binary(sc, op, dst, args, temps)

    def _binary(self, sc: Scope, op: str, dst: str, args: list[Operand], temps) -> str:
        c = sc.count
        a, b = args
        vec_fn = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "maximum": "Max", "minimum": "Min",
                  "clamp_lo": "Max", "clamp_hi": "Min"}[op]
        scal_fn = {"add": "Adds", "mul": "Muls", "maximum": "Maxs", "minimum": "Mins", "clamp_lo": "Maxs",
                   "clamp_hi": "Mins"}
        if a.kind == "V" and b.kind == "V":
            sc.emit(f"{vec_fn}({dst}, {a.expr}, {b.expr}, {c});")
        elif op in scal_fn and (a.kind == "V" or b.kind == "V"):
            v, s = (a, b) if a.kind == "V" else (b, a)
            sc.emit(f"{scal_fn[op]}({dst}, {v.expr}, {s.expr}, {c});")
        elif op == "sub" and a.kind == "V":
            sc.emit(f"Adds({dst}, {a.expr}, -({b.expr}), {c});")
        elif op == "sub" and b.kind == "V":
            sc.emit(f"Muls({dst}, {b.expr}, -1.0f, {c});")
            sc.emit(f"Adds({dst}, {dst}, {a.expr}, {c});")
        else:  # divisions by/of a scalar, or scalar-scalar: exact with Duplicate + the vector form
            sc.emit(f"{vec_fn}({dst}, {self.vec(sc, a, temps)}, {self.vec(sc, b, temps)}, {c});")
        return dst

    def _recip(self, sc: Scope, n, op: str, dst: str, v: str) -> str:
        c = sc.count
        if n.dtype == "bfloat16":  # the approximate instructions are well inside bf16's precision
            sc.emit(f"{'Reciprocal' if op == 'reciprocal' else 'Rsqrt'}({dst}, {v}, {c});")
            return dst
        if op == "rsqrt":
            sc.emit(f"Sqrt({dst}, {v}, {c});")
            v = dst
        sc.emit(f"Div({dst}, {self.ones()}, {v}, {c});")
        return dst

    def _pow(self, sc: Scope, n, dst: str, a: Operand, temps) -> str:
        e = float(self.nodes[n.args[1]].number)
        c = sc.count
        if e == 0.0:
            sc.emit(f"Duplicate({dst}, 1.0f, {c});")
            return dst
        v = self.vec(sc, a, temps)
        if e == 1.0:
            sc.emit(f"Muls({dst}, {v}, 1.0f, {c});")
        elif e in (2.0, -2.0):
            sc.emit(f"Mul({dst}, {v}, {v}, {c});")
            if e < 0:
                sc.emit(f"Div({dst}, {self.ones()}, {dst}, {c});")
        elif e == 3.0:
            t = sc.temp()
            temps.append(t)
            sc.emit(f"Mul({t}, {v}, {v}, {c});")
            sc.emit(f"Mul({dst}, {t}, {v}, {c});")
        elif e == 0.5:
            sc.emit(f"Sqrt({dst}, {v}, {c});")
        elif e == -0.5:
            return self._recip(sc, n, "rsqrt", dst, v)
        else:  # -1
            return self._recip(sc, n, "reciprocal", dst, v)
        return dst

    def _compare(self, sc: Scope, op: str, dst: str, args: list[Operand], temps) -> str:
        a, b = args
        m = self.mask()
        if a.kind == "V" and b.kind == "V":
            sc.emit(f"Compare({m}, {a.expr}, {b.expr}, CMPMODE::{CMP[op]}, {sc.pad});")
        elif a.kind == "V":
            sc.emit(f"{SCALAR_COMPARE}({m}, {a.expr}, {b.expr}, CMPMODE::{CMP[op]}, {sc.pad});")
        elif b.kind == "V":
            sc.emit(f"{SCALAR_COMPARE}({m}, {b.expr}, {a.expr}, CMPMODE::{CMP[MIRROR[op]]}, {sc.pad});")
        else:
            v = self.vec(sc, a, temps)
            sc.emit(f"{SCALAR_COMPARE}({m}, {v}, {b.expr}, CMPMODE::{CMP[op]}, {sc.pad});")
        self.mask_to_float(sc, dst)
        return dst

    def _where(self, sc: Scope, n, dst: str, args: list[Operand], temps) -> str:
        cond, a, b = args
        c = sc.count
        if cond.kind == "S":  # a row-level condition: the scalar unit picks the operand
            sc.emit(f"if ({cond.expr} != 0.0f) {{")
            sc.emit(f"  Muls({dst}, {self.vec(sc, a, temps)}, 1.0f, {c});" if a.kind == "V"
                    else f"  Duplicate({dst}, {a.expr}, {c});")
            sc.emit("} else {")
            sc.emit(f"  Muls({dst}, {self.vec(sc, b, temps)}, 1.0f, {c});" if b.kind == "V"
                    else f"  Duplicate({dst}, {b.expr}, {c});")
            sc.emit("}")
            return dst
        m = self.mask()
        if a.kind == "S" and b.kind == "V":  # swap so the tensor is src0
            sc.emit(f"{SCALAR_COMPARE}({m}, {cond.expr}, 0.0f, CMPMODE::EQ, {sc.pad});")
            sc.emit(f"Select({dst}, {m}, {b.expr}, {a.expr}, SELMODE::VSEL_TENSOR_SCALAR_MODE, {sc.pad});")
            return dst
        sc.emit(f"{SCALAR_COMPARE}({m}, {cond.expr}, 0.0f, CMPMODE::NE, {sc.pad});")
        va = self.vec(sc, a, temps)
        if b.kind == "S":
            sc.emit(f"Select({dst}, {m}, {va}, {b.expr}, SELMODE::VSEL_TENSOR_SCALAR_MODE, {sc.pad});")
        else:
            sc.emit(f"Select({dst}, {m}, {va}, {b.expr}, SELMODE::VSEL_TENSOR_TENSOR_MODE, {sc.pad});")
        return dst

    def _erf(self, sc: Scope, dst: str, x: str, temps) -> str:
        """erf(x) = sign(x) (1 - t (a1 + t (a2 + ... + t a5)) exp(-x^2)), t = 1 / (1 + p |x|)."""
        c = sc.count
        ax, t, q = sc.temp(), sc.temp(), sc.temp()
        temps += [ax, t, q]
        m = self.mask()
        sc.emit(f"{SCALAR_COMPARE}({m}, {x}, 0.0f, CMPMODE::LT, {sc.pad});")
        sc.emit(f"Abs({ax}, {x}, {c});")
        sc.emit(f"Muls({t}, {ax}, {flit(ERF_P)}, {c});")
        sc.emit(f"Adds({t}, {t}, 1.0f, {c});")
        sc.emit(f"Div({t}, {self.ones()}, {t}, {c});")
        sc.emit(f"Muls({q}, {t}, {flit(ERF_A[4])}, {c});")
        for coef in reversed(ERF_A[:4]):
            sc.emit(f"Adds({q}, {q}, {flit(coef)}, {c});")
            sc.emit(f"Mul({q}, {q}, {t}, {c});")
        sc.emit(f"Mul({ax}, {ax}, {ax}, {c});")
        sc.emit(f"Muls({ax}, {ax}, -1.0f, {c});")
        sc.emit(f"Exp({ax}, {ax}, {c});")
        sc.emit(f"Mul({q}, {q}, {ax}, {c});")
        sc.emit(f"Muls({q}, {q}, -1.0f, {c});")
        sc.emit(f"Adds({q}, {q}, 1.0f, {c});")
        sc.emit(f"Muls({t}, {q}, -1.0f, {c});")
        sc.emit(f"Select({dst}, {m}, {t}, {q}, SELMODE::VSEL_TENSOR_TENSOR_MODE, {sc.pad});")
        return dst
