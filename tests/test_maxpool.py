"""The generated max pooling (kernels/pool/maxpool.py, templates/kernel/maxpool.cpp.j2) and the
``pool`` tactic steps it is a candidate of: every candidate bit-exact against eager (NaN and -inf
included), misuse errors that name the fix, which steps are matched, and builds that choose it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ascendc_pack_runtime as rt
from ascendc_pack.autotune.protocol import Protocol
from ascendc_pack.config import BuildConfig
from ascendc_pack.frontend.capture import capture
from ascendc_pack.kernels import family
from ascendc_pack.kernels.pool import maxpool
from ascendc_pack.kernels.pool.maxpool import MaxPoolKernel, MaxPoolSpec, MaxPoolSpecError
from ascendc_pack.kernels.target import CpuTarget
from ascendc_pack.passes.fold import fold_constants
from ascendc_pack.pipeline import build
from ascendc_pack.tactics import precision
from ascendc_pack.tactics.dispatch.lowp import bf16_offered
from ascendc_pack.tactics.rewrite import find_tactics
from ascendc_pack_runtime.accuracy import relative_error

from .bundle_fixtures import build_root

FAST = Protocol(warmup=1, min_rounds=2, max_rounds=3, time_cap_s=0.05, min_sample_us=20.0)
CL = torch.channels_last

SPECS = [
    MaxPoolSpec("mp_stem", 1, 64, 28, 30, 3, 3, 2, 1),                                   # resnet's
    MaxPoolSpec("mp_tail", 2, 37, 11, 9, 3, 2, (2, 1), (1, 1), (2, 1)),                   # channel tail, dilated
    MaxPoolSpec("mp_narrow", 1, 5, 8, 8, 2, 2, 2, 0),                                     # fewer channels than a vector
    MaxPoolSpec("mp_bf16", 2, 48, 13, 12, 3, 3, (1, 2), (0, 1), (1, 2), "bfloat16"),
    MaxPoolSpec("mp_bf16_tail", 1, 40, 9, 9, 2, 3, 2, (1, 1), dtype="bfloat16"),
]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    config = BuildConfig.resolve(cache_dir=build_root(tmp_path_factory) / "build_cache", jobs=2, topn=6)
    target = CpuTarget.detect(config.effective_cores, config.march, cache_dir=config.cache_dir)
    return {s.name: b for s, b in zip(SPECS, family.compile_all(maxpool.GENERATOR, SPECS, config, target))}


def _x(spec: MaxPoolSpec, seed: int = 0) -> torch.Tensor:
    """Normal values in ``spec``'s dtype (channels_last) with NaNs and -infs sprinkled in."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(spec.n, spec.h, spec.w, spec.c, generator=g)
    flat = x.view(-1)
    flat[::53] = float("nan")
    flat[7::29] = float("-inf")
    return x.to(maxpool.DTYPES[spec.dtype]).permute(0, 3, 1, 2)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_candidate_equals_eager_bit_for_bit(spec, compiled):
    b = compiled[spec.name]
    assert len(b.candidates) >= 2
    x = _x(spec)
    want = maxpool.eager_reference(spec, x)
    for cand, cc in zip(b.candidates, b.compiled.candidates):
        assert cc.ok, cc.log
        got = MaxPoolKernel(spec, cc.so_path, cc.candidate.kernel_key)(x)
        assert got.is_contiguous(memory_format=CL) and got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.isnan(), want.isnan()), cand.tiling
        assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0)), cand.tiling


def test_a_window_of_padding_and_nan_keeps_eager_rules(compiled):
    """A NaN anywhere in the window wins over larger values before and after it; -inf stays -inf."""
    spec = SPECS[0]
    cc = compiled[spec.name].compiled.candidates[0]
    x = torch.full((1, spec.h, spec.w, spec.c), float("-inf")).permute(0, 3, 1, 2)
    x[0, 0, 0, 1] = float("nan")   # (0, 0)'s and (0, 1)'s window
    x[0, 0, 0, 0] = 5.0
    x[0, 0, 0, 2] = 7.0
    got = MaxPoolKernel(spec, cc.so_path)(x)
    want = maxpool.eager_reference(spec, x)
    assert got[0, 0, 0, 0].isnan() and got[0, 0, 0, 1].isnan() and want[0, 0, 0, 1].isnan()
    assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))
    assert got[0, 1].eq(float("-inf")).all()


