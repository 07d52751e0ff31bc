"""npu kernels under the AscendC rules: the cost model keeps every candidate inside them, and a
generated kernel forced outside them is caught by the emulation (never a silent wrong result).

The emulation (docs/ASCENDC_EMU.md) aborts a launch with the rule's name when a kernel exceeds
the Unified Buffer, uses a UB operand that is not 32-byte aligned, or calls SyncAll with more
blocks than the SoC's vector cores; these tests render real generated kernels with tilings the
cost model would never propose and assert on the emulator's message.
"""

from __future__ import annotations

import torch

from ascendc_pack.frontend.capture import capture
from ascendc_pack.passes.fuse import fuse
from ascendc_pack.kernels.fused.build import FusedKernel
from ascendc_pack.backends.npu.codegen import render, ub_bytes
from ascendc_pack.backends.npu.layout import Unsupported, analyze, unsupported_reason
from ascendc_pack.backends.npu.tiling import SOCS, plan_for, propose
from ascendc_pack_runtime.kernels import KernelLibrary
from tests.kernel_check import Fn
from tests.npu_check import compile_sources, last_error, target

SOC = SOCS["Ascend910B2"]


def _spec(fn, *inputs):
    fused = fuse(capture(Fn(fn), inputs).model)
    (step,) = fused.program.fused_steps()
    return step


def _launch(step, params, cache, workspace=0):
    plan = plan_for(step.kernel, params)
    src = render(plan, tile=params["tile"], buffer_num=params["buf"], block_dim=params["bd"], kernel_key="k",
                 tiling_repr="forced", workspace=workspace, soc=SOC.name, emulate=True, isa="")
    (so,) = compile_sources([src], cache)
    assert not isinstance(so, str), so
    kernel = FusedKernel(step.kernel, KernelLibrary(so))
    try:
        kernel([torch.randn(i.shape) for i in step.kernel.inputs])
    except RuntimeError:
        return last_error(so)
    return ""


SOFTMAX = (lambda x: torch.softmax(x, -1), torch.randn(8, 20000))


def test_proposed_tilings_respect_ub_and_alignment():
    step = _spec(*SOFTMAX)
    tilings = propose(step.kernel, target(), 10)
    assert len(tilings) == 10
    for t in tilings:
        p = t.params
        assert p["tile"] % 64 == 0  # 256-byte repeats: every UB operand 32-byte aligned
        assert ub_bytes(plan_for(step.kernel, p), p["tile"], p["buf"], p["bd"]) <= SOC.ub_usable
        assert p["bd"] <= SOC.vector_cores
    assert [t.est_us for t in tilings] == sorted(t.est_us for t in tilings)


def test_core_limit_caps_block_dim():
    step = _spec(*SOFTMAX)
    assert max(t.params["bd"] for t in propose(step.kernel, target(cores=6), 10)) <= 6


def test_ub_overflow_is_caught(tmp_path):
    step = _spec(*SOFTMAX)
    plan = plan_for(step.kernel, {"mode": "row", "resident": False})
    tile = 16384  # streaming softmax: loads, accumulators and work slots of 16k floats: > 188 KiB
    assert ub_bytes(plan, tile, 2, 4) > SOC.ub_usable
    msg = _launch(step, {"mode": "row", "resident": False, "tile": tile, "buf": 2, "bd": 4}, tmp_path)
    assert "rule 'Unified Buffer capacity' violated" in msg, msg


def test_misaligned_tile_is_caught(tmp_path):
    # two float32 tile loads share the VECIN buffer: with a 60-element tile the second starts
    # 240 bytes in, not on a 32-byte boundary
    step = _spec(lambda x, y: x * y + x, torch.randn(4, 500), torch.randn(4, 500))
    msg = _launch(step, {"mode": "row", "resident": False, "tile": 60, "buf": 2, "bd": 2}, tmp_path)
    assert "32-byte alignment" in msg, msg


def test_split_beyond_vector_cores_is_caught(tmp_path):
    step = _spec(lambda x: x - x.amax(-1, keepdim=True), torch.randn(2, 30000))
    lay = analyze(step.kernel)
    bd = SOC.vector_cores + 8  # SyncAll needs every block resident at once
    msg = _launch(step, {"mode": "split", "resident": False, "tile": 512, "buf": 2, "bd": bd}, tmp_path,
                  workspace=lay.rows * len(lay.reductions) * bd * 4)
    assert "SyncAll needs block_dim <= vector cores" in msg, msg


def test_unsupported_names_the_reason():
    # (a transposed input alone is stored in its own memory order, contiguous runs: supported)
    step = _spec(lambda x, y: y + x.t() * 2, torch.randn(40, 33), torch.randn(33, 40))
    reason = unsupported_reason(step.kernel)
    assert reason.startswith("unsupported: ") and "stride" in reason
    try:
        propose(step.kernel, target(), 4)
    except Unsupported as exc:
        assert str(exc) == reason
    else:
        raise AssertionError("propose accepted a kernel the generator cannot express")


def test_barriers_go_exactly_where_vector_instructions_depend():
    """sync.py: a barrier before a vector instruction that reads or overwrites what one since the
    last barrier wrote (or overwrites what one read); none between independent ones; state reset
    at every block boundary, member call and scalar sync."""
    from ascendc_pack.backends.npu.sync import BARRIER, insert_barriers

    body = insert_barriers([
        "Exp(work_[0 * TILE], inT[0 * TILE].ReinterpretCast<float>(), n);",   # first: after the caller's work
        "Abs(work_[1 * TILE], inT[4 * TILE].ReinterpretCast<float>(), n);",   # independent slot
        "Mul(work_[2 * TILE], work_[0 * TILE], work_[1 * TILE], n);",        # reads both: barrier
        "Adds(work_[0 * TILE], inT[0 * TILE].ReinterpretCast<float>(), 1.0f, n);",  # overwrites a read: barrier
        "SyncVS();",
        "Muls(work_[3 * TILE], work_[2 * TILE], 2.0f, n);",                  # after the V->S drain: none
        "Cast(half_, rowv_[0], RoundMode::CAST_RINT, 1); Cast(outT[0 * TILE], half_, RoundMode::CAST_NONE, 1);",
    ])
    barriers = [i for i, line in enumerate(body) if line.strip() == BARRIER]
    assert [body[i + 1].split("(")[0].strip() for i in barriers] == ["Exp", "Mul", "Adds", "Cast"]
    assert body[-3].startswith("Cast(half_") and body[-1].startswith("Cast(outT")  # split, then ordered
    assert insert_barriers(["{", "Add(acc_[0 * TILE], acc_[0 * TILE], work_[0 * TILE], n);", "}"])[1] == BARRIER
