"""Fuse: group pointwise ops, reductions, views and casts of a Program into fused kernels.

Every fusible step starts as its own group; groups are merged along producer/consumer edges
when the merged group is still *one iteration space* and still convex in the step graph:

* the iteration space is a list of axes found by unifying the dims of every value in the
  group (broadcasting, reductions and dim-preserving views tie dims together); axes reduced by
  the group's reductions are the reduce axes, and every reduction must reduce exactly them;
* a group's outputs must vary over every kept axis, so a store is never repeated;
* convex: no path leaves the group and re-enters it through a step outside it.

Views of kernel inputs become strided loads (strides computed by torch on meta tensors); views
of intermediates that only permute, insert or drop unit dims become dim maps. Anything else
stays an ATen step. The result is a Program whose ``FusedStep.kernel`` holds the kernel spec
(:class:`ascendc_pack.ir.fusion.KernelSpec`, built by :mod:`ascendc_pack.passes.lower`).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ascendc_pack_runtime.tensor_meta import contiguous_strides

from ascendc_pack.ir.fusion import Analysis, Internal, Load, Operand
from ascendc_pack.ir.symbolic import order_key
from ascendc_pack.passes.lower import build_spec, output_layout
from ascendc_pack.ir.ops import ATEN_POINTWISE, ATEN_REDUCTIONS, SUPPORTED_DTYPES, VIEW_OPS, reduce_dims, reduce_keepdim
from ascendc_pack.ir.program import AtenStep, CondStep, FusedStep, ModelProgram, Program, Step

MAX_GROUP_STEPS = 96


class NotFusible(Exception):
    """Raised inside analysis when a set of steps cannot form one kernel."""


# --- classification --------------------------------------------------------------------------

def _first_ref(step: AtenStep) -> str | None:
    names = step.input_names()
    return names[0] if names else None


def is_view(step: Step) -> bool:
    return isinstance(step, AtenStep) and step.op in VIEW_OPS and not step.multi


def is_fusible(step: Step, values) -> bool:
    """Can this step be computed inside a fused kernel?"""
    if not isinstance(step, AtenStep) or step.multi:
        return False
    if step.op not in ATEN_POINTWISE and step.op not in ATEN_REDUCTIONS:
        return False
    out = values.get(step.outputs[0])
    if out is None or out.dtype not in SUPPORTED_DTYPES or out.numel == 0:
        return False
    for name in step.input_names():
        spec = values.get(name)
        if spec is None or spec.dtype not in SUPPORTED_DTYPES or spec.numel == 0:
            return False
    if step.op in ATEN_REDUCTIONS:
        src = values[_first_ref(step)]
        if len(src.shape) == 0:
            return False
        if step.kwargs.get("dtype") is not None and "float" not in str(step.kwargs["dtype"]) \
                and "int64" not in str(step.kwargs["dtype"]):
            return False
    if step.op in ("aten._to_copy.default",):
        allowed = {"dtype", "layout", "device", "pin_memory", "memory_format"}
        if set(step.kwargs) - allowed:
            return False
        dev = step.kwargs.get("device")
        if dev is not None and torch.device(dev).type != "cpu":
            return False
    if step.op in ("aten.div.Tensor_mode", "aten.div.Scalar_mode", "aten.fmod.Tensor", "aten.fmod.Scalar"):
        # integer division / remainder: C's semantics differ and a zero divisor must raise
        if out.dtype not in ("float32", "float64", "float16", "bfloat16"):
            return False
    if step.op in ("aten.clamp.Tensor",):
        return False
    return True


# --- resolving operands through views ----------------------------------------------------------

class Graph:
    """Producer/consumer index over one Program's steps."""

    def __init__(self, program: Program):
        self.program = program
        self.steps = program.steps
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = {}
        for i, s in enumerate(self.steps):
            for o in s.outputs:
                if o is not None:
                    self.producer[o] = i
            for name in set(s.input_names()):
                self.consumers.setdefault(name, []).append(i)
        self.outputs = set(program.outputs)


