"""Compile stage: cache layout and keys, warm cache, failures, parallelism, locking, debug."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import platform
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import ascendc_pack.toolchain.compiler as comp
import ascendc_pack.toolchain.cxx as tc
from ascendc_pack.cache import (KernelDir, LockTimeoutError, atomic_write_bytes, atomic_write_text,
                                kernel_lock, stable_hash)
from ascendc_pack.ir.candidate import Candidate
from ascendc_pack.toolchain.compiler import (CandidateSource, KernelBuild, KernelLibraryError, compile_kernels,
                                  describe_library)
from ascendc_pack.config import BuildConfig
from ascendc_pack.errors import CompileError, ConfigError

ROOT = Path(__file__).resolve().parents[1]
NAME = "autofused_add_one_test"
HASH = "a" * 64
N = 1000
IS_X86 = platform.machine() in ("x86_64", "AMD64")

ADD_ONE = textwrap.dedent("""\
    #include <ascendc_pack/kernel_abi.h>
    #include <stdint.h>
    namespace {
    constexpr int64_t N = %(n)d;
    constexpr int64_t TILE = %(tile)d;
    constexpr int32_t BLOCK_DIM = %(block_dim)d;
    const ap_kernel_info kInfo = {AP_KERNEL_ABI_VERSION, "%(name)s", "%(key)s", "%(repr)s",
                                  %(workspace)d, BLOCK_DIM, "", 1, 1};
    }
    extern "C" const ap_kernel_info *ap_kernel_describe(void) { return &kInfo; }
    extern "C" int ap_kernel_launch(void *const *inputs, void *const *outputs, void *workspace,
                                    int32_t max_threads) {
      (void)workspace;
      const float *x = static_cast<const float *>(inputs[0]);
      float *y = static_cast<float *>(outputs[0]);
      int nt = (max_threads > 0 && max_threads < BLOCK_DIM) ? max_threads : BLOCK_DIM;
    #pragma omp parallel for num_threads(nt) schedule(static)
      for (int64_t t = 0; t < (N + TILE - 1) / TILE; ++t) {
        int64_t end = (t + 1) * TILE < N ? (t + 1) * TILE : N;
        for (int64_t i = t * TILE; i < end; ++i) y[i] = x[i] + 1.0f;
      }
      return 0;
    }
    %(extra)s
    """)

CANDIDATES = [Candidate("tile=64", 0, 1), Candidate("tile=128", 0, 2), Candidate("tile=256", 16, 2)]


def source(c: Candidate, name: str = NAME, key: str | None = None, extra: str = "") -> str:
    tile = int(c.tiling_repr.split("=")[1])
    return ADD_ONE % {"n": N, "tile": tile, "block_dim": c.block_dim, "name": name,
                      "key": key or c.kernel_key, "repr": c.tiling_repr, "workspace": c.workspace,
                      "extra": extra}


def build(sources: list[str] | None = None, candidates=CANDIDATES, name=NAME) -> KernelBuild:
    sources = sources or [source(c, name) for c in candidates]
    return KernelBuild(name, HASH, [CandidateSource(c, s) for c, s in zip(candidates, sources)])


def config(tmp_path: Path, jobs: int = 2, debug: bool = False) -> BuildConfig:
    return BuildConfig(cache_dir=tmp_path / "cache", jobs=jobs, debug=debug)


def calls(kernels) -> int:
    """Compiler runs of one compile_kernels call (counted from its results: no global counter)."""
    return comp.CompileCounts.of(kernels).compiler_calls


def launch(so: Path) -> list[float]:
    lib = ctypes.CDLL(str(so))
    x = (ctypes.c_float * N)(*[float(i) / 8 for i in range(N)])
    y = (ctypes.c_float * N)()
    ins = (ctypes.c_void_p * 1)(ctypes.addressof(x))
    outs = (ctypes.c_void_p * 1)(ctypes.addressof(y))
    lib.ap_kernel_launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32]
    assert lib.ap_kernel_launch(ins, outs, None, 0) == 0
    return [y[i] - x[i] for i in range(N)]


# ----------------------------------------------------------------------------- cache helpers


def test_stable_hash_separates_parts():
    assert stable_hash("ab", "c") != stable_hash("a", "bc")
    assert stable_hash("a", "b") == stable_hash("a", "b")
    assert stable_hash(None) != stable_hash("") != stable_hash(b"")
    assert stable_hash(1) != stable_hash("1")
    assert len(stable_hash("x")) == 64
    with pytest.raises(TypeError):
        stable_hash(1.5)


def test_atomic_write_leaves_no_temp_files(tmp_path):
    p = tmp_path / "d" / "f.txt"
    atomic_write_text(p, "one")
    atomic_write_bytes(p, b"two", fsync=True)
    assert p.read_bytes() == b"two"
    assert os.listdir(p.parent) == ["f.txt"]


def test_kernel_lock_timeout_is_a_clear_error(tmp_path):
    holder = kernel_lock(tmp_path / "k")
    with holder:
        with pytest.raises(LockTimeoutError, match=r"timed out after 0.1 s waiting for .*compile.lock"):
            with kernel_lock(tmp_path / "k", timeout=0.1):
                pass
    with kernel_lock(tmp_path / "k", timeout=0.1):
        pass


def test_kernel_dir_layout(tmp_path):
    kd = KernelDir(tmp_path, NAME, HASH)
    base = tmp_path / NAME / HASH
    key = CANDIDATES[0].kernel_key
    assert kd.path == base and kd.lock_path == base / "compile.lock"
    assert kd.optimize_tiling == base / "optimize_tiling" and kd.tuning_json == base / "tuning.json"
    assert kd.kernel_so(key) == base / "static_kernel" / key / "kernel.so"
    assert kd.kernel_cpp(key) == base / "static_kernel" / key / "kernel.cpp"
    for bad in ["../x", "", ".hidden", "a/b"]:
        with pytest.raises(ValueError):
            KernelDir(tmp_path, bad, HASH)
    with pytest.raises(ValueError):
        kd.kernel_so("..")


def test_kernel_build_rejects_duplicate_candidates():
    c = CANDIDATES[0]
    with pytest.raises(ValueError, match="same candidate twice"):
        KernelBuild(NAME, HASH, [CandidateSource(c, "a"), CandidateSource(c, "b")])


# ----------------------------------------------------------------------------- toolchain, keys


def test_compile_flags():
    flags = comp.compile_flags("native")
    inc = comp.runtime_include_dir()
    wide = ["-mprefer-vector-width=512"] if "avx512f" in comp.isa_features("native") else []
    assert flags == ["-O3", *comp.target_flags("native"), *wide, "-std=c++17", "-fPIC", "-shared", "-fopenmp",
                     "-fno-math-errno", "-fno-trapping-math", "-fno-plt", f"-I{inc}"]
    assert (inc / "ascendc_pack" / "kernel_abi.h").is_file()
    assert not any("fast-math" in f for f in flags)
    if IS_X86:  # g++ vectorizes for 256-bit registers on AVX-512 targets unless told otherwise
        assert "-mprefer-vector-width=512" in comp.compile_flags("x86-64-v4")
        assert not any("vector-width" in f for f in comp.compile_flags("x86-64-v3"))


def test_compiler_identity():
    ident = comp.compiler_identity()
    path = ident.split(" ", 1)[0]
    assert os.path.isabs(path) and os.path.realpath(path) == path and len(ident) > len(path) + 1
    with pytest.raises(CompileError, match="not found on PATH"):
        comp.compiler_identity("no-such-compiler-xyz")


@pytest.mark.skipif(not IS_X86, reason="x86 feature names")
def test_native_turns_off_features_the_host_does_not_list(monkeypatch):
    """A hypervisor may hide a CPUID feature from /proc/cpuinfo (seen: rdseed); -march=native
    must not use it, or the runtime refuses every native bundle on the build host itself."""
    tc._target_flags.cache_clear()
    tc._isa_features.cache_clear()
    full = set(comp.isa_features("native"))
    monkeypatch.setattr(tc, "host_cpu_flags", lambda: full - {"avx2", "sse4_1"})
    tc._target_flags.cache_clear()
    tc._isa_features.cache_clear()
    try:
        flags = comp.target_flags("native")
        assert flags[0] == "-march=native" and "-mno-avx2" in flags and "-mno-sse4.1" in flags
        feats = set(comp.isa_features("native"))
        assert "avx2" not in feats and "sse4_1" not in feats and feats <= full
        assert comp.target_flags("x86-64-v3") == ["-march=x86-64-v3"]
    finally:
        tc._target_flags.cache_clear()
        tc._isa_features.cache_clear()

def test_isa_features():
    feats = comp.isa_features("native")
    assert feats == sorted(feats) and all(f == f.lower() for f in feats)
    host = comp.host_cpu_flags()
    if host:
        assert set(feats) <= host, set(feats) - host  # names are /proc/cpuinfo flag names
    if IS_X86:
        v3 = comp.isa_features("x86-64-v3")
        assert {"avx", "avx2", "fma", "f16c", "bmi2"} <= set(v3) and "avx512f" not in v3
        assert "avx2" not in comp.isa_features("x86-64")
    with pytest.raises(ConfigError, match="rejected -march=no-such-arch"):
        comp.isa_features("no-such-arch")


def test_artifact_hash_sensitivity():
    base = comp.artifact_hash("spec", "v1", None, "native")
    assert base == comp.artifact_hash("spec", "v1", None, "native") and len(base) == 64
    others = [comp.artifact_hash("spec2", "v1", None, "native"),
              comp.artifact_hash("spec", "v2", None, "native"),
              comp.artifact_hash("spec", "v1", 1, "native")]
    if IS_X86:
        others.append(comp.artifact_hash("spec", "v1", None, "x86-64-v3"))
    assert len({base, *others}) == len(others) + 1


def test_package_version_is_a_string():
    assert isinstance(comp.package_version(), str) and comp.package_version()


# ----------------------------------------------------------------------------- compile + cache


@pytest.mark.parametrize("jobs", [1, 2])
def test_compile_layout_describe_launch_then_warm_cache(tmp_path, jobs):
    cfg = config(tmp_path, jobs=jobs)
    ticks: list[int] = []
    [ck] = compile_kernels([build()], cfg, progress=ticks.append)
    assert calls([ck]) == 3 and sum(ticks) == 3
    assert comp.CompileCounts.of([ck]) == comp.CompileCounts(compiler_calls=3, cache_hits=0, failures=0)
    base = tmp_path / "cache" / "ascendc" / NAME / HASH
    assert ck.kernel_dir.path == base and (base / "compile.lock").is_file()
    assert [c.candidate for c in ck.candidates] == CANDIDATES
    for cc in ck.candidates:
        key = cc.candidate.kernel_key
        assert cc.ok and cc.compiled and cc.error is None
        assert cc.so_path == base / "static_kernel" / key / "kernel.so" and cc.so_path.stat().st_size > 0
        assert (base / "static_kernel" / key / "kernel.cpp").read_text() == source(cc.candidate)
        info = describe_library(cc.so_path, expected_key=key, expected_name=NAME)
        assert info == {"abi_version": 1, "name": NAME, "kernel_key": key,
                        "tiling_repr": cc.candidate.tiling_repr, "workspace": cc.candidate.workspace,
                        "block_dim": cc.candidate.block_dim, "isa": "", "n_inputs": 1, "n_outputs": 1}
        assert launch(cc.so_path) == [1.0] * N
    assert not list(base.rglob("*.tmp"))

    # warm cache: zero compiler calls, same files
    ticks = []
    [warm] = compile_kernels([build()], cfg, progress=ticks.append)
    assert calls([warm]) == 0 and sum(ticks) == 3
    assert comp.CompileCounts.of([warm]) == comp.CompileCounts(compiler_calls=0, cache_hits=3, failures=0)
    assert [c.so_path for c in warm.candidates] == [c.so_path for c in ck.candidates]
    assert all(c.ok and not c.compiled for c in warm.candidates)

    # a corrupt cached library is detected and rebuilt (only that one)
    atomic_write_bytes(ck.candidates[1].so_path, b"not an ELF file")  # never in place: it is loaded
    [fixed] = compile_kernels([build()], cfg)
    assert calls([fixed]) == 1
    assert [c.compiled for c in fixed.candidates] == [False, True, False]
    assert launch(fixed.candidates[1].so_path) == [1.0] * N


def test_failed_candidate_is_recorded_and_others_compile(tmp_path):
    cfg = config(tmp_path, jobs=2)
    srcs = [source(c) for c in CANDIDATES]
    srcs[1] = srcs[1].replace("return 0;", "return 0 this is not C++;")
    wrong_key = source(CANDIDATES[2], key="0" * 32)   # compiles, but describes the wrong key
    srcs[2] = wrong_key
    [ck] = compile_kernels([build(srcs)], cfg)
    assert comp.CompileCounts.of([ck]) == comp.CompileCounts(compiler_calls=3, cache_hits=0, failures=2)
    ok, bad, mislabeled = ck.candidates
    assert ok.ok and launch(ok.so_path) == [1.0] * N
    assert bad.so_path is None and bad.compiled
    assert "exit code" in bad.error and "command: " in bad.error and "-march=native" in bad.error
    assert "error:" in bad.error  # the compiler's own diagnostics
    kd = ck.kernel_dir
    err_file = kd.compile_error(bad.candidate.kernel_key)
    assert "error:" in err_file.read_text() and not kd.kernel_so(bad.candidate.kernel_key).exists()
    assert mislabeled.so_path is None and "failed validation" in mislabeled.error
    assert "0" * 32 in mislabeled.error and not kd.kernel_so(mislabeled.candidate.kernel_key).exists()
    assert not list(kd.path.rglob("*.tmp"))

    # the same failing sources again: failures come from the cache, zero compiler calls
    [again] = compile_kernels([build(srcs)], cfg)
    assert calls([again]) == 0
    assert [c.compiled for c in again.candidates] == [False, False, False]
    assert again.candidates[1].error == bad.error

    # fixing one source recompiles exactly that candidate and clears its error file
    srcs[1] = source(CANDIDATES[1])
    [fixed] = compile_kernels([build(srcs)], cfg)
    assert calls([fixed]) == 1
    assert fixed.candidates[1].ok and fixed.candidates[1].compiled and not err_file.exists()
    assert [c.ok for c in fixed.ok_candidates] == [True, True]


def test_compile_timeout_is_recorded_and_not_cached(tmp_path):
    cfg = config(tmp_path, jobs=1)
    b = build(candidates=CANDIDATES[:1])
    [ck] = compile_kernels([b], cfg, timeout_s=0.001)
    assert "timed out after 0.001 s" in ck.candidates[0].error
    [ck] = compile_kernels([b], cfg)
    assert calls([ck]) == 1 and ck.candidates[0].ok


def test_missing_compiler_is_a_clear_error(tmp_path):
    with pytest.raises(CompileError, match="'no-such-g\\+\\+' not found on PATH"):
        compile_kernels([build()], config(tmp_path), cxx="no-such-g++")
    assert compile_kernels([], config(tmp_path)) == []


def test_describe_library_errors(tmp_path):
    with pytest.raises(KernelLibraryError, match="cannot load kernel library"):
        describe_library(tmp_path / "missing.so")
    libm = ctypes.util.find_library("m")
    if libm:
        with pytest.raises(KernelLibraryError, match="not an ascendc-pack kernel library"):
            describe_library(libm)


def test_debug_mode_writes_sources_and_commands(tmp_path, monkeypatch):
    cfg = config(tmp_path, jobs=2, debug=True)
    b = build()
    compile_kernels([b], cfg, debug_root=tmp_path / "dbg")
    assert comp.debug_dir_for(NAME, tmp_path / "dbg") == tmp_path / "dbg" / NAME
    for cs in b.candidates:
        d = tmp_path / "dbg" / NAME / cs.candidate.kernel_key
        assert (d / "kernel.cpp").read_text() == cs.source
        cmd = (d / "compile_cmd.txt").read_text()
        assert "-march=native" in cmd and "-fopenmp" in cmd and "kernel.cpp" in cmd and " -o " in cmd
    # default debug root is <cwd>/torch_compile_debug; a warm cache still writes the files
    monkeypatch.chdir(tmp_path)
    assert calls(compile_kernels([b], cfg)) == 0
    d = tmp_path / "torch_compile_debug" / NAME / b.candidates[0].candidate.kernel_key
    assert (d / "kernel.cpp").is_file() and "cache hit" in (d / "compile_cmd.txt").read_text()
    # debug off writes nothing
    monkeypatch.chdir(tmp_path / "cache")
    compile_kernels([b], config(tmp_path, jobs=2))
    assert not (tmp_path / "cache" / "torch_compile_debug").exists()


CHILD = textwrap.dedent("""\
    import json, sys, time
    from pathlib import Path
    import ascendc_pack.toolchain.compiler as comp
    from ascendc_pack.ir.candidate import Candidate
    from ascendc_pack.config import BuildConfig
    spec = json.loads(Path(sys.argv[1]).read_text())
    builds = [comp.KernelBuild(spec["name"], spec["hash"],
              [comp.CandidateSource(Candidate.from_json(c), s) for c, s in spec["candidates"]])]
    cfg = BuildConfig(cache_dir=Path(spec["cache"]), jobs=int(sys.argv[2]))
    Path(sys.argv[3]).touch()
    while not Path(spec["go"]).exists():
        time.sleep(0.005)
    [ck] = comp.compile_kernels(builds, cfg)
    print(json.dumps({"calls": comp.CompileCounts.of([ck]).compiler_calls, "ok": [c.ok for c in ck.candidates],
                      "so": [str(c.so_path) for c in ck.candidates]}))
    """)


def test_two_processes_compile_the_same_kernel_once(tmp_path):
    b = build()
    spec = {"name": b.kernel_name, "hash": b.artifact_hash, "cache": str(tmp_path / "cache"),
            "go": str(tmp_path / "go"),
            "candidates": [[cs.candidate.to_json(), cs.source] for cs in b.candidates]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "runtime"), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "spec.json"), str(jobs),
                               str(tmp_path / f"ready{i}")], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for i, jobs in enumerate([1, 2])]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
            [p.communicate() for p in procs]
        time.sleep(0.01)
    (tmp_path / "go").touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["calls"] for r in results) == [0, 3]  # one compiled, the other reused
    assert all(r["ok"] == [True, True, True] for r in results)
    assert results[0]["so"] == results[1]["so"]
    for so in results[0]["so"]:
        assert launch(Path(so)) == [1.0] * N
