"""The kernel planner of the npu generator: a spec's C++ member functions, UB slots and scalars.

:class:`Planner` walks a :class:`~ascendc_pack.backends.npu.layout.NpuLayout` in node order and writes the
kernel class's member functions (:class:`Function`): ``CopyIn``/``Compute``/``CopyOut`` of each
tile pass, with the values of one tile in *work slots* (TILE floats each, reused once a value is
dead; an identity aliases its operand), row values in *row slots* (64 floats; vectors over the
column tile in a col layout), the row values tile ops read as scalars (``SetFlag<V_S>`` +
``GetValue``), reductions as vector accumulators and ``Reduce*``. :mod:`ascendc_pack.backends.npu.codegen`
assembles the functions of a mode and renders the source.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ascendc_pack.ir.fusion import ConstNode, LoadNode, NodeKind, ReduceNode
from ascendc_pack.backends.npu.emit import ROUND16_TYPE, OpEmitter, Operand, Scope, flit
from ascendc_pack.backends.npu.layout import NpuLayout

GM_TYPE = {"float32": "float", "float16": "half", "bfloat16": "bfloat16_t", "bool": "uint8_t", "int32": "int32_t"}
ROW_SLOT = 64          # floats per row slot: one 256-byte repeat (Compare works on whole repeats)
REDUCE_IDENTITY = {"sum": "0.0f", "mean": "0.0f", "amax": "(-AP_INF)", "amin": "AP_INF", "any": "0.0f",
                   "all": "1.0f"}
REDUCE_VEC = {"sum": "Add", "mean": "Add", "amax": "Max", "amin": "Min", "any": "Max", "all": "Min"}
REDUCE_FINAL = {"sum": "ReduceSum", "mean": "ReduceSum", "amax": "ReduceMax", "amin": "ReduceMin",
                "any": "ReduceMax", "all": "ReduceMin"}


@dataclass
class Function:
    """One member function of the kernel class."""

    signature: str
    body: list[str]


class _Slots:
    """Work slots of one tile scope; ``users`` lets an identity alias its operand's slot."""

    def __init__(self):
        self.free: list[int] = []
        self.count = 0
        self.users: dict[int, set] = {}

    def take(self) -> int:
        if self.free:
            return self.free.pop()
        self.count += 1
        return self.count - 1

    def give(self, k: int) -> None:
        self.free.append(k)
        self.free.sort(reverse=True)


@dataclass
class _TileState:
    sc: Scope
    slots: _Slots
    value: dict = field(default_factory=dict)      # node id -> tensor expr
    slot_of: dict = field(default_factory=dict)    # node id -> work slot (absent: an input view)
    remaining: dict = field(default_factory=dict)  # node id -> uses left in this scope
    in_off: dict = field(default_factory=dict)     # load node id -> offset in the VECIN buffer (x TILE bytes)
    out_off: dict = field(default_factory=dict)    # output index -> offset in the VECOUT buffer (x TILE bytes)


def _work(k: int) -> str:
    return f"work_[{k} * TILE]"


def _slot_index(expr: str) -> int:
    return int(expr[len("work_["):].split(" ")[0])


