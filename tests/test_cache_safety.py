"""An extraction the runtime can trust (issue 14, part 1), in Python and C++: the bundle file
is the authority, not the cache. A tampered library in the cache never runs (healed by a new
extraction, or refused right before dlopen); a cache whose manifest and marker were "fixed up"
is not trusted; symlinked entries and caches group/other can write are refused; directories are
private whatever the umask; an OS error while loading (cache deleted) is a typed CacheError."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import torch

import ascendc_pack_runtime as rt
from ascendc_pack.pipeline import compare_outputs
from ascendc_pack_runtime import extract
from ascendc_pack_runtime.bundle import open_bundle

from .runtime_fixtures import eager_reference, evil_library, example, refix_marker, run_bundle_binary


@pytest.fixture(scope="module")
def add_sum(tmp_path_factory):
    return example(tmp_path_factory, "add_sum")


def _correct(b, model) -> bool:
    inputs, expected = eager_reference(b)
    return compare_outputs(expected, model(*inputs), atol=1e-3, rtol=1e-4) is None


def _kernel(ex) -> str:
    return ex.contract.kernels[0].file


def _tamper_library(tmp_path: Path, ex, flag: Path, name: str | None = None) -> str:
    """Replace a library of the extraction by a same-size one whose constructor creates ``flag``."""
    name = name or _kernel(ex)
    target = ex.directory / name
    evil = evil_library(tmp_path, target.stat().st_size, flag)
    if evil is None:
        pytest.skip("no C compiler or the library is too small to be replaced by one of the same size")
    # a new file in its place (writing into the old one would also rewrite the pages of a copy this
    # test process has loaded already: dlopen() returns a library loaded from the same path)
    tmp = target.with_name(".evil")
    tmp.write_bytes(evil)
    os.replace(tmp, target)
    return name


def test_same_size_tampered_kernel_never_runs_and_is_healed(add_sum, tmp_path):
    cache, flag = tmp_path / "cache", tmp_path / "ran"
    ex = open_bundle(add_sum.bundle, cache_dir=cache)
    _tamper_library(tmp_path, ex, flag)
    for verify in ("sizes", "full"):
        model = rt.load(add_sum.bundle, cache_dir=cache, verify=verify)
        assert model.extracted, "a tampered extraction was reused"
        assert _correct(add_sum, model) and not flag.exists()
        _tamper_library(tmp_path, open_bundle(add_sum.bundle, cache_dir=cache), flag)
    assert sorted(p.name for p in cache.iterdir()) == [ex.directory.name]


def test_fixed_up_cache_manifest_and_marker_are_not_trusted(add_sum, tmp_path):
    """The attacker swaps graph.so, edits the cache's manifest.json hashes to match and
    re-computes the marker: the manifest is compared with the bundle's own, so nothing is reused."""
    import hashlib

    cache, flag = tmp_path / "cache", tmp_path / "ran"
    for verify in ("full", "sizes"):
        ex = open_bundle(add_sum.bundle, cache_dir=cache)
        name = _tamper_library(tmp_path, ex, flag, "graph.so")
        doc = json.loads((ex.directory / "manifest.json").read_text())
        doc["members"][name]["sha256"] = hashlib.sha256((ex.directory / name).read_bytes()).hexdigest()
        (ex.directory / "manifest.json").write_text(json.dumps(doc, indent=1) + "\n")
        refix_marker(ex.directory)
        model = rt.load(add_sum.bundle, cache_dir=cache, verify=verify)
        assert model.extracted and _correct(add_sum, model) and not flag.exists()


def test_library_changed_after_verification_is_refused_before_dlopen(add_sum, tmp_path, monkeypatch):
    cache, flag = tmp_path / "cache", tmp_path / "ran"
    ex = open_bundle(add_sum.bundle, cache_dir=cache)
    name = _tamper_library(tmp_path, ex, flag)   # between verification and loading
    monkeypatch.setattr(torch.ops, "load_library", lambda *a: pytest.fail("dlopen attempted"))
    with pytest.raises(rt.TamperedExtractionError) as ei:
        rt.Model(ex)
    assert ei.value.member == name and "sha256" in str(ei.value) and not flag.exists()


def test_symlinked_entries_are_refused(add_sum, tmp_path):
    cache = tmp_path / "cache"
    ex = open_bundle(add_sum.bundle, cache_dir=cache)
    copy = tmp_path / "copy"
    shutil.copytree(ex.directory, copy, symlinks=True)
    shutil.rmtree(ex.directory)
    ex.directory.symlink_to(copy)                         # <sha> -> a copy elsewhere
    with pytest.raises(rt.InsecureCacheError, match="symbolic link"):
        rt.load(add_sum.bundle, cache_dir=cache)
    ex.directory.unlink()
    ex = open_bundle(add_sum.bundle, cache_dir=cache)
    kernel = ex.directory / _kernel(ex)
    kernel.unlink()
    kernel.symlink_to(copy / _kernel(ex))                 # a member -> a file elsewhere
    with pytest.raises(rt.InsecureCacheError, match="symbolic link"):
        rt.load(add_sum.bundle, cache_dir=cache)


