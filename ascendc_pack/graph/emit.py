"""Graph emitter: a :class:`~ascendc_pack.graph.plan.GraphPlan` -> the text of ``graph.cpp``.

graph.cpp is data (ascendc_pack/graph_program.h): tables of tensor specs, operators with their
constant arguments, kernel libraries and two instruction lists, ``init`` (at load) and ``run``
(every call), for the interpreter in ascendc_pack/graph_interp.h. Rendering decides only where
each value lives (a register: input, weight, static tensor of the graph state, or local of one
call) and what runs once at load: views of tensors that never change.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field

from ascendc_pack_runtime.constants import (
    GRAPH_ABI_VERSION,  # the one definition (runtime contract)
)
from ascendc_pack_runtime.tensor_meta import SCALAR_TYPES

from ascendc_pack.graph.aten import INT64_MIN, Const, ConstKind, RenderError
from ascendc_pack.graph.memory import align
from ascendc_pack.graph.ir import (
    Arg,
    AtenAction,
    Buf,
    CallMode,
    CheckAction,
    CondAction,
    FusedAction,
    GraphPlan,
    PackAction,
    RelayoutAction,
    Val,
    ValKind,
)
from ascendc_pack.ir.symbolic import any_symbolic, bounds, dim_symbol, is_symbolic, postfix
from ascendc_pack.toolchain.cxx import package_version

GRAPH_TEMPLATE = "graph/graph.cpp.j2"
NIL = "AP_NIL"


@dataclass(frozen=True)
class GraphSource:
    """A rendered graph: its C++ source and what the bundle records about it."""

    source: str
    namespace: str
    signature: str            # JSON baked into graph.so (kernels, io counts), checked at load
    stats: dict               # memory plan and step counts
    aten_ops: dict = field(default_factory=dict)   # plain ATen calls per model call, by operator
    flush_denormals: bool = False   # every call runs with denormals flushed to zero (fp_mode.h)


def render_source(plan: GraphPlan, flush_denormals: bool = False) -> GraphSource:
    """Render ``plan`` as graph.cpp (the namespace is a hash of the text); ``flush_denormals``:
    its calls flush denormals to zero (``--flush-denormals``)."""
    from ascendc_pack.kernels.fused.codegen import template_env

    em = _Emitter(plan)
    run = em.run_program()
    mem = plan.memory
    arena = [b for b in plan.bufs if mem.in_arena(b.id)]
    fresh = [b for b in plan.bufs if not mem.in_arena(b.id)]
    ranges = {name: (lo, hi) for name, lo, hi in plan.dims}
    largest = lambda n: bounds(n, ranges)[1]  # noqa: E731 - a generic plan's sizes at the declared maxima
    stats = {
        "arena_bytes": mem.arena_bytes,
        "arena_buffers": len(arena),
        "arena_unshared_bytes": sum(align(largest(b.nbytes)) for b in arena),
        "fresh_buffers": len(fresh),
        "fresh_bytes": sum(largest(b.nbytes) for b in fresh),
        "steps": dict(plan.counts),
        "static_tensors": em.n_static,
    }
    sig = {
        "graph_abi": GRAPH_ABI_VERSION,
        "kernels": [{"name": k.name, "kernel_key": k.kernel_key, "file": k.file} for k in plan.kernels],
        "n_weights": len(plan.weights), "n_inputs": len(plan.inputs), "n_outputs": len(plan.outputs),
    }
    if plan.dims:
        sig["dims"] = [{"name": n, "min": lo, "max": hi} for n, lo, hi in plan.dims]
    signature = json.dumps(sig, sort_keys=True, separators=(",", ":"))
    t = em.tables
    ctx = {
        "version": package_version(), "model_name": plan.model_name, "stats": stats,
        "graph_abi": GRAPH_ABI_VERSION, "signature_literal": _cpp_string(signature),
        "weights": em.tensor_specs(plan.weights), "inputs": em.tensor_specs(plan.inputs),
        "kernels": [{"name": _cpp_string(k.name), "key": _cpp_string(k.kernel_key), "file": _cpp_string(k.file),
                     "workspace": k.workspace, "n_inputs": k.n_inputs, "n_outputs": k.n_outputs,
                     "n_dims": len(k.dims)} for k in plan.kernels],
        "ops": em.op_table(),
        "init": [i.render() for i in em.init], "run": [i.render() for i in run],
        "returns": em.returns(), "n_static": em.n_static, "n_locals": em.n_locals,
        "arena_bytes": mem.arena_bytes, "dynamic": em.sym.tables(plan, t) if plan.dims else None,
        "flush_denormals": flush_denormals,
    }
    ctx["arrays"] = t.lines
    text = template_env().get_template(GRAPH_TEMPLATE).render(**ctx)
    namespace = "ascpack_" + hashlib.sha256(text.encode()).hexdigest()[:20]
    return GraphSource(text.replace("@NAMESPACE@", namespace), namespace, signature, stats, dict(plan.aten_ops or {}),
                       flush_denormals)


# ----------------------------------------------------------------------------- C text


def _cpp_string(s: str) -> str:
    return json.dumps(s)  # a valid C++ string literal for printable text


def _cpp_float(x: float) -> str:
    if math.isnan(x):
        return "AP_NAN"
    if math.isinf(x):
        return ("-" if x < 0 else "") + "AP_INF"
    return float(x).hex()


def _cpp_int(x: int) -> str:
    return "INT64_MIN" if x == INT64_MIN else f"int64_t({x}LL)"


def _comment(text: str) -> str:
    return " ".join(text.split())


class _Exprs:
    """The sizes of a generic plan that are expressions over its dynamic dims: each distinct one
    is an entry of the graph's expression table (postfix code, graph_program.h), written where a
    size goes as ``AP_SYM(k)``; the interpreter evaluates the table once per call shape."""

    def __init__(self, dims: tuple):
        self.dims = [d[0] for d in dims]
        self.codes: list[list[int]] = []
        self._index: dict[str, int] = {}

    def ref(self, x) -> str:
        """``AP_SYM(k)`` of expression ``x``."""
        key = str(x)
        k = self._index.get(key)
        if k is None:
            k = self._index[key] = len(self.codes)
            self.codes.append(postfix(x, self.dims.index))
        return f"AP_SYM({k})"

    def tables(self, plan: GraphPlan, t: _Tables) -> dict:
        """The dims, how the inputs bind them and the expression table, for the template."""
        binds = [(i, d, self.dims.index(s.name)) for i, (_, v) in enumerate(plan.inputs)
                 for d, s in enumerate(v.shape) if getattr(s, "is_Symbol", False)]
        unbound = [n for k, n in enumerate(self.dims) if k not in {b[2] for b in binds}]
        if unbound:
            raise RenderError(f"dynamic dim(s) {unbound} are the size of no input dim; the graph cannot bind them")
        offsets, code = [0], []
        for c in self.codes:
            code += c
            offsets.append(len(code))
        return {"dims": [f"{{{_cpp_string(n)}, {lo}, {hi}}}" for n, lo, hi in plan.dims],
                "binds": t.array("ap_dim_bind", [f"{{{i}, {d}, {k}}}" for i, d, k in binds]), "n_binds": len(binds),
                "n_exprs": len(self.codes), "offsets": t.array("int32_t", [str(o) for o in offsets]),
                "code": t.array("int64_t", [_cpp_int(c) for c in code])}


class _Tables:
    """Static arrays of graph.cpp, each written once and named by content."""

    def __init__(self, sym: _Exprs | None = None):
        self.sym = sym
        self.lines: list[str] = []
        self._names: dict[tuple, str] = {}

    def array(self, ctype: str, items: list[str]) -> str:
        """Name of a ``const <ctype> x[] = {items}`` array ("nullptr" when empty)."""
        if not items:
            return "nullptr"
        key = (ctype, tuple(items))
        name = self._names.get(key)
        if name is None:
            name = f"a{len(self._names)}"
            self._names[key] = name
            self.lines.append(f"const {ctype} {name}[] = {{{', '.join(items)}}};")
        return name

    def ints(self, xs) -> str:
        return self.array("int64_t", [self.int_text(x) for x in xs])

    def int_text(self, x) -> str:
        """A size or int constant: its literal, or ``AP_SYM(k)`` for an expression."""
        if is_symbolic(x):
            return self.sym.ref(x)
        return str(int(x)) if int(x) != INT64_MIN else "INT64_MIN"


_INSN_FIELDS = ("a", "b", "dst", "src", "ndim", "shape", "stride", "offset", "nbytes", "nargs", "args",
                "nrefs", "refs")  # declaration order of ap_insn (designated initializers follow it)


@dataclass
class _Insn:
    """One instruction before rendering (fields of ``ap_insn``; only those set are written)."""

    code: str
    comment: str = ""
    fields: dict = field(default_factory=dict)

    def render(self) -> str:
        body = ", ".join(f".{k} = {self.fields[k]}" for k in _INSN_FIELDS if k in self.fields)
        tail = f"  // {self.comment}" if self.comment else ""
        return f"{{.code = {self.code}{', ' if body else ''}{body}}},{tail}"


class _Emitter:
    def __init__(self, plan: GraphPlan):
        self.plan = plan
        self.sym = _Exprs(plan.dims)
        self.tables = _Tables(self.sym)
        self.init: list[_Insn] = []
        self.n_static = 0
        self.n_locals = 0
        self.static_memo: dict[int, bool] = {}
        self.buf_ref: dict[int, str] = {}
        self.val_ref: dict[int, str] = {}
        for b in plan.bufs:  # arena buffers are static tensors; fresh ones are per-call locals
            self.buf_ref[b.id] = self._static() if self.static_buf(b) else self._local()
        for v in plan.vals:
            if v.kind in (ValKind.VIEW, ValKind.COND, ValKind.OPAQUE, ValKind.DERIVED):
                self.val_ref[v.id] = self._static() if self.is_static(v) else self._local()
        for b in plan.bufs:
            if self.static_buf(b):
                self.init.append(self.arena_insn(b))

    def static_buf(self, b: Buf) -> bool:
        """An arena buffer whose layout never changes: a static tensor made at load. (In a generic
        plan a buffer whose size holds a dynamic dim is made per call, at its arena offset.)"""
        return self.plan.memory.in_arena(b.id) and not any_symbolic(b.shape, b.stride)

    def arena_insn(self, b: Buf) -> _Insn:
        return self.layout_insn("AP_ARENA", b.dtype, b.shape, b.stride, b.label, dst=self.buf_ref[b.id],
                                offset=self.plan.memory.placements[b.id].offset,
                                nbytes=self.tables.int_text(b.nbytes))

    # registers ------------------------------------------------------------------------------
    def _static(self) -> str:
        self.n_static += 1
        return f"AP_S({self.n_static - 1})"

    def _local(self) -> str:
        self.n_locals += 1
        return f"AP_L({self.n_locals - 1})"

    def is_static(self, v: Val) -> bool:
        """The value never changes after load (weights, arena buffers, views of them)."""
        memo = self.static_memo.get(v.id)
        if memo is not None:
            return memo
        if v.kind in (ValKind.WEIGHT, ValKind.DERIVED):
            r = True
        elif v.kind is ValKind.BUF:
            r = self.static_buf(v.buf)
        elif v.kind is ValKind.VIEW:  # (a generic plan's view whose size holds a dim changes per call)
            r = bool(v.deps) and all(self.is_static(d) for d in v.deps) and not any_symbolic(v.shape, v.stride)
        else:
            r = False
        self.static_memo[v.id] = r
        return r

    def ref(self, v: Val) -> str:
        if v.kind is ValKind.INPUT:
            return f"AP_IN({v.index})"
        if v.kind is ValKind.WEIGHT:
            return f"AP_W({v.index})"
        if v.kind is ValKind.BUF:
            return self.buf_ref[v.buf.id]
        return self.val_ref[v.id]

    # arguments ------------------------------------------------------------------------------
    def const(self, c: Const) -> str:
        k, v, t = c.kind, c.value, self.tables
        simple = {ConstKind.NONE: "AP_A_NONE", ConstKind.LAYOUT_STRIDED: "AP_A_LAYOUT_STRIDED",
                  ConstKind.DEVICE_CPU: "AP_A_DEVICE_CPU",
                  ConstKind.EMPTY_SCALARS: "AP_A_LIST(AP_ARG_OPTIONAL_SCALARS, 0, nullptr)"}
        if k in simple:
            return simple[k]
        if k is ConstKind.INT:
            return f"AP_A_INT({t.int_text(v) if is_symbolic(v) else _cpp_int(v)})"
        if k is ConstKind.FLOAT:
            return f"AP_A_DOUBLE({_cpp_float(v)})"
        if k is ConstKind.BOOL:
            return f"AP_A_BOOL({int(v)})"
        if k is ConstKind.STR:
            return f"AP_A_STRING({_cpp_string(v)})"
        if k is ConstKind.INTS:
            return f"AP_A_LIST(AP_ARG_INTS, {len(v)}, {t.ints(v)})"
        if k is ConstKind.FLOATS:
            return f"AP_A_LIST(AP_ARG_DOUBLES, {len(v)}, {t.array('double', [_cpp_float(x) for x in v])})"
        if k is ConstKind.BOOLS:
            return f"AP_A_LIST(AP_ARG_BOOLS, {len(v)}, {t.array('bool', ['true' if x else 'false' for x in v])})"
        if k is ConstKind.DTYPE:
            return f"AP_A_DTYPE({v})"
        if k is ConstKind.MEMORY_FORMAT:
            return f"AP_A_MEMORY_FORMAT({v})"
        if k is ConstKind.WRAPPED_INT:
            return f"AP_A_WRAPPED_INT({_cpp_int(v)})"
        if k is ConstKind.WRAPPED_FLOAT:
            return f"AP_A_WRAPPED_DOUBLE({_cpp_float(v)})"
        if k is ConstKind.WRAPPED_BOOL:
            return f"AP_A_WRAPPED_BOOL({int(v)})"
        raise AssertionError(f"unhandled constant kind {k}")  # pragma: no cover

    def tensor_arg(self, a: Arg) -> str:
        if a.tensor is not None:
            return f"AP_A_TENSOR({self.ref(a.tensor)})"
        refs = self.tables.array("ap_ref", [NIL if v is None else self.ref(v) for v in a.tensors])
        kind = "AP_ARG_OPTIONAL_TENSORS" if a.optional_list else "AP_ARG_TENSORS"
        return f"AP_A_LIST({kind}, {len(a.tensors)}, {refs})"

    def arg_static(self, a: Arg) -> bool:
        if a.const is not None:
            return True
        return all(self.is_static(v) for v in a.values())

    def op_table(self) -> list[dict]:
        ops = []
        for op in self.plan.ops:
            args = [self.const(a.const) if a.const is not None else "AP_A_NONE" for a in op.template]
            ops.append({"name": _cpp_string(op.qualified), "overload": _cpp_string(op.overload),
                        "nargs": len(args), "args": self.tables.array("ap_arg", args)})
        return ops

    def tensor_specs(self, named: tuple) -> list[str]:
        return [f"{{{_cpp_string(name)}, AP_{SCALAR_TYPES[v.dtype]}, {len(v.shape)}, {self.tables.ints(v.shape)}, "
                f"{self.tables.ints(v.stride)}}}" for name, v in named]

    def returns(self) -> list[str]:
        return [f"AP_IN({o.input_index})" if o.input_index >= 0 else self.ref(o.val) for o in self.plan.outputs]

    # instructions ---------------------------------------------------------------------------
    def layout_insn(self, code: str, dtype: str, shape, stride, comment: str, **fields) -> _Insn:
        """An instruction about a tensor of ``dtype`` and layout ``shape``/``stride``."""
        return _Insn(code, _comment(comment), {"a": f"AP_{SCALAR_TYPES[dtype]}", "ndim": len(shape),
                                               "shape": self.tables.ints(shape),
                                               "stride": self.tables.ints(stride), **fields})

    def run_program(self) -> list[_Insn]:
        run = self.emit(self.plan.actions, [])
        for m in self.plan.mutations:
            run.append(_Insn("AP_COPY", f"mutation of input {m.name}",
                             {"dst": f"AP_IN({m.input_index})", "src": self.ref(m.val)}))
        return run

    def alloc_fresh(self, b: Buf, out: list) -> None:
        if not self.plan.memory.in_arena(b.id):
            out.append(self.layout_insn("AP_EMPTY", b.dtype, b.shape, b.stride, b.label, dst=self.buf_ref[b.id]))
        elif not self.static_buf(b):  # its place in the arena, at this call's sizes
            out.append(self.arena_insn(b))

    def emit(self, actions, out: list[_Insn]) -> list[_Insn]:
        for act in actions:
            if isinstance(act, AtenAction):
                self.emit_aten(act, out)
            elif isinstance(act, FusedAction):
                self.emit_fused(act, out)
            elif isinstance(act, RelayoutAction):
                self.alloc_fresh(act.dst, out)
                out.append(_Insn("AP_RELAYOUT", _comment(act.dst.label),
                                 {"dst": self.buf_ref[act.dst.id], "src": self.ref(act.src)}))
            elif isinstance(act, CheckAction):
                out.append(self.layout_insn("AP_EXPECT", act.src.dtype, act.shape, act.stride,
                                            f"{act.dst.label}", dst=self.ref(act.dst), src=self.ref(act.src)))
            elif isinstance(act, CondAction):
                self.emit_cond(act, out)
            elif isinstance(act, PackAction):  # a GEMM's constant B, packed once at load
                self.init.append(_Insn("AP_PACK_B", f"pack B of kernel {act.kernel_index} (at load)",
                                       {"a": act.kernel_index, "dst": self.ref(act.dst), "src": self.ref(act.src),
                                        "nbytes": act.nbytes}))
        return out

    def emit_cond(self, act: CondAction, out: list) -> None:
        # `out` is the whole run list, so jump targets are absolute instruction indices
        if isinstance(act.pred, bool):
            branch = _Insn("AP_BRANCH", "if (constant)", {"a": int(act.pred)})
        else:
            branch = _Insn("AP_BRANCH", "if", {"a": -1, "src": self.ref(act.pred)})
        out.append(branch)
        self.emit(act.then_actions, out)
        out.extend(_Insn("AP_MOVE", "", {"dst": self.ref(o), "src": self.ref(v)})
                   for o, v in zip(act.outs, act.then_outs))
        jump = _Insn("AP_JUMP", "end if")
        out.append(jump)
        branch.fields["b"] = len(out)
        branch.comment += f" (else: {len(out)})"
        self.emit(act.else_actions, out)
        out.extend(_Insn("AP_MOVE", "", {"dst": self.ref(o), "src": self.ref(v)})
                   for o, v in zip(act.outs, act.else_outs))
        jump.fields["b"] = len(out)

    def emit_aten(self, act: AtenAction, out: list) -> None:
        static_call = act.mode is CallMode.VIEW and all(self.arg_static(a) for a in act.args) and \
            all(o is None or self.is_static(o) for o in act.outs) and \
            not any(a.const is not None and any_symbolic(a.const.value) for a in act.args)
        if act.mode is CallMode.LOAD:  # a tactic's derived weight: made once, from tensors that never change
            if not all(self.arg_static(a) for a in act.args):
                raise RenderError(f"{act.label}: a derived weight reads a value that changes per call")
            static_call = True
        # tensors that never change go into the argument template once, at load
        for i, a in enumerate(act.args):
            if a.const is None and self.arg_static(a):
                args = self.tables.array("ap_dyn_arg", [f"{{{i}, {self.tensor_arg(a)}}}"])
                self.init.append(_Insn("AP_SET_ARG", "", {"a": act.op_index, "b": i, "nargs": 1, "args": args}))
        target = self.init if static_call else out
        if not static_call:
            for b in act.out_bufs:
                self.alloc_fresh(b, out)
        dyn = [f"{{{i}, {self.tensor_arg(a)}}}" for i, a in enumerate(act.args)
               if a.const is None and not self.arg_static(a)]
        fields = {"a": act.op_index}
        if act.list_return:
            fields["b"] = 1
        if dyn:
            fields.update(nargs=len(dyn), args=self.tables.array("ap_dyn_arg", dyn))
        if act.mode is not CallMode.OUT and act.outs:
            refs = [NIL if o is None else self.ref(o) for o in act.outs]
            fields.update(nrefs=len(refs), refs=self.tables.array("ap_ref", refs))
        insn = _Insn("AP_CALL", _comment(act.label), fields)
        if target is self.init:
            self.init.append(insn)
        else:
            out.append(insn)

    def emit_fused(self, act: FusedAction, out: list) -> None:
        for b in act.outs:
            self.alloc_fresh(b, out)
        if act.workspace is not None:
            self.alloc_fresh(act.workspace, out)
        refs = [self.ref(v) for v in act.ins] + [self.buf_ref[b.id] for b in act.outs]
        fields = {"a": act.kernel_index, "b": len(act.ins),
                  "src": self.buf_ref[act.workspace.id] if act.workspace is not None else NIL,
                  "nrefs": len(refs), "refs": self.tables.array("ap_ref", refs)}
        dims = self.plan.kernels[act.kernel_index].dims
        if dims:  # a jit kernel: the sizes of the dims it takes (docs/DESIGN.md §3.5)
            fields.update(ndim=len(dims), shape=self.tables.ints([dim_symbol(d) for d in dims]))
        out.append(_Insn("AP_LAUNCH", _comment(act.label), fields))

