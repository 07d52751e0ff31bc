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
        assert "ascendc_pack.ir.epilogue" in module_closure(build_module) or fam.name == "attention", fam.name
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
