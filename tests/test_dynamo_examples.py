"""torch.compile(backend="ascendc_pack") on every example model (docs/DESIGN.md §2.11): one
compiled graph each, no fallback, running its C++ graph after the first call, outputs (and
in-place input updates) equal to eager's on the example and calibration inputs (both sides of
``cond_model``'s ``torch.cond``)."""

from __future__ import annotations

import warnings

import pytest
import torch

from ascendc_pack.dynamo import EagerFallbackWarning, with_protocol
from ascendc_pack.frontend.check import check_against_eager
from ascendc_pack.frontend.loader import load_model_file

from .conftest import EXAMPLE_NAMES, EXAMPLES
from .test_dynamo import FAST


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_example_under_torch_compile_matches_eager(name, tmp_path_factory):
    loaded = load_model_file(EXAMPLES / f"{name}.py")
    torch._dynamo.reset()
    backend = with_protocol(FAST)
    cache = tmp_path_factory.getbasetemp() / "dynamo_examples_cache"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", EagerFallbackWarning)
        f = torch.compile(loaded.module, backend=backend, options={"topn": 2, "cache_dir": str(cache)})
        checks = check_against_eager(loaded.module, loaded.all_input_sets, f)
    assert [c.problem for c in checks] == [None] * len(checks)
    counts = backend.counts()
    assert counts.graphs == 1 and counts.fallbacks == 0 and counts.kernels_compiled + counts.cache_hits > 0
    assert all(s.graph is not None for g in backend.graphs() for s in g._specs.values())  # runs its C++ graph
    torch._dynamo.reset()
