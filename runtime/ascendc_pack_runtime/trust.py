"""Signed bundles: ed25519 over the exact bytes of ``manifest.json`` (docs/FORMAT.md, "Signatures").

The manifest hashes every other member, so a valid signature over it covers the whole bundle.
A signed bundle carries the signature as its second member, ``manifest.sig`` (JSON, unlisted in
the manifest). A **trust policy** is a set of public keys (``trusted_keys=`` of
:func:`~ascendc_pack_runtime.load`, or ``ASCENDC_PACK_RUNTIME_TRUSTED_KEYS``); with one set,
a bundle that is unsigned, signed by another key, or whose manifest changed after signing is
refused before anything is extracted or loaded. Verifying needs the ``cryptography`` package
(extra ``sign``); signing lives in ``ascendc_pack.package.signing``.

Key text: ``ed25519:<64 hex digits>`` (the raw 32-byte public key); a key file holds one or more
such lines (``#`` comments allowed). A key's id is the first 16 hex digits of its sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .constants import SIGNATURE_NAME, TRUSTED_KEYS_ENV
from .errors import SignatureInvalidError, TrustPolicyError, UnsignedBundleError, UntrustedSignerError

SIGNATURE_FORMAT = "ascpack-signature"
SIGNATURE_VERSION = 1
ALGORITHM = "ed25519"
MAX_SIGNATURE_BYTES = 1 << 16
_KEY_RE = re.compile(r"ed25519:([0-9a-f]{64})")
_SIG_RE = re.compile(r"[0-9a-f]{128}")
_SIGN_FIX = "sign the bundle with a trusted key (`ascendc-pack sign BUNDLE --key KEY`) or trust its signer"


def key_text(raw: bytes) -> str:
    """``ed25519:<hex>`` of a raw 32-byte public key."""
    return f"{ALGORITHM}:{raw.hex()}"


def key_id(raw: bytes) -> str:
    """The first 16 hex digits of the sha256 of a raw public key."""
    return hashlib.sha256(raw).hexdigest()[:16]


def parse_key(text: str) -> bytes:
    """The raw public key of ``ed25519:<64 hex>`` (ValueError otherwise)."""
    m = _KEY_RE.fullmatch(text.strip())
    if not m:
        raise ValueError(f"{text.strip()[:80]!r} is not a public key of the form 'ed25519:<64 hex digits>'")
    return bytes.fromhex(m.group(1))


def _keys_of(entry: str | os.PathLike) -> list[bytes]:
    """The keys of one policy entry: a key text, or a file of key lines."""
    text = os.fspath(entry).strip()
    if _KEY_RE.fullmatch(text):
        return [parse_key(text)]
    try:
        lines = Path(text).read_text().splitlines()
    except OSError as e:
        raise TrustPolicyError(f"trusted key {text[:200]!r} is neither 'ed25519:<hex>' nor a readable key file "
                               f"({e.strerror or e}); fix the trust policy ({TRUSTED_KEYS_ENV} or trusted_keys=)",
                               field=TRUSTED_KEYS_ENV, fix="pass public keys as ed25519:<hex> or .pub files") from None
    keys = []
    for n, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if line:
            try:
                keys.append(parse_key(line))
            except ValueError as e:
                raise TrustPolicyError(f"{text}:{n}: {e}; a key file holds lines 'ed25519:<hex>' (as written by "
                                       "`ascendc-pack keygen`)", field=TRUSTED_KEYS_ENV,
                                       fix="fix the key file") from None
    if not keys:
        raise TrustPolicyError(f"key file {text} holds no public key; fix the trust policy", field=TRUSTED_KEYS_ENV,
                               fix="fix the key file")
    return keys


@dataclass(frozen=True)
class TrustPolicy:
    """The public keys a deployment trusts (an empty policy trusts nothing)."""

    keys: frozenset[bytes]

    @staticmethod
    def of(entries: Iterable[str | os.PathLike]) -> TrustPolicy:
        """From key texts and key files."""
        return TrustPolicy(frozenset(k for e in entries for k in _keys_of(e)))

    @staticmethod
    def resolve(trusted_keys: Iterable[str | os.PathLike] | None) -> TrustPolicy | None:
        """``trusted_keys`` when given (an empty list trusts nothing), else
        ``ASCENDC_PACK_RUNTIME_TRUSTED_KEYS`` (comma-separated: ``:`` is part of a key) when set, else None
        (no policy: signatures are neither required nor checked)."""
        if trusted_keys is not None:
            if isinstance(trusted_keys, (str, os.PathLike)):
                trusted_keys = [trusted_keys]
            return TrustPolicy.of(trusted_keys)
        env = os.environ.get(TRUSTED_KEYS_ENV, "").strip()
        if not env:
            return None
        return TrustPolicy.of(e for e in env.split(",") if e.strip())

    def describe(self) -> str:
        return ", ".join(sorted(key_id(k) for k in self.keys)) or "no key"


@dataclass(frozen=True)
class Signature:
    """The content of ``manifest.sig``."""

    public_key: bytes
    signature: bytes

    def to_bytes(self) -> bytes:
        doc = {"format": SIGNATURE_FORMAT, "version": SIGNATURE_VERSION, "algorithm": ALGORITHM,
               "public_key": key_text(self.public_key), "key_id": key_id(self.public_key),
               "signature": self.signature.hex()}
        return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()

    @staticmethod
    def from_bytes(data: bytes) -> Signature:
        """Parse ``manifest.sig`` (SignatureInvalidError when malformed)."""
        try:
            doc = json.loads(data.decode("utf-8"))
            ok = (isinstance(doc, dict) and doc.get("format") == SIGNATURE_FORMAT
                  and doc.get("version") == SIGNATURE_VERSION and doc.get("algorithm") == ALGORITHM
                  and isinstance(doc.get("signature"), str) and bool(_SIG_RE.fullmatch(doc["signature"])))
            key = parse_key(doc["public_key"]) if ok and isinstance(doc.get("public_key"), str) else None
        except (UnicodeDecodeError, ValueError, RecursionError):
            ok, key = False, None
        if not ok or key is None:
            raise SignatureInvalidError(f"{SIGNATURE_NAME} is not an {ALGORITHM} signature of the format "
                                        f"{SIGNATURE_FORMAT!r} version {SIGNATURE_VERSION}; {_SIGN_FIX}",
                                        member=SIGNATURE_NAME, fix=_SIGN_FIX)
        return Signature(key, bytes.fromhex(doc["signature"]))


def _ed25519_public_key(raw: bytes):
    try:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    except ImportError:
        fix = "install the `sign` extra: pip install 'ascendc-pack[sign]' (the cryptography package)"
        raise TrustPolicyError(f"a trust policy is set but signatures cannot be verified without the "
                               f"`cryptography` package; {fix}", fix=fix) from None
    return Ed25519PublicKey.from_public_bytes(raw)


def check_signature(manifest_bytes: bytes, signature: bytes | None, policy: TrustPolicy, where: str) -> str:
    """Enforce ``policy`` on a bundle: return the signer's key id, or raise UnsignedBundleError,
    UntrustedSignerError, SignatureInvalidError or TrustPolicyError."""
    if signature is None:
        raise UnsignedBundleError(f"{where} is not signed (no {SIGNATURE_NAME}) and a trust policy is set "
                                  f"(trusted: {policy.describe()}); refusing it before extracting or loading "
                                  f"anything: {_SIGN_FIX}", member=SIGNATURE_NAME, fix=_SIGN_FIX)
    sig = Signature.from_bytes(signature)
    if sig.public_key not in policy.keys:
        raise UntrustedSignerError(f"{where} is signed by key {key_id(sig.public_key)}, which the trust policy does "
                                   f"not list (trusted: {policy.describe()}); refusing it before extracting or "
                                   f"loading anything: {_SIGN_FIX}", member=SIGNATURE_NAME, fix=_SIGN_FIX)
    key = _ed25519_public_key(sig.public_key)
    from cryptography.exceptions import InvalidSignature  # importable: _ed25519_public_key imported the package

    try:
        key.verify(sig.signature, manifest_bytes)
    except InvalidSignature:
        raise SignatureInvalidError(f"{where}: the {ALGORITHM} signature of key {key_id(sig.public_key)} does not "
                                    f"match manifest.json (the manifest was changed after signing); refusing it "
                                    f"before extracting or loading anything: {_SIGN_FIX}", member=SIGNATURE_NAME,
                                    fix=_SIGN_FIX) from None
    return key_id(sig.public_key)


__all__ = ["TrustPolicy", "Signature", "check_signature", "parse_key", "key_text", "key_id", "SIGNATURE_FORMAT"]
