"""Render one candidate of a fused kernel to C++ (templates/kernel/fused.cpp.j2).

The generator turns a kernel spec (:class:`ascendc_pack.ir.fusion.KernelSpec`) and a tiling into plain
data for the template: loop bounds, and per *pass* over the inner (reduce) axes the C
statements of its body, its accumulators and its stores. Python writes the expressions; the
template writes the loops for the tiling's schedule:

* ``row``   - threads take blocks of rows (kept-axis indices); each row runs its passes over
              the inner axes, the innermost loop vectorized in lanes;
* ``split`` - all threads share each row: the inner range is split across threads, partial
              reductions are combined through the workspace after a barrier;
* ``col``   - threads take tiles of rows and vectorize *across* rows, looping the reduce axes
              outside (for reductions over a strided, outer axis).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import jinja2

from ascendc_pack.ir.fusion import ConstNode, KernelSpec, NodeKind
from ascendc_pack.ir.symbolic import is_symbolic
from ascendc_pack.ir.ops import (BINARY, BOOL_CTYPE, COMPARISONS, COMPUTE_TYPE, FLOAT_DTYPES, LOGICAL, PREDICATES, REDUCE_COMBINE,
                  ROUNDING, STORAGE_BYTES, STORAGE_TYPE, TERNARY, UNARY, c_literal, reduce_identity)

SQRT1_2 = 0.7071067811865476  # torch's M_SQRT1_2, the constant of its gelu decomposition

ROUND_FN = {"float16": "ap_round_f16", "bfloat16": "ap_round_bf16"}  # round a float to a 16-bit dtype
STAGE_MAX = 16384
"""Most elements of a row a boolean input is staged for (:meth:`Emitter._staged`): an int32 array on
the thread's stack, 64 KiB."""


@lru_cache(maxsize=1)
def template_root() -> Path:
    """The directory of the kernel and graph templates (``templates/``)."""
    try:
        return Path(str(resources.files("ascendc_pack.templates")))
    except ModuleNotFoundError:  # running from a source tree without installing
        return Path(__file__).resolve().parents[3] / "templates"


@lru_cache(maxsize=1)
def template_env() -> jinja2.Environment:
    """The one Jinja environment for kernel and graph templates (StrictUndefined); one per
    process, so each template is compiled once."""
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(template_root())), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)




@dataclass(frozen=True)
class Layout:
    """How a spec's axes are split into outer (row) and inner (pass) loops."""

    outer: list[int]   # axis ids, row index space
    inner: list[int]   # axis ids, looped inside each pass (reduce axes, or the last axis)

    @staticmethod
    def of(spec: KernelSpec) -> Layout:
        n = len(spec.axes)
        red = spec.reduce_axes
        if red:
            return Layout([a for a in range(n) if a not in red], list(red))
        return Layout(list(range(n - 1)), [n - 1])


def _pyconst_type(node) -> str | None:
    return node.dtype if node.dtype in ("pyint", "pyfloat") else None


