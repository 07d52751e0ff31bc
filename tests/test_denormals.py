"""``--flush-denormals`` (docs/PRECISION.md "Denormals"): a bundle built with it computes every call
with denormal floats flushed to zero (results) and read as zero (operands) - on the calling thread
and on every worker of the graph's task pool - and leaves the caller's floating-point mode as it
was; a bundle built without it keeps denormals exactly as eager does. The manifest records the
choice, ``inspect`` shows it, and a backend it cannot apply to is refused. A build that does not
flush and whose model makes many denormals says so and names the option; one that makes none
stays silent."""

from __future__ import annotations


import pytest
import torch
from click.testing import CliRunner

import ascendc_pack_runtime as rt
from ascendc_pack.cli.main import main
from ascendc_pack.config import BuildConfig
from ascendc_pack.errors import ConfigError
from ascendc_pack.frontend.denormals import SHARE, count_denormals, flushes_now, flushing
from ascendc_pack.pipeline import build

TINY = torch.finfo(torch.float32).tiny  # the smallest normal float32


class MakesDenormals(torch.nn.Module):
    """``x * 1e-30 * 1e-10`` is denormal (FTZ flushes it); ``d * 1e10`` of a denormal ``d`` is a
    normal number unless the operand is read as zero (DAZ)."""

    def forward(self, x, d):
        return (x * 1e-30) * 1e-10, d * 1e10


def _inputs(n: int = 1 << 20):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, generator=g) + 0.5
    return x, torch.full((n,), 1e-39)


def _denormal(t: torch.Tensor) -> torch.Tensor:
    return (t != 0) & (t.abs() < TINY)


class MaskedSoftmax(torch.nn.Module):
    """Swin's shifted-window pattern in small: a softmax over scores with a -100 mask."""

    def forward(self, scores, mask):
        return torch.softmax(scores + mask * -100.0, dim=-1)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("denormals")
    out = {}
    for flush in (False, True):
        path = root / f"flush{int(flush)}.ascpack"
        out[flush] = build(MakesDenormals(), _inputs(), output=path, cache_dir=root / "cache", flush_denormals=flush)
    return out


@pytest.fixture(scope="module")
def bundles(results):
    return {flush: r.output for flush, r in results.items()}


def test_eager_makes_denormals_here():
    y, z = MakesDenormals()(*_inputs())
    assert _denormal(y).all() and (z > 0).all()


def test_a_flushing_bundle_flushes_on_every_thread_and_restores_the_callers_mode(bundles):
    model = rt.load(bundles[True])
    kernels = model.contract.kernels
    y, z = model(*_inputs())
    assert (y == 0).all(), "FTZ: every denormal result is zero, whichever pool thread computed it"
    assert (z == 0).all(), "DAZ: a denormal operand is read as zero"
    assert _denormal(torch.tensor([1e-39]) * 1.0).all(), "the caller's mode is restored after the call"
    assert any(k.block_dim > 1 for k in kernels) or torch.get_num_threads() == 1, \
        "the kernel should be split over threads here, or the pool's share of the test proves nothing"
    assert model.contract.graph.flush_denormals


def test_a_default_bundle_keeps_denormals_like_eager(bundles):
    model = rt.load(bundles[False])
    inputs = _inputs()
    for got, want in zip(model(*inputs), MakesDenormals()(*inputs)):
        assert torch.equal(got, want)
    assert not model.contract.graph.flush_denormals
    assert "flush_denormals" not in model.manifest["graph"], "absent, not false: old readers see nothing new"


def test_inspect_shows_it(bundles):
    runner = CliRunner()
    flushing = runner.invoke(main, ["inspect", str(bundles[True])])
    default = runner.invoke(main, ["inspect", str(bundles[False])])
    assert flushing.exit_code == 0 and "denormals flushed to zero in every call" in flushing.output
    assert default.exit_code == 0 and "denormals flushed" not in default.output


def test_a_build_that_does_not_flush_names_the_option_when_the_model_makes_denormals(results):
    hint = results[False].denormals
    assert hint is not None and hint.worth_flushing and hint.by_op[0][0] == "aten.mul"
    assert "rebuild with --flush-denormals" in results[False].summary()
    assert results[True].denormals is None and "--flush-denormals" not in results[True].summary()


def test_the_count_sees_a_masked_softmax_and_nothing_in_a_plain_model():
    g = torch.Generator().manual_seed(0)
    scores, mask = torch.randn(4, 64, 64, generator=g), (torch.rand(64, 64, generator=g) < 0.5).float()
    report = count_denormals(MaskedSoftmax(), (scores, mask))
    assert report.worth_flushing and report.by_op[0][0] == "aten._softmax"
    plain = count_denormals(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()), (torch.randn(8, 64),))
    assert plain.denormal == 0 and plain.values > 0 and not plain.worth_flushing and SHARE > 0


def test_flushing_sets_the_mode_for_the_block_and_restores_it():
    assert not flushes_now()
    with flushing(True):
        assert flushes_now() and _denormal(torch.tensor([1e-39]) * 1.0).logical_not().all()
        with flushing(False):   # off: leaves the mode as it is
            assert flushes_now()
    assert not flushes_now()
    torch.set_flush_denormal(True)
    try:
        with flushing(True):
            pass
        assert flushes_now(), "a caller that flushed before still flushes after"
    finally:
        torch.set_flush_denormal(False)


@pytest.mark.parametrize("kw, message", [
    ({"flush_denormals": "yes"}, "flush_denormals must be True or False"),
    ({"flush_denormals": True, "backend": "npu"}, "--flush-denormals applies to the cpu backend"),
])
def test_bad_options_name_the_problem(kw, message):
    with pytest.raises(ConfigError, match=message):
        BuildConfig.resolve(**kw)


def test_the_cli_refuses_it_for_the_npu_backend_before_loading_the_model(tmp_path):
    result = CliRunner().invoke(main, ["build", str(tmp_path / "never_read.py"), "--backend", "npu", "--emulate",
                                       "--flush-denormals"])
    assert result.exit_code != 0 and "--flush-denormals applies to the cpu backend" in result.output
