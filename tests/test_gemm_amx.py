"""The generated AMX bfloat16 GEMM (kernels/gemm/amx.py, templates/kernel/gemm_amx.cpp.j2): every
candidate against eager, the packing contract, who gets offered it, and a ``--precision bf16``
build that picks it (the bundle then requires ``amx_bf16``). Skipped on a host without AMX-BF16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ascendc_pack_runtime as rt
from ascendc_pack.config import BuildConfig
from ascendc_pack.kernels import family
from ascendc_pack.kernels.gemm import amx
from ascendc_pack.kernels.gemm.generator import GemmSpec, GemmSpecError
from ascendc_pack.kernels.gemm.launch import GemmKernel
from ascendc_pack.kernels.target import CpuTarget
from ascendc_pack.tactics.dispatch.lowp import STEP_TOLERANCE
from ascendc_pack.tactics.families.base import plan_kernel_tactics
from ascendc_pack.toolchain.compiler import host_cpu_flags
from ascendc_pack_runtime.accuracy import relative_error

from .bundle_fixtures import assert_within_budget, build_bf16, build_root

WHY_NOT = amx.amx_offered(host_cpu_flags())
needs_amx = pytest.mark.skipif(WHY_NOT is not None, reason=f"no AMX bfloat16 here: {WHY_NOT}")

SPECS = [
    GemmSpec.linear("amx_bert", 128, 256, 256, epilogue=("gelu",)),
    GemmSpec.linear("amx_tails", 37, 50, 70, bias=False, epilogue=("add",)),          # M, N, K off the tiles
    GemmSpec.linear("amx_thin", 20, 16, 33, epilogue=("relu",)),                       # one column tile, K = 33
    GemmSpec.linear("amx_gated", 64, 96, 64, epilogue=("mul", "silu"), residual_strides=((0, 1, 64),)),
    GemmSpec("amx_kn", 48, 40, 24, 1, "float32", None, (0, 40, 1), True, True, ()),  # B as [K, N]
]


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.bfloat16().double()


def _eager(spec: GemmSpec, a, w, bias, res, round_operands: bool):
    """The step in float64: on the float32 operands, or on them rounded to bfloat16 (what the
    kernel multiplies; it accumulates in float32, so that reference is near-exact)."""
    cast = _bf16 if round_operands else (lambda t: t.double())
    y = cast(a) @ cast(w).t()
    if bias is not None:
        y = y + bias.double()
    rs = iter(res)
    for op in spec.epilogue:
        y = {"gelu": F.gelu, "relu": F.relu, "silu": F.silu}[op](y) if op not in ("add", "mul") else \
            (y + next(rs).double() if op == "add" else y * next(rs).double())
    return y


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    if WHY_NOT is not None:
        pytest.skip(f"no AMX bfloat16 here: {WHY_NOT}")
    config = BuildConfig.resolve(cache_dir=build_root(tmp_path_factory) / "build_cache", jobs=2, topn=amx.MAX_CANDIDATES)
    target = CpuTarget.detect(config.effective_cores, config.march, cache_dir=config.cache_dir)
    return dict(zip([s.name for s in SPECS], family.compile_all(amx.GENERATOR, SPECS, config, target)))


@needs_amx
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_amx_candidate_matches_eager(spec, compiled):
    """Every tiling: within the bf16 step tolerance of float32 eager, and within float32 rounding
    of the same GEMM on bfloat16-rounded operands (a packing or tail error shows there at once)."""
    g = torch.Generator().manual_seed(spec.m)
    a = torch.randn(spec.m, spec.k, generator=g)
    w = torch.randn(spec.n, spec.k, generator=g) * 0.1
    b_given = w if spec.b_strides[2] != 1 else w.t().contiguous()   # [N, K] or [K, N], as the spec holds it
    bias = torch.randn(spec.n, generator=g) if spec.bias else None
    # a residual as the spec holds it: [M, N] rows, or ([0, 1, M] strides) an [N, M] tensor transposed
    res = [torch.randn(spec.m, spec.n, generator=g) if st[2] == 1 else torch.randn(spec.n, spec.m, generator=g).t()
           for st in spec.residual_strides]
    want32, want_rounded = _eager(spec, a, w, bias, res, False), _eager(spec, a, w, bias, res, True)
    build = compiled[spec.name]
    assert len(build.candidates) >= 2
    for cc in build.compiled.candidates:
        assert cc.ok, cc.error
        k = GemmKernel(spec, cc.so_path, cc.candidate.kernel_key)
        assert k.b_packed and k.nr == 16
        t = amx.AmxTiling.parse(cc.candidate.tiling_repr)
        assert k.packed_b_bytes == -(-(-(-spec.n // 16)) // (t.nr // 16)) * (t.nr // 16) * (-(-spec.k // 32) * 32) * 32
        got = k(a, k.prepare_b(b_given), bias, res)
        assert relative_error(want32, got) <= STEP_TOLERANCE["bf16"], cc.candidate.tiling_repr
        assert relative_error(want_rounded, got) < 1e-5, cc.candidate.tiling_repr


def test_the_amx_kernel_is_offered_only_where_it_runs():
    assert amx.amx_offered({"avx512f", "avx512_bf16"}) == "the host lacks amx_bf16, amx_tile"
    assert amx.amx_offered(set(amx.FEATURES)) is None
    assert "dtype bfloat16" in amx.amx_applies(GemmSpec.linear("x", 4, 4, 4, dtype="bfloat16"))
    assert "weight" in amx.amx_applies(GemmSpec.matmul("x", 4, 4, 4, batch=2))
    with pytest.raises(GemmSpecError, match="no AMX kernel"):
        amx.render(GemmSpec.matmul("x", 4, 4, 4, batch=2), None, "")


# ---- in a build ----------------------------------------------------------------------------------

MLP = """
import torch
from torch import nn


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(256, 512)
        self.down = nn.Linear(512, 256)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def get_model():
    torch.manual_seed(0)
    return Mlp().eval()