class Emitter:
    """Writes C statements for spec nodes, hoisting row-invariant ones out of the passes."""

    def __init__(self, spec: KernelSpec, layout: Layout, col: bool, num=str):
        self.spec = spec
        self.num = num  # C text of a stride, offset or count (a jit kernel names its dynamic ones)
        self.nodes = spec.nodes
        self.layout = layout
        self.col = col
        self.inner = set(layout.inner)
        self.varies: list[bool] = []
        for n in self.nodes:  # nodes are in topological order
            self.varies.append(self._varies(n))
        self.stage = self._stages()
        self.row_memo: dict[int, str] = {}
        self.row_lines: list[str] = []
        self.row_decls: list[str] = []  # col mode: per-task arrays
        self.staged: dict[int, str] = {}  # LOAD node -> its per-row int32 copy (bool inputs, row mode)
        self.tmp = 0

    # analysis ---------------------------------------------------------------------------------
    def _varies(self, n) -> bool:
        if n.kind is NodeKind.LOAD:
            return any(n.strides[a] != 0 for a in self.inner)
        if n.kind in (NodeKind.CONST, NodeKind.REDUCE):
            return False
        return any(self.varies[a] for a in n.args)

    def _stages(self) -> list[int]:
        """Per node: number of reduction stages that must finish before it can be computed."""
        st = []
        for n in self.nodes:
            if n.kind in (NodeKind.LOAD, NodeKind.CONST):
                st.append(0)
            elif n.kind is NodeKind.REDUCE:
                st.append(st[n.args[0]] + 1)
            else:
                st.append(max((st[a] for a in n.args), default=0))
        return st

    def ctype(self, nid: int) -> str:
        d = self.nodes[nid].dtype
        return {"pyint": "int64_t", "pyfloat": "float"}.get(d, COMPUTE_TYPE.get(d, "float"))

    # expressions ------------------------------------------------------------------------------
    def index(self, strides, offset) -> str:
        terms = [self.num(offset)] if offset != 0 else []
        for a, s in enumerate(strides):
            if s == 0:
                continue
            var = self.axis_var(a)
            terms.append(var if s == 1 else f"{var} * {self.num(s)}")
        return " + ".join(terms) or "0"

    def axis_var(self, a: int) -> str:
        if a in self.inner:
            return f"r{self.layout.inner.index(a)}"
        return f"x{self.layout.outer.index(a)}"

    def value(self, nid: int, scope: dict | None) -> str:
        """C expression of node ``nid``; ``scope`` is the current pass (None = row level)."""
        n = self.nodes[nid]
        if n.kind is NodeKind.CONST and _pyconst_type(n):
            raise AssertionError("python constants are rendered by their consumer")
        if not self.varies[nid] or scope is None:
            if nid in self.row_memo:
                return self.row_memo[nid]
            expr = self._expr(nid, None)
            return self._bind_row(nid, expr)
        if nid in scope["memo"]:
            return scope["memo"][nid]
        expr = self._expr(nid, scope)
        name = f"v{nid}"
        scope["lines"].append(f"const {self.ctype(nid)} {name} = {expr};")
        scope["memo"][nid] = name
        return name

    def _bind_row(self, nid: int, expr: str) -> str:
        n = self.nodes[nid]
        if n.kind is NodeKind.CONST:
            self.row_memo[nid] = expr
            return expr
        if self.col:
            name = f"t{nid}"
            self.row_decls.append(f"{self.ctype(nid)} {name}[TX];")
            self.row_lines.append(f"{name}[tx] = {expr};")
            ref = f"{name}[tx]"
        else:
            ref = f"t{nid}"
            self.row_lines.append(f"const {self.ctype(nid)} {ref} = {expr};")
        self.row_memo[nid] = ref
        return ref

    def _arg(self, aid: int, otype: str, scope) -> str:
        a = self.nodes[aid]
        if isinstance(a, ConstNode):
            return c_literal(a.number, otype)
        expr = self.value(aid, scope)
        atype = self.ctype(aid)
        if atype == otype:
            return expr
        if otype == BOOL_CTYPE:
            return f"({expr} != 0)"
        return f"(({otype}){expr})"

    def _expr(self, nid: int, scope) -> str:
        n = self.nodes[nid]
        if n.kind is NodeKind.CONST:
            return c_literal(n.number, self.ctype(nid))
        if n.kind is NodeKind.LOAD:
            if n.dtype == "bool" and scope is not None and self._stageable(n):
                return self._staged(nid)
            idx = self.index(n.strides, n.offset)
            raw = f"in{n.input}[{idx}]"
            return {"float16": f"ap_f16_to_f32({raw})", "bfloat16": f"ap_bf16_to_f32({raw})",
                    "bool": f"({raw} != 0)"}.get(n.dtype, raw)
        if n.kind is NodeKind.REDUCE:
            raise AssertionError("reductions are bound when their pass finishes")
        op, args, dtype = n.op, n.args, n.dtype
        out_t = self.ctype(nid)
        if op == "cast":
            src = self.value(args[0], scope) if self.nodes[args[0]].kind is not NodeKind.CONST else \
                self._arg(args[0], out_t, scope)
            if out_t == BOOL_CTYPE:
                expr = f"({src} != 0)"
            else:
                expr = f"(({out_t}){src})"
        elif op in COMPARISONS:
            otype = self._promote(args)
            a, b = (self._arg(x, otype, scope) for x in args)
            expr = BINARY[op].format(a=a, b=b)
        elif op in LOGICAL:
            vals = [self._arg(x, BOOL_CTYPE, scope) for x in args]
            expr = (UNARY if len(vals) == 1 else BINARY)[op].format(a=vals[0], b=vals[-1])
        elif op == "where":
            c = self._arg(args[0], BOOL_CTYPE, scope)
            a, b = (self._arg(x, out_t, scope) for x in args[1:])
            # floats: a bitwise select (same bits; vectorizes inside reductions, kernel_ops.h)
            expr = f"ap_select({c}, {a}, {b})" if out_t in ("float", "double") else \
                TERNARY["where"].format(a=c, b=a, c=b)
        elif op == "pow" and out_t not in ("float", "double"):
            a, b = (self._arg(x, out_t, scope) for x in args)
            e = self.nodes[args[1]]
            if isinstance(e, ConstNode) and not isinstance(e.value, str) and 1 <= e.value <= 4:
                expr = "(" + " * ".join([a] * int(e.value)) + ")"  # a loop-free power vectorizes
            else:
                expr = f"ap_ipow<{out_t}>({a}, {b})"
        elif op == "pow" and self.nodes[args[1]].kind is NodeKind.CONST:
            expr = self._pow_const(args, out_t, scope)
        elif op in PREDICATES:
            a = self.nodes[args[0]]
            expr = UNARY[op].format(a=self._arg(args[0], "float", scope) if a.kind is NodeKind.CONST
                                    else self.value(args[0], scope))
        elif op in ROUNDING and out_t not in ("float", "double"):
            expr = self._arg(args[0], out_t, scope)
        elif op == "abs" and out_t in ("float", "double"):
            expr = f"ap_fabs({self._arg(args[0], out_t, scope)})"
        elif op in ("div_trunc", "div_floor") and dtype in ROUND_FN:
            # torch rounds the quotient (and the floor's intermediates) to the 16-bit dtype
            a, b = (self._arg(x, out_t, scope) for x in args)
            expr = f"ap_trunc({ROUND_FN[dtype]}({a} / {b}))" if op == "div_trunc" else \
                f"ap_div_floor({a}, {b}, {ROUND_FN[dtype]})"
        elif op == "mul" and dtype == "float32" and (x := self._gelu_of(args)) is not None:
            expr = f"ap_gelu({self._arg(x, out_t, scope)})"
        elif op in UNARY:
            expr = UNARY[op].format(a=self._arg(args[0], out_t, scope))
            if op == "bitwise_not" and out_t == BOOL_CTYPE:
                expr = f"(!{self._arg(args[0], BOOL_CTYPE, scope)})"
        elif op in BINARY:
            a, b = (self._arg(x, out_t, scope) for x in args)
            expr = BINARY[op].format(a=a, b=b)
        else:
            raise AssertionError(f"no C for op {op}")
        if dtype in ROUND_FN:
            expr = f"{ROUND_FN[dtype]}({expr})"
        return expr

    def _times(self, nid: int, c: float) -> int | None:
        """``y`` when float32 node ``nid`` is ``y * c`` (either operand order), else None."""
        n = self.nodes[nid]
        if n.kind is not NodeKind.OP or n.op != "mul" or n.dtype != "float32":
            return None
        for y, k in (n.args, n.args[::-1]):
            if isinstance(self.nodes[k], ConstNode) and self.nodes[k].number == c:
                return y
        return None

    def _gelu_of(self, args) -> int | None:
        """``x`` when ``args[0] * args[1]`` is ``x * 0.5 * (1 + erf(x * sqrt(1/2)))``, torch's
        ``gelu`` (approximate="none") as capture decomposes it: emitted as ``ap_gelu(x)``
        (kernel_math.h: one exp and one division, within 4.2e-7 of float64; the erf form costs
        ~1.5x: mlp's LayerNorm + GELU over 256 x 2048, ~0.3 ms of a 6.5 ms call)."""
        for half, rest in (args, args[::-1]):
            x, one_plus = self._times(half, 0.5), self.nodes[rest]
            if x is None or one_plus.kind is not NodeKind.OP or one_plus.op != "add" or one_plus.dtype != "float32":
                continue
            for e, one in (one_plus.args, one_plus.args[::-1]):
                erf = self.nodes[e]
                if isinstance(self.nodes[one], ConstNode) and self.nodes[one].number == 1 and \
                        erf.kind is NodeKind.OP and erf.op == "erf" and self._times(erf.args[0], SQRT1_2) == x:
                    return x
        return None

    def _stageable(self, n) -> bool:
        """A boolean input varying along the one inner axis of a row-schedule kernel: read once per
        row into an int32 array (g++ vectorizes a loop mixing uint8 loads with float math on
        narrow vectors, or not at all: a masked softmax's passes ran 4.4x slower than unmasked)."""
        return (not self.col and len(self.layout.inner) == 1 and self.spec.axes[self.layout.inner[0]] <= STAGE_MAX
                and any(n.strides[a] != 0 for a in self.inner))

    def _staged(self, nid: int) -> str:
        """``m<nid>[r0]``: the row's copy of boolean load ``nid``, made (once) before the pass."""
        if nid not in self.staged:
            n = self.nodes[nid]
            name = f"m{nid}"
            self.row_lines.append(f"alignas(64) ap_bool {name}[R0];")
            self.row_lines.append(f"for (int64_t r0 = 0; r0 < R0; ++r0) {name}[r0] = "
                                  f"(in{n.input}[{self.index(n.strides, n.offset)}] != 0);")
            self.staged[nid] = name
        return f"{self.staged[nid]}[r0]"

    def _pow_const(self, args, out_t, scope) -> str:
        e = self.nodes[args[1]].number
        a = self._arg(args[0], out_t, scope)
        special = {2.0: f"({a} * {a})", 3.0: f"({a} * {a} * {a})", 1.0: a, 0.5: f"ap_sqrt({a})",
                   -1.0: f"(1 / {a})", 0.0: c_literal(1, out_t), -0.5: f"(1 / ap_sqrt({a}))"}
        if float(e) in special and out_t in ("float", "double"):
            return special[float(e)]
        return f"ap_pow({a}, {c_literal(e, out_t)})"

    def _promote(self, args) -> str:
        types = [self.nodes[a].dtype for a in args]
        if "float64" in types:
            return "double"
        if any(t in FLOAT_DTYPES for t in types) or "pyfloat" in types:
            return "float"
        if all(t == "bool" for t in types):
            return BOOL_CTYPE
        if all(t in ("int32", "bool", "pyint") for t in types) and "int32" in types:
            return "int32_t"
        return "int64_t"


