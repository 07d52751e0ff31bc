"""Work bounded by real resources (issue 14, part 3): hostile bundles that cost time, disk or
memory out of proportion to their size, and manifests that lie consistently, are refused early
with typed errors, nothing written outside (or left in) the cache; the C++ reader uses the same
bounds with overflow-checked arithmetic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ascendc_pack_runtime as rt
from ascendc_pack_runtime import extract
from ascendc_pack_runtime.bundle import open_bundle

from .runtime_fixtures import example, pack, parts_of, refix_marker, reg, run_bundle_binary


@pytest.fixture(scope="module")
def add_sum(tmp_path_factory):
    return example(tmp_path_factory, "add_sum")


@pytest.fixture(scope="module")
def inplace(tmp_path_factory):
    return example(tmp_path_factory, "inplace")


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _refused(path: Path, cache: Path, expected: type, **kw) -> rt.BundleError:
    with pytest.raises(expected) as ei:
        rt.load(path, cache_dir=cache, **kw)
    assert not cache.exists() or [p.name for p in cache.iterdir()] == [], "the refusal left files in the cache"
    assert [type(p) for p in rt.verify_bundle(path).problems][:1] == [expected]
    return ei.value


def test_declared_size_out_of_proportion_to_the_file_is_refused_before_reading(add_sum, tmp_path, monkeypatch):
    """60 GiB declared (under the 64 GiB cap) in a small file, and real zeros 290 times the
    file's size (with the ratio cap lowered to 100): refused from the manifest, before any
    member is decompressed."""
    p = parts_of(add_sum.bundle)
    p.manifest["members"]["tuning.json"]["size"] = 60 << 30
    err = _refused(_write(tmp_path, "declared.ascpack", pack(p)), tmp_path / "c1", rt.SizeLimitError)
    assert "ratio" in str(err) and rt.constants.MAX_RATIO_ENV in str(err)

    zeros = b"\0" * (16 << 20)
    p = parts_of(add_sum.bundle)
    p.members.append([reg("zeros.bin", zeros), zeros])
    bomb = pack(p.resign())
    assert len(bomb) * 100 < len(zeros)
    monkeypatch.setenv(rt.constants.MAX_RATIO_ENV, "100")
    _refused(_write(tmp_path, "bomb.ascpack", bomb), tmp_path / "c2", rt.SizeLimitError)
    monkeypatch.setenv(rt.constants.MAX_RATIO_ENV, str(1 << 20))   # a trusted bundle: raise the cap
    assert rt.verify_bundle(tmp_path / "bomb.ascpack").ok


def test_free_space_is_checked_before_extraction(add_sum, tmp_path, monkeypatch):
    real = os.statvfs

    class Full:
        def __init__(self, path):
            st = real(path)
            self.f_frsize, self.f_bavail = st.f_frsize, 10

    monkeypatch.setattr(extract.os, "statvfs", Full)
    cache = tmp_path / "cache"
    with pytest.raises(rt.CacheSpaceError) as ei:
        rt.load(add_sum.bundle, cache_dir=cache)
    assert "free" in str(ei.value) and ei.value.fix
    assert [p.name for p in cache.iterdir()] == []        # not even a temporary directory


_VERIFY_CHILD = textwrap.dedent("""
    import json, sys, time
    import ascendc_pack_runtime as rt
    t0 = time.perf_counter()
    rep = rt.verify_bundle(sys.argv[1])
    t1 = time.perf_counter()
    try:
        rt.load(sys.argv[1], cache_dir=sys.argv[2])
        load = "loaded"
    except rt.BundleError as e:
        load = type(e).__name__
    print(json.dumps({"verify_s": t1 - t0, "load_s": time.perf_counter() - t1, "ok": rep.ok,
                      "problems": [p.kind for p in rep.problems], "members": rep.members_checked, "load": load}))
