"""The real AscendC kernel API per CANN release: the oracle the generator and the emulation answer to.

``cann-<version>.json`` beside this module is extracted from the public ``asc-devkit`` headers of
that release by ``tools/extract_ascendc_api.py`` (names, template and parameter lists, enums and
their values, macros, ``RESERVED_WORKSPACE`` per architecture; no vendor code). This module
loads a table (:class:`ApiTable`), finds the AscendC calls in a kernel source (:func:`calls_in`)
and checks each against the table (:meth:`ApiTable.problems`): the name exists for the target
architecture (``__NPU_ARCH__`` 2201: Atlas A2/A3 Vector cores), an overload takes that many
arguments, and every enum argument (``CMPMODE::NE``, ``HardEvent::V_S``, ...) lands on a
parameter of that enum type and names one of its enumerators.

The target CANN version of a build (:func:`resolve_cann`): ``--cann VERSION`` if given, else
the toolkit's on an Ascend host (:func:`detect_cann`), else :data:`DEFAULT_CANN`, the oldest
supported (an emulated build on a machine without CANN targets it).
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ascendc_pack.backends.npu.api.cxxdecl import condition_holds
from ascendc_pack.errors import ConfigError

HERE = Path(__file__).parent
SUPPORTED = ("8.5.0", "9.1.0")
"""CANN releases whose API tables ship here (tools/extract_ascendc_api.py at asc-devkit v8.5.0, 9.1.0)."""
DEFAULT_CANN = SUPPORTED[0]
VECTOR_ARCH = 2201
"""``__NPU_ARCH__`` of the Atlas A2/A3 Vector cores (dav-c220-vec) the generator targets."""
BUILTIN_ENUMS = {"pipe_t": {"PIPE_S", "PIPE_V", "PIPE_M", "PIPE_MTE1", "PIPE_MTE2", "PIPE_MTE3", "PIPE_ALL"},
                 "event_t": {f"EVENT_ID{i}" for i in range(8)}}
"""Enums of the CCE compiler itself (the headers use them, asc-devkit does not define them)."""
NOT_CALLS = {"if", "for", "while", "switch", "return", "sizeof", "static_cast", "reinterpret_cast",
             "const_cast", "decltype", "__builtin_huge_valf", "__builtin_nanf", "defined"}
TYPE_NAMES = {"float", "half", "bfloat16_t", "int8_t", "uint8_t", "int16_t", "uint16_t", "int32_t", "uint32_t",
              "int64_t", "uint64_t", "bool", "void", "GM_ADDR", "TEventID", "QuePosition"}


def version_number(version: str) -> int:
    """``"8.5.0"`` -> 80500 (the value of ``-DASCENDC_CANN_VERSION`` for the emulation)."""
    parts = [int(p) for p in re.findall(r"\d+", version)[:3]] + [0, 0, 0]
    return parts[0] * 10000 + parts[1] * 100 + parts[2]


def scalar_compare(version: str) -> str:
    """The tensor-vs-scalar comparison of a release: ``Compares`` from CANN 9.0 (asc-devkit's basic
    API), ``CompareScalar`` before (8.5.0 declares no ``Compares``; 9.x keeps CompareScalar deprecated)."""
    return "Compares" if version_number(version) >= 90000 else "CompareScalar"


def check_cann(version: str, source: str = "--cann") -> str:
    """``version`` if an API table ships for it, else a ConfigError naming the supported ones."""
    if version not in SUPPORTED:
        near = [v for v in SUPPORTED if v.split(".")[:2] == version.split(".")[:2]]
        if near:
            return near[0]
        raise ConfigError(f"{source}: CANN {version!r} has no AscendC API table here; supported: "
                          f"{', '.join(SUPPORTED)} (add one with tools/extract_ascendc_api.py)")
    return version


def detect_cann(env=os.environ) -> str | None:
    """The CANN version of this host's toolkit: torch_npu's ``get_cann_version()`` when torch_npu
    imports, else ``ASC_DEVKIT_VERSION_STR`` of ``$ASCEND_HOME_PATH/include/ascendc/asc_devkit_version.h``,
    else ``version=`` of ``$ASCEND_HOME_PATH/<arch>-linux/ascend_toolkit_install.info``; None
    without a toolkit (never on our machines)."""
    try:
        from torch_npu.npu.utils import get_cann_version  # type: ignore[import-not-found]

        found = str(get_cann_version("CANN"))
        if re.match(r"\d+\.\d+", found):
            return re.match(r"\d+\.\d+(\.\d+)?", found).group()
    except Exception:  # noqa: BLE001 - no torch_npu, or no CANN under it
        pass
    home = env.get("ASCEND_HOME_PATH")
    if not home:
        return None
    header = Path(home) / "include" / "ascendc" / "asc_devkit_version.h"
    if header.is_file():
        m = re.search(r'ASC_DEVKIT_VERSION_STR\s+"([\d.]+)', header.read_text(errors="replace"))
        if m:
            return m.group(1)
    for info in Path(home).glob("*-linux/ascend_toolkit_install.info"):
        m = re.search(r"^version=([\d.]+)", info.read_text(errors="replace"), re.M)
        if m:
            return m.group(1)
    return None


def resolve_cann(requested: str | None, env=os.environ) -> str:
    """The CANN version a build targets: ``requested``, else the toolkit's, else the oldest supported."""
    if requested:
        return check_cann(requested)
    found = detect_cann(env)
    return check_cann(found, f"the CANN toolkit at ASCEND_HOME_PATH ({found})") if found else DEFAULT_CANN


