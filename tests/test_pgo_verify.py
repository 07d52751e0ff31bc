"""PGO verifies every candidate's outputs before timing it (issue 11.5).

Wrong, hanging and crashing candidates are real generated kernels whose source a test changes
for one candidate (monkeypatching the kernel renderer); the rest of the pipeline runs for real.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

import ascendc_pack
import ascendc_pack_runtime as rt
import ascendc_pack.kernels.fused.codegen as codegen
from ascendc_pack.autotune.protocol import Protocol
from ascendc_pack.frontend.loader import load_model_file
from ascendc_pack.pipeline import compare_outputs
from ascendc_pack.tune.python_mode import inline_kernels
from ascendc_pack.autotune.verify import ROUNDING_SHARE, KernelSandbox, compare_output, rounded_outputs, tolerance
from ascendc_pack.ir.program import AtenStep, FusedStep

from .bundle_fixtures import manifest_of, read_bundle
from .conftest import EXAMPLES

FAST = Protocol(warmup=1, min_rounds=3, max_rounds=6, time_cap_s=0.3, verify_timeout_s=3.0)
LAUNCH = "extern \"C\" int ap_kernel_launch("


def _clone(ts):
    return tuple(t.clone() for t in ts)


def patch_renderer(monkeypatch, edit, which=lambda name, index: True):
    """Render every candidate as usual, then ``edit(source, spec)`` those ``which(kernel, index)``
    selects (index = the candidate's rank: prepare_kernels renders them in order)."""
    real = codegen.render_kernel
    seen: dict[str, int] = {}

    def render(spec, *args, **kwargs):
        src = real(spec, *args, **kwargs)
        index = seen.setdefault(spec.name, 0)
        seen[spec.name] += 1
        if not which(spec.name, index):
            return src
        changed = edit(src, spec)
        assert changed != src, "the edit did not apply: the kernel template changed"
        return changed

    monkeypatch.setattr(codegen, "render_kernel", render)
    return seen


def drop_y(src: str, spec) -> str:
    """add_sum's kernel computes sum(x + y); this variant drops the ``+ y`` term."""
    return src.replace("(v0 + v1)", "(v0)")


ENTRY = "AP_KERNEL_ENTRY_POINTS(launch)"  # a kernel whose tasks run on a pool (kernel_pool.h)


def wrap_launch(src: str, before: str = "", after: str = "") -> str:
    """The kernel with its launch wrapped: ``before`` runs first, ``after`` once it returned
    (``rc``: its status) - in either form a fused kernel takes (pooled or OpenMP-only)."""
    if ENTRY in src:
        return src.replace(ENTRY, (
            "static int wrapped(void *const *inputs, void *const *outputs, void *workspace, int32_t max_threads,\n"
            f"                   const ap_pool *pool) {{\n{before}"
            "  const int rc = launch(inputs, outputs, workspace, max_threads, pool);\n"
            f"{after}  return rc;\n}}\nAP_KERNEL_ENTRY_POINTS(wrapped)"))
    return src.replace(LAUNCH, "static int launch_impl(") + (
        "\nextern \"C\" int ap_kernel_launch(void *const *inputs, void *const *outputs, void *workspace,\n"
        f"                                int32_t max_threads) {{\n{before}"
        "  const int rc = launch_impl(inputs, outputs, workspace, max_threads);\n"
        f"{after}  return rc;\n}}\n")


def off_by_one(src: str, spec) -> str:
    """Any float32 kernel: the first element of output 0 comes out 1.0 too large."""
    assert spec.outputs[0].dtype == "float32"
    return wrap_launch(src, after="  static_cast<float *>(outputs[0])[0] += 1.0f;\n")


def spin(src: str, spec) -> str:
    """A candidate that never returns."""
    return wrap_launch(src, before="  for (volatile int s = 1; s;) {}\n")


# ----------------------------------------------------------------------------- comparison


def test_compare_output_reports_the_worst_error_and_its_allowance():
    e = torch.tensor([1.0, 2.0, float("nan"), float("inf"), 1000.0])
    assert compare_output("y", e.clone(), e) is None
    atol, rtol = tolerance(torch.float32)
    near = e.clone()
    near[4] += 0.5 * (atol + rtol * 1000.0)
    assert compare_output("y", near, e) is None
    bad = e.clone()
    bad[1] = 2.5
    bad[4] = 1000.1
    d = compare_output("y", bad, e)
    assert d.reason == "wrong result" and d.output == "y"
    assert d.max_error == pytest.approx(0.5) and d.allowed == pytest.approx(atol + rtol * 2.0)
    assert "max error 0.5 at [1]" in d.detail and "2 of 5 elements differ" in d.detail
    nan = e.clone()
    nan[0] = float("nan")   # a NaN where the reference has a number
    assert compare_output("y", nan, e).max_error == float("inf")
    assert compare_output("y", e.to(torch.float16), e.to(torch.float16)) is None
    i = torch.tensor([[1, 2], [3, 4]])
    assert compare_output("i", i.clone(), i) is None
    j = i.clone()
    j[1, 0] = 4
    assert "at [1, 0]" in compare_output("i", j, i).detail and compare_output("i", j, i).allowed == 0
    assert compare_output("b", torch.tensor([True]), torch.tensor([False])) is not None
    assert "torch.float64" in compare_output("s", e.double(), e).detail


def test_a_rounded_output_may_be_off_by_one_on_a_few_elements_only():
    # an int8 candidate's quantized activation: the float before round() carries the float tolerance,
    # so a few elements near a .5 boundary land on the neighbouring integer (5 of 524288 seen here)
    g = torch.Generator().manual_seed(0)
    e = torch.randint(1, 254, (512, 1024), generator=g, dtype=torch.int64).to(torch.uint8)
    few = e.clone()
    few.view(-1)[torch.randperm(e.numel(), generator=g)[:5]] += 1
    assert compare_output("x_u8", few, e, rounded=True) is None
    assert compare_output("x_u8", few, e).allowed == 0            # not rounded: exact
    limit = int(ROUNDING_SHARE * e.numel())
    many = e.clone()
    many.view(-1)[:limit + 1] -= 1                                  # more than the share
    d = compare_output("x_u8", many, e, rounded=True)
    assert d is not None and f"off by one on {limit + 1} elements" in d.detail
    truncated = torch.where(torch.rand(e.shape, generator=g) < 0.5, e - 1, e)  # truncating, not rounding
    assert compare_output("x_u8", truncated, e, rounded=True) is not None
    two = e.clone()
    two[3, 7] += 2
    d = compare_output("x_u8", two, e, rounded=True)
    assert d is not None and d.max_error == 2 and "at [3, 7]" in d.detail


def test_rounded_outputs_are_the_integer_casts_of_a_rounding_step():
    quantize = [AtenStep("aten.mul.Scalar", [], {}, ["x_div"]), AtenStep("aten.round.default", [], {}, ["x_round"]),
                AtenStep("aten.add.Scalar", [], {}, ["x_shift"]), AtenStep("aten.clamp.default", [], {}, ["x_clamp"]),
                AtenStep("aten._to_copy.default", [], {"dtype": torch.uint8}, ["x_u8"])]
    to_float = AtenStep("aten._to_copy.default", [], {"dtype": torch.bfloat16}, ["x_bf16"])
    assert rounded_outputs(FusedStep("k", ["x"], ["x_u8", "x_bf16"], quantize + [to_float], None)) == {"x_u8"}
    # an integer cast without a rounding (a truncating cast, an index): exact
    truncate = AtenStep("aten._to_copy.default", [], {"dtype": torch.int64}, ["i"])
    assert rounded_outputs(FusedStep("k", ["x"], ["i"], [truncate], None)) == set()


# ----------------------------------------------------------------------------- PGO


def test_wrong_candidate_is_disqualified_and_the_build_keeps_a_correct_winner(tmp_path, monkeypatch, caplog):
    lm = load_model_file(EXAMPLES / "add_sum.py")
    patch_renderer(monkeypatch, drop_y, which=lambda name, i: i == 1)
    out = tmp_path / "add_sum.ascpack"
    with caplog.at_level("INFO", logger="ascendc_pack"):
        result = ascendc_pack.build(lm.module, lm.example_inputs, topn=3, output=out, cache_dir=tmp_path / "c",
                                    name="add_sum", protocol=FAST)
    (name, choice), = result.choices.items()
    bad = choice.results[1]
    assert choice.chosen_index != 1 and bad.median_us is None and not bad.samples_us
    assert bad.disqualified["reason"] == "wrong result" and bad.disqualified["max_error"] > bad.disqualified["allowed"]
    assert result.candidates_disqualified == 1 and result.kernels_profiled == 1 and not result.fallbacks
    warning = next(r for r in caplog.records if r.levelname == "WARNING" and "disqualified" in r.getMessage())
    assert f"kernel {name}: candidate #1" in warning.getMessage()
    assert "max error" in warning.getMessage() and "exceeds the allowed" in warning.getMessage()
    assert caplog.text.count("Timing = ") == 2
    # recorded in the cache's tuning.json and in the bundle's
    kd = next((tmp_path / "c" / "ascendc" / name).iterdir())
    cached = json.loads((kd / "tuning.json").read_text())["candidates"][1]
    assert cached["disqualified"]["reason"] == "wrong result" and "max error" in cached["error"]
    members = {info.name: data for info, data in read_bundle(out)}
    record = json.loads(members["tuning.json"])["kernels"][0]["results"][1]
    assert record["disqualified"]["max_error"] == bad.disqualified["max_error"]
    assert manifest_of(out)["kernels"][0]["candidates"][1]["failed"] is True
    # the bundle computes the right thing
    model = rt.load(out, cache_dir=tmp_path / "rt")
    x, y = _clone(lm.example_inputs)
    assert compare_outputs(lm.module(x, y), model(x, y), atol=1e-3, rtol=1e-5) is None


def test_hanging_candidate_is_stopped_and_skipped(tmp_path, monkeypatch, caplog):
    lm = load_model_file(EXAMPLES / "add_sum.py")
    patch_renderer(monkeypatch, spin, which=lambda name, i: i == 0)
    t0 = time.monotonic()
    with caplog.at_level("WARNING", logger="ascendc_pack"):
        pm = ascendc_pack.compile(lm.module, lm.example_inputs, topn=3, cache_dir=tmp_path, protocol=FAST,
                                  calibration_inputs=[lm.example_inputs])
    elapsed = time.monotonic() - t0
    (choice,) = pm.choices().values()
    assert choice.chosen_index in (1, 2)
    assert choice.results[0].disqualified["reason"] == "timeout" and "no result after 3 s" in choice.results[0].error
    assert "disqualified (timeout)" in caplog.text
    assert pm.sandbox.starts == 2  # the hung worker was killed; the other candidates ran in a new one
    x, y = _clone(lm.example_inputs)
    assert compare_outputs(lm.module(x, y), pm(x, y), atol=1e-3, rtol=1e-5) is None
    assert elapsed < 300  # sanity: the build did not wait forever
    pm.close()


def test_sandbox_kills_a_hung_worker_and_reports_crashes(tmp_path):
    """The worker process of a hung launch is gone after the timeout (not left spinning)."""
    import subprocess

    src = tmp_path / "k.cpp"
    src.write_text('#include <stdint.h>\n'
                   'extern "C" int ap_kernel_launch(void *const *i, void *const *o, void *w, int32_t t) {\n'
                   '  if (*static_cast<const float *>(i[0]) < 0) { for (volatile int s = 1; s;) {} }\n'
                   '  if (*static_cast<const float *>(i[0]) > 1) { return *static_cast<volatile int *>(nullptr); }\n'
                   '  *static_cast<float *>(o[0]) = *static_cast<const float *>(i[0]) * 2; return 0; }\n')
    so = tmp_path / "k.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-O1", "-o", str(so), str(src)], check=True)
    from ascendc_pack.autotune.verify import SandboxCrashed, SandboxHung, _Arena

    sandbox = KernelSandbox()
    arenas = []

    def arena(value: float) -> _Arena:
        arenas.append(_Arena([torch.tensor([value])], [((1,), torch.float32)]))
        return arenas[-1]

    try:
        for value, expect in ((0.5, 1.0), (0.25, 0.5)):
            a = arena(value)
            assert sandbox.launch(so, a, 0, 5.0) == 0 and a.outputs[0].item() == expect
        assert sandbox.starts == 1
        pid = sandbox._proc.pid
        with pytest.raises(SandboxHung):
            sandbox.launch(so, arena(-1.0), 0, 0.5)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        with pytest.raises(SandboxCrashed, match="SIGSEGV"):
            sandbox.launch(so, arena(2.0), 0, 5.0)
        assert sandbox.launch(so, arena(1.0), 0, 5.0) == 0 and arenas[-1].outputs[0].item() == 2.0
        assert sandbox.starts == 3
    finally:
        sandbox.close()
        for a in arenas:
            a.close()
    assert not any(a.path.exists() for a in arenas)


