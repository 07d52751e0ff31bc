"""The trust gaps a hostile retest found (issue 37), each closed in Python and in the C++ API:
a trust policy hashes every member of a reused extraction (weights included); one set of cache
rules (every level up to /, entries inside the extraction, a symlinked cache); key files read
bounded and without blocking; an empty policy variable refused; a deleted manifest.sig
restored by extracting again; a duplicate key in manifest.sig refused by both readers."""

from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import ascendc_pack_runtime as rt
from ascendc_pack.pipeline import compare_outputs
from ascendc_pack.package.signing import sign_bundle
from ascendc_pack_runtime.bundle import open_bundle
from ascendc_pack_runtime.constants import CACHE_ENV, MAX_KEY_FILE_BYTES, TRUSTED_KEYS_ENV

from .runtime_fixtures import eager_reference, example, pack, parts_of, reg, run_bundle_binary, signing_keys

pytest.importorskip("cryptography")

OTHER_UID = 54321          # a user that is not us (chown needs root)
AS_ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return example(tmp_path_factory, "mlp")     # 16 MB of weights


@pytest.fixture(scope="module")
def add_sum(tmp_path_factory):
    return example(tmp_path_factory, "add_sum")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return signing_keys(tmp_path_factory)   # {name: (private, public, id)}


def _signed(b, keys, tmp_path_factory, name: str) -> Path:
    out = tmp_path_factory.mktemp("signed") / f"{name}.ascpack"
    sign_bundle(b.bundle, keys["alice"][0], out)
    return out


@pytest.fixture(scope="module")
def signed_mlp(mlp, keys, tmp_path_factory):
    return _signed(mlp, keys, tmp_path_factory, "mlp")


@pytest.fixture(scope="module")
def signed_add_sum(add_sum, keys, tmp_path_factory):
    return _signed(add_sum, keys, tmp_path_factory, "add_sum")


@pytest.fixture(scope="module")
def binary(tmp_path_factory) -> Path:
    return run_bundle_binary(tmp_path_factory)


def _limits():
    # a reader that does not bound what it reads fails here instead of filling the machine's memory
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def _run(binary: Path, *args, env=None, timeout=120):
    e = {k: v for k, v in os.environ.items() if not k.startswith("ASCENDC_PACK_RUNTIME_")}
    e.update(env or {})
    try:
        return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, env=e, timeout=timeout,
                              preexec_fn=_limits)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{binary.name} {args} hung for {timeout} s")


def _extract_cli(bundle: Path, *args, env=None, timeout=120):
    """``python -m ascendc_pack_runtime extract BUNDLE ARGS`` (bounded in memory and time)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("ASCENDC_PACK_RUNTIME_")}
    e.update(env or {})
    try:
        return subprocess.run([sys.executable, "-m", "ascendc_pack_runtime", "extract", str(bundle), *map(str, args)],
                              capture_output=True, text=True, env=e, timeout=timeout, preexec_fn=_limits)
    except subprocess.TimeoutExpired:
        pytest.fail(f"extract {args} hung for {timeout} s")


def _correct(b, model) -> bool:
    inputs, expected = eager_reference(b)
    return compare_outputs(expected, model(*inputs), atol=1e-3, rtol=1e-4) is None


def _overwrite(path: Path, offset: int, data: bytes) -> None:
    """Change bytes in place (same file, same size): what a writer of the cache would do."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _empty(cache: Path) -> bool:
    return not cache.exists() or not any(cache.iterdir())


# ----------------------------------------------------------------------------- 1. weights under a policy


def test_policy_hashes_every_member_of_a_reused_extraction(mlp, signed_mlp, keys, tmp_path):
    cache, alice = tmp_path / "cache", [keys["alice"][1]]
    first = rt.load(signed_mlp, cache_dir=cache, trusted_keys=alice)
    assert first.extracted and _correct(mlp, first)
    weights = first.directory / "weights.bin"
    _overwrite(weights, 4096, b"\xff" * 64)                 # 16 NaNs, same size
    again = rt.load(signed_mlp, cache_dir=cache, trusted_keys=alice)
    assert again.extracted, "a reuse under a trust policy used weights it had not hashed"
    assert _correct(mlp, again)
    # without a policy a reuse checks sizes (documented): the same change is reused; verify="full" is not
    _overwrite(weights, 4096, b"\xff" * 64)
    assert not open_bundle(signed_mlp, cache_dir=cache).extracted
    assert open_bundle(signed_mlp, cache_dir=cache, verify="full").extracted


def test_cpp_policy_hashes_every_member(binary, signed_mlp, keys, tmp_path):
    alice = keys["alice"][1]
    ex = open_bundle(signed_mlp, cache_dir=tmp_path / "cache")
    assert _run(binary, ex.directory, "--trusted-key", alice).returncode == 0
    _overwrite(ex.directory / "weights.bin", 4096, b"\xff" * 64)
    assert _run(binary, ex.directory).returncode == 0          # no policy: sizes only (documented)
    for args, env in ((["--trusted-key", alice], None), ([], {TRUSTED_KEYS_ENV: str(alice)})):
        proc = _run(binary, ex.directory, *args, env=env)
        assert proc.returncode == 2 and "weights.bin" in proc.stderr and "sha256" in proc.stderr, proc.stderr
    # the fix it names works: extracting again (with the policy) replaces the extraction
    assert open_bundle(signed_mlp, cache_dir=tmp_path / "cache", trusted_keys=[alice]).extracted
    assert _run(binary, ex.directory, "--trusted-key", alice).returncode == 0


