"""The registry of generated-kernel tactic families (docs/DESIGN.md §6.2).

A family is one :class:`~ascendc_pack.tactics.families.base.KernelFamily` instance. Shipped
families are listed here by name as ``"module:attribute"`` and imported on first use (a leaf
module: the graph planner, the tuner and the report look families up here without importing
them); :func:`register` adds one at run time (a plugin, or a test's toy family). Adding a
family = one module under ``tactics/families/`` + one line in :data:`SHIPPED`.

The name is what a candidate's JSON and a lowered step record as ``"family"``; :data:`DISPATCH`
is the family of the dispatcher tactics (ATen as captured, oneDNN / MKL calls), which are not
generated kernels and are handled by the tuner and the lowering directly.
"""

from __future__ import annotations

import importlib
from types import MappingProxyType

DISPATCH = "dispatch"

SHIPPED = MappingProxyType({
    "gemm": "ascendc_pack.tactics.families.gemm:GEMM",
    "gemm_amx_bf16": "ascendc_pack.tactics.families.gemm:AMX_BF16",
    "dwconv": "ascendc_pack.tactics.families.conv:DWCONV",
    "directconv": "ascendc_pack.tactics.families.conv:DIRECTCONV",
    "directconv_nchw": "ascendc_pack.tactics.families.conv:DIRECTCONV_NCHW",
    "winograd": "ascendc_pack.tactics.families.conv:WINOGRAD",
    "conv_amx_bf16": "ascendc_pack.tactics.families.conv:AMX_CONV",
    "conv_amx_nchw_bf16": "ascendc_pack.tactics.families.conv:AMX_NCHW_CONV",
    "conv_amx_direct_bf16": "ascendc_pack.tactics.families.conv:AMX_DIRECT_CONV",
    "conv_amx_rows_bf16": "ascendc_pack.tactics.families.conv:AMX_ROWS_CONV",
    "attention": "ascendc_pack.tactics.families.attention:ATTENTION",
    "attention_amx_bf16": "ascendc_pack.tactics.families.attention:AMX_ATTENTION",
    "maxpool": "ascendc_pack.tactics.families.pool:POOL",
})
"""Shipped families, in the order their candidates join a step's (after the dispatcher tactics)."""

_registered: dict[str, object] = {}


def register(family) -> None:
    """Add ``family`` (a ``KernelFamily``) under ``family.name``, after the shipped ones. Raises
    ValueError when the name is taken."""
    if family.name in SHIPPED or family.name in _registered or family.name == DISPATCH:
        raise ValueError(f"a tactic family named {family.name!r} is already registered")
    _registered[family.name] = family


def unregister(name: str) -> None:
    """Remove a family :func:`register` added (shipped families stay)."""
    _registered.pop(name, None)


def names() -> list[str]:
    """Every family's name, shipped first."""
    return [*SHIPPED, *_registered]


def family(name: str):
    """The family called ``name``. Raises KeyError naming the known ones."""
    if name in _registered:
        return _registered[name]
    target = SHIPPED.get(name)
    if target is None:
        raise KeyError(f"unknown tactic family {name!r}; known: {', '.join(names())}")
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def families() -> list:
    """Every family, in :func:`names` order."""
    return [family(n) for n in names()]


def lowered_family(chosen: dict) -> str:
    """The family of a lowered step's ``chosen`` (dispatcher tactics record none)."""
    return chosen.get("family", DISPATCH)


__all__ = ["DISPATCH", "SHIPPED", "register", "unregister", "names", "family", "families", "lowered_family"]