""")


def test_member_name_checks_are_linear(add_sum, tmp_path):
    """3,900 member names of 2,048 path components each (a ~100 KB bundle): verify finishes in
    seconds (a quadratic prefix walk took minutes); extracting them is refused as a typed error
    (the paths are longer than the file system allows), leaving nothing behind."""
    chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    lasts = [*chars, *(a + b for a in chars for b in chars)][:3900]
    names = ["c/" * 2047 + last for last in lasts]
    assert all(len(n) <= 4096 and n.count("/") == 2047 for n in names)
    p = parts_of(add_sum.bundle)
    p.members += [[reg(n, b"x"), b"x"] for n in names]
    bundle = _write(tmp_path, "deep.ascpack", pack(p.resign()))
    cache = tmp_path / "cache"
    child = _write(tmp_path, "child.py", _VERIFY_CHILD.encode())
    # a hang guard, not a timing assertion: the quadratic check did not finish in 150 s
    proc = subprocess.run([sys.executable, str(child), str(bundle), str(cache)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"\n{len(names)} names x 2,048 components ({bundle.stat().st_size} bytes): verify {res['verify_s']:.2f} s, "
          f"load {res['load_s']:.2f} s ({res['load']}); load average {os.getloadavg()[0]:.1f}")
    assert res["ok"] and res["members"] == len(names) + 5
    assert res["load"] == "UnsafeMemberNameError"
    assert [q.name for q in cache.iterdir()] == []


def _with_weights(bundle: Path):
    """The bundle's parts with two float32[16] weights at offsets 0 and 64 of a 128-byte
    weights.bin (consistent: it verifies; graph.so would refuse the weight count at load)."""
    p = parts_of(bundle)
    p.manifest["weights"]["tensors"] = [
        {"name": f"w{i}", "fqn": f"w{i}", "dtype": "float32", "shape": [16], "stride": [1], "offset": 64 * i,
         "nbytes": 64} for i in range(2)]
    p.member("weights.bin")[1] = bytes(range(128))
    return p.resign()


def test_consistent_lies_are_cross_checked(inplace, tmp_path):
    """Well-typed, hash-consistent manifests that would change results are refused at verify."""
    assert rt.verify_bundle(_write(tmp_path, "weights.ascpack", pack(_with_weights(inplace.bundle)))).ok
    cases = []
    p = parts_of(inplace.bundle)
    p.manifest["outputs"][0]["input_index"] = 1                     # input 1 (bias) is not mutated
    cases.append(("input_index", pack(p), "outputs[0].input_index"))
    p = parts_of(inplace.bundle)
    p.manifest["mutations"][0]["index"] = 1                         # x is input 0
    cases.append(("mutation_index", pack(p), "mutations[0].index"))
    p = _with_weights(inplace.bundle)
    p.manifest["weights"]["tensors"][1]["offset"] = 0               # both weights share bytes
    cases.append(("overlap", pack(p), "weights.tensors[1].offset"))
    p = _with_weights(inplace.bundle)
    p.manifest["weights"]["tensors"][0]["offset"] = 4               # not 64-byte aligned
    cases.append(("misaligned", pack(p), "weights.tensors[0].offset"))
    for label, data, field in cases:
        err = _refused(_write(tmp_path, f"{label}.ascpack", data), tmp_path / f"c_{label}", rt.ManifestFieldError)
        assert err.field == field, (label, err)


def test_huge_integers_are_field_errors_not_corruption(add_sum, tmp_path):
    p = parts_of(add_sum.bundle)
    text = json.dumps(p.manifest, indent=1).replace('"topn": 1', '"topn": ' + "7" * 5000)
    p.manifest_bytes = text.encode()
    err = _refused(_write(tmp_path, "digits.ascpack", pack(p)), tmp_path / "c", rt.ManifestFieldError)
    assert err.field == "topn" and "5000 digits" in str(err)


# ----------------------------------------------------------------------------- C++


@pytest.fixture(scope="module")
def binary(tmp_path_factory) -> Path:
    return run_bundle_binary(tmp_path_factory)


def test_cpp_bounds_are_the_python_bounds(binary, inplace, tmp_path):
    """Shapes and strides that would overflow a 64-bit span are typed refusals naming the field
    (the process survives); so are the consistent lies Python refuses. The manifest is edited
    inside an extraction with the marker fixed up, as an attacker who can write the cache would."""
    ex = open_bundle(_write(tmp_path, "weights.ascpack", pack(_with_weights(inplace.bundle))),
                     cache_dir=tmp_path / "cache")
    original = (ex.directory / "manifest.json").read_text()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCENDC_PACK_RUNTIME_")}
    edits = [
        (lambda m: m["weights"]["tensors"][0].update(shape=[2**62 + 1], stride=[1]), "weights.tensors[0].shape[0]"),
        (lambda m: m["weights"]["tensors"][0].update(shape=[2**47, 2**47], stride=[2**47, 1]),
         "weights.tensors[0]"),
        (lambda m: m["inputs"][0].update(shape=[2**48]), "inputs[0].shape[0]"),
        (lambda m: m["members"]["weights.bin"].update(size=2**63 + 5), "members['weights.bin'].size"),
        (lambda m: m["outputs"][0].update(input_index=1), "outputs[0].input_index"),
        (lambda m: m["weights"]["tensors"][0].update(offset=m["weights"]["tensors"][0]["offset"] + 4),
         "weights.tensors[0].offset"),
    ]
    for edit, field in edits:
        doc = json.loads(original)
        edit(doc)
        (ex.directory / "manifest.json").write_text(json.dumps(doc, indent=1) + "\n")
        refix_marker(ex.directory)
        proc = subprocess.run([str(binary), str(ex.directory)], capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 2 and f"field '{field}'" in proc.stderr, (field, proc.returncode, proc.stderr[-2000:])
        with pytest.raises(rt.BundleFormatError):                      # Python refuses the same
            rt.manifest.parse((ex.directory / "manifest.json").read_bytes())
    (ex.directory / "manifest.json").write_text(original)
    refix_marker(ex.directory)
    proc = subprocess.run([str(binary), str(ex.directory)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "the graph refused to load" in proc.stderr   # only graph.so sees the lie