# ----------------------------------------------------------------------------- 2. one set of cache rules


def test_every_level_above_the_cache_is_checked_in_python_and_cpp(binary, add_sum, tmp_path):
    top = tmp_path / "top"
    cache = top / "mid" / "cache"
    ex = open_bundle(add_sum.bundle, cache_dir=cache)
    assert _run(binary, ex.directory).returncode == 0
    for mode in (0o770, 0o777, 0o722):     # two levels above the cache: others could rename mid/
        os.chmod(top, mode)
        with pytest.raises(rt.InsecureCacheError, match="above the cache"):
            rt.load(add_sum.bundle, cache_dir=cache)
        proc = _run(binary, ex.directory)
        assert proc.returncode == 2 and "above the cache" in proc.stderr and str(top) in proc.stderr, proc.stderr
    os.chmod(top, 0o1777)                  # sticky, like /tmp: others cannot rename what is ours
    assert not open_bundle(add_sum.bundle, cache_dir=cache).extracted
    assert _run(binary, ex.directory).returncode == 0
    os.chmod(top, 0o755)
    if AS_ROOT:                            # a directory on the way that belongs to another user
        os.chown(top, OTHER_UID, -1)
        try:
            with pytest.raises(rt.InsecureCacheError, match="another user"):
                rt.load(add_sum.bundle, cache_dir=cache)
            proc = _run(binary, ex.directory)
            assert proc.returncode == 2 and "another user" in proc.stderr, proc.stderr
        finally:
            os.chown(top, os.geteuid(), -1)
    assert _run(binary, ex.directory).returncode == 0


def _kernel(ex) -> str:
    return ex.contract.kernels[0].file


def test_entries_inside_the_extraction_are_checked_in_python_and_cpp(binary, signed_add_sum, keys, tmp_path):
    alice = keys["alice"][1]
    cache = tmp_path / "cache"
    ex = open_bundle(signed_add_sum, cache_dir=cache)
    cases = [("kernels", 0o770), ("weights.bin", 0o666), (_kernel(ex), 0o777), ("graph.so", 0o775),
             ("manifest.json", 0o664), (".ascpack-verified", 0o606), ("manifest.sig", 0o666)]
    for name, mode in cases:
        path = ex.directory / name
        before = stat.S_IMODE(path.stat().st_mode)
        os.chmod(path, mode)
        with pytest.raises(rt.InsecureCacheError) as ei:
            rt.load(signed_add_sum, cache_dir=cache, trusted_keys=[alice])
        assert "group or other" in str(ei.value) and "chmod -R go-w" in ei.value.fix, name
        for args in ([], ["--trusted-key", alice]):
            proc = _run(binary, ex.directory, *args)
            assert proc.returncode == 2 and "group or other" in proc.stderr, (name, proc.stderr)
        os.chmod(path, before)
    if AS_ROOT:
        os.chown(ex.directory / "weights.bin", OTHER_UID, -1)
        with pytest.raises(rt.InsecureCacheError, match="another user"):
            rt.load(signed_add_sum, cache_dir=cache)
        proc = _run(binary, ex.directory)
        assert proc.returncode == 2 and "another user" in proc.stderr, proc.stderr
        os.chown(ex.directory / "weights.bin", os.geteuid(), -1)
    assert not rt.load(signed_add_sum, cache_dir=cache, trusted_keys=[alice]).extracted
    assert _run(binary, ex.directory, "--trusted-key", alice).returncode == 0