def get_example_inputs():
    return (torch.randn(128, 256, generator=torch.Generator().manual_seed(0)),)
"""


def _linear_steps(tmp_path):
    from ascendc_pack.frontend.capture import capture
    from ascendc_pack.frontend.loader import load_model_file
    from ascendc_pack.tactics.rewrite import find_tactics

    f = tmp_path / "mlp.py"
    f.write_text(MLP)
    loaded = load_model_file(f)
    captured = capture(loaded.module, loaded.example_inputs)
    program = find_tactics(captured.model, captured.weights).model.program
    steps = [s for s in program.steps if getattr(s, "tactic_kind", None) == "linear"]
    return steps, {s.name: program.values for s in steps}


@needs_amx
def test_only_a_low_precision_build_plans_amx_candidates(tmp_path):
    steps, values_of = _linear_steps(tmp_path)
    config = BuildConfig.resolve(cache_dir=tmp_path / "cache", topn=2)
    plans = plan_kernel_tactics(steps, values_of, config)
    assert steps and all("gemm_amx_bf16" not in dict(p) for p in plans.values())
    plans = plan_kernel_tactics(steps, values_of, config, offered=("bf16",))
    assert all("gemm_amx_bf16" in dict(p) for p in plans.values())


@needs_amx
def test_a_bf16_build_picks_the_amx_gemm_and_the_bundle_requires_amx(tmp_path_factory):
    from ascendc_pack_runtime import host

    loaded, out, res = build_bf16(MLP, tmp_path_factory.mktemp("amx"), build_root(tmp_path_factory) / "build_cache", 3)
    amx_steps = [ch for ch in res.tactics.values() for u in ch.uses
                 if ch.candidates[u["chosen_index"]].family == "gemm_amx_bf16"]
    assert amx_steps, res.summary()          # 5-20x float32 here: PGO takes it
    for ch in res.tactics.values():          # every AMX candidate verified
        assert all(r.ok for t, r in zip(ch.candidates, ch.results) if t.family == "gemm_amx_bf16")
    assert_within_budget(loaded, out, res)
    m = rt.read_manifest(out)
    assert "amx_bf16" in m.precision.requires and "amx_bf16" in m.target.isa
    with pytest.raises(rt.MissingCpuFeaturesError, match="amx_bf16"):
        host.check_host(m, cpu_flags=frozenset(host.host_cpu_flags() or ()) - {"amx_bf16"})
