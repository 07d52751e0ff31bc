"""The npu backend against the real AscendC API (issue 38): the tables of
``ascendc_pack/backends/npu/api/cann-<version>.json``, extracted from asc-devkit's headers at
the CANN release tags (tools/extract_ascendc_api.py), are the oracle.

(a) Every AscendC call in every kernel the generator writes - every case of the npu parity
    list, every candidate kind (row resident/streaming, split with SyncAll, col), for CANN 8.5.0
    and 9.1.0 - exists in that release for NPU architecture 2201, with an overload taking that
    many arguments and each enum argument on a parameter of that enum type.
(b) The emulation's API (its headers after the preprocessor, per ``-DASCENDC_CANN_VERSION``) is a
    subset of the release's: every function and method it declares exists there with a
    compatible arity, and every API it refuses (a static_assert naming the release) is one the
    release lacks.

The APIs the generator emits per release are listed in docs/NPU.md; a test keeps that list true.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from ascendc_pack.backends.npu.api import SUPPORTED, ApiTable, emitted_apis, version_number
from ascendc_pack.backends.npu.api.cxxdecl import scan
from ascendc_pack.backends.npu.layout import Unsupported
from ascendc_pack.backends.npu.tiling import propose
from ascendc_pack.backends.npu.toolchain import emu_include_dir
from ascendc_pack.frontend.capture import capture
from ascendc_pack.passes.fuse import fuse
from tests.kernel_check import Fn
from tests.npu_check import check_npu, source_of, target
from tests.test_npu_parity import NPU_CASES

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "NPU.md"


@pytest.fixture(scope="module")
def specs():
    """Every fused kernel spec of the npu parity list with every candidate kind the cost model
    proposes (topn 10)."""
    out = []
    for c in NPU_CASES:
        fused = fuse(capture(Fn(c.fn), tuple(t.clone() for t in c.inputs)).model)
        for step in fused.program.fused_steps():
            try:
                tilings = propose(step.kernel, target(), 10)
            except Unsupported:
                continue
            kinds = {}
            for t in tilings:
                kinds.setdefault((t.params["mode"], t.params["resident"], t.params["buf"]), t)
            out += [(c.id, step.kernel, t) for t in kinds.values()]
    return out


@pytest.fixture(scope="module")
def sources(specs):
    """version -> [(case id, device source)] (the kernel as BiSheng would compile it)."""
    return {v: [(cid, source_of(spec, t, cann=v, emulate=False)) for cid, spec, t in specs] for v in SUPPORTED}


def test_the_corpus_covers_every_kernel_kind(specs):
    modes = {(t.params["mode"], t.params["resident"]) for _, _, t in specs}
    assert {("row", True), ("row", False), ("split", False), ("col", False)} <= modes, modes


@pytest.mark.parametrize("version", SUPPORTED)
def test_every_emitted_call_exists_in_the_targeted_cann(sources, version):
    """(a): asc-devkit v8.5.0 / 9.1.0 declare every call with a matching parameter list."""
    table = ApiTable.load(version)
    problems = {}
    for cid, src in sources[version]:
        for p in table.problems(src):
            problems.setdefault(p.split(": ", 1)[1], cid)
    assert not problems, "\n".join(f"{cid}: {p}" for p, cid in list(problems.items())[:20])


def test_the_check_fails_on_what_a_release_lacks(sources):
    """The oracle is not vacuous: a CANN 9.1 kernel (Compares) is refused by the 8.5.0 table, a
    wrong enum or arity by either."""
    v85, v91 = ApiTable.load("8.5.0"), ApiTable.load("9.1.0")
    with_compares = next(src for _, src in sources["9.1.0"] if "Compares(" in src)
    assert any("Compares is not a function of namespace AscendC in CANN 8.5.0" in p for p in v85.problems(with_compares))
    assert v91.problems("void f() { Select(a, m, b, c, CMPMODE::EQ, 64); }")  # SELMODE expected
    assert v91.problems("void f() { Exp(a, b); }")                               # no 2-argument Exp
    assert v85.problems("void f() { SetFlag<HardEvent::V_X>(e); }")              # no such enumerator


def test_no_compares_for_cann_8_and_every_syncall_kernel_is_mix(sources):
    """The faults of issue 38 stay fixed in every generated kernel."""
    for version in SUPPORTED:
        for cid, src in sources[version]:
            body = src[:src.index("// Host side")] if "// Host side" in src else src
            assert ("Compares(" in body) is False or version_number(version) >= 90000, (version, cid)
            if version_number(version) < 90000:
                assert "Compares(" not in body
            if "SyncAll();" in body:
                assert "KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIV_1_0);" in body, cid
            assert "GetUserWorkspace(workspace)" not in body and "EVENT_ID0" not in body, cid
            assert not re.search(r"TQue<QuePosition::\w+, (?!1>)", body), cid
            assert "PipeBarrier<PIPE_V>();" in body, cid


def emitted_by_version(sources) -> dict[str, list[str]]:
    return {v: sorted(set().union(*(emitted_apis(src, ApiTable.load(v)) for _, src in sources[v])))
            for v in SUPPORTED}


def test_docs_list_the_emitted_apis_per_version(sources):
    """docs/NPU.md's list of emitted APIs per release is what the generator emits."""
    text = DOC.read_text()
    for version, names in emitted_by_version(sources).items():
        m = re.search(rf"^Emitted for CANN {re.escape(version)}: (.*)$", text, re.M)
        assert m, f"docs/NPU.md lacks the line 'Emitted for CANN {version}: ...'"
        assert m.group(1).strip().rstrip(".").split(", ") == names, (version, names)