def test_bad_specs_and_operands_name_the_fix(compiled):
    with pytest.raises(MaxPoolSpecError, match="dtype must be one of float32, bfloat16"):
        MaxPoolSpec("mp_bad", 1, 4, 8, 8, 2, 2, dtype="float16")
    with pytest.raises(MaxPoolSpecError, match="more than half the kernel"):
        MaxPoolSpec("mp_bad", 1, 4, 8, 8, 2, 2, 1, 2)
    with pytest.raises(MaxPoolSpecError, match="no output"):
        MaxPoolSpec("mp_bad", 1, 4, 2, 2, 5, 5)
    with pytest.raises(MaxPoolSpecError, match="stride must be"):
        MaxPoolSpec("mp_bad", 1, 4, 8, 8, 2, 2, 0)
    spec = SPECS[0]
    k = MaxPoolKernel(spec, compiled[spec.name].compiled.candidates[0].so_path)
    with pytest.raises(MaxPoolSpecError, match="channels_last"):
        k(torch.randn(spec.n, spec.c, spec.h, spec.w))            # NCHW memory
    with pytest.raises(MaxPoolSpecError, match="CPU float32 tensor, got torch.bfloat16"):
        k(_x(spec).bfloat16())
    with pytest.raises(MaxPoolSpecError, match="not this spec's"):
        MaxPoolKernel(SPECS[1], compiled[spec.name].compiled.candidates[0].so_path)


class Fn(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return self.f(x)


def _pool_steps(f, x):
    cap = capture(Fn(f).eval(), (x,))
    folded = fold_constants(cap.model, cap.weights)
    res = find_tactics(folded.model, folded.weights)
    return [s for s in res.model.program.tactic_steps() if s.tactic_kind == "pool"]


def test_only_poolings_whose_indices_nothing_reads_are_steps():
    x = torch.randn(1, 4, 8, 8)
    (step,) = _pool_steps(lambda x: F.max_pool2d(x, 3, 2, 1), x)
    assert step.desc["position"] == "entry" and step.desc["layout"] == "contiguous" and step.desc["padding"] == [1, 1]
    assert _pool_steps(lambda x: F.max_pool2d(x, 2, return_indices=True)[1].float(), x) == []   # indices read
    assert _pool_steps(lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True), x) == []                # ceil_mode
    assert _pool_steps(lambda x: F.max_pool2d(x.double(), 2), x.double()) == []                 # float64


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        y = F.max_pool2d(F.relu(self.c1(F.max_pool2d(x, 2))), 3, 2, 1)   # an entry pooling, an interior one
        return self.c2(y)


def test_a_cnn_build_verifies_and_times_every_pooling_candidate(tmp_path):
    torch.manual_seed(0)
    model, x = Cnn().eval(), torch.randn(2, 3, 20, 22)
    res = build(model, (x,), output=tmp_path / "m.ascpack", cache_dir=tmp_path / "cache", topn=3, jobs=2,
                protocol=FAST)
    pools = [ch for ch in res.tactics.values() if ch.kind == "pool"]
    assert sorted(ch.desc["position"] for ch in pools) == ["entry", "interior"]
    for ch in pools:
        names = [t.name for t in ch.candidates]
        assert "aten" in names and any(n.startswith("maxpool#") for n in names)
        assert all(r.error is None and r.median_us is not None for r in ch.results), ch.results
    with rt.load(tmp_path / "m.ascpack") as m, torch.no_grad():
        assert torch.allclose(m(x), model(x), atol=1e-5, rtol=1e-5)


class StemCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 7, 2, 3)
        self.c2 = nn.Conv2d(32, 32, 3, padding=1)

    def forward(self, x):
        return self.c2(F.max_pool2d(F.relu(self.stem(x)), 3, 2, 1))


@pytest.mark.skipif(bf16_offered() is not None, reason=f"no bfloat16 candidates here: {bf16_offered()}")
def test_a_bf16_convolutions_widening_moves_after_its_pooling(tmp_path, monkeypatch):
    """oneDNN's bfloat16 stem returns bfloat16; the pooling reads it with its kernel's bfloat16
    twin and the widening follows (tactics/pool_widen.py). The choices are forced (PGO on a tiny
    model may pick anything); the build verifies the bundle against eager."""
    real = precision.choose

    def forced(tuner, decisions, *args, **kwargs):
        report = real(tuner, decisions, *args, **kwargs)
        for s in tuner.instances:
            names = [t.name for t in tuner.choices[s.name].candidates]
            for want in ("onednn_cl_bf16", "maxpool#0"):
                if want in names:
                    decisions[id(s)] = names.index(want)
        return report

    monkeypatch.setattr(precision, "choose", forced)
    torch.manual_seed(0)
    model, x = StemCnn().eval(), torch.randn(1, 3, 40, 36)
    out = tmp_path / "m.ascpack"
    res = build(model, (x,), output=out, cache_dir=tmp_path / "cache", topn=2, jobs=2, precision="bf16",
                protocol=FAST)
    (pool,) = [ch for ch in res.tactics.values() if ch.kind == "pool"]
    twin = pool.candidates[pool.chosen_index]
    assert twin.spec.dtype == "bfloat16" and twin.spec.name.endswith("_bf16") and twin.extra == {"reads": "bfloat16"}
    assert pool.results[pool.chosen_index].median_us is None   # untimed: its float32 sibling chose the tiling
    m = rt.read_manifest(out)
    assert any(k.name == twin.spec.name for k in m.kernels)
    with rt.load(out) as bundle, torch.no_grad():
        assert relative_error(model(x), bundle(x)) <= res.precision.budget
