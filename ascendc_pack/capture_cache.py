"""The capture cache: a rebuild of an unchanged model skips torch.export (docs/DESIGN.md §2.1).

``torch.export`` plus decomposition is most of a warm rebuild (4-5 s of a 7 s rebuild of
``transformer_block``; every kernel and tuning choice already comes from the kernel cache). The
captured Program is stored under ``<cache>/ascendc/capture/<key>/`` and reused when the key
matches. The key covers everything that decides what export produces:

* the versions of ascendc-pack, torch (and its git revision) and Python;
* the source files of every ``nn.Module`` class in the model, and of every loaded module of the
  user's own code next to them (the directories of those files, when they are not installed
  packages), plus the versions of the installed packages the classes come from;
* every parameter and buffer (name, dtype, shape, strides and a sha256 of the bytes) and the
  plain attributes of every submodule (numbers, strings, flags: what ``forward`` may read);
* the example inputs' shapes, strides and dtypes (shapes are static), the model name and the
  output names.

A model whose behaviour depends on something else (an environment variable read in ``forward``,
a file it opens) could reuse a stale capture: the build's final check of the bundle against
eager on the example and calibration inputs catches a difference, and ``--cache-dir`` on a fresh
directory (or deleting ``<cache>/ascendc/capture``) forces a new capture.

Weights are never stored here: a hit reads parameters and buffers from the live module by their
fully qualified names; only tensor constants that ``forward`` creates (lifted by export) are
stored, as raw bytes.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.metadata
import inspect
import json
import logging
import os
import sys
import sysconfig
from pathlib import Path

import torch

from ascendc_pack_runtime.constants import VERSION
from ascendc_pack_runtime.tensor_meta import torch_dtype

from .cache import atomic_write_bytes, atomic_write_text, kernel_lock
from .capture import Captured, capture
from .program import ModelProgram

log = logging.getLogger("ascendc_pack")

CAPTURE_SUBDIR = Path("ascendc") / "capture"
KEY_VERSION = "ascendc-pack/capture/v1"
_PLAIN = (bool, int, float, str, type(None))


def capture_cached(module: torch.nn.Module, example_inputs: tuple, *, name: str, cache_dir: Path | str,
                   output_names: list[str] | None = None) -> tuple[Captured, bool]:
    """:func:`ascendc_pack.capture.capture`, reusing a stored capture of the same model.

    Returns ``(captured, hit)``; ``hit`` is True when export was skipped."""
    module.eval()
    key = capture_key(module, example_inputs, name, output_names)
    d = Path(cache_dir) / CAPTURE_SUBDIR / key
    with kernel_lock(d):
        stored = _load(d, module)
        if stored is not None:
            log.info("capture: reused %s", d)
            return stored, True
        captured = capture(module, example_inputs, name=name, output_names=output_names)
        _store(d, captured, module)
        return captured, False


def capture_key(module: torch.nn.Module, example_inputs: tuple, name: str,
                output_names: list[str] | None) -> str:
    """The hex key of a capture (see the module docstring for what it covers)."""
    h = hashlib.sha256()

    def put(*parts) -> None:
        for p in parts:
            b = p if isinstance(p, bytes) else str(p).encode()
            h.update(len(b).to_bytes(8, "little") + b)

    put(KEY_VERSION, VERSION, torch.__version__, torch.version.git_version, sys.version, name,
        json.dumps(output_names))
    for t in example_inputs:
        put("input", t.dtype, tuple(t.shape), tuple(t.stride()))
    for path in sorted(_code_files(module)):
        put("file", path, Path(path).read_bytes())
    for dist in sorted(_distributions(module)):
        put("dist", dist)
    for prefix, sub in module.named_modules(remove_duplicate=False):
        put("module", prefix, type(sub).__qualname__, sub.training)
        for attr, value in sorted(vars(sub).items()):
            if isinstance(value, _PLAIN) or (isinstance(value, tuple) and all(isinstance(v, _PLAIN) for v in value)):
                put("attr", attr, repr(value))
    for fqn, t in _tensors(module).items():
        put("tensor", fqn, t.dtype, tuple(t.shape), tuple(t.stride()), _digest(t))
    return h.hexdigest()[:40]


def _tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer (persistent or not) by fully qualified name."""
    out = dict(module.named_parameters(remove_duplicate=False))
    out.update(module.named_buffers(remove_duplicate=False))
    return {k: v.detach() for k, v in sorted(out.items())}


