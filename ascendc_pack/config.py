"""Build settings in one typed place (docs/DESIGN.md §1.3).

Every setting has a CLI/API value, an environment variable compatible with torch_npu's ascendc
backend, and a default. :meth:`BuildConfig.resolve` applies the precedence

    explicit argument (CLI / API)  >  environment variable  >  default

and validates the result, raising :class:`~ascendc_pack.errors.ConfigError` with a message that
names the setting, the bad value and what to do instead. An environment variable set to the
empty string counts as unset.
"""

from __future__ import annotations

import getpass
import os
import re
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ascendc_pack_runtime.host import usable_cores

from ascendc_pack.backends.registry import DEFAULT_BACKEND, check_backend_name
from ascendc_pack.errors import ConfigError

ENV_TOPN = "TORCHINDUCTOR_ASCENDC_AUTOTUNE_TOPN"
ENV_CACHE_DIR = "TORCHINDUCTOR_CACHE_DIR"
ENV_COMPILE_THREADS = "TORCHINDUCTOR_COMPILE_THREADS"
ENV_DEBUG = "TORCH_COMPILE_DEBUG"

PRECISIONS = ("fp32", "bf16", "int8", "auto")
"""``--precision`` values: ``fp32`` the model's own dtype (today's behaviour; also what leaving it out
means), ``bf16`` / ``int8`` offer candidates of that precision for the heavy steps, ``auto`` every
low precision the host offers (docs/PRECISION.md)."""
DEFAULT_ACCURACY_BUDGET = 1e-2
"""The default ``--accuracy-budget``: every output's relative error ``||y - y_fp32|| / ||y_fp32||``
on every calibration input set stays within 1 % (docs/PRECISION.md says why)."""
MAX_TOPN = 10
"""Most candidates a kernel may propose (torch_npu's ``AUTOTUNE_TOPN``)."""
MAX_COMPILE_THREADS = 32
"""Cap on parallel compiles (torch_npu's ``min(32, compile_threads)``)."""
KERNEL_CACHE_SUBDIR = "ascendc"
DEFAULT_MARCH = "native"

_INT_RE = re.compile(r"\s*[+-]?\d+\s*")
_MARCH_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
_USER_UNSAFE_RE = re.compile(r"[^A-Za-z0-9_.-]")


class ConfigWarning(UserWarning):
    """A setting was accepted but adjusted (e.g. a TopN above the maximum)."""


def host_cores() -> int:
    """Number of CPU cores this process may run on (its affinity mask), at least 1."""
    return usable_cores()


def default_cache_dir() -> Path:
    """``<tempfile.gettempdir()>/torchinductor_<user>``, as torch Inductor does."""
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry / no USER in a container
        user = f"uid{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    user = _USER_UNSAFE_RE.sub("_", user) or "unknown"
    return Path(tempfile.gettempdir()) / f"torchinductor_{user}"


def default_jobs() -> int:
    """Default number of parallel compiles: the usable cores, capped at 32."""
    return min(host_cores(), MAX_COMPILE_THREADS)


