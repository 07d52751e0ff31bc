"""Runtime hardening: verification before any dlopen, host compatibility, the portable -march,
concurrent and crash-safe extraction, and a runtime that needs neither the compiler nor click.

One small example (add_sum) is built per session (plus its x86-64-v2 build); every malformed
bundle is derived from it by tests/runtime_fixtures.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import ascendc_pack_runtime as rt
from ascendc_pack.toolchain.compiler import isa_features
from ascendc_pack.pipeline import compare_outputs
from ascendc_pack_runtime import errors as rt_errors
from ascendc_pack_runtime import host as rt_host
from ascendc_pack_runtime.bundle import open_bundle, verify_bundle
from ascendc_pack_runtime.tools import verify_lines

from .runtime_fixtures import corpus, eager_reference, example, missing_host_feature, pack, parts_of, reg

FIX_WORDS = ("rebuild", "copy the bundle", "upgrade", "install", "raise ", "pass ", "extract", "set ",
             "use ", "unset")


@pytest.fixture(scope="module")
def add_sum(tmp_path_factory):
    return example(tmp_path_factory, "add_sum")


def _cache_entries(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


# ----------------------------------------------------------------------------- the corpus


def test_every_invariant_has_a_typed_error_and_a_corpus_case(add_sum, tmp_path, monkeypatch):
    """Every malformed bundle of the corpus is refused with exactly its error class, whose
    message names the member or field and the fix; refusals before load leave the cache empty
    and are found by verify_bundle too; load-stage refusals never crash the process."""
    cases = corpus(add_sum.bundle)
    # (the trust and cache families concern the policy and the cache, not the bundle's bytes:
    # tests/test_trust.py and tests/test_cache_safety.py have their cases)
    leaves = {c for c in vars(rt_errors).values() if isinstance(c, type) and issubclass(c, rt.BundleError)
              and not c.__subclasses__() and not issubclass(c, (rt.TrustError, rt.CacheError))} - \
        {rt.BundleNotFoundError}
    assert leaves <= {c.expected for c in cases}, f"no corpus case for {leaves - {c.expected for c in cases}}"
    failures = []
    for i, case in enumerate(cases):
        path = tmp_path / f"{i:03d}.ascpack"
        path.write_bytes(case.data)
        cache = tmp_path / f"cache{i:03d}"
        with monkeypatch.context() as mp:
            for k, v in case.env.items():
                mp.setenv(k, v)
            try:
                rt.load(path, cache_dir=cache)
                failures.append(f"{case.name}: loaded")
                continue
            except rt.BundleError as e:
                err = e
            rep = verify_bundle(path)
        problems = []
        if type(err) is not case.expected:
            problems.append(f"raised {type(err).__name__}: {err}")
        named = err.member or err.field
        if named is not None and named[:40] not in str(err) and repr(named)[1:40] not in str(err):
            problems.append(f"message does not name {named!r}: {err}")
        if not err.fix or not any(w in str(err) for w in FIX_WORDS):
            problems.append(f"no fix in {err}")
        if case.before_load:
            if _cache_entries(cache):
                problems.append(f"left {_cache_entries(cache)} in the cache")
            if rep.ok or type(rep.problems[0]) is not case.expected:
                problems.append(f"verify_bundle found {[p.kind for p in rep.problems]}")
        else:
            if not rep.ok:
                problems.append(f"verify_bundle refused a load-stage case: {[p.kind for p in rep.problems]}")
            if [n for n in _cache_entries(cache) if n.startswith(".")]:
                problems.append(f"temporary directories left: {_cache_entries(cache)}")
        if problems:
            failures.append(f"{case.name}: " + "; ".join(problems))
    print(f"\ncorpus: {len(cases)} malformed bundles, {len(cases) - len(failures)} refused as expected")
    assert not failures, "\n".join(failures)
    assert not (tmp_path / "evil").exists() and not Path("/abs/evil").exists()


def test_verify_reports_every_problem(add_sum, tmp_path):
    p = parts_of(add_sum.bundle)
    m = p.member("graph.cpp")
    m[1] = m[1][:10] + b"#" + m[1][11:]                    # hash mismatch
    p.members.append([reg("extra.txt", b"x"), b"x"])      # extra member
    p.members = [x for x in p.members if x[0].name != "tuning.json"]   # missing member
    p.manifest["target"]["isa"].append(missing_host_feature())         # host problem
    bad = tmp_path / "bad.ascpack"
    bad.write_bytes(pack(p))
    rep = verify_bundle(bad)
    assert [type(e) for e in rep.problems] == [rt.MemberHashError, rt.ExtraMemberError, rt.MissingMemberError,
                                               rt.MissingCpuFeaturesError]
    lines, rc = verify_lines(bad)
    assert rc == 1 and len(lines) == 4
    assert lines[0].startswith("MemberHashError: ") and "graph.cpp" in lines[0]
    assert lines[2].startswith("MissingMemberError: ") and "tuning.json" in lines[2]
    lines, rc = verify_lines(add_sum.bundle)
    assert rc == 0 and lines[0].startswith("OK ") and "zstd checksum verified" in lines[0]


# ----------------------------------------------------------------------------- compatibility


def test_isa_refusal_before_any_dlopen(add_sum, tmp_path, monkeypatch):
    """A manifest requiring a CPU feature this host lacks (hashes consistent, so only the ISA
    check can fire) is refused with a message naming the feature and the portable -march,
    before graph.so or any kernel is loaded."""
    feature = missing_host_feature()
    p = parts_of(add_sum.bundle)
    p.manifest["target"]["isa"].append(feature)
    bad = tmp_path / "isa.ascpack"
    bad.write_bytes(pack(p.resign()))

    def no_dlopen(*a, **k):
        raise AssertionError("dlopen attempted")

    monkeypatch.setattr(torch.ops, "load_library", no_dlopen)
    with pytest.raises(rt.MissingCpuFeaturesError) as ei:
        rt.load(bad, cache_dir=tmp_path / "cache")
    assert feature in str(ei.value) and "--march x86-64-v2" in str(ei.value) and ei.value.field == "target.isa"
    assert _cache_entries(tmp_path / "cache") == []
    assert [type(e) for e in verify_bundle(bad).problems] == [rt.MissingCpuFeaturesError]


def test_portable_march_records_only_its_features_and_loads_on_a_lesser_host(add_sum, tmp_path_factory,
                                                                           tmp_path, monkeypatch):
    v2 = example(tmp_path_factory, "add_sum", march="x86-64-v2")
    m = v2.report.manifest
    if m["target"]["arch"] != "x86_64":
        pytest.skip("x86-64 only")
    v2_flags = isa_features("x86-64-v2")
    assert m["target"]["march"] == "x86-64-v2" and m["target"]["isa"] == v2_flags
    assert not {"avx", "avx2", "fma", "avx512f"} & set(v2_flags)
    assert "-march=x86-64-v2" in m["graph"]["flags"]          # graph.so built for the same target
    native = add_sum.report.manifest
    assert f"-march={native['target']['march']}" in native["graph"]["flags"]

    if shutil.which("objdump"):  # no AVX register anywhere in the portable bundle's code
        ex = open_bundle(v2.bundle, cache_dir=tmp_path / "c0")
        for so in [ex.directory / "graph.so", *(ex.directory / k["file"] for k in m["kernels"])]:
            dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(so)], capture_output=True,
                                 text=True).stdout
            assert "%ymm" not in dis and "%zmm" not in dis, f"{so.name} uses AVX registers"

    # simulate a host that has exactly the x86-64-v2 features
    monkeypatch.setattr(rt_host, "host_cpu_flags", lambda: frozenset(v2_flags))
    inputs, expected = eager_reference(v2)
    model = rt.load(v2.bundle, cache_dir=tmp_path / "c1")
    assert compare_outputs(expected, model(*inputs), atol=1e-3, rtol=1e-4) is None
    extra = sorted(set(native["target"]["isa"]) - set(v2_flags))
    if extra:  # a -march=native bundle from this (richer) host is refused there, never SIGILL
        with pytest.raises(rt.MissingCpuFeaturesError, match=extra[0]):
            rt.load(add_sum.bundle, cache_dir=tmp_path / "c2")


# ----------------------------------------------------------------------------- processes

_BLOCKER = textwrap.dedent("""
    import importlib.abc, sys
    BLOCKED = ("ascendc_pack", "jinja2", "click")

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is blocked in this test")
            return None

    sys.meta_path.insert(0, Blocker())
    for blocked in BLOCKED:
        try:
            __import__(blocked)
        except ImportError:
            pass
        else:
            raise SystemExit(f"{blocked} is still importable")