def _store(out_index: int, dtype: str, index: str, value: str) -> str:
    conv = {"float16": f"ap_f32_to_f16({value})", "bfloat16": f"ap_f32_to_bf16({value})",
            "bool": f"(uint8_t)({value})"}.get(dtype, f"({STORAGE_TYPE[dtype]})({value})")
    return f"out{out_index}[{index}] = {conv};"


def _count_text(count, em: Emitter) -> str:
    """A mean's element count as a C double."""
    return f"(double){em.num(count)}" if is_symbolic(count) else f"{int(count)}.0"


def plan_passes(spec: KernelSpec, em: Emitter) -> list[dict]:
    """Group reductions and stores into passes; emit row statements between them."""
    nodes = spec.nodes
    reductions = [n.id for n in spec.reductions]
    n_stages = max((em.stage[r] for r in reductions), default=0)
    # an output is stored in a pass when its value or its store index varies over the inner axes
    # (a value broadcast along them, e.g. an expanded input or a constant, still needs the loop)
    full = [em.varies[o.node] or any(o.strides[a] != 0 for a in em.inner) for o in spec.outputs]
    full_outs = [(j, o) for j, o in enumerate(spec.outputs) if full[j]]
    row_outs = [(j, o) for j, o in enumerate(spec.outputs) if not full[j]]
    sections: list[dict] = []

    def flush_row(stores=()):
        if em.row_lines or stores:
            sections.append({"kind": "row", "lines": list(em.row_lines), "stores": list(stores)})
            em.row_lines.clear()

    for s in range(n_stages + 1):
        reds = [r for r in reductions if em.stage[r] == s + 1]
        stores = [(j, o) for j, o in full_outs if em.stage[o.node] == s]
        if not reds and not stores:
            continue
        scope = {"memo": {}, "lines": []}
        accs = []
        # row-level values needed by this pass are emitted (hoisted) before it
        for r in reds:
            node = nodes[r]
            acc_t = em.ctype(r)
            v = em._arg(node.args[0], acc_t, scope)
            accs.append({"id": r, "type": acc_t, "kind": node.op, "value": v,
                         "identity": reduce_identity(node.op, acc_t),
                         "combine": REDUCE_COMBINE[node.op],
                         "wide": acc_t == "float" and node.op in ("sum", "mean"),
                         "count_text": _count_text(1 if node.count is None else node.count, em),
                         "rnd": ROUND_FN.get(node.dtype, "")})
        store_lines = []
        for j, o in stores:
            val = em._arg(o.node, COMPUTE_TYPE[o.dtype], scope)
            store_lines.append(_store(j, o.dtype, em.index(o.strides, 0), val))
        flush_row()
        sections.append({"kind": "pass", "body": scope["lines"], "accs": accs, "stores": store_lines})
        for acc in accs:  # the reduced value becomes a row-level value
            em.row_memo[acc["id"]] = f"t{acc['id']}[tx]" if em.col else f"t{acc['id']}"
            if em.col:
                em.row_decls.append(f"{acc['type']} t{acc['id']}[TX];")
    row_stores = []
    for j, o in row_outs:
        val = em._arg(o.node, COMPUTE_TYPE[o.dtype], None)
        row_stores.append(_store(j, o.dtype, em.index(o.strides, 0), val))
    flush_row(row_stores)
    return sections