def _apply_view_meta(step: AtenStep, shape, strides, offset):
    """Apply a view op to a (shape, strides, offset) layout using torch on the meta device."""
    base = torch.empty_strided((max(offset, 0) + 1 + sum((s - 1) * st for s, st in zip(shape, strides)),),
                               (1,), device="meta")
    t = base.as_strided(shape, strides, offset)
    from ascendc_pack.frontend.executor import resolve_op

    args = [t] + [a for a in step.args[1:]]
    out = resolve_op(step.op)(*args, **step.kwargs)
    return tuple(out.shape), tuple(out.stride()), out.storage_offset()


def _view_dim_map(step: AtenStep, src_shape, out_shape):
    """For views of intermediates: map each output dim to a source dim (None: unit/broadcast).

    Returns None when the view mixes data across dims (a real reshape, slice or select).
    """
    kind = VIEW_OPS[step.op]
    if kind == "alias":
        return list(range(len(out_shape)))
    if kind == "permute":
        if step.op == "aten.t.default":
            perm = [1, 0] if len(src_shape) == 2 else list(range(len(src_shape)))
        elif step.op == "aten.transpose.int":
            d0, d1 = (d % len(src_shape) for d in step.args[1:3])
            perm = list(range(len(src_shape)))
            perm[d0], perm[d1] = perm[d1], perm[d0]
        else:
            perm = [d % len(src_shape) for d in step.args[1]]
        return perm
    if kind == "expand":
        lead = len(out_shape) - len(src_shape)
        m = []
        for j, size in enumerate(out_shape):
            i = j - lead
            m.append(i if i >= 0 and src_shape[i] == size else None)
        return m
    if kind in ("reshape", "unsqueeze", "squeeze"):
        src_non1 = [i for i, s in enumerate(src_shape) if s != 1]
        out_non1 = [j for j, s in enumerate(out_shape) if s != 1]
        if [src_shape[i] for i in src_non1] != [out_shape[j] for j in out_non1]:
            return None
        m = [None] * len(out_shape)
        for i, j in zip(src_non1, out_non1):
            m[j] = i
        return m
    return None  # slice / select of an intermediate: materialize instead


# --- analysis of a candidate group ------------------------------------------------------------

class _UnionFind:
    def __init__(self):
        self.parent: dict = {}
        self.size: dict = {}

    def add(self, item, size):
        if item not in self.parent:
            self.parent[item] = item
            self.size[item] = size
        elif self.size[self.find(item)] != size:
            raise NotFusible(f"size mismatch at {item}")

    def find(self, item):
        root = item
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[item] != root:
            self.parent[item], item = root, self.parent[item]
        return root

    def union(self, a, b):
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        if self.size[ra] != self.size[rb]:
            raise NotFusible(f"axes of size {self.size[ra]} and {self.size[rb]} meet")
        self.parent[rb] = ra