class Planner:
    """Builds a :class:`KernelPlan` (see the module docstring)."""

    def __init__(self, layout: NpuLayout, mode: str, resident: bool):
        self.lay = layout
        self.spec = layout.spec
        self.nodes = layout.spec.nodes
        self.mode = mode
        self.resident = resident
        self.em = OpEmitter(layout.spec, self._operand)
        self.row_slot: dict[int, int] = {}
        self.row_free: list[int] = []
        self.n_row_slots = 0
        self.scalar_of: dict[int, str] = {}
        tile = layout.tile_nodes
        self.tile_consumed = {n.id for n in self.nodes if n.id not in tile and n.kind is not NodeKind.CONST
                              and any(c in tile for c in layout.consumers[n.id])}
        self.tile_stores = [j for j, a in enumerate(layout.stores) if a.kind == "tile"]
        self.row_stores = [j for j, a in enumerate(layout.stores) if a.kind == "row"]
        for j in self.tile_stores:  # a row value stored over whole tiles is read as a scalar too
            src = self._store_source(j)
            if src not in tile and self.nodes[src].kind is not NodeKind.CONST:
                self.tile_consumed.add(src)
        self.row_needed = self._row_needed()
        self.reds = [r.id for r in layout.reductions]
        self.work_slots = 0
        self.guard = not layout.col and any(self.nodes[r].op in ("amax", "amin") for r in self.reds)
        self.acc_slots = 0
        self.in_esize = 0
        self.out_esize = 0
        self.functions: list[Function] = []
        self._tile: _TileState | None = None

    # --------------------------------------------------------------------------- operands
    def _operand(self, sc: Scope, nid: int) -> Operand:
        n = self.nodes[nid]
        if isinstance(n, ConstNode):
            return Operand("S", flit(1.0 if n.value is True else (0.0 if n.value is False else n.number)))
        if sc.kind == "row":
            return Operand("V", self._row_expr(nid))
        if nid in self.lay.tile_nodes:
            return Operand("V", self._tile.value[nid])
        if self.lay.col:  # a col layout's row values are vectors over the column tile
            return Operand("V", self._row_expr(nid))
        return Operand("S", self.scalar_of[nid])

    def _slot_expr(self, k: int) -> str:
        return f"rowv_[{k} * TILE]" if self.lay.col else f"rowv_[{k * ROW_SLOT}]"

    def _row_expr(self, nid: int) -> str:
        return self._slot_expr(self.row_slot[nid])

    def _new_row_slot(self, nid: int) -> str:
        if nid not in self.row_slot:
            self.row_slot[nid] = self._take_row()
        return self._row_expr(nid)

    def _take_row(self) -> int:
        if self.row_free:
            return self.row_free.pop()
        self.n_row_slots += 1
        return self.n_row_slots - 1

    def _row_scope(self, lines: list[str]) -> Scope:
        col = self.lay.col

        def give(expr):
            index = expr[len("rowv_["):-1]
            self.row_free.append(int(index.split(" ")[0]) if col else int(index) // ROW_SLOT)
        return Scope("row", "n" if col else "1", "np" if col else str(ROW_SLOT), lines=lines,
                     take_temp=lambda: self._slot_expr(self._take_row()), give_temp=give)

    def _tile_scope(self, lines: list[str]) -> _TileState:
        st = _TileState(Scope("tile", "n", "np", lines=lines), _Slots())
        st.sc.take_temp = lambda: _work(st.slots.take())
        st.sc.give_temp = lambda e: st.slots.give(_slot_index(e))
        return st

    def _store_source(self, j: int) -> int:
        """The node whose value output j stores (an int32 output stores its cast's operand)."""
        o = self.spec.outputs[j]
        return self.nodes[o.node].args[0] if o.dtype == "int32" else o.node

    def _row_needed(self) -> set[int]:
        """Row-level op nodes some tile op, row store or needed row node uses."""
        tile = self.lay.tile_nodes
        need = set(self.tile_consumed) | {self._store_source(j) for j in self.row_stores}
        stack = list(need)
        while stack:
            nid = stack.pop()
            for a in self.nodes[nid].args:
                if a not in tile and a not in need:
                    need.add(a)
                    stack.append(a)
        return {n for n in need if self.nodes[n].kind is NodeKind.OP}

    # --------------------------------------------------------------------------- row code
    def _row_op(self, lines: list[str], nid: int) -> None:
        sc = self._row_scope(lines)
        dst = self._new_row_slot(nid)
        out = self.em.emit(sc, nid, dst)
        if out != dst:  # a Vector copy: UB->UB DataCopy VECCALC->VECCALC is not a documented path
            sc.emit(f"Muls({dst}, {out}, 1.0f, 8);")

    def _row_load(self, lines: list[str], nid: int) -> None:
        acc = self.lay.loads[nid]
        dst = self._new_row_slot(nid)
        t = GM_TYPE[acc.dtype]
        if acc.along:  # col layout: the column tile of a value invariant over the reduced axes
            self.in_esize = max(self.in_esize, acc.esize)
            lines += ["{", "  LocalTensor<uint8_t> t = inQ_.AllocTensor<uint8_t>();",
                      f"  DataCopyPad(t.ReinterpretCast<{t}>(), in{acc.index}Gm_[{_offset(acc)} + c0], "
                      f"DataCopyExtParams{{1, n * {acc.esize}, 0, 0, 0}}, DataCopyPadExtParams<{t}>{{false, 0, 0, 0}});",
                      "  inQ_.EnQue(t);", "  t = inQ_.DeQue<uint8_t>();",
                      "  " + self._to_float(acc.dtype, dst, "t", "n"), "  inQ_.FreeTensor(t);", "}"]
            return
        if self.lay.col:  # one element per row, spread over the column tile
            final, dst = dst, "rowTmp_"
        lines += ["{", "  LocalTensor<uint8_t> t = smallQ_.AllocTensor<uint8_t>();",
                  f"  DataCopyPad(t.ReinterpretCast<{t}>(), in{acc.index}Gm_[{_offset(acc)}], "
                  f"DataCopyExtParams{{1, {acc.esize}, 0, 0, 0}}, DataCopyPadExtParams<{t}>{{false, 0, 0, 0}});",
                  "  smallQ_.EnQue(t);", "  t = smallQ_.DeQue<uint8_t>();",
                  "  " + self._to_float(acc.dtype, dst, "t", "1"), "  smallQ_.FreeTensor(t);", "}"]
        if self.lay.col:
            lines += ["SyncVS();", f"Duplicate({final}, rowTmp_.GetValue(0), n);"]

    def _to_float(self, dtype: str, dst: str, src: str, count: str) -> str:
        """Convert a GM-typed UB view (``src``, a uint8 tensor) to float ``dst``."""
        if dtype == "float32":
            return f"DataCopy({dst}, {src}.ReinterpretCast<float>(), {'8' if count == '1' else 'Pad64(' + count + ')'});"
        if dtype == "bool":
            self.em.uses["half"] = True
            return (f"Cast(half_, {src}, RoundMode::CAST_NONE, {count}); "
                    f"Cast({dst}, half_, RoundMode::CAST_NONE, {count});")
        return f"Cast({dst}, {src}.ReinterpretCast<{GM_TYPE[dtype]}>(), RoundMode::CAST_NONE, {count});"

    def _from_float(self, dtype: str, view: str, v: str, count: str, pad: str) -> str:
        """Convert float ``v`` into a GM-typed UB view (``view``, a uint8 tensor)."""
        if dtype == "float32":  # UB->UB DataCopy only VECCALC -> VECOUT; from a VECIN view: a Vector copy
            if v.startswith("inT"):
                return f"Muls({view}.ReinterpretCast<float>(), {v}, 1.0f, {pad});"
            return f"DataCopy({view}.ReinterpretCast<float>(), {v}, {pad});"
        if dtype == "bool":
            self.em.uses["half"] = True
            return f"Cast(half_, {v}, RoundMode::CAST_RINT, {count}); Cast({view}, half_, RoundMode::CAST_NONE, {count});"
        if dtype == "int32":
            return f"Cast({view}.ReinterpretCast<int32_t>(), {v}, RoundMode::CAST_TRUNC, {count});"
        return f"Cast({view}.ReinterpretCast<{GM_TYPE[dtype]}>(), {v}, RoundMode::CAST_RINT, {count});"

    def _extract(self, lines: list[str], nids: list[int]) -> None:
        """Read the row values tile ops use as scalars (after the Vector unit wrote them)."""
        want = [n for n in nids if n in self.tile_consumed]
        if not want or self.lay.col:
            return
        lines.append("SyncVS();")  # the scalar unit waits for the Vector unit (V_S, an event from the TPipe)
        for nid in want:
            self.scalar_of[nid] = f"s{nid}_"
            lines.append(f"s{nid}_ = rowv_.GetValue({self.row_slot[nid] * ROW_SLOT});")

    def _reduce(self, lines: list[str], rid: int, src: str, count: str, dst: str, final: bool) -> None:
        """``dst`` (a row slot) = reduction ``rid`` over ``count`` elements of ``src``; ``final``
        False for a core's partial (a mean stays a sum until the partials are combined)."""
        r = self.nodes[rid]
        if self.lay.col:  # the accumulator already holds one result per column
            if r.op == "mean":
                lines += [f"Duplicate({dst}, {flit(float(r.count))}, n);", f"Div({dst}, {src}, {dst}, n);"]
            else:
                lines.append(f"Muls({dst}, {src}, 1.0f, n);")
            if r.dtype in ROUND16_TYPE and r.op in ("sum", "mean"):
                self.em.round16(self._row_scope(lines), dst, r.dtype)
            return
        lines.append(f"{REDUCE_FINAL[r.op]}({dst}, {src}, redWork_, {count});")
        if r.op in ("amax", "amin"):  # Reduce{Max,Min} may skip NaN; torch propagates it
            self.em.mask(0)
            lines.append(f"NanGuard({dst}, {src}, {count});")
        if final and r.op == "mean":
            lines += [f"Duplicate(rowTmp_, {flit(float(r.count))}, 1);", f"Div({dst}, {dst}, rowTmp_, 1);"]
        if final and r.dtype in ROUND16_TYPE and r.op in ("sum", "mean"):
            self.em.round16(self._row_scope(lines), dst, r.dtype)

    def _row_store(self, lines: list[str], j: int) -> None:
        acc = self.lay.stores[j]
        src = self._store_source(j)
        n = self.nodes[src]
        if self.lay.col:  # the column tile of an output invariant over the reduced axes
            self.out_esize = max(self.out_esize, acc.esize)
            value = self._slot_expr(self._take_row()) if isinstance(n, ConstNode) else self._row_expr(src)
            if isinstance(n, ConstNode):
                lines.append(f"Duplicate({value}, {self._operand(self._row_scope(lines), src).expr}, n);")
            lines += ["{", "  LocalTensor<uint8_t> t = outQ_.AllocTensor<uint8_t>();",
                      "  " + self._from_float(acc.dtype, "t", value, "n", "Pad64(n)"),
                      "  outQ_.EnQue(t);", "  t = outQ_.DeQue<uint8_t>();",
                      f"  DataCopyPad(out{j}Gm_[{_offset(acc)} + c0], t.ReinterpretCast<{GM_TYPE[acc.dtype]}>(), "
                      f"DataCopyExtParams{{1, n * {acc.esize}, 0, 0, 0}});", "  outQ_.FreeTensor(t);", "}"]
            return
        if isinstance(n, ConstNode):
            value = "rowTmp_"
            lines.append(f"Duplicate(rowTmp_, {self._operand(self._row_scope(lines), src).expr}, 1);")
        else:
            value = self._row_expr(src)
        lines += ["{", "  LocalTensor<uint8_t> t = outQ_.AllocTensor<uint8_t>();",
                  "  " + self._from_float(acc.dtype, "t", value, "1", "8"),
                  "  outQ_.EnQue(t);", "  t = outQ_.DeQue<uint8_t>();",
                  f"  DataCopyPad(out{j}Gm_[{_offset(acc)}], t.ReinterpretCast<{GM_TYPE[acc.dtype]}>(), "
                  f"DataCopyExtParams{{1, {acc.esize}, 0, 0, 0}});", "  outQ_.FreeTensor(t);", "}"]

    # --------------------------------------------------------------------------- tile code
    def _tile_targets(self, stage: int | None) -> tuple[list[int], list[int]]:
        """(reductions fed, tile outputs stored) by the tile pass of ``stage`` (None: all)."""
        st = self.lay.stage
        if stage is None:
            return list(self.reds), list(self.tile_stores)
        return ([r for r in self.reds if st[r] == stage + 1],
                [j for j in self.tile_stores if st[self._store_source(j)] == stage])

    def _compute(self, stage: int | None, lines: list[str]) -> tuple[list[int], list[int]]:
        """The body of Compute: tile nodes of ``stage`` (None: resident, every stage with its
        reductions and row ops inline). Returns (tile loads read, outputs stored)."""
        lay = self.lay
        tile = lay.tile_nodes
        reds, stores = self._tile_targets(stage)
        need, stack = set(), [self.nodes[r].args[0] for r in reds] + [self._store_source(j) for j in stores]
        while stack:
            nid = stack.pop()
            if nid in tile and nid not in need:
                need.add(nid)
                stack.extend(self.nodes[nid].args)
        order = sorted(need)
        if stage is None:
            order = sorted(need | set(reds) | self.row_needed)
        st = self._tile_scope(lines)
        self._tile = st
        for nid in order:
            n = self.nodes[nid]
            if nid in tile or isinstance(n, ReduceNode):
                for a in n.args:
                    st.remaining[a] = st.remaining.get(a, 0) + 1
        if stage is not None:
            for r in reds:
                a = self.nodes[r].args[0]
                st.remaining[a] = st.remaining.get(a, 0) + 1
        for j in stores:
            s = self._store_source(j)
            st.remaining[s] = st.remaining.get(s, 0) + 1
        loads = [nid for nid in order if isinstance(self.nodes[nid], LoadNode)]
        off = 0
        for nid in loads:
            st.in_off[nid] = off
            off += lay.loads[nid].esize
        self.in_esize = max(self.in_esize, off)
        off = 0
        for j in stores:
            st.out_off[j] = off
            off += lay.stores[j].esize
        self.out_esize = max(self.out_esize, off)
        if stage is not None:
            self.acc_slots = max(self.acc_slots, len(reds))
        stored: set[int] = set()
        for nid in order:
            n = self.nodes[nid]
            if isinstance(n, ReduceNode):  # resident: the whole row is in this tile
                src, tmp = self._reduce_source(st, nid)
                self._reduce(lines, nid, src, "n", self._new_row_slot(nid), final=True)
                if tmp:
                    st.sc.give(tmp)
                self._use(st, n.args[0])
                self._extract(lines, [nid])
                continue
            if nid not in tile:  # resident: a row op between stages
                self._row_op(lines, nid)
                self._extract(lines, [nid])
                continue
            self._tile_node(st, nid)
            for k, r in enumerate(reds):
                if stage is not None and self.nodes[r].args[0] == nid:
                    src, tmp = self._reduce_source(st, r)
                    lines.append(f"{REDUCE_VEC[self.nodes[r].op]}(acc_[{k} * TILE], acc_[{k} * TILE], {src}, n);")
                    if tmp:
                        st.sc.give(tmp)
                    self._use(st, nid)
            for j in stores:
                if j not in stored and self._store_source(j) == nid:
                    self._store_tile(st, j)
                    stored.add(j)
        for j in stores:  # row values and constants stored over the whole tile
            if j not in stored:
                self._store_tile(st, j)
        self.work_slots = max(self.work_slots, st.slots.count)
        self._tile = None
        self._last_in_off, self._last_out_off = st.in_off, st.out_off
        return loads, stores

    def _reduce_source(self, st: _TileState, rid: int) -> tuple[str, str | None]:
        """The tensor reduction ``rid`` reduces: any/all of a non-bool value reduce ``x != 0``
        (0.0/1.0, in a temp returned second for the caller to give back)."""
        r = self.nodes[rid]
        v = st.value[r.args[0]]
        if r.op not in ("any", "all") or self.nodes[r.args[0]].dtype == "bool":
            return v, None
        tmp = st.sc.temp()
        self.em.to_bool(st.sc, tmp, Operand("V", v), [])
        return tmp, tmp

    def _use(self, st: _TileState, nid: int) -> None:
        if nid in st.remaining:
            st.remaining[nid] -= 1
            if st.remaining[nid] == 0:
                self._release(st, nid)

    def _release(self, st: _TileState, nid: int) -> None:
        k = st.slot_of.get(nid)
        if k is None or any(st.remaining.get(u, 0) > 0 for u in st.slots.users[k]):
            return
        for u in st.slots.users.pop(k):
            st.slot_of.pop(u, None)
        st.slots.give(k)

    def _tile_node(self, st: _TileState, nid: int) -> None:
        n = self.nodes[nid]
        if isinstance(n, LoadNode):
            acc = self.lay.loads[nid]
            view = f"inT[{st.in_off[nid]} * TILE]"
            if acc.dtype == "float32":
                st.value[nid] = f"{view}.ReinterpretCast<float>()"
                return
            k = st.slots.take()
            st.slots.users[k] = {nid}
            st.slot_of[nid] = k
            st.value[nid] = _work(k)
            st.sc.emit(self._to_float(acc.dtype, _work(k), view, "n"))
            return
        # destination: the slot of an operand used for the last time here, else a fresh one
        dst_slot = next((st.slot_of[a] for a in n.args if a in st.slot_of and st.remaining.get(a) == 1
                         and len(st.slots.users[st.slot_of[a]]) == 1), None)
        fresh = dst_slot is None
        if fresh:
            dst_slot = st.slots.take()
        dst = _work(dst_slot)
        out = self.em.emit(st.sc, nid, dst)
        for a in n.args:
            if a in st.remaining:
                st.remaining[a] -= 1
        if out != dst:  # an identity: alias the operand's tensor
            if fresh:
                st.slots.give(dst_slot)
            st.value[nid] = out
            src = next(a for a in n.args if st.value.get(a) == out)
            if src in st.slot_of:
                st.slot_of[nid] = st.slot_of[src]
                st.slots.users[st.slot_of[src]].add(nid)
        else:
            if not fresh:
                for u in st.slots.users.pop(dst_slot):
                    st.slot_of.pop(u, None)
            st.value[nid] = dst
            st.slots.users[dst_slot] = {nid}
            st.slot_of[nid] = dst_slot
        for a in set(n.args):
            if st.remaining.get(a) == 0:
                self._release(st, a)

    def _store_tile(self, st: _TileState, j: int) -> None:
        """Convert output j's value into its part of the VECOUT buffer."""
        sc = st.sc
        src = self._store_source(j)
        view = f"outT[{st.out_off[j]} * TILE]"
        tmp = None
        if src in self.lay.tile_nodes:
            value = st.value[src]
        else:  # a row value or a constant, the same over the tile
            tmp = value = sc.temp()
            sc.emit(f"Duplicate({tmp}, {self._operand(sc, src).expr}, n);")
        sc.emit(self._from_float(self.spec.outputs[j].dtype, view, value, "n", "np"))
        if tmp is not None:
            sc.give(tmp)
        self._use(st, src)

    def _tile_functions(self, name: str, stage: int | None, row_arg: str) -> bool:
        """Add CopyIn/Compute/CopyOut for a tile pass; False when the pass has nothing to do."""
        body: list[str] = []
        loads, stores = self._compute(stage, body)
        if not loads and not stores and not any(line.strip() for line in body):
            return False
        copy_in = [] if not loads else ["LocalTensor<uint8_t> inT = inQ_.AllocTensor<uint8_t>();"]
        for nid in loads:
            acc = self.lay.loads[nid]
            t = GM_TYPE[acc.dtype]
            copy_in.append(f"DataCopyPad(inT[{self._last_in_off[nid]} * TILE].ReinterpretCast<{t}>(), "
                           f"in{acc.index}Gm_[{_tile_offset(acc)}], "
                           f"DataCopyExtParams{{1, n * {acc.esize}, 0, 0, 0}}, DataCopyPadExtParams<{t}>{{false, 0, 0, 0}});")
        if loads:
            copy_in.append("inQ_.EnQue(inT);")
        compute = ["const uint32_t np = Pad64(n);"]
        if loads:
            compute.append("LocalTensor<uint8_t> inT = inQ_.DeQue<uint8_t>();")
        if stores:
            compute.append("LocalTensor<uint8_t> outT = outQ_.AllocTensor<uint8_t>();")
        compute += body
        if stores:
            compute.append("outQ_.EnQue(outT);")
        if loads:
            compute.append("inQ_.FreeTensor(inT);")
        copy_out = ["LocalTensor<uint8_t> outT = outQ_.DeQue<uint8_t>();"] if stores else []
        for j in stores:
            acc = self.lay.stores[j]
            t = GM_TYPE[acc.dtype]
            copy_out.append(f"DataCopyPad(out{j}Gm_[{_tile_offset(acc)}], outT[{self._last_out_off[j]} * TILE]"
                            f".ReinterpretCast<{t}>(), DataCopyExtParams{{1, n * {acc.esize}, 0, 0, 0}});")
        if stores:
            copy_out.append("outQ_.FreeTensor(outT);")
        sig = f"(int64_t {row_arg}, int64_t sub, int64_t c0, uint32_t n)"
        self.functions += [Function(f"void CopyIn{name}{sig}", copy_in),
                           Function(f"void Compute{name}(uint32_t n)", compute),
                           Function(f"void CopyOut{name}{sig}", copy_out)]
        return True


def _tile_offset(acc) -> str:
    """C++ of the GM element index of a tile access at row ``r``, subrow ``sub``, column ``c0``."""
    sub = _offset(acc, "sub", acc.sub_terms, with_base=False)
    return f"{_offset(acc)} + {sub} + c0" if sub != "0" else f"{_offset(acc)} + c0"


def _offset(acc, r: str = "r", terms_of=None, with_base: bool = True) -> str:
    """C++ of the GM element index of ``acc`` at row ``r`` (subrow 0, column 0)."""
    terms = [str(acc.offset)] if acc.offset and with_base else []
    for div, mod, stride in (acc.row_terms if terms_of is None else terms_of):
        idx = r if div == 1 else f"({r} / {div})"
        if mod:
            idx = f"({idx} % {mod})"
        terms.append(idx if stride == 1 else f"{idx} * {stride}")
    return " + ".join(terms) or "0"


# ------------------------------------------------------------------------------- whole kernels
