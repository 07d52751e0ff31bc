"""The shape of the code (docs/DESIGN.md §1.2): no import cycle, the stages layered, the runtime
never imports the compiler, no module over the size limit.

Imports are read with ``ast`` from the source, at module level, inside functions and under ``if
TYPE_CHECKING:`` alike (a function-level import only hides a cycle until the function runs; an
annotation-only one is still a dependency a reader and a type checker follow). Not counted: the
registries' ``"module:attr"`` strings (:data:`ascendc_pack.backends.registry.BACKENDS`,
:data:`ascendc_pack.tactics.families.registry.SHIPPED`: plugin tables resolved by name when one is
selected). Importing ``pkg.sub`` does not count as importing ``pkg/__init__.py``: every package
``__init__`` re-exports its submodules, so that edge would make every package one cycle.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"ascendc_pack": ROOT / "ascendc_pack", "ascendc_pack_runtime": ROOT / "runtime" / "ascendc_pack_runtime"}

MAX_LINES = 600
"""docs/DESIGN.md §1.2: no module over ~600 lines (Python modules, C/C++ headers, templates)."""
OVER_LIMIT: dict[str, str] = {}
"""Known exceptions, each with the reason. The test also fails once one of them is back under the
limit, so this table only ever shrinks."""
SIZED = [ROOT / "ascendc_pack", ROOT / "runtime", ROOT / "templates"]
SIZED_SUFFIXES = {".py", ".h", ".hpp", ".j2"}


def module_name(path: Path, package: str, root: Path) -> str:
    parts = [package, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_of(package: str) -> dict[str, Path]:
    root = PACKAGES[package]
    return {module_name(p, package, root): p for p in sorted(root.rglob("*.py"))}


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``module`` imports anywhere in its source (see the docstring
    of this file for what is not counted)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    out: set[str] = set()

    def add(name: str) -> None:
        # the longest known prefix: "a.b.c" (a function of module a.b) counts as a.b
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module:
            out.add(name)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for alias in node.names:
                full = f"{prefix}.{alias.name}"
                add(full if full in known else prefix)  # ``from . import sub`` imports sub
    return out


def import_graph(package: str) -> dict[str, set[str]]:
    mods = modules_of(package)
    known = set(mods)
    return {m: imports_of(m, p, known) for m, p in mods.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan), as a path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_path_in(graph, set(c)) for c in components]


def _path_in(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A closed path through ``comp`` (for the failure message)."""
    start = min(comp)
    path, seen = [start], {start}
    while True:
        nxt = sorted(w for w in graph[path[-1]] if w in comp)
        back = [w for w in nxt if w in seen]
        if back:
            return path[path.index(back[0]):] + [back[0]]
        path.append(nxt[0])
        seen.add(nxt[0])


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycle(package):
    cycles = find_cycles(import_graph(package))
    assert not cycles, "import cycles (break them; docs/DESIGN.md §1.2):\n" + "\n".join(
        " -> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_function_level_cycles(tmp_path):
    """The checker itself: a cycle hidden in a function-level import or under TYPE_CHECKING is
    found, ``from . import sub`` is an import of ``sub``."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n    return a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import x\n")
    (pkg / "d.py").write_text("from .c import y\n")
    mods = {module_name(p, "pkg", pkg): p for p in pkg.rglob("*.py")}
    graph = {m: imports_of(m, p, set(mods)) for m, p in mods.items()}
    assert graph["pkg"] == {"pkg.a"} and graph["pkg.b"] == {"pkg.a"} and graph["pkg.c"] == {"pkg.d"}
    assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"], ["pkg.c", "pkg.d", "pkg.c"]]


# ----------------------------------------------------------------------------- layers

LAYERS = [
    ("errors",), ("cache", "progress"), ("ir",), ("config",), ("toolchain",), ("frontend",), ("passes",),
    ("kernels",), ("autotune",), ("backends",), ("tactics",), ("tune",), ("graph",), ("package",),
    ("pipeline",), ("dynamic",), ("dynamo",), ("cli",), ("bench",),
]
"""The compiler's units (a package of ``ascendc_pack``, or a module at its top) bottom-up: a unit
may import its own modules and those of units in lower layers only. docs/DESIGN.md §1.2 has the
table with what each layer is."""
LEAVES = {"ascendc_pack.backends.registry", "ascendc_pack.tactics.families.registry"}
"""Name tables every layer may read (they import nothing of the compiler but ``errors``)."""
ALLOWED = {("cli", "bench")}
"""Upward edges with a reason: the CLI's ``bench`` subcommand imports the bench when it runs."""


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    rank = {u: i for i, units in enumerate(LAYERS) for u in units}
    rank.update({"__init__": len(LAYERS), "__main__": len(LAYERS)})
    bad = []
    for mod, deps in sorted(graph.items()):
        src = _unit(mod)
        for dep in sorted(deps):
            dst = _unit(dep)
            if dst == src or dep in LEAVES or (src, dst) in ALLOWED:
                continue
            if dst not in rank or src not in rank:
                bad.append(f"{mod} -> {dep}: {dst if dst not in rank else src} is in no layer of LAYERS")
            elif rank[dst] >= rank[src]:
                bad.append(f"{mod} -> {dep}: {src} (layer {rank[src]}) imports {dst} (layer {rank[dst]})")
    return bad


def test_the_stages_are_layered():
    """Each unit imports only lower layers (and the leaf registries): no stage reaches up into a
    later one, and nothing but the CLI's bench command imports the bench."""
    graph = import_graph("ascendc_pack")
    bad = layer_violations(graph)
    assert not bad, "imports against the layers (docs/DESIGN.md §1.2):\n" + "\n".join(bad)
    for leaf in LEAVES:
        assert graph[leaf] <= {"ascendc_pack.errors"}, f"{leaf} must stay a leaf: {graph[leaf]}"
    assert not [m for m, deps in graph.items() if _unit(m) not in ("bench", "cli")
                and any(_unit(d) == "bench" for d in deps)], "shipped code imports the bench"


def test_the_layer_check_finds_an_upward_import():
    graph = {"ascendc_pack.kernels.gemm.generator": {"ascendc_pack.tactics.tune", "ascendc_pack.ir.program"},
             "ascendc_pack.tactics.tune": {"ascendc_pack.tactics.families.registry"},
             "ascendc_pack.autotune.x": {"ascendc_pack.bench.stats"}}
    bad = layer_violations(graph)
    assert len(bad) == 2 and any("kernels (layer 7) imports tactics (layer 10)" in b for b in bad) \
        and any("autotune (layer 8) imports bench" in b for b in bad)


GLOBAL_STATE = {
    "ascendc_pack.passes.meta_layouts._META_MEMO": "each meta-layout question answered once per process",
    "ascendc_pack.frontend.executor._OP_CACHE": "op name -> resolved OpOverload, a pure lookup",
    "ascendc_pack.kernels.target._MEMO": "the host profile, measured once per process",
    "ascendc_pack.tactics.families.registry._registered": "families registered at run time",
    "ascendc_pack.autotune.protocol.contention_clock": "schedstat files kept open between samples",
    "ascendc_pack.autotune.timing_pool._keep": "the timing pool's library stays loaded",
    "ascendc_pack.dynamo.backend.backend": "the torch.compile backend: its live graphs, for counts and "
                                           "torch._dynamo.reset()",
}
"""Every piece of process-global mutable state in the compiler, with its reason (docs/DESIGN.md
§1.2 lists the same)."""


def _global_state() -> set[str]:
    """Module-level names bound to an empty container or to an instance of a private class."""
    out = set()
    for mod, path in modules_of("ascendc_pack").items():
        for node in ast.parse(path.read_text()).body:
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
                node.target if isinstance(node, ast.AnnAssign) else None
            value = getattr(node, "value", None)
            if not isinstance(target, ast.Name) or value is None:
                continue
            empty = isinstance(value, (ast.Dict, ast.List, ast.Set)) and not (
                getattr(value, "keys", None) or getattr(value, "elts", None))
            private_instance = isinstance(value, ast.Call) and isinstance(value.func, ast.Name) \
                and value.func.id.startswith("_") and value.func.id[1:2].isupper()
            if empty or private_instance:
                out.add(f"{mod}.{target.id}")
    return out


def test_process_global_state_is_the_listed_state():
    assert _global_state() == set(GLOBAL_STATE), "process-global state changed: list it (with its reason) in " \
        "GLOBAL_STATE and docs/DESIGN.md §1.2, or remove it"
    design = DESIGN.read_text()
    assert all(name.rpartition(".")[2] in design for name in GLOBAL_STATE)


def test_the_runtime_never_imports_the_compiler():
    """docs/DESIGN.md §1.2: ascendc_pack_runtime runs without ascendc_pack, jinja2, click or a compiler."""
    bad = {}
    for mod, path in modules_of("ascendc_pack_runtime").items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            hits = [n for n in names if n.split(".")[0] in ("ascendc_pack", "jinja2", "click")]
            if hits:
                bad.setdefault(mod, []).extend(hits)
    assert not bad, f"the runtime imports the compiler side: {bad}"


def _sized_files() -> dict[str, int]:
    out = {}
    for base in SIZED:
        for p in sorted(base.rglob("*")):
            if p.is_file() and p.suffix in SIZED_SUFFIXES and "__pycache__" not in p.parts:
                out[p.relative_to(ROOT).as_posix()] = len(p.read_text(errors="replace").splitlines())
    return out


def test_no_module_over_the_size_limit():
    sizes = _sized_files()
    over = {f: n for f, n in sizes.items() if n > MAX_LINES and f not in OVER_LIMIT}
    assert not over, (f"modules over {MAX_LINES} lines (split them into parts of one concern each; "
                      f"docs/DESIGN.md §1.2): {over}")
    back = [f for f in OVER_LIMIT if sizes.get(f, 0) <= MAX_LINES]
    assert not back, f"{back} no longer exceed {MAX_LINES} lines: remove them from OVER_LIMIT"


# ----------------------------------------------------------------------------- design citations

DESIGN = ROOT / "docs" / "DESIGN.md"
CITED_IN = ["README.md", "ascendc_pack", "runtime", "templates", "tests", "bench", "docs", "examples"]
_HEADING = re.compile(r"^#{2,4} (\d+(?:\.\d+)*)\.? ", re.M)
_SECTION = re.compile(r"§(\d+(?:\.\d+)*)")
_STALE = re.compile(r"(?<!docs/)\bDESIGN(?:\.md)?\s*§?\s*\d")


def _citing_files() -> list[Path]:
    out = []
    for name in CITED_IN:
        p = ROOT / name
        files = [p] if p.is_file() else sorted(p.rglob("*"))
        out += [f for f in files if f.is_file() and f.suffix in {".py", ".h", ".hpp", ".j2", ".md", ".cpp", ".sh"}
                and "__pycache__" not in f.parts and f != Path(__file__)]
    return out


def test_design_citations_name_sections_that_exist():
    """Comments and docs cite the architecture as "docs/DESIGN.md §x.y"; every cited section must be
    a heading of docs/DESIGN.md, and no citation of the old, out-of-tree "DESIGN x.y" remains."""
    sections = set(_HEADING.findall(DESIGN.read_text()))
    assert {"1", "2", "2.5", "3.3", "6.3", "8"} <= sections  # the parser reads the headings
    bad = []
    for f in _citing_files():
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            where = f"{f.relative_to(ROOT)}:{n}"
            if _STALE.search(line):
                bad.append(f"{where}: cites a DESIGN section without docs/DESIGN.md: {line.strip()}")
            if "DESIGN.md" in line or f == DESIGN:
                bad += [f"{where}: §{s} is not a section of docs/DESIGN.md" for s in _SECTION.findall(line)
                        if s not in sections]
    assert not bad, "\n".join(bad)


def test_design_lists_every_template_and_shared_header():
    """docs/DESIGN.md §1.2's layout table names every template (its `templates/` row) and every
    header at the top of runtime/include/ascendc_pack/ (its headers row)."""
    rows = {line.split("|")[1].strip(): line for line in DESIGN.read_text().splitlines()
            if line.startswith("| `templates/`") or line.startswith("| `runtime/include/ascendc_pack/`")}
    templates_row, headers_row = rows["`templates/`"], rows["`runtime/include/ascendc_pack/`"]
    missing = [str(p.relative_to(ROOT / "templates")) for p in sorted((ROOT / "templates").rglob("*.j2"))
               if p.name.split(".")[0] not in templates_row and f"{p.parent.name}/*.j2" not in templates_row]
    missing += [p.name for p in sorted((ROOT / "runtime" / "include" / "ascendc_pack").glob("*.h*"))
                if p.name not in headers_row]
    assert not missing, f"docs/DESIGN.md §1.2 does not list {missing}"
