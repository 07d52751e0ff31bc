"""``torch.compile(backend="ascendc_pack", mode=..., options={...})`` into a
:class:`~ascendc_pack.config.BuildConfig` (docs/DESIGN.md §2.11).

``options`` takes the CLI's settings by their API names (``topn``, ``cores``, ``cache_dir``,
``backend``, ``jobs``, ``debug``, ``march``) and resolves them exactly as the CLI does
(:meth:`BuildConfig.resolve`: option > ``TORCHINDUCTOR_*`` variable > default). ``mode`` follows
torch.compile's names: ``max-autotune`` (and ``max-autotune-no-cudagraphs``) time
:data:`MAX_AUTOTUNE_TOPN` candidates per kernel unless ``TORCHINDUCTOR_ASCENDC_AUTOTUNE_TOPN`` names
a TopN; ``default`` and ``reduce-overhead`` keep the default (there are no CUDA graphs to reduce
overhead with on these backends).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from ascendc_pack.config import ENV_TOPN, BuildConfig
from ascendc_pack.errors import ConfigError

OPTIONS = ("topn", "cores", "cache_dir", "backend", "jobs", "debug", "march", "graph")
"""The keys ``options={...}`` accepts: the ``ascendc-pack build`` options, and ``graph`` (default
True: after its first call a graph runs through the C++ graph, as a bundle does; False keeps
Python mode, one Python dispatch per step)."""

MAX_AUTOTUNE_TOPN = 4
"""Candidates per kernel under ``mode="max-autotune"`` (the README's recommended ``--topn``)."""

MODES: dict[str, int | None] = {
    "default": None, "reduce-overhead": None,
    "max-autotune": MAX_AUTOTUNE_TOPN, "max-autotune-no-cudagraphs": MAX_AUTOTUNE_TOPN,
}
"""torch.compile's modes and the TopN each implies (None: the configured default)."""


def resolve_config(mode: str | None = None, options: Mapping[str, Any] | None = None,
                   env: Mapping[str, str] = os.environ) -> BuildConfig:
    """The build settings of one ``torch.compile`` call; raises ConfigError naming a bad mode,
    an unknown option or a bad value, and the fix (``graph`` is read by :func:`graph_mode`)."""
    options = dict(options or {})
    unknown = sorted(k for k in options if k not in OPTIONS)
    if unknown:
        raise ConfigError(f"torch.compile(backend='ascendc_pack', options=...): unknown option(s) "
                          f"{', '.join(map(repr, unknown))}; the options are {', '.join(OPTIONS)} "
                          "(the `ascendc-pack build` settings)")
    if mode is not None and mode not in MODES:
        raise ConfigError(f"torch.compile(backend='ascendc_pack', mode={mode!r}): unknown mode; use one of "
                          f"{', '.join(MODES)}")
    graph = options.pop("graph", True)
    if not isinstance(graph, bool):
        raise ConfigError(f"torch.compile(backend='ascendc_pack', options=...): graph must be True or False, "
                          f"got {graph!r}")
    topn = options.pop("topn", None)
    if topn is None and mode is not None and MODES[mode] is not None and not (env.get(ENV_TOPN) or "").strip():
        topn = MODES[mode]
    return BuildConfig.resolve(topn=topn, env=env, **options)


def graph_mode(options: Mapping[str, Any] | None) -> bool:
    """The ``graph`` option (checked by :func:`resolve_config`)."""
    return bool((options or {}).get("graph", True))
