"""Render one candidate of a fused kernel as an AscendC Vector kernel (templates/kernel/npu/).

The kernel follows the documented AscendC style: an ``extern "C" __global__ __aicore__`` entry
taking ``GM_ADDR``s, a kernel class with a ``TPipe``, one ``VECIN`` and one ``VECOUT`` ``TQue``
of ``BUFFER_NUM`` buffers (double buffering when 2), ``CopyIn -> Compute -> CopyOut`` per tile,
``TBuf`` work buffers, ``GetBlockIdx()`` over ``block_dim`` cores, tails through
``DataCopyPad``. The tiling (``mode``, ``block_dim``, ``tile``, ``buffer_num``) is compiled in.

Two modes split the ``rows x cols`` of :mod:`ascendc_pack.backends.npu.layout` over the cores:

* ``row``   - each core takes a contiguous range of rows. A row whose inner range fits one tile
              is *resident*: loaded once, every reduction stage runs on the same UB data.
              Otherwise each stage streams the row's tiles again (reductions accumulate in a
              tile-long vector accumulator, reduced with ``ReduceSum``/``ReduceMax`` at the end).
* ``split`` - every core takes a segment of every row's inner range; partial reductions go to a
              GM workspace (``rows x reductions x block_dim`` floats) and ``SyncAll()`` separates
              the stages, after which each core combines the partials it needs.

:func:`plan_kernel` turns (layout, mode, resident) into a :class:`KernelPlan` - the C++ of every
function plus what it needs from the Unified Buffer - independent of the tile length
(``TILE`` is a constant of the source); :func:`render` writes the source of one candidate.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from ascendc_pack.kernels.fused.codegen import template_env
from ascendc_pack.backends.npu.layout import NpuLayout
from ascendc_pack.backends.npu.api import DEFAULT_CANN, scalar_compare
from ascendc_pack.backends.npu.emit import SCALAR_COMPARE
from ascendc_pack.backends.npu.planner import GM_TYPE, REDUCE_IDENTITY, ROW_SLOT, Function, Planner
from ascendc_pack.backends.npu.sync import insert_barriers

TEMPLATES = ("kernel/npu/vector.cpp.j2", "kernel/npu/emu_host.cpp.j2")


def _generator_version() -> str:
    """Changes whenever the templates or the generator change (part of the cache key)."""
    env = template_env()
    h = hashlib.sha256()
    for name in TEMPLATES:
        h.update(env.loader.get_source(env, name)[0].encode())
    here = Path(__file__).parent
    for module in ("codegen.py", "planner.py", "emit.py", "layout.py", "sync.py"):
        h.update((here / module).read_bytes())
    return "npu-vector-v1-" + h.hexdigest()[:16]


@dataclass
class KernelPlan:
    """The C++ of one kernel for a mode (tile length symbolic) and what it needs from the UB:
    ``in_esize``/``out_esize`` bytes per tile element of the VECIN/VECOUT buffers, float work
    slots and accumulators of TILE elements, 64-float row slots."""

    layout: NpuLayout
    mode: str
    resident: bool
    functions: list[Function]
    process: list[str]
    scalars: list[str]
    work_slots: int
    acc_slots: int
    row_slots: int
    in_esize: int
    out_esize: int
    uses: dict
    n_reductions: int

    @property
    def consts(self) -> list[str]:
        return [c for c in ("ones", "pinf", "ninf") if self.uses[c]]

    @property
    def masks(self) -> int:
        return self.uses["mask"]


def _topo_row_ops(planner: Planner, keep) -> list[int]:
    return [nid for nid in sorted(planner.row_needed) if keep(planner.lay.stage[nid])]


def _plan_row(p: Planner) -> list[str]:
    """Row mode: ``Row(r)`` runs every stage of one row; cores take ranges of rows."""
    lay = p.lay
    body: list[str] = []
    row_loads = [nid for nid, a in lay.loads.items() if a.kind == "row" and lay.consumers[nid]]
    for nid in row_loads:
        p._row_load(body, nid)
    p._extract(body, row_loads)
    if p.resident:
        if p._tile_functions("R", None, "r"):
            body += ["CopyInR(r, 0, 0, COLS);", "ComputeR(COLS);", "CopyOutR(r, 0, 0, COLS);"]
    else:
        for s in range(lay.n_stages):
            ops = _topo_row_ops(p, lambda st, s=s: st == s)
            for nid in ops:
                p._row_op(body, nid)
            p._extract(body, ops)
            reds, _ = p._tile_targets(s)
            if not p._tile_functions(str(s), s, "r"):
                continue
            for k, r in enumerate(reds):
                body.append(f"Duplicate(acc_[{k} * TILE], {REDUCE_IDENTITY[p.nodes[r].op]}, TILE);")
            body += _tile_loop(s, "0", "INNER")
            for k, r in enumerate(reds):
                p._reduce(body, r, f"acc_[{k} * TILE]", "ACC_COUNT", p._new_row_slot(r), final=True)
            p._extract(body, reds)
    if not p.resident:  # row ops after the last reduction stage that only row stores need
        pass
    for j in p.row_stores:
        p._row_store(body, j)
    p.functions.append(Function("void Row(int64_t r)", body))
    return ["for (int64_t r = rowBegin_; r < rowEnd_; ++r) {", "  Row(r);", "}"]


def _plan_split(p: Planner) -> list[str]:
    """Split mode: ``Stage<s>(r)`` per stage over all rows, partials through the workspace."""
    lay = p.lay
    process: list[str] = []
    row_loads = [nid for nid, a in lay.loads.items() if a.kind == "row" and lay.consumers[nid]]
    last = lay.n_stages - 1
    for s in range(lay.n_stages):
        body: list[str] = []
        p.row_slot = {}  # every stage recomputes its row values (in the same slots)
        p.row_free = list(range(p.n_row_slots - 1, -1, -1))
        for nid in row_loads:
            p._row_load(body, nid)
        known = list(row_loads)
        for k, r in enumerate(p.reds):
            if lay.stage[r] <= s:
                body += ["{", "  LocalTensor<uint8_t> t = smallQ_.AllocTensor<uint8_t>();",
                         f"  DataCopyPad(t.ReinterpretCast<float>(), wsGm_[(r * NRED + {k}) * BLOCK_DIM], "
                         "DataCopyExtParams{1, BLOCK_DIM * 4, 0, 0, 0}, DataCopyPadExtParams<float>{false, 0, 0, 0});",
                         "  smallQ_.EnQue(t);", "  t = smallQ_.DeQue<uint8_t>();"]
                p._reduce(body, r, "t.ReinterpretCast<float>()", "BLOCK_DIM", p._new_row_slot(r), final=True)
                body += ["  smallQ_.FreeTensor(t);", "}"]
                known.append(r)
        ops = _topo_row_ops(p, lambda st, s=s: st <= s)
        for nid in ops:
            p._row_op(body, nid)
        p._extract(body, known + ops)
        reds, _ = p._tile_targets(s)
        if p._tile_functions(str(s), s, "r"):
            for k, r in enumerate(reds):
                body.append(f"Duplicate(acc_[{k} * TILE], {REDUCE_IDENTITY[p.nodes[r].op]}, TILE);")
            body += _tile_loop(s, "segBegin_", "segEnd_")
        for k, r in enumerate(reds):
            part = f"rowv_[{p._take_row() * ROW_SLOT}]"
            p._reduce(body, r, f"acc_[{k} * TILE]", "ACC_COUNT", part, final=False)
            body += ["{", "  LocalTensor<uint8_t> t = outQ_.AllocTensor<uint8_t>();",
                     f"  DataCopy(t.ReinterpretCast<float>(), {part}, 8);", "  outQ_.EnQue(t);",
                     "  t = outQ_.DeQue<uint8_t>();",
                     f"  DataCopyPad(wsGm_[(r * NRED + {p.reds.index(r)}) * BLOCK_DIM + block_], "
                     "t.ReinterpretCast<float>(), DataCopyExtParams{1, 4, 0, 0, 0});",
                     "  outQ_.FreeTensor(t);", "}"]
        if s == last and p.row_stores:
            body.append("if (block_ == 0) {")
            for j in p.row_stores:
                p._row_store(body, j)
            body.append("}")
        p.functions.append(Function(f"void Stage{s}(int64_t r)", body))
        process += ["for (int64_t r = 0; r < ROWS; ++r) {", f"  Stage{s}(r);", "}"]
        if s < last:
            process.append("SyncAll();")
    return process


def _tile_loop(stage: int, begin: str, end: str) -> list[str]:
    """Tiles of [begin, end) of the inner range; a tile never crosses a subrow."""
    return [f"for (int64_t i = {begin}; i < {end};) {{",
            "  const int64_t sub = i / COLS, c0 = i % COLS;",
            f"  int64_t left = {end} - i < COLS - c0 ? {end} - i : COLS - c0;",
            "  const uint32_t n = static_cast<uint32_t>(left < TILE ? left : TILE);",
            f"  CopyIn{stage}(r, sub, c0, n);", f"  Compute{stage}(n);", f"  CopyOut{stage}(r, sub, c0, n);",
            "  i += n;", "}"]


def _plan_col(p: Planner) -> list[str]:
    """Col mode: ``Col(r, c0, n)`` runs every stage of one column tile of one row; each stage
    accumulates over the subrows (the reduced axes) in vector accumulators."""
    lay = p.lay
    body: list[str] = []
    for nid, a in lay.loads.items():
        if a.kind == "row" and lay.consumers[nid]:
            p._row_load(body, nid)
    for s in range(lay.n_stages):
        for nid in _topo_row_ops(p, lambda st, s=s: st == s):
            p._row_op(body, nid)
        reds, _ = p._tile_targets(s)
        if not p._tile_functions(str(s), s, "r"):
            continue
        for k, r in enumerate(reds):
            body.append(f"Duplicate(acc_[{k} * TILE], {REDUCE_IDENTITY[p.nodes[r].op]}, n);")
        body += ["for (int64_t sub = 0; sub < SUBROWS; ++sub) {", f"  CopyIn{s}(r, sub, c0, n);", f"  Compute{s}(n);",
                 f"  CopyOut{s}(r, sub, c0, n);", "}"]
        for k, r in enumerate(reds):
            p._reduce(body, r, f"acc_[{k} * TILE]", "n", p._new_row_slot(r), final=True)
    body.insert(0, "const uint32_t np = Pad64(n);")
    for j in p.row_stores:
        p._row_store(body, j)
    p.functions.append(Function("void Col(int64_t r, int64_t c0, uint32_t n)", body))
    return ["const int64_t tiles = (COLS + TILE - 1) / TILE;",
            "const int64_t per = (ROWS * tiles + BLOCK_DIM - 1) / BLOCK_DIM;",
            "const int64_t end = (block_ + 1) * per < ROWS * tiles ? (block_ + 1) * per : ROWS * tiles;",
            "for (int64_t it = block_ * per; it < end; ++it) {",
            "  const int64_t r = it / tiles, c0 = (it % tiles) * TILE;",
            "  Col(r, c0, static_cast<uint32_t>(COLS - c0 < TILE ? COLS - c0 : TILE));", "}"]


def plan_kernel(layout: NpuLayout, mode: str, resident: bool) -> KernelPlan:
    """The C++ of a kernel for ``mode`` ("row" or "split"); ``resident`` (row mode): every row's
    inner range fits one tile."""
    p = Planner(layout, mode, resident and mode == "row" and layout.subrows == 1)
    if layout.col != (mode == "col"):
        raise ValueError(f"mode {mode!r} does not fit a {'col' if layout.col else 'row'} layout")
    process = {"row": _plan_row, "split": _plan_split, "col": _plan_col}[mode](p)
    scalars = sorted(set(p.scalar_of.values()), key=lambda s: int(s[1:-1]))
    functions = [Function(f.signature, insert_barriers(f.body)) for f in p.functions]
    return KernelPlan(layout=layout, mode=mode, resident=p.resident, functions=functions, process=process,
                      scalars=scalars, work_slots=p.work_slots, acc_slots=p.acc_slots,
                      row_slots=max(p.n_row_slots, 1), in_esize=p.in_esize, out_esize=p.out_esize,
                      uses={**p.em.uses, "guard": p.guard}, n_reductions=len(p.reds))


def _r32(n: int) -> int:
    return (n + 31) // 32 * 32


def red_work_floats(tile: int) -> int:
    """Floats of the ReduceMax/ReduceSum sharedTmpBuffer for counts up to ``tile`` (the
    reference's formula: ceil(2 x repeats / 8) x 8 for ReduceMax without index)."""
    repeats = -(-max(tile, 64) // 64)
    return max(8, -(-2 * repeats // 8) * 8)


def buffers(plan: KernelPlan, tile: int, buffer_num: int, block_dim: int) -> list[dict]:
    """Every InitBuffer of the kernel: name, kind (``que``/``buf``), position, num and bytes."""
    out = []

    def add(name, kind, pos, num, nbytes):
        if nbytes > 0 and num > 0:
            out.append({"name": name, "kind": kind, "pos": pos, "num": num, "bytes": int(nbytes)})
    add("inQ_", "que", "VECIN", buffer_num, tile * plan.in_esize)
    add("outQ_", "que", "VECOUT", buffer_num, max(32, tile * plan.out_esize))
    lay = plan.layout
    needs_small = any(a.kind == "row" for a in lay.loads.values()) or (plan.mode == "split" and plan.n_reductions)
    add("smallQ_", "que", "VECIN", 1 if needs_small else 0, max(256, _r32(4 * block_dim)))
    add("workBuf_", "buf", "VECCALC", 1, 4 * tile * plan.work_slots)
    add("accBuf_", "buf", "VECCALC", 1, 4 * tile * plan.acc_slots)
    add("constBuf_", "buf", "VECCALC", 1, 4 * tile * len(plan.consts))
    add("halfBuf_", "buf", "VECCALC", 1 if plan.uses["half"] else 0, 2 * tile)
    add("maskBuf_", "buf", "VECCALC", 1, plan.masks * _r32(max(32, tile // 8)))
    add("guardBuf_", "buf", "VECCALC", 1 if plan.uses["guard"] else 0, 4 * tile)
    add("redBuf_", "buf", "VECCALC", 1, 4 * red_work_floats(tile))
    add("rowBuf_", "buf", "VECCALC", 1, 4 * (tile if plan.mode == "col" else ROW_SLOT) * plan.row_slots)
    add("rowTmpBuf_", "buf", "VECCALC", 1, 4 * ROW_SLOT)
    return out


def ub_bytes(plan: KernelPlan, tile: int, buffer_num: int, block_dim: int) -> int:
    """Unified Buffer bytes the kernel's InitBuffer calls take (each rounded up to 32 B, as
    TPipe::InitBuffer does)."""
    return sum(b["num"] * _r32(b["bytes"]) for b in buffers(plan, tile, buffer_num, block_dim))


def gm_span(shape, stride) -> int:
    """Elements from a tensor's first to its last addressed element (0 for an empty tensor)."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride))


def render(plan: KernelPlan, *, tile: int, buffer_num: int, block_dim: int, kernel_key: str, tiling_repr: str,
           workspace: int, soc: str, emulate: bool, isa: str, cann: str = DEFAULT_CANN) -> str:
    """The complete source of one candidate for CANN release ``cann`` (the emulation host shim
    appended when ``emulate``): the scalar comparison gets the release's name, a kernel with
    ``SyncAll`` is typed ``KERNEL_TYPE_MIX_AIV_1_0``."""
    lay = plan.layout
    spec = lay.spec
    seg = -(-lay.inner // block_dim)
    seg = -(-seg // 64) * 64
    ctx = {
        "name": spec.name, "kernel_key": kernel_key, "tiling_repr": tiling_repr, "workspace": workspace,
        "block_dim": block_dim, "soc": soc, "isa": isa, "mode": plan.mode, "tile": tile,
        "buffer_num": buffer_num, "rows": lay.rows, "cols": lay.cols, "inner": lay.inner,
        "rows_per_core": -(-lay.rows // block_dim), "seg": seg,
        "acc_count": min(tile, lay.cols), "nred": max(plan.n_reductions, 1),
        "inputs": [{"type": GM_TYPE.get(i.dtype, "uint8_t"), "span": gm_span(i.shape, i.stride),
                    "esize": _esize(i.dtype)} for i in spec.inputs],
        "outputs": [{"type": GM_TYPE[o.dtype], "numel": _numel(o.shape), "esize": _esize(o.dtype)}
                    for o in spec.outputs],
        "buffers": buffers(plan, tile, buffer_num, block_dim), "consts": plan.consts, "masks": plan.masks,
        "uses": plan.uses, "functions": plan.functions, "process": plan.process, "scalars": plan.scalars,
        "ws_floats": lay.rows * plan.n_reductions * block_dim if plan.mode == "split" else 0,
        "red_work": red_work_floats(tile), "mask_stride": _r32(max(32, tile // 8)),
        "cann": cann, "mix": any("SyncAll()" in line for line in plan.process),
    }
    env = template_env()
    text = env.get_template(TEMPLATES[0]).render(**ctx).replace(SCALAR_COMPARE, scalar_compare(cann))
    if emulate:
        text += env.get_template(TEMPLATES[1]).render(**ctx)
    return text


def _esize(dtype: str) -> int:
    return {"float32": 4, "float16": 2, "bfloat16": 2, "bool": 1, "int32": 4}.get(dtype, 1)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


TEMPLATE_VERSION = _generator_version()
