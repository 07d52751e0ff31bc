"""Tiling search: candidate space, ranking, TopN trimming, core limit, kernel_key."""

from __future__ import annotations

import hashlib

import pytest

from ascendc_pack.fuse import fuse
from ascendc_pack.pipeline import capture_file
from ascendc_pack.tiling import MAX_CANDIDATES, Target, propose

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