@pytest.mark.parametrize("mode", [0o1777, 0o777, 0o770, 0o722])
def test_caches_others_can_write_are_refused(add_sum, tmp_path, mode):
    cache = tmp_path / "shared"
    cache.mkdir()
    os.chmod(cache, mode)
    with pytest.raises(rt.InsecureCacheError) as ei:
        rt.load(add_sum.bundle, cache_dir=cache)
    assert "group or other" in str(ei.value) and "chmod go-w" in str(ei.value)
    assert list(cache.iterdir()) == []                    # refused before writing anything
    # a non-sticky world-writable directory above the cache: others could rename the cache
    os.chmod(cache, 0o700)
    parent = tmp_path / "open"
    parent.mkdir()
    os.chmod(parent, 0o777)
    with pytest.raises(rt.InsecureCacheError, match="above the cache"):
        rt.load(add_sum.bundle, cache_dir=parent / "cache")
    os.chmod(parent, 0o1777)                              # sticky, like /tmp: fine
    assert _correct(add_sum, rt.load(add_sum.bundle, cache_dir=parent / "cache"))


def test_directories_are_private_whatever_the_umask(add_sum, tmp_path):
    old = os.umask(0)
    try:
        ex = open_bundle(add_sum.bundle, cache_dir=tmp_path / "new" / "cache")
    finally:
        os.umask(old)
    dirs = [ex.directory.parent, ex.directory, *(p for p in ex.directory.rglob("*") if p.is_dir())]
    assert {stat.S_IMODE(d.stat().st_mode) for d in dirs} == {0o700}
    files = [p for p in ex.directory.rglob("*") if p.is_file()]
    assert {stat.S_IMODE(f.stat().st_mode) for f in files} <= {0o600, 0o700}


def test_os_errors_while_loading_are_typed(add_sum, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    ex = open_bundle(add_sum.bundle, cache_dir=cache)
    shutil.rmtree(cache)                                  # the cache deleted under a load
    with pytest.raises(rt.CacheIOError) as ei:
        rt.Model(ex)
    assert "No such file or directory" in str(ei.value)

    def vanish(self, name):                               # ... or during the extraction
        shutil.rmtree(self.root)

    monkeypatch.setattr(extract._DirectorySink, "finish", vanish)
    with pytest.raises(rt.CacheIOError, match="No such file or directory"):
        rt.load(add_sum.bundle, cache_dir=cache)


# ----------------------------------------------------------------------------- C++


@pytest.fixture(scope="module")
def binary(tmp_path_factory) -> Path:
    return run_bundle_binary(tmp_path_factory)


def _run(binary: Path, *args, timeout=120):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCENDC_PACK_RUNTIME_")}
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout)


def test_cpp_applies_the_same_rules(binary, add_sum, tmp_path):
    cache, flag = tmp_path / "cache", tmp_path / "ran"
    ex = open_bundle(add_sum.bundle, cache_dir=cache)
    assert _run(binary, ex.directory).returncode == 0

    # a same-size kernel: refused with and without --verify-hashes, its constructor never runs
    kernel = ex.directory / _kernel(ex)
    original = kernel.read_bytes()
    _tamper_library(tmp_path, ex, flag)
    for extra in ([], ["--verify-hashes"]):
        proc = _run(binary, ex.directory, *extra)
        assert proc.returncode == 2 and _kernel(ex) in proc.stderr and "sha256" in proc.stderr, proc.stderr
    assert not flag.exists()
    kernel.write_bytes(original)

    # a marker that does not name the manifest's sha256 (or the bundle's) is not a verified extraction
    marker = ex.directory / rt.bundle.VERIFIED_MARKER
    good = marker.read_text()
    for drop in ("bundle_sha256", "manifest_sha256"):
        doc = json.loads(good)
        del doc[drop]
        marker.write_text(json.dumps(doc))
        proc = _run(binary, ex.directory)
        assert proc.returncode == 2 and "marker" in proc.stderr, proc.stderr
    marker.write_text(good)
    doc = json.loads((ex.directory / "manifest.json").read_text())
    doc["model"]["name"] = "edited"
    (ex.directory / "manifest.json").write_text(json.dumps(doc))
    proc = _run(binary, ex.directory)
    assert proc.returncode == 2 and "not the manifest the extraction was verified with" in proc.stderr

    # symlinked directory, group-writable directory or cache
    ex = open_bundle(add_sum.bundle, cache_dir=tmp_path / "cache2")
    link = tmp_path / "cache2" / "link"
    link.symlink_to(ex.directory)
    proc = _run(binary, link)
    assert proc.returncode == 2 and "symbolic link" in proc.stderr
    for d in (ex.directory, ex.directory.parent):
        os.chmod(d, 0o770)
        proc = _run(binary, ex.directory)
        assert proc.returncode == 2 and "group or other" in proc.stderr, proc.stderr
        os.chmod(d, 0o700)
    assert _run(binary, ex.directory).returncode == 0


def test_leftovers_of_any_depth_are_removed_without_following_links(tmp_path):
    """A killed extraction of a deeply nested bundle leaves a tree shutil.rmtree cannot remove
    (it recurses per level); remove_tree walks it with directory descriptors and never follows
    a symlink out of it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    root = tmp_path / "deep"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY)
    for i in range(2500):
        os.mkdir("a", dir_fd=fd)
        nxt = os.open("a", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
        if i % 500 == 0:
            os.close(os.open("f", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
    os.symlink(outside, "link", dir_fd=fd)
    os.close(fd)
    extract.remove_tree(root)
    assert not root.exists() and (outside / "keep").read_text() == "x"
