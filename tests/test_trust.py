"""Signed bundles (issue 14, part 2): ed25519 over manifest.json; with a trust policy, unsigned,
foreign-key, edited and re-signed bundles are refused before anything is extracted or loaded,
in Python and in C++ (which verifies through libcrypto)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import ascendc_pack_runtime as rt
from ascendc_pack.cli.main import main
from ascendc_pack.pipeline import compare_outputs
from ascendc_pack.package.signing import sign_bundle
from ascendc_pack_runtime.bundle import open_bundle
from ascendc_pack_runtime.trust import TrustPolicy, key_id, parse_key

from .conftest import EXAMPLES
from .runtime_fixtures import (eager_reference, example, pack, parts_of, refix_marker, reg,
                               run_bundle_binary, signing_keys)

pytest.importorskip("cryptography")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return signing_keys(tmp_path_factory)   # {name: (private, public, id)}


@pytest.fixture(scope="module")
def add_sum(tmp_path_factory):
    return example(tmp_path_factory, "add_sum")


@pytest.fixture(scope="module")
def signed(add_sum, keys, tmp_path_factory):
    out = tmp_path_factory.mktemp("signed") / "add_sum.ascpack"
    sign_bundle(add_sum.bundle, keys["alice"][0], out)
    return out


def _empty(cache: Path) -> bool:
    return not cache.exists() or not any(cache.iterdir())


def test_sign_round_trip(add_sum, signed, keys, tmp_path, monkeypatch):
    alice_priv, alice_pub, alice_id = keys["alice"]
    assert alice_pub.read_text().startswith("ed25519:") and oct(alice_priv.stat().st_mode)[-3:] == "600"
    model = rt.load(signed, cache_dir=tmp_path / "c", trusted_keys=[alice_pub])
    inputs, expected = eager_reference(add_sum)
    assert compare_outputs(expected, model(*inputs), atol=1e-3, rtol=1e-4) is None
    assert open_bundle(signed, cache_dir=tmp_path / "c", trusted_keys=[alice_pub]).signer == alice_id
    assert (model.directory / "manifest.sig").is_file()
    # the signature covers the manifest only: every other member is copied unchanged; signing is
    # deterministic and signing again replaces the signature
    assert rt.read_manifest(signed) == rt.read_manifest(add_sum.bundle)
    again = tmp_path / "again.ascpack"
    sign_bundle(signed, alice_priv, again)
    assert again.read_bytes() == signed.read_bytes()
    # key texts work as well as key files; the environment variable is the deployment policy
    text = alice_pub.read_text().split()[0]
    assert rt.load(signed, cache_dir=tmp_path / "c", trusted_keys=[text]).directory == model.directory
    with monkeypatch.context() as mp:
        mp.setenv(rt.constants.TRUSTED_KEYS_ENV, f"{keys['mallory'][1]},{text}")
        assert rt.load(signed, cache_dir=tmp_path / "c").directory == model.directory
        with pytest.raises(rt.UnsignedBundleError):
            rt.load(add_sum.bundle, cache_dir=tmp_path / "c")
    # no policy: a signed bundle loads like any other
    assert rt.load(signed, cache_dir=tmp_path / "c").directory == model.directory


def _edited_after_signing(signed: Path, resign_key=None) -> bytes:
    """The signed bundle with graph.cpp changed and the manifest's hashes recomputed; its old
    signature kept, or a new one by ``resign_key`` (an attacker re-signing)."""
    from ascendc_pack.package.signing import load_private_key, signature_for

    p = parts_of(signed)
    sig = p.member("manifest.sig")
    p.members.remove(sig)
    m = p.member("graph.cpp")
    m[1] = m[1] + b"// evil\n"
    p.resign()
    manifest_bytes = (json.dumps(p.manifest, indent=1) + "\n").encode()
    p.manifest_bytes = manifest_bytes
    data = sig[1] if resign_key is None else signature_for(manifest_bytes, load_private_key(resign_key)).to_bytes()
    p.members.insert(0, [reg("manifest.sig", data), data])
    return pack(p)


def test_policy_refusals_happen_before_anything_is_extracted_or_loaded(add_sum, signed, keys, tmp_path,
                                                                      monkeypatch):
    alice = [keys["alice"][1]]
    cases = {
        "unsigned": (add_sum.bundle.read_bytes(), alice, rt.UnsignedBundleError),
        "foreign key": (signed.read_bytes(), [keys["mallory"][1]], rt.UntrustedSignerError),
        "empty policy": (signed.read_bytes(), [], rt.UntrustedSignerError),
        "edited after signing": (_edited_after_signing(signed), alice, rt.SignatureInvalidError),
        "re-signed by another key": (_edited_after_signing(signed, keys["mallory"][0]), alice,
                                     rt.UntrustedSignerError),
    }
    p = parts_of(signed)
    p.member("manifest.sig")[1] = b'{"format": "ascpack-signature"}'
    cases["malformed signature"] = (pack(p), alice, rt.SignatureInvalidError)
    monkeypatch.setattr(torch.ops, "load_library", lambda *a: pytest.fail("dlopen attempted"))
    for i, (label, (data, policy, expected)) in enumerate(cases.items()):
        path, cache = tmp_path / f"{i}.ascpack", tmp_path / f"cache{i}"
        path.write_bytes(data)
        with pytest.raises(expected) as ei:
            rt.load(path, cache_dir=cache, trusted_keys=policy)
        assert ei.value.fix and "sign" in str(ei.value), label
        assert _empty(cache), f"{label}: something was extracted"
        rep = rt.verify_bundle(path, trusted_keys=policy)
        assert rep.problems and type(rep.problems[0]) is expected, (label, rep.problems)
    # the edited bundle is consistent (hashes recomputed): without a policy it would load
    assert rt.verify_bundle(tmp_path / "3.ascpack").ok


def test_unusable_policies_are_typed(signed, tmp_path):
    with pytest.raises(rt.TrustPolicyError, match="neither"):
        rt.load(signed, cache_dir=tmp_path / "c", trusted_keys=[tmp_path / "missing.pub"])
    bad = tmp_path / "bad.pub"
    bad.write_text("ed25519:xyz\n")
    with pytest.raises(rt.TrustPolicyError, match="not a public key"):
        rt.load(signed, cache_dir=tmp_path / "c", trusted_keys=[bad])
    assert _empty(tmp_path / "c")
    assert TrustPolicy.resolve(None) is None       # no policy unless asked for


def test_cli_keygen_sign_verify_and_build_sign_key(add_sum, keys, tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["keygen", "-o", str(tmp_path / "k")])
    assert res.exit_code == 0 and (tmp_path / "k.pub").is_file(), res.output
    assert runner.invoke(main, ["keygen", "-o", str(tmp_path / "k")]).exit_code == 1      # no overwrite
    out = tmp_path / "s.ascpack"
    res = runner.invoke(main, ["sign", str(add_sum.bundle), "--key", str(tmp_path / "k"), "-o", str(out)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["verify", str(out), "--trusted-key", str(tmp_path / "k.pub")])
    assert res.exit_code == 0 and "signed by trusted key" in res.output, res.output
    res = runner.invoke(main, ["verify", str(out), "--trusted-key", str(keys["alice"][1])])
    assert res.exit_code == 1 and res.output.startswith("UntrustedSignerError: "), res.output
    # build --sign-key (the build reuses the session's kernel and graph cache)
    built = tmp_path / "built.ascpack"
    res = runner.invoke(main, ["build", str(EXAMPLES / "add_sum.py"), "-o", str(built), "--cache-dir",
                               str(build_root_of(add_sum)), "--sign-key", str(tmp_path / "k")])
    assert res.exit_code == 0, res.output
    rep = rt.verify_bundle(built, trusted_keys=[tmp_path / "k.pub"])
    assert rep.ok and rep.signature_checked and rep.signer == key_id(parse_key((tmp_path / "k.pub").read_text()
                                                                               .split()[0]))
    # python -m ascendc_pack_runtime extract --trusted-key
    proc = subprocess.run([sys.executable, "-m", "ascendc_pack_runtime", "extract", str(built), "--cache-dir",
                           str(tmp_path / "cache"), "--trusted-key", str(keys["alice"][1])],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "UntrustedSignerError" in proc.stderr


def build_root_of(b) -> Path:
    return Path(b.config.cache_dir)


# ----------------------------------------------------------------------------- C++


@pytest.fixture(scope="module")
def binary(tmp_path_factory) -> Path:
    return run_bundle_binary(tmp_path_factory)


def _run(binary: Path, *args, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("ASCENDC_PACK_RUNTIME_")}
    e.update(env or {})
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, env=e, timeout=120)


def test_cpp_signing_round_trip_and_refusals(binary, add_sum, signed, keys, tmp_path):
    alice, mallory = keys["alice"][1], keys["mallory"][1]
    ex = open_bundle(signed, cache_dir=tmp_path / "cache")
    assert _run(binary, ex.directory, "--trusted-key", alice).returncode == 0
    text = alice.read_text().split()[0]
    assert _run(binary, ex.directory, env={rt.constants.TRUSTED_KEYS_ENV: text}).returncode == 0
    proc = _run(binary, ex.directory, "--trusted-key", mallory)
    assert proc.returncode == 2 and "does not list" in proc.stderr, proc.stderr
    proc = _run(binary, ex.directory, env={rt.constants.TRUSTED_KEYS_ENV: str(mallory)})
    assert proc.returncode == 2 and "does not list" in proc.stderr, proc.stderr

    unsigned = open_bundle(add_sum.bundle, cache_dir=tmp_path / "cache")
    proc = _run(binary, unsigned.directory, "--trusted-key", alice)
    assert proc.returncode == 2 and "not signed" in proc.stderr, proc.stderr

    # an attacker who can write the cache edits manifest.json and fixes up the marker: without a
    # policy the C++ API cannot tell (documented); with one the signature no longer matches
    copy = tmp_path / "cache" / "copy"
    shutil.copytree(ex.directory, copy)
    doc = json.loads((copy / "manifest.json").read_text())
    doc["model"]["name"] = "edited"
    (copy / "manifest.json").write_text(json.dumps(doc, indent=1) + "\n")
    refix_marker(copy)
    assert _run(binary, copy).returncode == 0
    proc = _run(binary, copy, "--trusted-key", alice)
    assert proc.returncode == 2 and "does not match manifest.json" in proc.stderr, proc.stderr
    # ... and re-signs it with their own key: a key the policy does not list
    from ascendc_pack.package.signing import load_private_key, signature_for

    sig = signature_for((copy / "manifest.json").read_bytes(), load_private_key(keys["mallory"][0]))
    (copy / "manifest.sig").write_bytes(sig.to_bytes())
    proc = _run(binary, copy, "--trusted-key", alice)
    assert proc.returncode == 2 and "does not list" in proc.stderr, proc.stderr
    assert _run(binary, copy, "--trusted-key", mallory).returncode == 0   # they trust themselves
