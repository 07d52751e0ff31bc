"""Signing bundles with ed25519 (needs the ``cryptography`` package: extra ``sign``).

:func:`generate_key` writes a private key (PKCS#8 PEM, mode 0600) and its public key
(``<key>.pub``: one line ``ed25519:<hex>``, what a trust policy lists). :func:`sign_bundle`
verifies a bundle, then rewrites it with ``manifest.sig`` (the signature over the exact bytes of
``manifest.json``) as its second member; every other member is copied unchanged. Signing is
deterministic (ed25519), so signing a bundle twice gives the same file. The format and the
verification are in ``ascendc_pack_runtime.trust`` (docs/FORMAT.md, "Signatures").
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from ascendc_pack_runtime.archive import read_head
from ascendc_pack_runtime.constants import MANIFEST_NAME, SIGNATURE_NAME
from ascendc_pack_runtime.errors import BundleError
from ascendc_pack_runtime.trust import Signature, key_id, key_text
from ascendc_pack_runtime.verify import verify_bundle

from ascendc_pack.package.bundle import ZSTD_LEVEL, archive_writer
from ascendc_pack.errors import PackError

_INSTALL = "install the `sign` extra: pip install 'ascendc-pack[sign]' (the cryptography package)"


class SigningError(PackError):
    """A key cannot be written or read, or the bundle to sign does not verify."""


def _crypto():
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    except ImportError:
        raise SigningError(f"signing needs the `cryptography` package; {_INSTALL}") from None
    return serialization, Ed25519PrivateKey


def public_key_path(key: Path | str) -> Path:
    """``<key>.pub``."""
    return Path(f"{key}.pub")


def generate_key(path: Path | str, *, force: bool = False) -> tuple[Path, Path, str]:
    """Write a new private key to ``path`` (0600) and its public key to ``path.pub``; returns
    (private path, public path, key id). Refuses to overwrite unless ``force``."""
    serialization, Ed25519PrivateKey = _crypto()
    path = Path(path)
    pub = public_key_path(path)
    for p in (path, pub):
        if p.exists() and not force:
            raise SigningError(f"{p} exists; pass another path or --force to replace it")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(pem)
        os.replace(tmp, path)
        pub.write_text(f"{key_text(raw)}  # ascendc-pack key {key_id(raw)}\n")
    except OSError as e:
        raise SigningError(f"cannot write the key pair {path}: {e}") from None
    return path, pub, key_id(raw)


def load_private_key(path: Path | str):
    """The ed25519 private key in ``path`` (PKCS#8 PEM, as :func:`generate_key` writes it)."""
    serialization, Ed25519PrivateKey = _crypto()
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SigningError(f"cannot read the signing key {path}: {e.strerror or e}; pass a key written by "
                           "`ascendc-pack keygen`") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise SigningError(f"{path} is not an unencrypted PEM private key ({e}); pass a key written by "
                           "`ascendc-pack keygen`") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningError(f"{path} is a {type(key).__name__}, not an ed25519 key; create one with "
                           "`ascendc-pack keygen`")
    return key


def signature_for(manifest_bytes: bytes, key) -> Signature:
    """The signature of ``manifest_bytes`` by private key ``key``."""
    serialization, _ = _crypto()
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return Signature(raw, key.sign(manifest_bytes))


def sign_bundle(bundle: Path | str, key_path: Path | str, output: Path | str | None = None) -> tuple[Path, str]:
    """Verify ``bundle`` (every integrity check; not the host) and write it signed by the key in
    ``key_path`` to ``output`` (default: in place, atomically). A previous signature is replaced.
    Returns (output, key id)."""
    key = load_private_key(key_path)
    bundle = Path(bundle)
    rep = verify_bundle(bundle, check_host_compat=False, trusted_keys=None)
    if not rep.ok:
        raise SigningError(f"{bundle} does not verify, refusing to sign it: {rep.problems[0].kind}: "
                           f"{rep.problems[0]}")
    try:
        head = read_head(bundle)
    except BundleError as e:
        raise SigningError(f"{bundle}: {e}") from None
    signature = signature_for(head.manifest_bytes, key)
    output = Path(output) if output is not None else bundle
    tmp = output.parent / f".{output.name}.{os.getpid()}.sign.tmp"
    try:
        _rewrite(bundle, tmp, head.manifest_bytes, signature.to_bytes())
        os.replace(tmp, output)
    except OSError as e:
        raise SigningError(f"cannot write the signed bundle {output}: {e}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return output, key_id(signature.public_key)


def _rewrite(src: Path, dest: Path, manifest_bytes: bytes, signature: bytes) -> None:
    """Copy the members of ``src`` after a new manifest.sig (streaming: no member in memory)."""
    import zstandard

    with open(src, "rb") as f, archive_writer(dest, ZSTD_LEVEL) as add:
        reader = zstandard.ZstdDecompressor().stream_reader(f)
        with tarfile.open(fileobj=reader, mode="r|") as tar:
            for member in tar:
                if member.name == MANIFEST_NAME:
                    add(MANIFEST_NAME, len(manifest_bytes), io.BytesIO(manifest_bytes))
                    add(SIGNATURE_NAME, len(signature), io.BytesIO(signature))
                elif member.name != SIGNATURE_NAME:
                    add(member.name, member.size, tar.extractfile(member))


__all__ = ["generate_key", "load_private_key", "sign_bundle", "signature_for", "public_key_path", "SigningError"]
