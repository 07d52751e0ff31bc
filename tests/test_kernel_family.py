"""The generated-kernel family base (ascendc_pack/kernels/family.py): tilings, and versions that
cover every module and table a kernel's render reads - so an edit never leaves a stale kernel in
the cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from ascendc_pack.kernels.family import Tiling, generator_version, module_closure, template_closure
from ascendc_pack.kernels.fused.codegen import template_env
from ascendc_pack.tactics.families import registry

ROOT = Path(__file__).resolve().parents[1]

COMPILE_ONE_GEMM = textwrap.dedent("""
    import json, sys
    import ascendc_pack
    from ascendc_pack.config import BuildConfig
    from ascendc_pack.kernels.gemm.generator import GemmSpec, compile_gemms
    spec = GemmSpec("gemm_stale", 8, 16, 32, 1, "float32", None, (0, 1, 32), True, False, ("relu",))
    [b] = compile_gemms([spec], BuildConfig.resolve(topn=1, cache_dir=sys.argv[1], jobs=1))
    print(json.dumps({"package": ascendc_pack.__file__, "ahash": b.build.artifact_hash,
                      "compiled": [c.compiled for c in b.compiled.candidates],
                      "source": b.build.candidates[0].source}))
""")


def _compile(src: Path, cache: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    run = subprocess.run([sys.executable, "-c", COMPILE_ONE_GEMM, str(cache)], capture_output=True, text=True,
                         env=env, cwd=src, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["package"].startswith(str(src)), out["package"]   # the copy ran, not the checkout
    return out


def test_editing_the_epilogue_table_rebuilds_the_cached_kernel(tmp_path):
    """The GEMM's render reads relu's C statement from ir/epilogue.py (not the generator's own
    module): edit that table in a copy of the package and the cached kernel is compiled again."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "ascendc_pack", src / "ascendc_pack", ignore=shutil.ignore_patterns("__pycache__"))
    cache = tmp_path / "cache"
    cold, warm = _compile(src, cache), _compile(src, cache)
    assert cold["compiled"] == [True] and warm["compiled"] == [False] and warm["ahash"] == cold["ahash"]
    table = src / "ascendc_pack" / "ir" / "epilogue.py"
    relu = 'c="v = v < 0.0f ? 0.0f : v;"'
    assert relu in table.read_text()
    table.write_text(table.read_text().replace(relu, 'c="v = v < 0.0f ? 0.0f : v; /* edited */"'))
    edited = _compile(src, cache)
    assert "/* edited */" in edited["source"]
    assert edited["ahash"] != cold["ahash"] and edited["compiled"] == [True]


def test_every_generator_version_covers_the_epilogue_table_and_its_templates():
    for fam in registry.families():
        build_module = type(fam).__module__
        assert "ascendc_pack.ir.epilogue" in module_closure(build_module) or fam.kinds == ("attention",), fam.name  # attention: no epilogue
    for module in ("ascendc_pack.kernels.gemm.generator", "ascendc_pack.kernels.conv.direct",
                   "ascendc_pack.kernels.conv.depthwise", "ascendc_pack.kernels.conv.winograd"):
        assert "ascendc_pack.ir.epilogue" in module_closure(module), module
    assert "ascendc_pack.kernels.conv.direct" in module_closure("ascendc_pack.kernels.conv.winograd")
    assert "kernel/_common.j2" in template_closure(template_env(), "kernel/gemm.cpp.j2")
    a = generator_version("gemm", "ascendc_pack.kernels.gemm.generator", "kernel/gemm.cpp.j2")
    assert a.startswith("gemm-v1-") and a != generator_version("gemm", "ascendc_pack.kernels.conv.direct",
                                                               "kernel/gemm.cpp.j2")


@dataclass(frozen=True)
class _Toy(Tiling):
    mr: int
    bd: int
    pack: str

    kind = "toy"


def test_a_tiling_round_trips_its_repr_and_names_a_bad_one():
    t = _Toy(4, 2, "load")
    assert t.tiling_repr == "bd=2;mr=4;pack=load" and _Toy.parse(t.tiling_repr) == t
    with pytest.raises(ValueError, match="not a toy tiling: 'bd=2;mr=x;pack=load'"):
        _Toy.parse("bd=2;mr=x;pack=load")
    with pytest.raises(ValueError, match="not a toy tiling"):
        _Toy.parse("bd=2")


# --- the host profile (ascendc_pack/kernels/target.py) ----------------------------------------

from ascendc_pack.kernels import target as target_mod  # noqa: E402
from ascendc_pack.kernels.target import FALLBACK, CpuTarget, HostProfile, host_profile  # noqa: E402


def test_the_host_profile_is_measured_for_real():
    profile, _quiet = target_mod.measure("native", 8, 1 << 20)
    assert profile.source.startswith("measured") and profile.ghz > 0 and profile.mem_gbps > 0 \
        and profile.l2_gbps > 0


def test_the_host_profile_is_kept_per_host_and_a_busy_measurement_is_not(tmp_path, monkeypatch, caplog):
    calls = []
    quiet = {"now": True}

    def fake_measure(march, lanes, l2):   # the counting stands in for the 0.3 s measurement
        calls.append(march)
        return HostProfile(2.5, 15.0, 70.0, "measured test"), quiet["now"]

    monkeypatch.setattr(target_mod, "measure", fake_measure)
    monkeypatch.setattr(target_mod, "_MEMO", {})
    first = host_profile("native", 8, 1 << 20, tmp_path)
    (kept,) = (tmp_path / "ascendc" / "host_profile").iterdir()
    monkeypatch.setattr(target_mod, "_MEMO", {})
    assert host_profile("native", 8, 1 << 20, tmp_path) == first == HostProfile(2.5, 15.0, 70.0, "measured test")
    assert len(calls) == 1                                     # read back, not measured again
    assert host_profile("x86-64-v2", 4, 1 << 20, tmp_path) == first and len(calls) == 2   # another target: its own
    kept.write_text("{broken")
    monkeypatch.setattr(target_mod, "_MEMO", {})
    host_profile("native", 8, 1 << 20, tmp_path)
    assert len(calls) == 3 and "unusable" in caplog.text       # a corrupt entry is measured again
    quiet["now"] = False
    other = tmp_path / "busy"
    monkeypatch.setattr(target_mod, "_MEMO", {})
    assert host_profile("native", 8, 1 << 20, other) == FALLBACK   # busy: the fallback, and nothing kept
    assert not (other / "ascendc" / "host_profile").exists()
    t = CpuTarget.detect(2, "native", caches={"L2": 1 << 20}, cache_dir=tmp_path)
    assert t.ghz == t.profile.ghz and t.mem_gbps == t.profile.mem_gbps
