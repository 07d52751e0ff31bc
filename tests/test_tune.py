"""Python-mode module, PGO on real inputs, and the tuning cache (optimize_tiling / tuning.json)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

import ascendc_pack
from ascendc_pack.ir.candidate import Candidate
from ascendc_pack.frontend.loader import load_model_file
from ascendc_pack.pipeline import compare_outputs

from .conftest import EXAMPLES, ROOT


def _clone(ts):
    return tuple(t.clone() for t in ts)


def _kernel_dirs(pm):
    return {name: st.kernel.compiled.kernel_dir for name, st in pm.states.items()}


def test_python_mode_matches_eager_and_tunes_on_first_call(tmp_path):
    lm = load_model_file(EXAMPLES / "mlp.py")
    pm = ascendc_pack.compile(lm.module, lm.example_inputs, topn=4, cache_dir=tmp_path)
    assert all(st.chosen is None for st in pm.states.values() if len(st.runners) > 1)
    x = lm.example_inputs[0].clone()
    assert compare_outputs(lm.module(x), pm(x), atol=1e-4, rtol=1e-4) is None
    for name, kd in _kernel_dirs(pm).items():
        text = kd.optimize_tiling.read_text()
        cand = Candidate.parse(text)
        tuning = json.loads(kd.tuning_json.read_text())
        assert tuning["chosen_key"] == cand.kernel_key  # md5 of the optimize_tiling text
        assert len(tuning["candidates"]) == len(pm.states[name].runners)
        assert all(c["median_us"] > 0 and c["samples_us"] for c in tuning["candidates"])
        assert tuning["protocol"]["min_rounds"] >= 1 and tuning["host"]["cores"] >= 1


def test_single_candidate_writes_candidate_zero_without_profiling(tmp_path):
    lm = load_model_file(EXAMPLES / "add_sum.py")
    pm = ascendc_pack.compile(lm.module, lm.example_inputs, topn=1, cache_dir=tmp_path)
    for st in pm.states.values():
        assert st.chosen == 0
        assert st.kernel.compiled.kernel_dir.optimize_tiling.read_text() == \
            st.kernel.compiled.candidates[0].candidate.optimize_tiling_text
    pm(*_clone(lm.example_inputs))
    assert pm.kernels_profiled == 0 and pm.sandbox.starts == 0


def test_inplace_model_tuned_with_topn4_keeps_user_data_exact(tmp_path):
    lm = load_model_file(EXAMPLES / "inplace.py")
    pm = ascendc_pack.compile(lm.module, lm.example_inputs, topn=4, cache_dir=tmp_path)
    ours, eager = _clone(lm.example_inputs), _clone(lm.example_inputs)
    out = pm(*ours)  # the first call tunes every kernel on these very tensors
    expected = lm.module(*eager)
    assert torch.equal(ours[0], eager[0])  # mutation applied exactly once
    assert torch.equal(ours[1], eager[1])
    assert compare_outputs(expected, out, atol=1e-5, rtol=1e-5) is None
    assert any(len(st.runners) > 1 for st in pm.states.values())


def test_warm_cache_does_zero_compiles_and_zero_profiling(tmp_path):
    lm = load_model_file(EXAMPLES / "mlp.py")
    first = ascendc_pack.compile(lm.module, lm.example_inputs, topn=4, cache_dir=tmp_path,
                                 calibration_inputs=[lm.example_inputs])
    choices1 = {k: c.candidate.kernel_key for k, c in first.choices().items()}
    assert first.compile_counts.compiler_calls == sum(len(st.runners) for st in first.states.values())
    assert first.kernels_profiled == len(first.states) > 0
    second = ascendc_pack.compile(lm.module, lm.example_inputs, topn=4, cache_dir=tmp_path,
                                  calibration_inputs=[lm.example_inputs])
    assert second.compile_counts.compiler_calls == 0 and second.kernels_profiled == 0
    assert second.compile_counts.cache_hits == first.compile_counts.compiler_calls
    assert {k: c.candidate.kernel_key for k, c in second.choices().items()} == choices1


def test_raising_topn_retunes(tmp_path):
    lm = load_model_file(EXAMPLES / "add_sum.py")
    ascendc_pack.compile(lm.module, lm.example_inputs, topn=2, cache_dir=tmp_path,
                         calibration_inputs=[lm.example_inputs])
    pm = ascendc_pack.compile(lm.module, lm.example_inputs, topn=4, cache_dir=tmp_path,
                              calibration_inputs=[lm.example_inputs])
    assert pm.kernels_profiled == len(pm.states)
    for kd in _kernel_dirs(pm).values():
        assert len(json.loads(kd.tuning_json.read_text())["timed_keys"]) == 4


def test_corrupt_optimize_tiling_is_reported_and_retuned(tmp_path, caplog):
    lm = load_model_file(EXAMPLES / "add_sum.py")
    pm = ascendc_pack.compile(lm.module, lm.example_inputs, topn=3, cache_dir=tmp_path,
                              calibration_inputs=[lm.example_inputs])
    kd = next(iter(_kernel_dirs(pm).values()))
    kd.optimize_tiling.write_text("garbage-without-separators")
    with caplog.at_level("WARNING", logger="ascendc_pack"):
        pm2 = ascendc_pack.compile(lm.module, lm.example_inputs, topn=3, cache_dir=tmp_path,
                                   calibration_inputs=[lm.example_inputs])
    assert "corrupt tuning cache" in caplog.text
    assert pm2.kernels_profiled == 1
    assert Candidate.parse(kd.optimize_tiling.read_text()).kernel_key == \
        next(iter(pm2.choices().values())).candidate.kernel_key


def test_autotune_logs_timing_and_completion(tmp_path, caplog):
    lm = load_model_file(EXAMPLES / "add_sum.py")
    with caplog.at_level("INFO", logger="ascendc_pack"):
        ascendc_pack.compile(lm.module, lm.example_inputs, topn=3, cache_dir=tmp_path,
                             calibration_inputs=[lm.example_inputs])
    assert caplog.text.count("Timing = ") == 3
    assert "Autotune completed fused_add_sum_" in caplog.text and "best kernel index: " in caplog.text


def test_cond_one_branch_leaves_other_branch_unvisited(tmp_path):
    lm = load_model_file(EXAMPLES / "cond_model.py")
    pm = ascendc_pack.compile(lm.module, lm.example_inputs, topn=3, cache_dir=tmp_path)
    pm(*_clone(lm.example_inputs))  # positive mean: the softmax branch only
    choices = pm.choices()
    cond = next(s for s in pm.model.program.steps if s.kind == "cond")
    then_k = {s.name for s in cond.then_branch.fused_steps()}
    else_k = {s.name for s in cond.else_branch.fused_steps()}
    assert then_k and else_k
    for name in then_k:
        assert choices[name].visited
    for name in else_k:
        assert not choices[name].visited and choices[name].chosen_index == 0
    pm(*_clone(lm.calibration_inputs[0]))  # negative mean: the other branch
    assert all(c.visited for c in pm.choices().values())


def test_two_builds_at_once_share_a_consistent_cache(tmp_path):
    script = textwrap.dedent(f"""
        import sys, json
        sys.path.insert(0, {str(ROOT)!r})
        import ascendc_pack
        from ascendc_pack.frontend.loader import load_model_file
        lm = load_model_file({str(EXAMPLES / 'add_sum.py')!r})
        pm = ascendc_pack.compile(lm.module, lm.example_inputs, topn=4, cache_dir={str(tmp_path)!r},
                                  calibration_inputs=[lm.example_inputs], jobs=1)
        print(json.dumps({{k: c.candidate.kernel_key for k, c in pm.choices().items()}}))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    results = [json.loads(o[0].strip().splitlines()[-1]) for o in outs]
    assert results[0] == results[1]
    for kdir in (tmp_path / "ascendc").iterdir():
        if kdir.name in ("capture", "tactics", "host_profile", "meta_layouts"):  # caches that are not kernels
            continue
        (hash_dir,) = list(kdir.iterdir())
        assert len(list((hash_dir / "static_kernel").iterdir())) == 4
        text = (hash_dir / "optimize_tiling").read_text()
        assert Candidate.parse(text).kernel_key == json.loads((hash_dir / "tuning.json").read_text())["chosen_key"]


@pytest.mark.parametrize("cores", [1])
def test_core_limit_caps_block_dim_and_changes_the_cache_key(tmp_path, cores):
    lm = load_model_file(EXAMPLES / "add_sum.py")
    all_cores = ascendc_pack.compile(lm.module, lm.example_inputs, topn=4, cache_dir=tmp_path)
    limited = ascendc_pack.compile(lm.module, lm.example_inputs, topn=4, cache_dir=tmp_path, cores=cores)
    for name, st in limited.states.items():
        assert all(cc.candidate.block_dim <= cores for cc in st.kernel.compiled.candidates)
        assert st.kernel.compiled.kernel_dir.artifact_hash != all_cores.states[name].kernel.compiled.kernel_dir.artifact_hash
