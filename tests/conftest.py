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