def store_lanes(spec: KernelSpec, lanes: int) -> int:
    """The step of a storing loop: ``lanes`` times 4 / the narrowest tensor's bytes. g++ sizes all
    of a loop's vectors by its narrowest type, so 16 lanes of a uint8 output made 16-byte vectors
    and the loop's floats ran 4 to an instruction: a LayerNorm + GELU quantized to uint8 (256 x 2048)
    took 660 µs at 16 lanes, 282 at 64 (its float32 twin 180-260)."""
    narrowest = min((STORAGE_BYTES[STORAGE_TYPE[t.dtype]] for t in (*spec.inputs, *spec.outputs)), default=4)
    return lanes * max(1, 4 // narrowest)


def render_kernel(spec: KernelSpec, tiling: dict, kernel_key: str, tiling_repr: str, workspace: int,
                  block_dim: int, isa: str) -> str:
    """C++ source of one candidate (a static kernel: the tiling is compiled in)."""
    layout = Layout.of(spec)
    sched = tiling["sched"]
    if sched == "col":
        layout = Layout(layout.outer, layout.inner)
    em = Emitter(spec, layout, col=(sched == "col"))
    sections = plan_passes(spec, em)
    axes = spec.axes
    outer_sizes = [axes[a] for a in layout.outer]
    inner_sizes = [axes[a] for a in layout.inner]
    n_accs = sum(len(s["accs"]) for s in sections if s["kind"] == "pass")
    ctx = {
        "name": spec.name, "kernel_key": kernel_key, "tiling_repr": tiling_repr,
        "workspace": workspace, "block_dim": block_dim, "isa": isa,
        "inputs": [{"type": STORAGE_TYPE[i.dtype]} for i in spec.inputs],
        "outputs": [{"type": STORAGE_TYPE[o.dtype]} for o in spec.outputs],
        "outer_sizes": outer_sizes, "inner_sizes": inner_sizes,
        "rows": math.prod(outer_sizes), "sections": sections, "row_decls": em.row_decls,
        "tiling": tiling, "n_accs": n_accs, "has_reduction": n_accs > 0, "jit": False,
        "store_lanes": store_lanes(spec, tiling.get("lanes", 16)),
    }
    return template_env().get_template("kernel/fused.cpp.j2").render(**ctx)