""")

_CHILD = _BLOCKER + textwrap.dedent("""
    import json, os, time
    import torch
    import ascendc_pack_runtime as rt

    bundle, cache, ref, start = sys.argv[1:5]
    ref = torch.load(ref)
    while not os.path.exists(start):      # start together
        time.sleep(0.005)
    t0 = time.time()
    model = rt.load(bundle, cache_dir=cache)
    got = model(*[t.clone() for t in ref["inputs"]])
    ok = bool(torch.allclose(got, ref["expected"], atol=1e-3, rtol=1e-4))
    forbidden = sorted(m for m in sys.modules if m.split(".")[0] in ("ascendc_pack", "jinja2", "click"))
    print(json.dumps({"extracted": model.extracted, "dir": str(model.directory), "correct": ok,
                      "seconds": time.time() - t0, "forbidden": forbidden,
                      "inode": os.stat(model.directory).st_ino}))
""")


def _env(tmp_path: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCENDC_PACK_RUNTIME_")}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def test_eight_processes_load_at_once_extract_once_without_compiler_packages(add_sum, tmp_path):
    inputs, expected = eager_reference(add_sum)
    torch.save({"inputs": inputs, "expected": expected}, tmp_path / "ref.pt")
    (tmp_path / "child.py").write_text(_CHILD)
    cache, start = tmp_path / "cache", tmp_path / "start"
    procs = [subprocess.Popen([sys.executable, str(tmp_path / "child.py"), str(add_sum.bundle), str(cache),
                               str(tmp_path / "ref.pt"), str(start)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=_env(tmp_path), cwd=tmp_path)
             for _ in range(8)]
    time.sleep(0.5)
    start.write_text("go")
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["correct"] for r in results)
    assert all(r["forbidden"] == [] for r in results)
    assert sum(r["extracted"] for r in results) == 1, results     # exactly one extraction
    assert len({r["dir"] for r in results}) == 1 and len({r["inode"] for r in results}) == 1
    assert _cache_entries(cache) == [Path(results[0]["dir"]).name]   # no temporary leftovers


_PAUSED_CHILD = _BLOCKER + textwrap.dedent("""
    import os, pathlib, time
    import ascendc_pack_runtime as rt
    from ascendc_pack_runtime import extract

    bundle, cache, flag = sys.argv[1:4]
    finish = extract._DirectorySink.finish

    def pause_after_graph_cpp(self, name):   # monkeypatched: no hook in the shipped code
        finish(self, name)
        if name == "graph.cpp":
            pathlib.Path(flag).write_text(str(os.getpid()))
            time.sleep(600)

    extract._DirectorySink.finish = pause_after_graph_cpp
    rt.load(bundle, cache_dir=cache)