class Fuser:
    """Groups the fusible steps of one Program (not its cond branches)."""

    def __init__(self, program: Program, fused_values: set[str]):
        self.g = Graph(program)
        self.values = program.values
        self.fused_values = fused_values  # values produced by fused kernels (lower.output_layout)
        self.fusible = [is_fusible(s, self.values) for s in self.g.steps]
        for i, ok in enumerate(self.fusible):
            if ok:
                fused_values.add(self.g.steps[i].outputs[0])
        self.group_of: dict[int, int] = {}
        self.groups: dict[int, list[int]] = {}
        self.analyses: dict[int, Analysis] = {}

    # operands ---------------------------------------------------------------------------------
    def _layout(self, name) -> tuple[tuple, tuple, int]:
        spec = self.values[name]
        if spec.stride is None:
            return tuple(spec.shape), tuple(contiguous_strides(spec.shape)), 0
        if name in self.fused_values:
            return tuple(spec.shape), output_layout(spec), 0
        return tuple(spec.shape), tuple(spec.stride), 0

    def resolve(self, name: str, members: set[int], views: list[int]) -> Operand:
        """Trace an operand through views to an internal value or a strided load."""
        idx = self.g.producer.get(name)
        if idx is not None and idx in members:
            return Internal(name, tuple(range(len(self.values[name].shape))))
        if idx is not None and is_view(self.g.steps[idx]):
            step = self.g.steps[idx]
            src = _first_ref(step)
            inner = self.resolve(src, members, views)
            if isinstance(inner, Internal):
                m = _view_dim_map(step, self.values[src].shape, self.values[name].shape)
                if m is None:
                    raise NotFusible(f"view {name} of an intermediate is not a dim map")
                views.append(idx)
                return Internal(inner.value, tuple(None if i is None else inner.dim_map[i] for i in m))
            try:
                shape, strides, offset = _apply_view_meta(step, inner.shape, inner.strides, inner.offset)
            except Exception:
                return Load(name, *self._layout(name))
            views.append(idx)
            return Load(inner.base, shape, strides, offset, inner.views + (name,))
        return Load(name, *self._layout(name))

    # analysis ---------------------------------------------------------------------------------
    def analyze(self, members: list[int]) -> Analysis:
        mset = set(members)
        uf = _UnionFind()
        operands, view_steps = {}, []
        reduce_items: list[set] = []
        kept_items: list = []
        value_dims: dict[str, list] = {}
        value_orders: list[list] = []

        def item_of(op, dim):
            if isinstance(op, Internal):
                src = op.dim_map[dim]
                return None if src is None else ("v", op.value, src)
            # identical loads of one input share their dims (so a row read by two passes is one axis)
            return ("l", op.layout_key, dim)

        for i in members:
            step = self.g.steps[i]
            out = step.outputs[0]
            oshape = self.values[out].shape
            for d, size in enumerate(oshape):
                if size != 1:
                    uf.add(("v", out, d), size)
            refs = step.input_names()
            if step.op in ("aten.full_like.default", "aten.zeros_like.default", "aten.ones_like.default"):
                refs = []  # only the shape of the argument matters
            ops_resolved = []
            for pos, ref in enumerate(refs):
                op = self.resolve(ref, mset, view_steps)
                operands[(i, pos)] = op
                ops_resolved.append(op)
                shape = op.shape if isinstance(op, Load) else self.values[ref].shape
                for d, size in enumerate(shape):
                    it = item_of(op, d)
                    if it is not None and size != 1:
                        uf.add(it, size)
            if step.op in ATEN_REDUCTIONS:
                src_ref = refs[0]
                op = ops_resolved[0]
                sshape = op.shape if isinstance(op, Load) else self.values[src_ref].shape
                rdims = reduce_dims(step, len(sshape))
                keep = reduce_keepdim(step)
                red = set()
                j = 0
                for d, size in enumerate(sshape):
                    it = item_of(op, d)
                    if d in rdims:
                        if it is not None and size != 1:
                            red.add(it)
                        if keep:
                            j += 1
                        continue
                    if it is not None and size != 1:
                        uf.union(("v", out, j), it)
                        kept_items.append(it)
                    j += 1
                reduce_items.append(red)
            else:
                for pos, op in enumerate(ops_resolved):
                    shape = op.shape if isinstance(op, Load) else self.values[refs[pos]].shape
                    lead = len(oshape) - len(shape)
                    if lead < 0:
                        raise NotFusible("operand has more dims than the result")
                    for d, size in enumerate(shape):
                        it = item_of(op, d)
                        if it is not None and size != 1:
                            if oshape[d + lead] != size:
                                raise NotFusible("broadcast mismatch")
                            uf.union(("v", out, d + lead), it)
        # axes
        roots = {}
        for it in list(uf.parent):
            r = uf.find(it)
            if r not in roots:
                roots[r] = len(roots)
        axis_of = {it: roots[uf.find(it)] for it in uf.parent}
        sizes = [0] * len(roots)
        for r, a in roots.items():
            sizes[a] = uf.size[r]
        reduce_sets = [frozenset(axis_of[it] for it in red) for red in reduce_items]
        reduced_kept = {axis_of[it] for it in kept_items}
        if reduce_sets and any(s != reduce_sets[0] for s in reduce_sets):
            raise NotFusible("reductions over different axes")
        raxes = set(reduce_sets[0]) if reduce_sets else set()
        if reduce_sets and not raxes:
            raise NotFusible("reduction over unit dims only")
        if reduce_sets:
            # the iteration space must be the reductions' input space: an extra axis would make
            # every reduction run once per index of it
            red_space = {axis_of[it] for it in reduce_items[0]} | set(reduced_kept)
            if set(range(len(sizes))) - red_space:
                raise NotFusible("an axis outside the reduction's input space")
        for i in members:
            out = self.g.steps[i].outputs[0]
            dims = [axis_of.get(("v", out, d)) for d in range(len(self.values[out].shape))]
            present = [a for a in dims if a is not None]
            if len(set(present)) != len(present):
                raise NotFusible("two dims of one value on one axis")
            value_dims[out] = dims
            value_orders.append(_memory_order(dims, output_layout(self.values[out])))
        # ordering of axes: follow the memory order of the largest value, reduce axes last
        load_orders = []
        for op in operands.values():
            if isinstance(op, Load):
                dims = [(op.strides[d], axis_of[("l", op.layout_key, d)])
                        for d in range(len(op.shape)) if ("l", op.layout_key, d) in axis_of]
                load_orders.append([a for _, a in sorted(dims, key=lambda sa: -order_key(sa[0]))])
        order = _axis_order(value_orders, sizes, raxes, load_orders)
        remap = {a: k for k, a in enumerate(order)}
        sizes = [sizes[a] for a in order]
        raxes = {remap[a] for a in raxes}
        value_dims = {v: [None if a is None else remap[a] for a in dims] for v, dims in value_dims.items()}
        # loads: attach axes per dim
        for pos, op in operands.items():
            if isinstance(op, Load):
                axes = tuple(None if axis_of.get(("l", op.layout_key, d)) is None
                             else remap[axis_of[("l", op.layout_key, d)]] for d in range(len(op.shape)))
                present = [a for a in axes if a is not None]
                if len(set(present)) != len(present):
                    raise NotFusible("two dims of one load on one axis")
                operands[pos] = replace(op, axes=axes)
        # outputs
        outputs = []
        kept = set(range(len(sizes))) - raxes
        for i in members:
            out = self.g.steps[i].outputs[0]
            if self._used_outside(out, mset, set(view_steps)):
                axes = {a for a in value_dims[out] if a is not None}
                if not kept <= axes:
                    raise NotFusible(f"output {out} does not cover every kept axis")
                if axes & raxes and not raxes <= axes:
                    raise NotFusible(f"output {out} covers part of the reduce axes")
                outputs.append(out)
        return Analysis(members=sorted(members), axis_sizes=sizes, reduce_axes=frozenset(raxes),
                        value_axes=value_dims, operands=operands, outputs=outputs,
                        view_steps=sorted(set(view_steps)))

    def _used_outside(self, value: str, members: set[int], views: set[int]) -> bool:
        if value in self.g.outputs:
            return True
        for c in self.g.consumers.get(value, []):
            if c in members:
                continue
            if is_view(self.g.steps[c]) and c in views:
                # a folded view: what matters is who reads the view
                if self._used_outside(self.g.steps[c].outputs[0], members, views):
                    return True
                continue
            return True
        return False

    # convexity ---------------------------------------------------------------------------------
    def _convex(self, members: set[int]) -> bool:
        """No path from the group back into it through a step outside it (views transparent).

        Steps are in execution order (a consumer comes after its producers), so such a path
        only visits steps before the group's last member: the search stops there."""
        stack, seen = [], set()
        last = max(members)
        for i in members:
            for c in self.g.consumers.get(self.g.steps[i].outputs[0], []):
                if c not in members and c < last:
                    stack.append((c, False))
        while stack:
            c, tainted = stack.pop()
            tainted = tainted or not is_view(self.g.steps[c])
            if (c, tainted) in seen:
                continue
            seen.add((c, tainted))
            for o in self.g.steps[c].outputs:
                for d in self.g.consumers.get(o, []) if o else []:
                    if d in members:
                        if tainted:
                            return False
                        continue
                    if d < last:
                        stack.append((d, tainted))
        return True

    # grouping ----------------------------------------------------------------------------------
    def try_merge(self, a: int, b: int) -> bool:
        if a == b:
            return True
        members = sorted(set(self.groups[a]) | set(self.groups[b]))
        if len(members) > MAX_GROUP_STEPS or not self._convex(set(members)):
            return False
        try:
            analysis = self.analyze(members)
        except NotFusible:
            return False
        keep, drop = min(a, b), max(a, b)
        self.groups[keep] = members
        del self.groups[drop]
        self.analyses.pop(drop, None)
        self.analyses[keep] = analysis
        for m in members:
            self.group_of[m] = keep
        return True

    def _producer_groups(self, i: int) -> list[int]:
        out = []
        for name in self.g.steps[i].input_names():
            seen = set()
            while True:
                p = self.g.producer.get(name)
                if p is None or p in seen:
                    break
                seen.add(p)
                if self.fusible[p]:
                    out.append(self.group_of[p])
                    break
                if is_view(self.g.steps[p]):
                    name = _first_ref(self.g.steps[p])
                    continue
                break
        return list(dict.fromkeys(out))

    def run(self) -> dict[int, Analysis]:
        for i, ok in enumerate(self.fusible):
            if not ok:
                continue
            try:
                analysis = self.analyze([i])
            except NotFusible:
                self.fusible[i] = False
                self.fused_values.discard(self.g.steps[i].outputs[0])
                continue
            self.group_of[i] = i
            self.groups[i] = [i]
            self.analyses[i] = analysis
            for p in self._producer_groups(i):
                self.try_merge(p, self.group_of[i])
        # siblings that read the same inputs (e.g. two reductions of one row) fuse too
        for gid in sorted(self.groups):
            if gid not in self.groups:
                continue
            for other in sorted(self.groups):
                if other > gid and other in self.groups and gid in self.groups and self._share_input(gid, other):
                    self.try_merge(gid, other)
        return {gid: self.analyses[gid] for gid in sorted(self.groups)}

    def _share_input(self, a: int, b: int) -> bool:
        ins = lambda gid: {op.base for op in self.analyses[gid].operands.values() if isinstance(op, Load)}
        return bool(ins(a) & ins(b))