def test_a_symlinked_cache_is_handled_alike(binary, add_sum, tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    proc = _extract_cli(add_sum.bundle, env={CACHE_ENV: str(link)})
    assert proc.returncode == 0, proc.stderr
    printed = proc.stdout.strip()
    assert printed.startswith(str(link) + "/")
    proc = _run(binary, printed)
    assert proc.returncode == 0, f"C++ refused the directory `extract` printed: {proc.stderr}"
    if AS_ROOT:                            # a link on the way that another user could re-point
        os.lchown(link, OTHER_UID, -1)
        with pytest.raises(rt.InsecureCacheError, match="symbolic link on the way"):
            rt.load(add_sum.bundle, cache_dir=link)
        proc = _run(binary, printed)
        assert proc.returncode == 2 and "symbolic link on the way" in proc.stderr, proc.stderr


# ----------------------------------------------------------------------------- 3. key files


def test_key_files_that_never_end_are_refused_without_blocking(binary, signed_add_sum, tmp_path):
    fifo = tmp_path / "keys.fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.pub"
    huge.write_bytes(b"# " + b"x" * MAX_KEY_FILE_BYTES + b"\n")
    ex = open_bundle(signed_add_sum, cache_dir=tmp_path / "cache")
    for key, problem in (("/dev/zero", "not a regular file"), (fifo, "not a regular file"),
                         (tmp_path, "not a regular file"), (huge, "larger than")):
        proc = _extract_cli(signed_add_sum, "--cache-dir", tmp_path / "c2", env={TRUSTED_KEYS_ENV: str(key)})
        assert proc.returncode == 1 and "TrustPolicyError" in proc.stderr and problem in proc.stderr, \
            (key, proc.stderr[-2000:])
        for args, env in ((["--trusted-key", key], None), ([], {TRUSTED_KEYS_ENV: str(key)})):
            proc = _run(binary, ex.directory, *args, env=env)
            assert proc.returncode == 2 and problem in proc.stderr, (key, proc.stderr[-2000:])
    assert _empty(tmp_path / "c2")


# ----------------------------------------------------------------------------- 4. an empty policy variable


def test_an_empty_policy_variable_is_refused_not_taken_as_no_policy(binary, add_sum, tmp_path, monkeypatch):
    ex = open_bundle(add_sum.bundle, cache_dir=tmp_path / "cache")     # unsigned
    for value in ("", "   ", ",", " , "):
        with monkeypatch.context() as mp:
            mp.setenv(TRUSTED_KEYS_ENV, value)
            with pytest.raises(rt.TrustPolicyError, match="names no key") as ei:
                rt.load(add_sum.bundle, cache_dir=tmp_path / "c2")
            assert "unset it" in ei.value.fix
            assert not rt.verify_bundle(add_sum.bundle).ok
        proc = _run(binary, ex.directory, env={TRUSTED_KEYS_ENV: value})
        assert proc.returncode == 2 and "names no key" in proc.stderr, (value, proc.stderr)
    assert _empty(tmp_path / "c2")
    # unset: no policy (an unsigned bundle loads)
    assert _run(binary, ex.directory).returncode == 0
    assert rt.load(add_sum.bundle, cache_dir=tmp_path / "cache").directory == ex.directory


# ----------------------------------------------------------------------------- 5. a deleted manifest.sig


def test_extracting_again_restores_a_deleted_signature(binary, signed_add_sum, add_sum, keys, tmp_path):
    alice, cache = keys["alice"][1], tmp_path / "cache"
    ex = open_bundle(signed_add_sum, cache_dir=cache, trusted_keys=[alice])
    sig = ex.directory / "manifest.sig"
    original = sig.read_bytes()
    sig.unlink()
    proc = _run(binary, ex.directory, "--trusted-key", alice)
    assert proc.returncode == 2 and "not signed" in proc.stderr and "ascendc_pack_runtime extract" in proc.stderr
    # the fix the refusal names works: `extract` (no policy needed) restores it
    proc = _extract_cli(signed_add_sum, "--cache-dir", cache)
    assert proc.returncode == 0 and proc.stdout.strip() == str(ex.directory), proc.stderr
    assert sig.read_bytes() == original
    assert _run(binary, ex.directory, "--trusted-key", alice).returncode == 0
    # another signature in the cache is not the bundle's: extracted again too
    sig.write_bytes(original.replace(b'"signature": "', b'"signature": "00', 1))
    assert open_bundle(signed_add_sum, cache_dir=cache).extracted and sig.read_bytes() == original
    # an extraction of an unsigned bundle has no manifest.sig: one planted there is not reused
    un = open_bundle(add_sum.bundle, cache_dir=cache)
    (un.directory / "manifest.sig").write_bytes(original)
    again = open_bundle(add_sum.bundle, cache_dir=cache)
    assert again.extracted and not (again.directory / "manifest.sig").exists()


# ----------------------------------------------------------------------------- 6. duplicate keys in manifest.sig


def test_a_duplicate_public_key_in_the_signature_is_refused_by_both(binary, signed_add_sum, keys, tmp_path):
    alice, mallory = keys["alice"][1], keys["mallory"][1]
    p = parts_of(signed_add_sum)
    sig = p.member("manifest.sig")
    text = sig[1].decode()
    # a last-wins reader sees alice's key (the signature is hers and valid); a first-wins one mallory's
    dup = text.replace('"public_key":', f'"public_key": "{mallory.read_text().split()[0]}", "public_key":', 1)
    assert dup != text
    sig[0], sig[1] = reg("manifest.sig", dup.encode()), dup.encode()
    path = tmp_path / "dup.ascpack"
    path.write_bytes(pack(p))
    with pytest.raises(rt.SignatureInvalidError):
        rt.load(path, cache_dir=tmp_path / "c", trusted_keys=[alice])
    assert _empty(tmp_path / "c")
    rep = rt.verify_bundle(path, trusted_keys=[alice])
    assert rep.problems and type(rep.problems[0]) is rt.SignatureInvalidError, rep.problems
    ex = open_bundle(path, cache_dir=tmp_path / "c")        # no policy: the signature is not read
    assert (ex.directory / "manifest.sig").read_text() == dup
    proc = _run(binary, ex.directory, "--trusted-key", alice)
    assert proc.returncode == 2 and "manifest.sig" in proc.stderr, proc.stderr