""")


def test_killed_extraction_is_never_trusted_and_is_recovered(add_sum, tmp_path):
    """SIGKILL a process paused half-way through extraction (the child monkeypatches the
    extraction to pause): the partial tree is never used; the next load extracts again, removes
    the leftover and runs correctly."""
    cache, flag = tmp_path / "cache", tmp_path / "paused"
    (tmp_path / "paused_child.py").write_text(_PAUSED_CHILD)
    env = _env(tmp_path)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "paused_child.py"), str(add_sum.bundle), str(cache),
                             str(flag)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not flag.exists():
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.time() < deadline, "the extraction never reached the pause"
            time.sleep(0.05)
        partial = [p for p in cache.iterdir() if p.name.startswith(".tmp-")]
        assert len(partial) == 1 and (partial[0] / "graph.so").is_file()
        assert not (partial[0] / "tuning.json").exists()          # half-way indeed
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".")] == []   # nothing trusted

    model = rt.load(add_sum.bundle, cache_dir=cache)           # the lock died with the process
    assert model.extracted
    inputs, expected = eager_reference(add_sum)
    assert compare_outputs(expected, model(*inputs), atol=1e-3, rtol=1e-4) is None
    assert _cache_entries(cache) == [model.directory.name]      # the leftover was removed

    # a directory in place without the verified marker (e.g. copied by hand) is not trusted either
    (model.directory / rt.bundle.VERIFIED_MARKER).unlink()
    again = open_bundle(add_sum.bundle, cache_dir=cache)
    assert again.extracted and (again.directory / rt.bundle.VERIFIED_MARKER).is_file()
    assert _cache_entries(cache) == [model.directory.name]
