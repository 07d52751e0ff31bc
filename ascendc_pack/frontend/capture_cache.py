"""The capture cache: a rebuild of an unchanged model skips torch.export (docs/DESIGN.md §2.1).

``torch.export`` plus decomposition is most of a warm rebuild (4-5 s of a 7 s rebuild of
``transformer_block``; every kernel and tuning choice already comes from the kernel cache). The
captured Program is stored under ``<cache>/ascendc/capture/<key>/`` and reused when the key
matches. The key covers everything that decides what export produces:

* the versions of ascendc-pack, torch (and its git revision) and Python;
* the source files of every ``nn.Module`` class in the model, and of every loaded module of the
  user's own code next to them (the directories of those files, when they are not installed
  packages), plus the versions of the installed packages the classes come from;
* every parameter and buffer (name, dtype, shape, strides and a sha256 of the bytes) and every
  other attribute of every submodule (:class:`_Fingerprint`): numbers, strings, containers, tensor
  attributes, callables by module, qualified name and code (with their defaults, closure cells
  and the globals their code names), objects by type and state; forward hooks included;
* the globals that the methods of the model's own classes (user code, not installed packages)
  name, e.g. a module-level ``ACTIVATION = "gelu"`` read by ``forward``;
* the example inputs' shapes, strides and dtypes (shapes are static), the model name and the
  output names.

A root module with a ``capture_state()`` method (a dynamo graph, docs/DESIGN.md §2.11) is keyed
by the value it returns, fingerprinted the same way, instead of its attributes and classes.

A model holding something that cannot be fingerprinted (an open file, a lock, an object with no
readable state, more than ``_MAX_OBJECTS`` objects) is never reused: a debug line on logger
``ascendc_pack`` says which attribute. And a key is not proof: a model can read an environment
variable or a file in ``forward``. So a stored capture is run with the reference executor on the
example inputs and compared with eager (the accuracy rule of ``check_against_eager``) before it
is trusted; a mismatch captures again and replaces the entry.

Weights are never stored here: a hit reads parameters and buffers from the live module by their
fully qualified names; only tensor constants that ``forward`` creates (lifted by export) are
stored, as raw bytes.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import hashlib
import importlib.metadata
import inspect
import json
import logging
import os
import sys
import sysconfig
import types
from pathlib import Path

import torch

from ascendc_pack_runtime.constants import VERSION
from ascendc_pack_runtime.tensor_meta import torch_dtype

from ascendc_pack.cache import atomic_write_bytes, atomic_write_text, kernel_lock
from ascendc_pack.frontend.capture import Captured, capture
from ascendc_pack.ir.program import ModelProgram

log = logging.getLogger("ascendc_pack")

CAPTURE_SUBDIR = Path("ascendc") / "capture"
KEY_VERSION = "ascendc-pack/capture/v1"


def capture_cached(module: torch.nn.Module, example_inputs: tuple, *, name: str, cache_dir: Path | str,
                   output_names: list[str] | None = None) -> tuple[Captured, bool]:
    """:func:`ascendc_pack.frontend.capture.capture`, reusing a stored capture of the same model.

    A stored capture is reused only when its key matches *and* the reference executor running it
    on ``example_inputs`` matches eager; otherwise the model is captured again and the entry
    replaced. Returns ``(captured, hit)``; ``hit`` is True when export was skipped."""
    module.eval()
    key = capture_key(module, example_inputs, name, output_names)
    if key is None:
        return capture(module, example_inputs, name=name, output_names=output_names), False
    d = Path(cache_dir) / CAPTURE_SUBDIR / key
    with kernel_lock(d):
        stored = _load(d, module)
        if stored is not None:
            problem = _differs_from_eager(module, example_inputs, stored)
            if problem is None:
                log.info("capture: reused %s", d)
                return stored, True
            log.warning("capture cache entry %s does not match eager on the example inputs (%s): the "
                        "model depends on something outside its fingerprint; capturing again", d, problem)
        captured = capture(module, example_inputs, name=name, output_names=output_names)
        _store(d, captured, module)
        return captured, False


def capture_key(module: torch.nn.Module, example_inputs: tuple, name: str,
                output_names: list[str] | None) -> str | None:
    """The hex key of a capture (see the module docstring for what it covers), or None when the
    model holds something that cannot be fingerprinted (never reused; a debug line says why)."""
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
    modules = dict(module.named_modules(remove_duplicate=False))
    fingerprint = _Fingerprint(put, registered={id(m): prefix for prefix, m in modules.items()})
    own_state = getattr(module, "capture_state", None)
    try:
        if callable(own_state):  # a generated module (a dynamo graph) says what its forward computes
            put("described", type(module).__qualname__)
            fingerprint.value(own_state(), "model")
        else:
            for prefix, sub in modules.items():
                put("module", prefix, type(sub).__qualname__, sub.training)
                fingerprint.module_attributes(sub, prefix or "model")
            for cls in sorted({type(sub) for sub in modules.values()}, key=lambda c: (c.__module__, c.__qualname__)):
                fingerprint.class_globals(cls)
    except (Unfingerprintable, RecursionError) as exc:   # RecursionError: a reference chain too deep to walk
        log.debug("capture cache: model %r is captured every time: %s", name, exc)
        return None
    for fqn, t in _tensors(module).items():
        put("tensor", fqn, t.dtype, tuple(t.shape), tuple(t.stride()), _digest(t))
    return h.hexdigest()[:40]


def _differs_from_eager(module: torch.nn.Module, example_inputs: tuple, stored: Captured) -> str | None:
    """None when the stored capture, run by the reference executor, matches eager on the example
    inputs; else the first difference (or the error it raised)."""
    from ascendc_pack.frontend.check import check_against_eager
    from ascendc_pack.frontend.executor import run_model

    mp = stored.model
    try:
        (check,) = check_against_eager(module, [example_inputs], lambda *xs: run_model(mp, stored.weights, xs),
                                       names=mp.output_names)
    except Exception as exc:  # noqa: BLE001 - a stale program may fail in any way; capture again
        return f"{type(exc).__name__}: {exc}"
    return check.problem


class Unfingerprintable(Exception):
    """A model attribute (or a global its code names) whose state cannot be read into the key."""


_MAX_OBJECTS = 100_000
"""Values one key may visit; a model past it (a global holding a dataset, say) is never reused."""

_SKIPPED_MODULE_STATE = frozenset({
    "_parameters", "_buffers", "_modules",  # hashed by name and bytes (tensors) and by path (modules)
    "_non_persistent_buffers_set", "_state_dict_hooks", "_state_dict_pre_hooks",  # never change forward
    "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks", "_backward_pre_hooks", "_backward_hooks",
    "_is_full_backward_hook",
})

_BY_REPR = (bool, int, float, complex, str, bytes, type(None), type(Ellipsis), range, slice, enum.Enum,
            torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Size)

_BUILTIN_CALLABLES = (types.BuiltinFunctionType, types.BuiltinMethodType, types.WrapperDescriptorType,
                      types.MethodDescriptorType, types.MethodWrapperType, types.ClassMethodDescriptorType,
                      torch._ops.OpOverload, torch._ops.OpOverloadPacket)


class _Fingerprint:
    """Feeds every value that can change what ``forward`` computes into the key's ``put``.

    Callables go in by module, qualified name and - for the user's own code, not installed
    packages (whose versions are in the key) - their code, defaults, closure cells and the
    globals their code names, recursively. Objects go in by type and state (``__dict__`` /
    ``__slots__``). A value with no readable state raises :class:`Unfingerprintable`."""

    def __init__(self, put, registered: dict[int, str]):
        self.put = put
        self.registered = registered   # id(submodule) -> its path: referenced by path, hashed once
        self.seen: dict[int, int] = {}  # id -> visit number: shared and cyclic references hashed once
        self.alive: list = []           # keeps visited objects alive so their ids stay unique
        self.installed = _installed_roots()

    def module_attributes(self, sub: torch.nn.Module, where: str) -> None:
        for attr, value in sorted(vars(sub).items()):
            if attr not in _SKIPPED_MODULE_STATE:
                self.put("attr", attr)
                self.value(value, f"{where}.{attr}")

    def class_globals(self, cls: type) -> None:
        """The code and named globals of the methods of a class from the user's own code."""
        for klass in cls.__mro__:
            if klass.__module__ == "builtins" or \
                    self._is_installed(getattr(sys.modules.get(klass.__module__), "__file__", None)):
                continue
            self.put("class", klass.__module__, klass.__qualname__)
            for attr, member in sorted(vars(klass).items()):
                fn = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
                if isinstance(fn, property):
                    fn = fn.fget
                if isinstance(fn, types.FunctionType):
                    self.put("method", attr)
                    self.value(fn, f"{klass.__qualname__}.{attr}")

    def value(self, v, where: str) -> None:  # noqa: C901 - one branch per kind of value, in order
        put = self.put
        if isinstance(v, _BY_REPR):
            put("repr", type(v).__qualname__, repr(v))
            return
        if id(v) in self.registered:
            put("submodule", self.registered[id(v)])
            return
        if id(v) in self.seen:
            put("seen", self.seen[id(v)])
            return
        if len(self.seen) >= _MAX_OBJECTS:
            raise Unfingerprintable(f"more than {_MAX_OBJECTS} objects reachable (at {where})")
        self.seen[id(v)] = len(self.seen)
        self.alive.append(v)
        if isinstance(v, torch.Tensor):
            t = v.detach()
            if t.layout != torch.strided or t.is_quantized:
                raise Unfingerprintable(f"{where} is a {t.layout} tensor whose bytes are not hashed")
            data = b"" if t.device.type == "meta" else _digest(t.cpu())
            put("tensor", t.dtype, tuple(t.shape), tuple(t.stride()), t.device.type, data)
        elif isinstance(v, (tuple, list)):
            put(type(v).__qualname__, len(v))
            for i, item in enumerate(v):
                self.value(item, f"{where}[{i}]")
        elif isinstance(v, (set, frozenset)):
            if not all(isinstance(item, _BY_REPR) for item in v):   # no order that holds across processes
                raise Unfingerprintable(f"{where} is a set of objects (its order changes from process to process)")
            put(type(v).__qualname__, len(v), *sorted(repr(item) for item in v))
        elif isinstance(v, dict):
            put(type(v).__qualname__, len(v))
            plain = all(isinstance(k, _BY_REPR) for k in v)   # else: insertion order, as the code built it
            for k, item in (sorted(v.items(), key=lambda kv: repr(kv[0])) if plain else v.items()):
                self.value(k, f"{where} key")
                self.value(item, f"{where}[{k!r}]")
        elif isinstance(v, types.ModuleType):
            put("pymodule", v.__name__)
        elif isinstance(v, type):
            put("type", v.__module__, v.__qualname__)
            self.class_globals(v)
        elif isinstance(v, types.FunctionType):
            self._function(v, where)
        elif isinstance(v, types.MethodType):
            put("method", v.__func__.__qualname__)
            self.value(v.__func__, where)
            self.value(v.__self__, f"{where}.__self__")
        elif isinstance(v, functools.partial):
            put("partial")
            self.value(v.func, where)
            self.value(v.args, f"{where} args")
            self.value(v.keywords, f"{where} keywords")
        elif isinstance(v, _BUILTIN_CALLABLES):
            put("builtin", getattr(v, "__module__", None), getattr(v, "__qualname__", None) or str(v))
            owner = getattr(v, "__self__", None)
            if owner is not None and not isinstance(owner, (type, types.ModuleType)):
                self.value(owner, f"{where}.__self__")
        elif isinstance(v, torch.nn.Module):   # a module kept outside the module tree (a plain list)
            put("free module", type(v).__module__, type(v).__qualname__)
            for fqn, t in _tensors(v).items():
                put("tensor", fqn, t.dtype, tuple(t.shape), tuple(t.stride()), _digest(t))
            self.module_attributes(v, where)
            self.value(type(v), f"{where} class")
        else:
            self._object(v, where)

    def _function(self, fn: types.FunctionType, where: str) -> None:
        self.put("function", fn.__module__, fn.__qualname__)
        if self._is_installed(fn.__code__.co_filename):
            return  # the package's version is in the key
        self._code(fn.__code__)
        self.value(fn.__defaults__, f"{where} defaults")
        self.value(fn.__kwdefaults__, f"{where} keyword defaults")
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                self.put("empty cell", name)
                continue
            self.put("cell", name)
            self.value(contents, f"{where} closure {name!r}")
        for name in sorted(_names(fn.__code__)):
            if name in fn.__globals__:
                self.put("global", name)
                self.value(fn.__globals__[name], f"global {name!r} of {fn.__qualname__}")

    def _code(self, code: types.CodeType) -> None:
        self.put("code", code.co_code, code.co_names, code.co_varnames)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                self._code(const)
            else:
                self.put("const", type(const).__qualname__, repr(const))

    def _object(self, v, where: str) -> None:
        cls = type(v)
        state = getattr(v, "__dict__", None)
        slots = [s for klass in cls.__mro__ for s in getattr(klass, "__slots__", ()) if isinstance(s, str)]
        if state is None and not slots:
            raise Unfingerprintable(f"{where} is a {cls.__module__}.{cls.__qualname__} whose state "
                                    "cannot be read")
        self.put("object", cls.__module__, cls.__qualname__)
        self.value(cls, f"{where} class")
        if state is not None:
            for attr, item in sorted(state.items()):
                self.put("field", attr)
                self.value(item, f"{where}.{attr}")
        for slot in slots:
            if hasattr(v, slot):
                self.put("slot", slot)
                self.value(getattr(v, slot), f"{where}.{slot}")

    def _is_installed(self, path) -> bool:
        return bool(path) and os.path.realpath(path).startswith(self.installed)


def _names(code: types.CodeType) -> set[str]:
    """The names a code object and the code nested in it look up (globals among them)."""
    out = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _names(const)
    return out


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


@functools.lru_cache(maxsize=None)
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
