"""Shared fixtures: paths of the examples and a helper to write model files."""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import pytest

warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
EXAMPLE_NAMES = ["add_sum", "mlp", "transformer_block", "cond_model", "inplace", "conv_block"]


@pytest.fixture
def write_model(tmp_path):
    """Write a model file from source text and return its path."""

    def write(source: str, name: str = "model.py") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        return path

    return write


SLOW_MODULES = {
    "test_kernel_parity", "test_npu_parity", "test_npu_pipeline", "test_bench", "test_bounds", "test_serve",
    "test_serve_hostile", "test_tactic_pipeline", "test_pgo_verify", "test_tune", "test_cli", "test_gemm",
    "test_new_user", "test_threads", "test_verify", "test_ascendc_emu", "test_conv_kernels", "test_dwconv",
    "test_directconv", "test_winograd", "test_triton_server", "test_serve_batching", "test_dynamo",
    "test_dynamo_examples", "test_runtime_wheel", "test_dynamic_shapes", "test_precision", "test_int8",
}
"""Modules of the whole suite left out of the quick subset (``pytest -m "not slow"``, README: about
3.5 minutes on two workers against 16 for everything): parity through every candidate, end-to-end
builds, servers, C++ programs. Measured with ``pytest --durations=0``; keep the subset near 3 minutes."""


def pytest_collection_modifyitems(items):
    """Mark every test of :data:`SLOW_MODULES` ``slow``."""
    for item in items:
        if item.path.stem in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