def _memory_order(dims: list, layout) -> list:
    """A value's axes (``dims[d]``: the axis of dim d, None for none) outermost first in its layout."""
    return [a for _, _, a in sorted((-order_key(st), d, a) for d, (a, st) in enumerate(zip(dims, layout)))]


def _axis_order(value_orders, sizes, raxes, load_orders=()) -> list[int]:
    """Axes in the memory order of the value spanning the most axes (a load's memory order when
    a load spans more, e.g. under a full reduction); kept axes first."""
    seqs = [[a for a in dims if a is not None] for dims in value_orders]
    best = max(seqs, key=len, default=[])
    for seq in load_orders:
        if len(seq) > len(best):
            best = seq
    order = list(best)
    for seq in seqs + list(load_orders):
        for a in seq:
            if a not in order:
                order.append(a)
    order += [a for a in range(len(sizes)) if a not in order]
    return [a for a in order if a not in raxes] + [a for a in order if a in raxes]


# --- building the fused Program ---------------------------------------------------------------

def fuse_program(program: Program, fused_values: set[str] | None = None) -> Program:
    """Return a new Program with fusible steps grouped into FusedSteps (branches included)."""
    fused_values = set() if fused_values is None else fused_values
    fuser = Fuser(program, fused_values)
    analyses = fuser.run()
    g = fuser.g
    folded_views: set[int] = set()
    fused_steps: dict[int, FusedStep] = {}
    for gid, an in analyses.items():
        step = _make_fused_step(fuser, an)
        fused_steps[gid] = step
        folded_views.update(an.view_steps)
    # keep a view step when anything outside the groups reads it
    member_of = {m: gid for gid, an in analyses.items() for m in an.members}
    needed_views = set()
    for v in folded_views:
        out = g.steps[v].outputs[0]
        if out in g.outputs or any(c not in member_of and c not in folded_views for c in g.consumers.get(out, [])):
            needed_views.add(v)
    changed = True
    while changed:  # views feeding kept views are kept too
        changed = False
        for v in list(needed_views):
            p = g.producer.get(_first_ref(g.steps[v]))
            if p is not None and p in folded_views and p not in needed_views:
                needed_views.add(p)
                changed = True
    new_steps: list[Step] = []
    for i, s in enumerate(g.steps):
        if i in member_of:
            gid = member_of[i]
            if i == analyses[gid].members[0]:
                new_steps.append(fused_steps[gid])
            continue
        if i in folded_views and i not in needed_views:
            continue
        if isinstance(s, CondStep):
            s = CondStep(pred=s.pred, then_branch=fuse_program(s.then_branch, fused_values),
                         else_branch=fuse_program(s.else_branch, fused_values),
                         operands=s.operands, outputs=s.outputs)
        new_steps.append(s)
    return Program(inputs=program.inputs, steps=_toposort(new_steps, program.inputs),
                   outputs=program.outputs, values=program.values)


