"""Signed bundles: ed25519 over the exact bytes of ``manifest.json`` (docs/FORMAT.md, "Signatures").

The manifest hashes every other member, so a valid signature over it covers the whole bundle.
A signed bundle carries the signature as its second member, ``manifest.sig`` (JSON, unlisted in
the manifest). A **trust policy** is a set of public keys (``trusted_keys=`` of
:func:`~ascendc_pack_runtime.load`, or ``ASCENDC_PACK_RUNTIME_TRUSTED_KEYS``); with one set,
a bundle that is unsigned, signed by another key, or whose manifest changed after signing is
refused before anything is extracted or loaded. Verifying needs the ``cryptography`` package
(extra ``sign``); signing lives in ``ascendc_pack.package.signing``.

Key text: ``ed25519:<64 hex digits>`` (the raw 32-byte public key); a key file (a regular file of
at most ``MAX_KEY_FILE_BYTES``) holds one or more such lines (``#`` comments allowed). A key's id
is the first 16 hex digits of its sha256. ``manifest.sig`` with a duplicate key is refused, as the
C++ reader refuses it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .constants import MAX_KEY_FILE_BYTES, SIGNATURE_NAME, TRUSTED_KEYS_ENV
from .errors import SignatureInvalidError, TrustPolicyError, UnsignedBundleError, UntrustedSignerError
from .schema import unique_keys

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


_POLICY_FIX = "pass public keys as ed25519:<hex> or .pub files"


def _policy_error(message: str, fix: str = _POLICY_FIX) -> TrustPolicyError:
    return TrustPolicyError(f"{message}; fix the trust policy ({TRUSTED_KEYS_ENV} or trusted_keys=)",
                            field=TRUSTED_KEYS_ENV, fix=fix)


def read_key_file(path: str) -> str:
    """The text of key file ``path``: a regular file of at most ``MAX_KEY_FILE_BYTES``, opened
    without blocking (a FIFO never hangs the load), UTF-8; TrustPolicyError otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise _policy_error(f"trusted key {path[:200]!r} is neither 'ed25519:<hex>' nor a readable key file "
                            f"({e.strerror or e})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _policy_error(f"trusted key file {path[:200]} is not a regular file (a directory, device, FIFO or "
                            "socket); a key file holds lines 'ed25519:<hex>'")
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_KEY_FILE_BYTES + 1)
    if len(data) > MAX_KEY_FILE_BYTES:
        raise _policy_error(f"trusted key file {path[:200]} is larger than {MAX_KEY_FILE_BYTES} bytes; a key file "
                            "holds lines 'ed25519:<hex>' (72 bytes each)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _policy_error(f"trusted key file {path[:200]} is not UTF-8 text; a key file holds lines "
                            "'ed25519:<hex>'") from None


def _keys_of(entry: str | os.PathLike) -> list[bytes]:
    """The keys of one policy entry: a key text, or a file of key lines."""
    text = os.fspath(entry).strip()
    if not text:
        raise _policy_error("a trusted key is an empty string")
    if _KEY_RE.fullmatch(text):
        return [parse_key(text)]
    keys = []
    for n, line in enumerate(read_key_file(text).splitlines(), 1):
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


_EMPTY_ENV_FIX = (f"list the trusted public keys in {TRUSTED_KEYS_ENV} (ed25519:<hex> or .pub files, "
                  f"comma-separated), or unset it to load without a trust policy")


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
        ``ASCENDC_PACK_RUNTIME_TRUSTED_KEYS`` (comma-separated: ``:`` is part of a key; empty items
        are skipped) when set, else None (no policy: signatures are neither required nor checked).
        Only an *unset* variable means no policy: set but naming no key (``""``, spaces, ``","``:
        what ``KEYS=$UNSET`` writes) is a TrustPolicyError, never a silent "no policy"."""
        if trusted_keys is not None:
            if isinstance(trusted_keys, (str, os.PathLike)):
                trusted_keys = [trusted_keys]
            return TrustPolicy.of(trusted_keys)
        env = os.environ.get(TRUSTED_KEYS_ENV)
        if env is None:
            return None
        entries = [e for e in env.split(",") if e.strip()]
        if not entries:
            raise TrustPolicyError(f"{TRUSTED_KEYS_ENV} is set but names no key ({env[:40]!r}); an empty trust "
                                   f"policy is refused rather than taken as no policy: {_EMPTY_ENV_FIX}",
                                   field=TRUSTED_KEYS_ENV, fix=_EMPTY_ENV_FIX)
        return TrustPolicy.of(entries)

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
            doc = json.loads(data.decode("utf-8"), object_pairs_hook=unique_keys)   # as strict as C++
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


__all__ = ["TrustPolicy", "Signature", "check_signature", "parse_key", "key_text", "key_id", "read_key_file",
           "SIGNATURE_FORMAT"]