def test_all_wrong_kernel_falls_back_to_aten_and_the_bundle_matches_eager(tmp_path, monkeypatch, caplog):
    lm = load_model_file(EXAMPLES / "mlp.py")
    first: list[str] = []

    def which(name, index):  # every candidate of the first kernel rendered
        first[:] = first or [name]
        return name == first[0]

    patch_renderer(monkeypatch, off_by_one, which)
    out = tmp_path / "mlp.ascpack"
    kw = dict(topn=2, output=out, cache_dir=tmp_path / "c", calibration_inputs=lm.calibration_inputs, name="mlp",
              protocol=FAST, tactics=False)  # tactics would render (and time) epilogue kernels first
    with caplog.at_level("WARNING", logger="ascendc_pack"):
        result = ascendc_pack.build(lm.module, lm.example_inputs, **kw)
    wrong = first[0]
    assert set(result.fallbacks) == {wrong} and wrong not in result.choices and result.choices
    assert all(r.disqualified["reason"] == "wrong result" for r in result.fallbacks[wrong].results)
    assert f"kernel {wrong}: every candidate was disqualified or failed; it falls back to its ATen steps" \
        in caplog.text
    assert "fell back to ATen" in result.summary()
    manifest = manifest_of(out)
    assert wrong not in {k["name"] for k in manifest["kernels"]}
    assert not any(wrong in name for name in manifest["members"])
    model = rt.load(out, cache_dir=tmp_path / "rt")
    (x,) = _clone(lm.example_inputs)
    assert compare_outputs(lm.module(x), model(x), atol=1e-4, rtol=1e-4) is None
    # a warm rebuild keeps the fallback from the cache: nothing compiled, nothing profiled
    caplog.clear()
    with caplog.at_level("WARNING", logger="ascendc_pack"):
        again = ascendc_pack.build(lm.module, lm.example_inputs, **kw)
    assert again.kernels_compiled == 0 and again.kernels_profiled == 0 and set(again.fallbacks) == {wrong}
    assert "cached record: no candidate passed" in caplog.text