def _make_fused_step(fuser: Fuser, an: Analysis) -> FusedStep:
    g = fuser.g
    inputs: list[str] = []
    for key in sorted(an.operands):
        op = an.operands[key]
        if isinstance(op, Load) and op.base not in inputs:
            inputs.append(op.base)
    ref_steps = sorted(set(an.members) | set(an.view_steps))
    layouts = {n: fuser._layout(n)[1] for n in inputs}
    # named after the computation alone: every step computing the same shares the kernel
    spec = build_spec(an, [g.steps[i] for i in an.members], inputs, fuser.values, layouts).named()
    return FusedStep(name=spec.name, inputs=inputs, outputs=list(an.outputs),
                     steps=[g.steps[i] for i in ref_steps], kernel=spec)


def _toposort(steps: list[Step], inputs: list[str]) -> list[Step]:
    """Stable topological order (original order wherever dependencies allow)."""
    produced_by = {}
    for k, s in enumerate(steps):
        for o in s.outputs:
            if o is not None:
                produced_by[o] = k
    deps = [{produced_by[n] for n in s.input_names() if n in produced_by and produced_by[n] != k}
            for k, s in enumerate(steps)]
    done, order = set(), []
    remaining = list(range(len(steps)))
    while remaining:
        for k in remaining:
            if deps[k] <= done:
                order.append(k)
                done.add(k)
                remaining.remove(k)
                break
        else:
            raise RuntimeError("fusion produced a cycle; this is a bug in the fuser")
    return [steps[k] for k in order]


def fuse(model: ModelProgram) -> ModelProgram:
    """Fuse a captured model's Program (stage 2 of the pipeline)."""
    return replace(model, program=fuse_program(model.program))


__all__ = ["fuse", "fuse_program", "is_fusible", "Fuser", "Analysis"]
