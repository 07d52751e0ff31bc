"""Imports and helpers shared by the real-architecture bench models (the optional `bench` extra).

torchvision's PyPI wheel for torch 2.13 is a CUDA build: its C extension (`torchvision/_C.so`)
links `libc10_cuda.so` and fails to load beside the CPU torch, and then
`torchvision/_meta_registrations.py` dies at import on ``operator torchvision::nms does not
exist``. The models here need only torchvision's pure-Python definitions, never its C++ ops
(nms, roi_align, deform_conv2d), so :func:`import_torchvision` tries the extension first and,
only if it cannot load, imports torchvision without the meta registrations of those ops.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

import torch

INSTALL_HINT = "install the bench extra: pip install -e '.[bench]' (with torch==2.13.0 already installed)"


def _require(name: str):
    if importlib.util.find_spec(name) is None:
        raise ImportError(f"this bench model needs `{name}`, which is not installed; {INSTALL_HINT}")
    return importlib.import_module(name)


def _torchvision_ops_load(spec) -> bool:
    """Whether torchvision's C extension loads here (it does on a CPU build of torchvision)."""
    for directory in spec.submodule_search_locations or []:
        for lib in Path(directory).glob("_C*.so"):
            try:
                torch.ops.load_library(str(lib))
                return True
            except (OSError, RuntimeError):
                return False
    return False


def import_torchvision():
    """``torchvision``, importable even when its C extension is a CUDA build that cannot load."""
    if "torchvision" in sys.modules:
        return sys.modules["torchvision"]
    spec = importlib.util.find_spec("torchvision")
    if spec is None:
        raise ImportError(f"this bench model needs `torchvision`, which is not installed; {INSTALL_HINT}")
    if not _torchvision_ops_load(spec):
        # Without the extension there is no torchvision::nms etc. to register fake kernels for;
        # an empty module stands in for the registrations (the detection ops stay unusable,
        # the classification models we build never call them).
        name = "torchvision._meta_registrations"
        sys.modules.setdefault(name, types.ModuleType(name))
    return importlib.import_module("torchvision")


def import_timm():
    """``timm`` (imports torchvision, so guard that first)."""
    import_torchvision()
    return _require("timm")


def import_transformers():
    """``transformers``, offline: the models are built from configs, nothing is downloaded.
    transformers imports torchvision when it is installed, so guard that first."""
    if importlib.util.find_spec("torchvision") is not None:
        import_torchvision()
    return _require("transformers")


def randomize_batchnorm(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Give every BatchNorm non-trivial running statistics and affine parameters, as after
    training (fresh ones are the identity, which would hide a wrong folding or fusion)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                n = m.running_mean.numel()
                m.running_mean.copy_(torch.rand(n, generator=g) - 0.5)
                m.running_var.copy_(torch.rand(n, generator=g) * 1.5 + 0.5)
                if m.affine:
                    m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                    m.bias.copy_(torch.rand(n, generator=g) * 0.4 - 0.2)
    return model


def torchvision_classifier(name: str):
    """``get_model`` for torchvision's ``name`` classifier: random weights, BatchNorm statistics
    randomized."""

    def get_model() -> torch.nn.Module:
        torch.manual_seed(0)
        return randomize_batchnorm(getattr(import_torchvision().models, name)(weights=None))

    return get_model


def image_inputs(batch: int = 1, size: int = 224) -> tuple[torch.Tensor]:
    """One batch of random 3-channel images."""
    g = torch.Generator().manual_seed(1)
    return (torch.randn(batch, 3, size, size, generator=g),)


def token_inputs(vocab: int, batch: int = 1, seq: int = 128) -> torch.Tensor:
    """Random token ids in [0, vocab)."""
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, (batch, seq), generator=g)

