"""Tiling search: candidate space, ranking, TopN trimming, core limit, kernel_key."""

from __future__ import annotations

import hashlib

import pytest

from ascendc_pack.passes.fuse import fuse
from ascendc_pack.pipeline import capture_file
from ascendc_pack.kernels.fused.tiling import MAX_CANDIDATES, Target, propose

from .conftest import EXAMPLE_NAMES, EXAMPLES


@pytest.fixture(scope="module")
def fused_examples():
    out = {}
    for name in EXAMPLE_NAMES:
        _, captured = capture_file(EXAMPLES / f"{name}.py")
        out[name] = fuse(captured.model).program.fused_steps()
    return out


@pytest.mark.parametrize("name", ["add_sum", "mlp", "transformer_block"])
def test_topn4_gives_every_kernel_at_least_two_distinct_candidates(fused_examples, name):
    for step in fused_examples[name]:
        cands = propose(step.kernel, Target(cores=2), topn=4)
        keys = {t.candidate.kernel_key for t in cands}
        assert 2 <= len(cands) <= 4 and len(keys) == len(cands), step.name


def test_candidates_are_ranked_distinct_and_capped(fused_examples):
    for steps in fused_examples.values():
        for step in steps:
            cands = propose(step.kernel, Target(cores=2), topn=100)
            assert 1 <= len(cands) <= MAX_CANDIDATES
            est = [t.est_us for t in cands]
            assert est == sorted(est)
            for t in cands:
                c = t.candidate
                assert "|" not in c.tiling_repr
                assert c.kernel_key == hashlib.md5(f"{c.tiling_repr}|{c.workspace}|{c.block_dim}".encode()).hexdigest()
                assert c.workspace >= 0 and c.block_dim >= 1


@pytest.mark.parametrize("cores", [1, 2, 4])
def test_block_dim_obeys_the_core_limit(fused_examples, cores):
    for steps in fused_examples.values():
        for step in steps:
            for t in propose(step.kernel, Target(cores=cores), topn=10):
                assert t.candidate.block_dim <= cores
                if cores == 1:
                    assert t.candidate.block_dim == 1


def test_topn_one_is_the_cost_model_best(fused_examples):
    step = fused_examples["mlp"][0]
    assert propose(step.kernel, Target(cores=2), topn=1)[0] == propose(step.kernel, Target(cores=2), topn=10)[0]


def test_split_reductions_declare_a_workspace(fused_examples):
    (step,) = fused_examples["add_sum"]
    split = [t for t in propose(step.kernel, Target(cores=2), topn=10) if t.params["sched"] == "split"]
    assert split and all(t.candidate.workspace == 64 * t.candidate.block_dim for t in split)


def _kernel(fn, *inputs):
    import torch

    from ascendc_pack.frontend.capture import capture

    from .kernel_check import Fn

    with torch.no_grad():
        (step,) = fuse(capture(Fn(fn), inputs).model).program.fused_steps()
    return step.kernel


def test_small_kernels_stay_single_threaded():
    import torch

    # a µs of work: even the task pool's fork/join (Target.pool_overhead_us) costs more than a
    # second thread can save, so no multi-thread candidate is proposed at all
    for fn, inputs in [(lambda x: torch.softmax(x, -1), (torch.randn(16, 77),)),
                       (lambda x: x.sum(0), (torch.randn(64, 64),))]:
        cands = propose(_kernel(fn, *inputs), Target(cores=2), topn=10)
        assert cands and all(t.candidate.block_dim == 1 for t in cands), [t.candidate.tiling_repr for t in cands]
    # near break-even (~7 µs): single-thread candidates first, a 2-thread one on the pool behind
    # them; at ~13 µs two threads on the pool come first. Never an OpenMP team (split: its
    # wake-up and barriers) at this size
    for rows, first in ((32, 1), (64, 2)):
        cands = propose(_kernel(lambda x, y: (x + y).sum(-1), torch.randn(rows, 256), torch.randn(rows, 256)),
                        Target(cores=2), topn=10)
        bds = [t.candidate.block_dim for t in cands]
        assert bds[0] == first and 1 in bds and 2 in bds, bds
        assert all(t.params["sched"] != "split" for t in cands if t.candidate.block_dim > 1)


def test_the_wake_up_cost_is_what_keeps_small_kernels_single_threaded():
    import torch

    # the same small kernel on a target whose parallel regions were free (a quiet host whose
    # team spins) does get multi-thread candidates: the rule is the measured overhead, not size
    spec = _kernel(lambda x, y: (x + y).sum(-1), torch.randn(64, 4096), torch.randn(64, 4096))
    free = Target(cores=2, parallel_overhead_us=0.0, barrier_us=0.0, pool_overhead_us=0.0)
    assert any(t.candidate.block_dim == 2 for t in propose(spec, free, topn=10))
    costly = propose(spec, Target(cores=2, parallel_overhead_us=1e4, barrier_us=1e3, pool_overhead_us=1e4), topn=10)
    assert all(t.candidate.block_dim == 1 for t in costly)


def test_large_kernels_keep_multi_thread_candidates_that_pay_off():
    import torch

    from ascendc_pack.kernels.fused.tiling import PAYOFF_MARGIN

    spec = _kernel(lambda x: torch.softmax(x * 2, -1), torch.randn(2048, 1024))
    cands = propose(spec, Target(cores=2), topn=10)
    single = min(t.est_us for t in cands if t.candidate.block_dim == 1)
    multi = [t for t in cands if t.candidate.block_dim == 2]
    assert multi and cands[0].candidate.block_dim == 2   # ~ms of work: two threads first
    assert all(t.est_us <= PAYOFF_MARGIN * single for t in multi)
    assert any(t.candidate.block_dim == 1 for t in propose(spec, Target(cores=2), topn=4))  # PGO still compares


def test_the_cpu_target_charges_the_hosts_measured_wake_up(monkeypatch, tmp_path):
    from ascendc_pack.backends.cpu import CpuBackend
    from ascendc_pack.config import BuildConfig
    from ascendc_pack.kernels import target as target_mod

    # measured for real: a 2-thread OpenMP region after the team slept, under the runtime's policy
    wake = target_mod._omp_wake_us()
    assert 0.0 < wake < 1e5
    # the build's fused-kernel cost model plans with what the host profile measured
    profile = target_mod.HostProfile(ghz=2.0, mem_gbps=10.0, l2_gbps=50.0, source="test", omp_wake_us=61.5)
    monkeypatch.setattr(target_mod.CpuTarget, "detect",
                        staticmethod(lambda cores, march="native", **kw: target_mod.CpuTarget(cores=cores, profile=profile)))
    t = CpuBackend().target(BuildConfig.resolve(cache_dir=tmp_path, cores=2))
    assert t.parallel_overhead_us == 61.5 and t.mem_gbps_per_core == 10.0
    # a profile kept before the wake-up was measured has a different key (PROFILE_VERSION) and is
    # measured again; the fallback plans with the 8 µs the cost models were written with
    assert target_mod.PROFILE_VERSION >= 2 and target_mod.FALLBACK.omp_wake_us == 8.0
