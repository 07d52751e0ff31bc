"""What a new user tripped over (issue 15): named outputs end to end, a build that checks itself,
honest timings and the CLI details."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import textwrap

import pytest
import torch
from click.testing import CliRunner

import ascendc_pack
import ascendc_pack_runtime as rt
from ascendc_pack.ir.candidate import Candidate
from ascendc_pack.ir.choice import CandidateResult, KernelChoice, MeasurementQuality
from ascendc_pack.cli.main import main
from ascendc_pack.errors import VerificationError
from ascendc_pack.ir.choice import format_us
from ascendc_pack.tune.python_mode import summary_table
from ascendc_pack_runtime.accuracy import check_tensor

from .conftest import EXAMPLES

NAMED_MODEL = textwrap.dedent("""
    import collections
    import torch

    Out = collections.namedtuple("Out", ["logits", "hidden"])

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 8)

        def forward(self, x):
            h = self.lin(x)
            return Out(torch.softmax(h, -1), h)

    def get_model():
        torch.manual_seed(0)
        return M()

    def get_example_inputs():
        return (torch.randn(4, 16),)
""")


@pytest.fixture(scope="module")
def named_bundle(tmp_path_factory):
    d = tmp_path_factory.mktemp("named")
    (d / "named.py").write_text(NAMED_MODEL)
    out = d / "named.ascpack"
    result = ascendc_pack.build_file(d / "named.py", output=out, cache_dir=d / "cache")
    return d, out, result


def test_namedtuple_outputs_keep_their_names_in_bundle_runtime_and_triton(named_bundle):
    d, out, result = named_bundle
    model = rt.load(out)
    assert [s.name for s in model.output_specs] == ["logits", "hidden"]
    x = torch.randn(4, 16)
    got = model(x)
    assert type(got).__name__ == "Out" and got._fields == ("logits", "hidden")
    assert torch.allclose(got.logits, torch.softmax(got.hidden, -1), atol=1e-6)
    manifest = rt.read_manifest(out)
    assert [o.name for o in manifest.outputs] == ["logits", "hidden"]
    assert manifest.out_tree["kind"] == "namedtuple" and manifest.out_tree["fields"] == ["logits", "hidden"]
    inspect = CliRunner().invoke(main, ["inspect", str(out)])
    assert inspect.exit_code == 0 and "logits" in inspect.output and "hidden" in inspect.output
    repo = d / "repo"
    exported = CliRunner().invoke(main, ["export-triton", str(out), "-o", str(repo)])
    assert exported.exit_code == 0, exported.output
    config = (repo / "named" / "config.pbtxt").read_text()
    assert 'name: "logits"' in config and 'name: "hidden"' in config


def test_build_summary_shows_the_error_per_output(named_bundle):
    _, _, result = named_bundle
    assert result.verification and all(c.ok for c in result.verification)
    text = result.summary()
    assert "bundle vs eager on 1 input set(s)" in text and "logits" in text and "hidden" in text


def test_build_that_does_not_match_eager_writes_nothing(tmp_path):
    # the model counts its calls: export sees the first call, eager later ones differ, so the
    # bundle (correctly) computes x * 1 while eager now computes x * 2
    (tmp_path / "drift.py").write_text(textwrap.dedent("""
        import torch
        class M(torch.nn.Module):
            calls = 0
            def forward(self, x):
                M.calls += 1
                return x * M.calls
        def get_model(): return M()
        def get_example_inputs(): return (torch.ones(8, 8),)
    """))
    out = tmp_path / "drift.ascpack"
    with pytest.raises(VerificationError, match=r"does not match eager on example inputs: output_0: max error 1 "
                                                 r".*No bundle was written to .*drift.ascpack.*--no-verify"):
        ascendc_pack.build_file(tmp_path / "drift.py", output=out, cache_dir=tmp_path / "cache")
    assert not out.exists() and not list(tmp_path.glob(".drift.ascpack*"))
    result = ascendc_pack.build_file(tmp_path / "drift.py", output=out, cache_dir=tmp_path / "cache", verify=False)
    assert out.is_file() and result.verification == []


def test_a_model_that_draws_random_numbers_is_told_why_it_cannot_match_eager(tmp_path):
    (tmp_path / "noisy.py").write_text(textwrap.dedent("""
        import torch
        class M(torch.nn.Module):
            def forward(self, x):
                return torch.nn.functional.rrelu(x, 0.1, 0.3, training=True)
        def get_model(): return M()
        def get_example_inputs(): return (-torch.ones(64),)
    """))
    out = tmp_path / "noisy.ascpack"
    with pytest.raises(VerificationError, match=r"draws random numbers in forward \(aten\.rrelu_with_noise.*"
                                                 r"model\.eval\(\).*--no-verify"):
        ascendc_pack.build_file(tmp_path / "noisy.py", output=out, cache_dir=tmp_path / "cache")
    assert not out.exists()


def test_accuracy_rule_scales_with_magnitude_and_dtype():
    e = torch.linspace(-2300, 2300, 1001)
    e[500] = 0.0
    a = e.clone()
    a[500] = 9.8e-4   # ~4 float32 ulp of the tensor's magnitude, on an element near zero
    assert check_tensor("logits", e, a).ok
    a[500] = 1.0
    bad = check_tensor("logits", e, a)
    assert not bad.ok and "max error 1 at [500]" in bad.problem and "allowed" in bad.problem
    b = torch.full((16,), 4.0, dtype=torch.bfloat16)
    assert check_tensor("b", b, b + 0.03125).ok          # one bf16 ulp at 4
    assert not check_tensor("b", b, b + 0.5).ok
    assert check_tensor("b", b, b + 0.5, atol=1.0).ok    # the user's override


def _choice(medians, samples, quality):
    results = [CandidateResult(Candidate(f"t={i}", 0, 1), m, s) for i, (m, s) in enumerate(zip(medians, samples))]
    return KernelChoice("fused_k", {}, 1, results[1].candidate, None, True, results, quality)


def test_unstable_timings_are_flagged_not_claimed():
    quiet = [[10.0, 10.1, 10.0, 9.9, 10.0]] * 2
    noisy = [[11818.0, 20.0, 30000.0, 15000.0, 9000.0], [22.8, 22.0, 23.0, 900.0, 22.5]]
    q_ok = MeasurementQuality.assess([CandidateResult(Candidate("a", 0, 1), 10.0, quiet[0])] * 2, 1, 0.3, 2)
    assert q_ok.stable
    res = [CandidateResult(Candidate(f"t={i}", 0, 1), m, s) for i, (m, s) in enumerate(zip([11818.0, 22.8], noisy))]
    q_bad = MeasurementQuality.assess(res, 1, 9.5, 2)
    assert not q_bad.stable and q_bad.load == 9.5
    text = summary_table({"fused_k": _choice([11818.0, 22.8], noisy, q_bad)})
    assert "518.33x?" in text and "unstable (load 9.5 on 2 cores" in text and "11.82 ms" in text
    assert "?" not in summary_table({"fused_k": _choice([10.0, 9.0], quiet, q_ok)}).splitlines()[-1]


def test_contended_tactic_timings_are_flagged_not_claimed():
    """A neighbour holding a core while a GEMM's candidates were timed made a 1-thread candidate
    win (mlp, 2026-12-04): the tactic summary marks such a choice and says why."""
    from types import SimpleNamespace

    from ascendc_pack.tactics.report import tactic_table
    from ascendc_pack.tactics.tune import TacticChoice, TacticResult

    samples = [[5000.0, 5010.0, 4990.0, 5005.0], [3900.0, 3910.0, 3890.0, 3905.0]]
    results = [TacticResult(i, f"k{i}", name, statistics.median(x), x)
               for i, (name, x) in enumerate(zip(("aten", "gemm#1"), samples))]
    contended = MeasurementQuality.assess(results, 1, 0.4, 2, wait_share=0.45)
    assert not contended.stable and contended.spread < 0.01   # steady timings: only the wait tells
    ch = TacticChoice("linear_m256", "linear", {}, [SimpleNamespace(name="aten"), SimpleNamespace(name="gemm#1")],
                      results, best=1, visited=True, quality=contended, uses=[{"chosen_index": 1}])
    text = tactic_table({"linear_m256": ch})
    assert "1.28x?" in text
    assert "? timings of 1 tactic step(s) were unstable" in text and "waited for a core 45% of the time" in text
    ch.quality = MeasurementQuality.assess(results, 1, 0.4, 2, wait_share=0.001)
    assert "?" not in tactic_table({"linear_m256": ch})


def test_format_us():
    assert (format_us(23.4), format_us(97755.8), format_us(1.2e6)) == ("23.4 us", "97.76 ms", "1.20 s")


def test_cli_integer_options_are_checked_by_type():
    for value in ("abc", "0", "-3"):
        r = CliRunner().invoke(main, ["build", str(EXAMPLES / "add_sum.py"), "--topn", value])
        assert r.exit_code == 2 and f"Invalid value for '--topn': '{value}' is not a positive integer" in r.output
    help_text = CliRunner().invoke(main, ["build", "--help"]).output
    for option in ("--topn", "--cores", "--jobs"):
        assert f"{option} INTEGER" in help_text


def test_capture_reports_the_fusion_result():
    r = CliRunner().invoke(main, ["capture", "--no-check", str(EXAMPLES / "add_sum.py")])
    assert r.exit_code == 0 and "after fusion: 1 fused kernels (2 ops), 0 ATen calls" in r.output
    assert "(0 fused kernels)" not in r.output


def test_no_numpy_warning_without_numpy(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        sys.modules["numpy"] = None   # an install without numpy
        from ascendc_pack.pipeline import capture_file
        capture_file({str(EXAMPLES / "add_sum.py")!r})
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ})
    assert out.returncode == 0, out.stderr
    assert "Failed to initialize NumPy" not in out.stderr