def test_kernel_without_a_compiled_candidate_runs_its_aten_steps(tmp_path, monkeypatch, caplog):
    lm = load_model_file(EXAMPLES / "add_sum.py")
    patch_renderer(monkeypatch, lambda src, spec: src + "\nthis is not C++;\n")
    with caplog.at_level("WARNING", logger="ascendc_pack"):
        pm = ascendc_pack.compile(lm.module, lm.example_inputs, topn=2, cache_dir=tmp_path)
    assert pm.choices() == {} and len(pm.fallbacks()) == 1
    assert "no candidate compiled" in caplog.text and pm.compile_counts.failures == 2
    x, y = _clone(lm.example_inputs)
    assert compare_outputs(lm.module(x, y), pm(x, y), atol=1e-5, rtol=1e-5) is None
    assert pm.kernels_profiled == 0 and pm.sandbox.starts == 0


def test_inline_kernels_replaces_fused_steps_in_branches_too():
    from ascendc_pack.frontend.capture import capture
    from ascendc_pack.frontend.executor import run_model
    from ascendc_pack.passes.fuse import fuse

    lm = load_model_file(EXAMPLES / "cond_model.py")
    captured = capture(lm.module, _clone(lm.example_inputs))
    fused = fuse(captured.model)
    names = {s.name for s in fused.program.fused_steps()}
    assert names
    plain = inline_kernels(fused, names)
    assert not plain.program.fused_steps() and fused.program.fused_steps()  # the original is unchanged
    for inputs in (lm.example_inputs, *lm.calibration_inputs):
        expected = run_model(fused, captured.weights, _clone(inputs))
        assert compare_outputs(expected, run_model(plain, captured.weights, _clone(inputs)), 0, 0) is None


def test_ctrl_c_while_timing_records_no_failure_and_the_next_call_tunes(tmp_path, monkeypatch):
    import ascendc_pack.autotune.protocol as autotune

    lm = load_model_file(EXAMPLES / "add_sum.py")
    pm = ascendc_pack.compile(lm.module, lm.example_inputs, topn=2, cache_dir=tmp_path, protocol=FAST)
    (st,) = pm.states.values()
    kd = st.kernel.compiled.kernel_dir

    def interrupted(kernels, args, pool=None):
        def measure(i, number):
            raise KeyboardInterrupt
        return measure

    monkeypatch.setattr(autotune, "kernel_measure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pm(*_clone(lm.example_inputs))
    assert not kd.tuning_json.exists() and not kd.optimize_tiling.exists() and not st.decided
    monkeypatch.undo()
    x, y = _clone(lm.example_inputs)
    assert compare_outputs(lm.module(x, y), pm(x, y), atol=1e-3, rtol=1e-5) is None
    assert st.chosen is not None and all(r.error is None for r in st.results)
    pm.close()
    assert pm.sandbox._proc is None
