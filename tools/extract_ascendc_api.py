#!/usr/bin/env python3
"""Extract the public AscendC kernel API of one CANN release into a data file.

The oracle of the npu backend (issue 38): the real ``asc-devkit`` headers of a CANN release,
read at a git tag of the public repository (gitcode.com/cann/asc-devkit, mirrored at
github.com/mirror-cann/asc-devkit), reduced to facts - the free functions and class methods of
namespace ``AscendC`` with their template and parameter lists, the enums with their values, the
macros, and ``RESERVED_WORKSPACE`` per architecture - written to
``ascendc_pack/backends/npu/api/cann-<version>.json``. No vendor code is copied.

    python tools/extract_ascendc_api.py --git-dir <asc-devkit>/.git --ref v8.5.0 --version 8.5.0
    python tools/extract_ascendc_api.py --git-dir <asc-devkit>/.git --ref 9.1.0 --version 9.1.0

Headers read: ``include/basic_api/**`` and ``include/kernel_operator.h`` (the public API:
functions and classes), ``include/utils/*.h``, ``impl/basic_api/*.h`` and
``impl/basic_api/utils/*.h`` (class bases, enums, macros, constants; their free functions are
implementation details and are not kept).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ascendc_pack.backends.npu.api.cxxdecl import Api, scan  # noqa: E402

PUBLIC = re.compile(r"^include/(basic_api/.*|kernel_operator)\.h$")
SUPPORT = re.compile(r"^(include/utils/[^/]*|impl/basic_api/[^/]*|impl/basic_api/utils/[^/]*)\.h$")
ARCH_IMPL = {"dav_c220": "2201", "dav_m200": "2002"}
"""Architecture directories of impl/basic_api whose non-``*Impl`` free functions are public API
declared nowhere else (``GetUserWorkspace`` on dav_c220), kept under ``__NPU_ARCH__ == <arch>``."""
OUT_DIR = ROOT / "ascendc_pack" / "backends" / "npu" / "api"


def _git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True,
                          text=True).stdout


def reserved_workspace(text: str) -> dict[str, int]:
    """``RESERVED_WORKSPACE`` bytes per ``__NPU_ARCH__`` from kernel_utils_constants.h."""
    out: dict[str, int] = {}
    arches: list[str] = []
    for line in text.splitlines():
        m = re.match(r"\s*#\s*(?:el)?if\b(.*)", line)
        if m:
            arches = re.findall(r"__NPU_ARCH__\s*==\s*(\d+)", m.group(1))
            continue
        m = re.match(r"\s*constexpr\s+size_t\s+RESERVED_WORKSPACE\s*=\s*([\d\s*]+);", line)
        if m and arches:
            value = 1
            for factor in m.group(1).split("*"):
                value *= int(factor)
            for a in arches:
                out[a] = value
    return out


def extract(git_dir: str, ref: str, version: str) -> dict:
    """The API table of ``ref`` (a tag or branch of asc-devkit) as a JSON-able dict."""
    commit = _git(git_dir, "rev-parse", f"{ref}^{{commit}}").strip()
    files = _git(git_dir, "ls-tree", "-r", "--name-only", commit).splitlines()
    public = Api()
    support = Api()
    extra: dict = {}
    for path in sorted(files):
        if PUBLIC.match(path):
            scan(_git(git_dir, "show", f"{commit}:{path}"), path, public)
        elif (m := re.match(r"^impl/basic_api/(dav_\w+)/[^/]*\.h$", path)) and m.group(1) in ARCH_IMPL:
            arch = scan(_git(git_dir, "show", f"{commit}:{path}"), path)
            known = {f.name for f in public.functions}
            for f in arch.functions:
                if f.scope == "AscendC" and not f.name.endswith("Impl") and f.name not in known:
                    f.conditions.append(f"__NPU_ARCH__ == {ARCH_IMPL[m.group(1)]}")
                    public.functions.append(f)
        elif SUPPORT.match(path):
            text = _git(git_dir, "show", f"{commit}:{path}")
            scan(text, path, support)
            if path.endswith("kernel_utils_constants.h"):
                extra["reserved_workspace"] = reserved_workspace(text)
    classes = {c.name for c in public.classes}
    api = public.to_json()
    # class bases live in impl/: their public methods are part of the classes' API
    api["classes"] += [c.__dict__ | {} for c in support.classes if c.name not in classes]
    api["functions"] += [f.__dict__ | {"params": [p.__dict__ for p in f.params]} for f in support.functions
                         if "::" in f.scope]
    api["enums"] += [e.__dict__ for e in support.enums]
    for name, conds in support.macros.items():
        api["macros"].setdefault(name, []).extend(conds)
    api["functions"].sort(key=lambda f: (f["scope"], f["name"], f["file"], len(f["params"])))
    return {"cann_version": version, "source": {"repository": "asc-devkit", "ref": ref, "commit": commit},
            "extractor": "tools/extract_ascendc_api.py", **extra, **api}


def dumps(data: dict) -> str:
    """JSON with one function, class, enum or macro per line (reviewable diffs between releases)."""
    lines = ["{"]
    keys = list(data)
    for k, key in enumerate(keys):
        value, comma = data[key], "," if k + 1 < len(keys) else ""
        if isinstance(value, list):
            items = [json.dumps(v, ensure_ascii=False, separators=(",", ":")) for v in value]
            lines.append(f" {json.dumps(key)}: [\n  " + ",\n  ".join(items) + f"\n ]{comma}")
        elif key == "macros":
            items = [f"{json.dumps(m)}: {json.dumps(c, ensure_ascii=False)}" for m, c in sorted(value.items())]
            lines.append(f" {json.dumps(key)}: {{\n  " + ",\n  ".join(items) + f"\n }}{comma}")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}{comma}")
    return "\n".join(lines) + "\n}\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--git-dir", required=True, help="the asc-devkit git directory")
    ap.add_argument("--ref", required=True, help="tag or branch, e.g. v8.5.0 or 9.1.0")
    ap.add_argument("--version", required=True, help="the CANN version it belongs to, e.g. 8.5.0")
    ap.add_argument("-o", "--output", help="default: ascendc_pack/backends/npu/api/cann-<version>.json")
    args = ap.parse_args(argv)
    data = extract(args.git_dir, args.ref, args.version)
    out = Path(args.output) if args.output else OUT_DIR / f"cann-{args.version}.json"
    out.write_text(dumps(data))
    print(f"{out}: {len(data['functions'])} functions, {len(data['classes'])} classes, "
          f"{len(data['enums'])} enums, {len(data['macros'])} macros (commit {data['source']['commit'][:10]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