@dataclass(frozen=True, kw_only=True)
class BuildConfig:
    """Validated build settings. Build one with :meth:`resolve` to honour CLI values and env vars.

    ``topn``: candidates per kernel (1 = no PGO); ``cache_dir``: the Inductor cache root, kernels
    live under ``cache_dir/ascendc``; ``jobs``: parallel candidate compiles (1 = serial, in the
    calling thread); ``debug``: keep sources and compile commands under ``torch_compile_debug/``;
    ``cores``: core limit (None = every usable core); ``march``: g++ ``-march=`` value;
    ``backend``: the target device's backend (:mod:`ascendc_pack.backends.registry`; only ``cpu`` today);
    ``precision``: None (the model's own dtype) or one of :data:`PRECISIONS`; ``accuracy_budget``:
    the largest relative output error a low precision may cost (:data:`DEFAULT_ACCURACY_BUDGET` when
    a low precision is asked for without one); ``flush_denormals``: the bundle's calls flush
    denormal floats to zero (cpu backend; docs/PRECISION.md "Denormals").
    """

    topn: int = 1
    cache_dir: Path = field(default_factory=default_cache_dir)
    jobs: int = field(default_factory=default_jobs)
    debug: bool = False
    cores: int | None = None
    march: str = DEFAULT_MARCH
    backend: str = DEFAULT_BACKEND
    precision: str | None = None
    accuracy_budget: float | None = None
    flush_denormals: bool = False

    def __post_init__(self):
        object.__setattr__(self, "cache_dir", Path(self.cache_dir))
        if isinstance(self.topn, bool) or not isinstance(self.topn, int) or not 1 <= self.topn <= MAX_TOPN:
            raise ConfigError(f"topn must be an integer in 1..{MAX_TOPN}, got: {self.topn!r}")
        if isinstance(self.jobs, bool) or not isinstance(self.jobs, int) or not 1 <= self.jobs <= MAX_COMPILE_THREADS:
            raise ConfigError(f"jobs must be an integer in 1..{MAX_COMPILE_THREADS}, got: {self.jobs!r}")
        check_backend_name(self.backend)
        if self.cores is not None:
            _check_cores(self.cores, "cores", self.backend)
        _check_march(self.march, "march")
        _check_precision(self.precision, self.accuracy_budget, "precision", "accuracy_budget")
        if self.low_precision and self.accuracy_budget is None:
            object.__setattr__(self, "accuracy_budget", DEFAULT_ACCURACY_BUDGET)
        if not isinstance(self.flush_denormals, bool):
            raise ConfigError(f"flush_denormals must be True or False, got: {self.flush_denormals!r}")
        if self.flush_denormals and self.backend != "cpu":
            raise ConfigError(f"--flush-denormals applies to the cpu backend (it sets the host CPU's floating-point "
                              f"mode for each call), got --backend {self.backend}: drop --flush-denormals")

    @classmethod
    def resolve(cls, topn: Any = None, cache_dir: Any = None, jobs: Any = None, debug: bool | None = None,
                cores: Any = None, march: str | None = None, backend: str | None = None,
                precision: str | None = None, accuracy_budget: Any = None, flush_denormals: bool = False,
                env: Mapping[str, str] = os.environ) -> BuildConfig:
        """Combine explicit values (CLI/API, ``None`` = not given), ``env`` and the defaults.

        Explicit values win over environment variables, which win over defaults. Integer
        settings accept ints or their decimal text (as a CLI passes them). Raises ConfigError on
        an invalid value; a TopN above 10 warns (:class:`ConfigWarning`) and uses 10.
        """
        return cls(
            topn=_resolve_topn(topn, env),
            cache_dir=_resolve_cache_dir(cache_dir, env),
            jobs=_resolve_jobs(jobs, env),
            debug=_resolve_debug(debug, env),
            cores=None if cores is None else _check_cores(cores, "--cores", backend or DEFAULT_BACKEND),
            march=DEFAULT_MARCH if march is None else _check_march(march, "--march"),
            backend=DEFAULT_BACKEND if backend is None else check_backend_name(backend, "--backend"),
            precision=precision,
            accuracy_budget=_check_precision(precision, accuracy_budget, "--precision", "--accuracy-budget"),
            flush_denormals=flush_denormals,
        )

    @property
    def kernel_cache_root(self) -> Path:
        """``<cache_dir>/ascendc``: the root of every fused kernel's cache directory."""
        return self.cache_dir / KERNEL_CACHE_SUBDIR

    @property
    def low_precision(self) -> bool:
        """Whether low-precision candidates are asked for (``--precision bf16|int8|auto``)."""
        return self.precision in ("bf16", "int8", "auto")

    @property
    def effective_cores(self) -> int:
        """The core limit in force: ``cores``, or every usable core when no limit is set."""
        return self.cores if self.cores is not None else host_cores()

    def to_json(self) -> dict:
        """Plain-data form (for logs and the manifest)."""
        return {"topn": self.topn, "cache_dir": str(self.cache_dir), "jobs": self.jobs,
                "debug": self.debug, "cores": self.cores, "march": self.march, "backend": self.backend,
                "precision": self.precision, "accuracy_budget": self.accuracy_budget,
                "flush_denormals": self.flush_denormals}


# ----------------------------------------------------------------------------- helpers


def _env_value(env: Mapping[str, str], name: str) -> str | None:
    raw = env.get(name)
    return None if raw is None or raw.strip() == "" else raw