# ------------------------------------------------------------------------------- (b) emulation

def _emulation_api(version: str):
    if shutil.which("g++") is None:
        pytest.skip("needs g++ to preprocess the emulation's headers")
    pre = subprocess.run(["g++", "-std=c++17", "-E", "-P", f"-DASCENDC_CANN_VERSION={version_number(version)}",
                          f"-I{emu_include_dir()}", "-x", "c++", str(emu_include_dir() / "kernel_operator.h")],
                         capture_output=True, text=True, check=True).stdout
    api = scan(pre, "ascendc_emu", global_scope=False)
    public = [f for f in api.functions if "detail" not in f.scope and not f.name.startswith("emu_")
              and f.name != f.scope.rsplit("::", 1)[-1]]  # constructors: not called by name
    refused = {f.name for f in public if len(f.params) == 1 and f.params[0].type.endswith("&&...")}
    return [f for f in public if f.name not in refused], refused


@pytest.mark.parametrize("version", SUPPORTED)
def test_emulation_api_is_a_subset_of_the_release(version):
    """(b): every function and method the emulation declares for CANN <version> is declared by
    that release with an overload whose arity range meets the emulation's."""
    table = ApiTable.load(version)
    functions, _ = _emulation_api(version)
    assert len(functions) > 80
    missing = []
    for f in functions:
        member = "::" in f.scope
        pool = (table.methods if member else table.free).get(f.name, [])
        lo, hi = f.required, len(f.params)
        if not any(sum(p["default"] is None for p in g["params"]) <= hi and lo <= len(g["params"]) for g in pool):
            missing.append(f"{f.scope}::{f.name}({', '.join(p.type for p in f.params)})")
    assert not missing, f"the emulation has API CANN {version} lacks: " + "; ".join(sorted(set(missing)))


@pytest.mark.parametrize("version", SUPPORTED)
def test_emulation_refuses_exactly_what_the_release_lacks(version):
    table = ApiTable.load(version)
    _, refused = _emulation_api(version)
    assert refused, "the emulation refuses nothing for this release"
    assert all(name not in table.free for name in refused), refused
    other = [v for v in SUPPORTED if v != version]
    assert all(any(name in ApiTable.load(v).free for v in other) for name in refused), refused


def test_cann_9_1_kernels_run_in_the_emulation(tmp_path):
    """Kernels generated for 9.1 (Compares, no WholeReduce*) compile against the 9.1 emulation
    and match eager."""
    for cid in ("clamp-where-f16", "compare-f32", "unary-bf16"):
        c = next(c for c in NPU_CASES if c.id == cid)
        report = check_npu(c.fn, [t.clone() for t in c.inputs], tmp_path, cann="9.1.0")
        assert not report.failures, report.failures[:3]
        assert report.npu_kernels == report.fused_kernels >= 1


def test_tables_pin_their_sources():
    for version in SUPPORTED:
        table = ApiTable.load(version)
        assert table.version == version and re.fullmatch(r"[0-9a-f]{40}", table.source["commit"])
        assert table.reserved_workspace_bytes == 16 * 1024 * 1024  # RESERVED_WORKSPACE, __NPU_ARCH__ 2201
    assert ApiTable.load("8.5.0").source["ref"] == "v8.5.0" and ApiTable.load("9.1.0").source["ref"] == "9.1.0"
    assert "Compares" not in ApiTable.load("8.5.0").free and "Compares" in ApiTable.load("9.1.0").free
    assert "WholeReduceSum" in ApiTable.load("8.5.0").free and "WholeReduceSum" not in ApiTable.load("9.1.0").free
    assert torch is not None