def _buffer(t: torch.Tensor):
    """A zero-copy buffer over the elements of a contiguous tensor (no numpy: a base install
    has none); keep ``t`` alive while it is used."""
    n = t.numel() * t.element_size()
    return (ctypes.c_char * n).from_address(t.data_ptr()) if n else b""


def _raw(t: torch.Tensor) -> bytes:
    """The bytes of a tensor's elements in row-major order."""
    return bytes(_buffer(t.contiguous()))


def _digest(t: torch.Tensor) -> bytes:
    t = t.contiguous()
    return hashlib.sha256(_buffer(t)).digest()


def _installed_roots() -> tuple[str, ...]:
    return tuple({os.path.realpath(sysconfig.get_paths()[k]) + os.sep
                  for k in ("stdlib", "platstdlib", "purelib", "platlib")})


def _code_files(module: torch.nn.Module) -> set[str]:
    """Source files of the model's module classes, and every loaded module of the user's own code
    next to them (in the directories of those class files that are not installed packages)."""
    installed = _installed_roots()
    files = set()
    for sub in module.modules():
        try:
            f = inspect.getsourcefile(type(sub))
        except (TypeError, OSError):
            f = None
        if f and os.path.isfile(f):
            files.add(os.path.realpath(f))
    roots = tuple({os.path.dirname(f) + os.sep for f in files if not f.startswith(installed)})
    if not roots:
        return files
    real_dir = functools.lru_cache(maxsize=None)(os.path.realpath)  # thousands of modules, few directories
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if f and f.endswith(".py"):
            d = real_dir(os.path.dirname(f))
            if (d + os.sep).startswith(roots) and not (d + os.sep).startswith(installed) and os.path.isfile(f):
                files.add(os.path.realpath(f))
    return files


def _distributions(module: torch.nn.Module) -> set[str]:
    """``name==version`` of the installed packages the model's classes come from: the package's
    ``__version__`` where it has one (``importlib.metadata`` scans every installed distribution,
    a tenth of a second), the distribution's metadata otherwise."""
    out, unresolved = set(), set()
    installed = _installed_roots()
    for top in {type(sub).__module__.split(".")[0] for sub in module.modules()}:
        mod = sys.modules.get(top)
        version = getattr(mod, "__version__", None)
        if isinstance(version, str):
            out.add(f"{top}=={version}")
        elif os.path.realpath(getattr(mod, "__file__", None) or "").startswith(installed):
            unresolved.add(top)  # (the user's own code is hashed by _code_files)
    if unresolved:
        for top, dists in importlib.metadata.packages_distributions().items():
            if top in unresolved:
                for dist in dists:
                    try:
                        out.add(f"{dist}=={importlib.metadata.version(dist)}")
                    except importlib.metadata.PackageNotFoundError:
                        pass
    return out


def _store(d: Path, captured: Captured, module: torch.nn.Module) -> None:
    live = _tensors(module)
    constants, blob = [], bytearray()
    for name, fqn in captured.model.weight_fqns.items():
        if fqn in live:
            continue
        t = captured.weights[name]
        constants.append({"name": name, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                          "offset": len(blob), "nbytes": t.numel() * t.element_size()})
        blob += _raw(t)
    atomic_write_bytes(d / "constants.bin", bytes(blob))
    atomic_write_text(d / "constants.json", json.dumps(constants))
    atomic_write_text(d / "program.json", captured.model.dumps())  # last: its presence marks a full entry


def _load(d: Path, module: torch.nn.Module) -> Captured | None:
    program = d / "program.json"
    if not program.is_file():
        return None
    try:
        model = ModelProgram.loads(program.read_text())
        constants = json.loads((d / "constants.json").read_text())
        blob = (d / "constants.bin").read_bytes()
        live = _tensors(module)
        weights = {}
        for c in constants:
            raw = torch.frombuffer(bytearray(blob[c["offset"]:c["offset"] + c["nbytes"]]), dtype=torch.uint8) \
                if c["nbytes"] else torch.empty(0, dtype=torch.uint8)
            weights[c["name"]] = raw.view(torch_dtype(c["dtype"])).reshape(c["shape"])
        for name, fqn in model.weight_fqns.items():
            if name not in weights:
                weights[name] = live[fqn]
        return Captured(model=model, weights=weights)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        log.warning("capture cache entry %s is unusable (%s: %s); capturing again", d, type(exc).__name__, exc)
        return None


__all__ = ["capture_cached", "capture_key", "CAPTURE_SUBDIR"]
