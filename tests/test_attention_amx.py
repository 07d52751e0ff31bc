"""The generated AMX bfloat16 attention kernel (kernels/attention/amx.py, templates/kernel/attention_amx.cpp.j2)
on the float32 kernel's cases (tests/test_attnkernel.py: masks, causal, grouped-query, strided qkv
views, shifted windows, tails of every tile, L != S): every candidate within the bf16 step tolerance
of eager and close to the same attention computed on bfloat16-rounded operands; fully masked rows
as eager (0 or NaN); a ``--precision bf16`` build of a transformer block picks it. Skipped on a host
without AMX-BF16."""

from __future__ import annotations

import pytest
import torch

from ascendc_pack.config import BuildConfig
from ascendc_pack.kernels import family
from ascendc_pack.kernels.attention import amx
from ascendc_pack.kernels.attention.generator import AttnKernel, AttnSpec
from ascendc_pack.kernels.gemm.amx import amx_offered
from ascendc_pack.tactics.dispatch.lowp import STEP_TOLERANCE
from ascendc_pack.toolchain.compiler import host_cpu_flags
from ascendc_pack_runtime.accuracy import relative_error
from tests.bundle_fixtures import assert_within_budget, build_bf16
from tests.test_attnkernel import CASES, _operands, _reference

WHY_NOT = amx_offered(host_cpu_flags())
needs_amx = pytest.mark.skipif(WHY_NOT is not None, reason=f"no AMX bfloat16 here: {WHY_NOT}")


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    if WHY_NOT is not None:
        pytest.skip(f"no AMX bfloat16 here: {WHY_NOT}")
    config = BuildConfig.resolve(topn=amx.MAX_CANDIDATES, cache_dir=tmp_path_factory.mktemp("amx_attn"), jobs=2)
    return family.compile_all(amx.GENERATOR, CASES, config)


def _rounded_reference(spec: AttnSpec, named: dict) -> torch.Tensor:
    """What the kernel computes, in float64: scores of bfloat16-rounded q and k, the float mask /
    bool mask / causal rule, softmax numerators rounded to bfloat16 times rounded v, over the
    unrounded sum (fully masked rows come out NaN here; the caller compares them separately)."""
    r = lambda t: t.bfloat16().double()  # noqa: E731
    g = spec.heads // spec.kv_heads
    q, k, v = r(named["q"]), r(named["k"]).repeat_interleave(g, 1), r(named["v"]).repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) * spec.scale
    if spec.causal:
        s = s.masked_fill(torch.ones(spec.q_len, spec.kv_len, dtype=torch.bool).triu(1), float("-inf"))
    if spec.mask == "float":
        m = named["mask"].double()
        s = s + (m.repeat(spec.batch // spec.mask_windows, 1, 1, 1) if spec.mask_windows else m)
    elif spec.mask == "bool":
        s = s.masked_fill(~named["mask"], float("-inf"))
    e = torch.exp(s - s.amax(-1, keepdim=True))
    return (r(e.float()) @ v) / e.sum(-1, keepdim=True)


@needs_amx
@pytest.mark.parametrize("case", range(len(CASES)), ids=[c.name for c in CASES])
def test_every_amx_attention_candidate_matches_eager(builds, case):
    b = builds[case]
    named = _operands(b.spec)
    ref, rounded = _reference(b.spec, named), _rounded_reference(b.spec, named)
    live = ~ref.isnan().any(-1)   # rows eager gives a number for
    scored = live & ~rounded.isnan().any(-1)   # and not fully masked (eager: 0 there, safe softmax)
    assert len(b.candidates) >= 2
    for cand, cc in zip(b.candidates, b.compiled.candidates):
        assert cc.ok, cc.error
        got = AttnKernel(b.spec, cc.so_path, cand.candidate.kernel_key)(named)
        assert got.shape == ref.shape and got.stride() == b.spec.out_strides
        assert torch.equal(got.isnan(), ref.isnan()), cand.tiling   # NaN rows of an unsafe softmax, nowhere else
        assert relative_error(ref[live], got[live]) <= STEP_TOLERANCE["bf16"], cand.tiling
        assert relative_error(rounded[scored], got[scored]) < 2e-3, cand.tiling
        if b.spec.mask == "bool" and b.spec.safe_softmax:
            assert (got[:, :, 0] == 0).all()


def test_proposals_cover_row_blocks_and_threads():
    spec = CASES[0]   # 120 query rows: 32 and 64 row blocks (128 would only run as a tail)
    from ascendc_pack.kernels.target import FALLBACK, CpuTarget

    cands = amx.propose(spec, CpuTarget.detect(2, profile=FALLBACK))
    tilings = {(c.tiling.qb, c.tiling.bd) for c in cands}
    assert tilings == {(32, 1), (32, 2), (64, 1), (64, 2), (128, 1), (128, 2)}
    assert [c.est_us for c in cands] == sorted(c.est_us for c in cands)
    short = amx.propose(CASES[7], CpuTarget.detect(2, profile=FALLBACK))   # 5 query rows: one block size
    assert {c.tiling.qb for c in short} == {32}
    assert all(c.candidate.workspace == amx.workspace(spec, c.tiling) for c in cands)


# ---- in a build ----------------------------------------------------------------------------------

BLOCK = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(128)
        self.qkv = nn.Linear(128, 384)
        self.proj = nn.Linear(128, 128)

    def forward(self, x):
        b, l, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, l, 3, 4, 32).permute(2, 0, 3, 1, 4).unbind(0)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return x + self.proj(a.transpose(1, 2).reshape(b, l, 128))


def get_model():
    torch.manual_seed(0)
    return Block().eval()


def get_example_inputs():
    return (torch.randn(1, 100, 128, generator=torch.Generator().manual_seed(0)),)
"""


@needs_amx
def test_a_bf16_build_offers_and_verifies_the_amx_attention(tmp_path):
    loaded, out, res = build_bf16(BLOCK, tmp_path, tmp_path / "cache", 2)
    attn = [ch for ch in res.tactics.values() if any(t.family == "attention_amx_bf16" for t in ch.candidates)]
    assert len(attn) == 1, res.summary()
    (ch,) = attn
    assert all(r.ok for t, r in zip(ch.candidates, ch.results) if t.family == "attention_amx_bf16")
    assert_within_budget(loaded, out, res)