@dataclass(frozen=True)
class Call:
    """One call in a kernel source: ``name<template_args>(args)``, a member call when ``member``."""

    name: str
    template_args: tuple[str, ...]
    args: tuple[str, ...]
    member: bool
    line: int

    def __str__(self) -> str:
        t = f"<{', '.join(self.template_args)}>" if self.template_args else ""
        return f"{'.' if self.member else ''}{self.name}{t}({', '.join(self.args)})"


def split_top(text: str, sep: str = ",", keep: bool = False) -> list[str]:
    """``text`` split at ``sep`` outside brackets (call arguments; statements with ``;``, kept
    with ``keep``), each part stripped, empty parts dropped."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        if ch == sep and depth == 0:
            out.append((cur + ch) if keep else cur)
            cur = ""
        else:
            cur += ch
    return [p.strip() for p in out + [cur] if p.strip()]


def _group(text: str, i: int, open_: str, close: str) -> int:
    depth = 0
    while i < len(text):
        if text[i] == open_:
            depth += 1
        elif text[i] == close:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return i


def _strip(source: str) -> str:
    source = re.sub(r"//[^\n]*", "", source)
    source = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group().count("\n"), source, flags=re.S)
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', source)


def defined_names(source: str) -> set[str]:
    """Functions, classes and macros a kernel source defines itself (not API calls)."""
    text = _strip(source)
    names = set(re.findall(r"\b(\w+)\s*\([^;{}()]*(?:\([^()]*\)[^;{}()]*)*\)\s*(?:const\s*)?\{", text))
    names |= set(re.findall(r"\b(?:class|struct)\s+(\w+)", text))
    names |= set(re.findall(r"#\s*define\s+(\w+)", text))
    return names


def calls_in(source: str, device_only: bool = True) -> list[Call]:
    """Every call of the kernel source (its own functions excluded), with its arguments.
    ``device_only``: stop at the host part of a kernel library (ascendc-pack's marker line)."""
    if device_only and "// Host side" in source:
        source = source[:source.index("// Host side")]
    text = _strip(source)
    own = defined_names(source) | NOT_CALLS | TYPE_NAMES
    out = []
    for m in re.finditer(r"(\.|->)?\s*\b([A-Za-z_]\w*)\s*(?=[<(])", text):
        name, member, j = m.group(2), bool(m.group(1)), m.end()
        if name in own or (m.start() > 0 and text[m.start() - 1] in "#"):
            continue
        targs: list[str] = []
        if text[j] == "<":
            end = _group(text, j, "<", ">")
            if end >= len(text) or not text[end + 1:].lstrip().startswith("("):
                continue
            targs = split_top(text[j + 1:end])
            j = text.index("(", end)
        pre = text[:m.start()].rstrip()
        if re.search(r"\b(void|bool|int\d*_t|uint\d*_t|float|auto|inline|TEventID|GM_ADDR)$", pre):
            continue  # a declaration, not a call
        end = _group(text, j, "(", ")")
        out.append(Call(name, tuple(targs), tuple(split_top(text[j + 1:end])), member, text.count("\n", 0, m.start()) + 1))
    return out


class ApiTable:
    """The API of one CANN release as the generator and the emulation need it."""

    def __init__(self, data: dict, arch: int = VECTOR_ARCH):
        self.version = data["cann_version"]
        self.source = data["source"]
        self.arch = arch
        self.reserved_workspace = {int(k): v for k, v in data.get("reserved_workspace", {}).items()}
        visible = [f for f in data["functions"] if condition_holds(f["conditions"], arch)]
        self.free: dict[str, list[dict]] = {}
        self.methods: dict[str, list[dict]] = {}
        for f in visible:
            (self.methods if "::" in f["scope"] else self.free).setdefault(f["name"], []).append(f)
        self.classes = {c["name"] for c in data["classes"] if condition_holds(c["conditions"], arch)}
        self.enums: dict[str, set[str]] = {k: set(v) for k, v in BUILTIN_ENUMS.items()}
        for e in data["enums"]:
            if condition_holds(e["conditions"], arch):
                self.enums.setdefault(e["name"], set()).update(e["values"])
        self.macros = {k for k, conds in data["macros"].items() if any(condition_holds([c], arch) for c in conds)}

    @classmethod
    @functools.lru_cache(maxsize=None)
    def load(cls, version: str) -> "ApiTable":
        """The table of CANN ``version`` (one of :data:`SUPPORTED`)."""
        return cls(json.loads((HERE / f"cann-{check_cann(version)}.json").read_text()))

    def has(self, name: str) -> bool:
        return name in self.free or name in self.methods or name in self.macros

    @property
    def reserved_workspace_bytes(self) -> int:
        """``RESERVED_WORKSPACE`` of the target architecture (the system workspace the API keeps)."""
        return self.reserved_workspace.get(self.arch, 0)

    def _enum_problem(self, arg: str, ptype: str) -> str | None:
        m = re.fullmatch(r"(?:AscendC::)?(\w+)::(\w+)", arg.strip())
        if m and m.group(1) in self.enums:
            enum, value = m.groups()
        elif arg.strip() in BUILTIN_ENUMS["pipe_t"] | BUILTIN_ENUMS["event_t"]:
            enum = "pipe_t" if arg.strip().startswith("PIPE_") else "event_t"
            value = arg.strip()
        else:
            return None
        if value not in self.enums.get(enum, ()):
            return f"{enum} has no enumerator {value}"
        base = re.sub(r"\b(const|volatile)\b|[&*\s]", "", ptype)
        if base.split("::")[-1] not in (enum, "T", "U") and not (enum == "event_t" and base in ("int32_t", "TEventID")):
            return f"{arg} passed where the parameter is {ptype}"
        return None

    def _matches(self, f: dict, call: Call) -> str | None:
        params = f["params"]
        required = sum(1 for p in params if p["default"] is None)
        if not required <= len(call.args) <= len(params):
            return f"takes {required}..{len(params)} arguments"
        tparams = [t.split("=")[0].strip() for t in f["template"]]
        if len(call.template_args) > len(tparams):
            return f"takes {len(tparams)} template arguments"
        for arg, tp in zip(call.template_args, tparams):
            problem = self._enum_problem(arg, tp.rsplit(" ", 1)[0] if " " in tp else tp)
            if problem:
                return problem
        for arg, p in zip(call.args, params):
            problem = self._enum_problem(arg, p["type"])
            if problem:
                return problem
        return None

    def problem(self, call: Call) -> str | None:
        """Why ``call`` does not compile against this release (None when an overload matches)."""
        pool = self.methods.get(call.name, []) if call.member else self.free.get(call.name, [])
        if not pool:
            if not call.member and call.name in self.macros:
                return None
            where = "a method of any AscendC class" if call.member else "a function of namespace AscendC"
            return (f"{call.name} is not {where} in CANN {self.version} (asc-devkit "
                    f"{self.source['ref']}, __NPU_ARCH__ {self.arch})")
        why = [self._matches(f, call) for f in pool]
        if None in why:
            return None
        return (f"no overload of {call.name} in CANN {self.version} takes {call}: "
                + "; ".join(sorted(set(w for w in why if w))))

    def problems(self, source: str) -> list[str]:
        """Every call of ``source`` that this release's API does not accept."""
        return [f"line {c.line}: {c}: {p}" for c in calls_in(source) if (p := self.problem(c))]


def emitted_apis(source: str, table: ApiTable) -> set[str]:
    """The AscendC names a kernel source calls (``Name`` or ``.Method``)."""
    return {("." if c.member else "") + c.name for c in calls_in(source) if table.has(c.name)}