def _parse_int(raw: Any) -> int | None:
    """An int from an int or decimal text; None when ``raw`` is neither (bools are rejected)."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and _INT_RE.fullmatch(raw):
        return int(raw)
    return None


def _raw_text(raw: Any) -> str:
    return repr(raw if isinstance(raw, str) else str(raw))


def _resolve_topn(explicit: Any, env: Mapping[str, str]) -> int:
    raw = explicit if explicit is not None else _env_value(env, ENV_TOPN)
    if raw is None:
        return 1
    n = _parse_int(raw)
    if n is None:
        raise ConfigError(f"{ENV_TOPN} must be a positive integer, got: {_raw_text(raw)}")
    if n < 1:
        raise ConfigError(f"{ENV_TOPN} must be >= 1, got: {n}")
    if n > MAX_TOPN:
        warnings.warn(f"{ENV_TOPN} (--topn) is {n}, above the maximum of {MAX_TOPN} candidates per "
                      f"kernel; using {MAX_TOPN}", ConfigWarning, stacklevel=3)
        return MAX_TOPN
    return n


def _resolve_cache_dir(explicit: Any, env: Mapping[str, str]) -> Path:
    if explicit is not None:
        raw, source = explicit, "--cache-dir"
    else:
        raw, source = _env_value(env, ENV_CACHE_DIR), ENV_CACHE_DIR
    if raw is None:
        return default_cache_dir()
    text = os.fspath(raw)
    if not text.strip():
        raise ConfigError(f"{source} must be a directory path, got an empty value; "
                          f"leave it unset to use {default_cache_dir()}")
    path = Path(os.path.abspath(os.path.expanduser(text)))
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{source} must be a directory, but {str(path)!r} is a file; "
                          "point it at a directory (it is created if missing)")
    return path


def _resolve_jobs(explicit: Any, env: Mapping[str, str]) -> int:
    if explicit is not None:
        raw, source = explicit, f"--jobs ({ENV_COMPILE_THREADS})"
    else:
        raw, source = _env_value(env, ENV_COMPILE_THREADS), ENV_COMPILE_THREADS
    if raw is None:
        return default_jobs()
    n = _parse_int(raw)
    if n is None or n < 1:
        raise ConfigError(f"{source} must be a positive integer (1 = compile serially), "
                          f"got: {_raw_text(raw)}")
    return min(n, MAX_COMPILE_THREADS)


def _resolve_debug(explicit: bool | None, env: Mapping[str, str]) -> bool:
    if explicit is not None:
        return bool(explicit)
    return (env.get(ENV_DEBUG) or "").strip() == "1"  # torch's own rule: only "1" turns it on


def _check_cores(raw: Any, source: str, backend: str = DEFAULT_BACKEND) -> int:
    if backend != DEFAULT_BACKEND:  # a device's cores: its backend checks the limit against the device
        n = _parse_int(raw)
        if n is None or n < 1:
            raise ConfigError(f"{source} must be a positive integer (the {backend} backend's core limit), "
                              f"got: {_raw_text(raw)}; omit it to use every core")
        return n
    usable = host_cores()
    n = _parse_int(raw)
    if n is None or not 1 <= n <= usable:
        raise ConfigError(f"{source} must be an integer between 1 and {usable} (the cores this "
                          f"process may use on this host), got: {_raw_text(raw)}; "
                          "omit it to use every core")
    return n


def _check_march(raw: Any, source: str) -> str:
    if not isinstance(raw, str) or not _MARCH_RE.fullmatch(raw):
        raise ConfigError(f"{source} must be a g++ -march= value such as 'native' or 'x86-64-v3', "
                          f"got: {raw!r}")
    return raw


def _check_precision(precision: Any, budget: Any, source: str, budget_source: str) -> float | None:
    """Validate ``--precision`` / ``--accuracy-budget``; returns the budget as a float (or None)."""
    if precision is not None and precision not in PRECISIONS:
        raise ConfigError(f"{source} must be one of {', '.join(PRECISIONS)} (fp32: the model's own dtype, the "
                          f"default), got: {precision!r}")
    if budget is None:
        return None
    try:
        value = float(budget) if not isinstance(budget, bool) else None
    except (TypeError, ValueError):
        value = None
    if value is None or not 0.0 < value < 1.0:
        raise ConfigError(f"{budget_source} must be a relative error between 0 and 1 (e.g. 0.01: every output "
                          f"within 1 % of float32 on the calibration inputs), got: {_raw_text(budget)}")
    if precision not in ("bf16", "int8", "auto"):
        raise ConfigError(f"{budget_source} limits the error of a low precision; pass --precision bf16, int8 or "
                          f"auto with it (with {precision or 'the default precision'} nothing is rounded)")
    return value
