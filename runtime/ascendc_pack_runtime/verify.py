"""Verification of a bundle without writing anything: every problem, one typed error each.

:func:`verify_bundle` runs the checks :func:`~ascendc_pack_runtime.extract.open_bundle` runs
(the container and members through :func:`~ascendc_pack_runtime.archive.scan`, then the host)
and collects every problem instead of stopping at the first; :func:`read_manifest` reads only
the manifest.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from .archive import Head, check_path, read_head, scan
from .errors import BundleError, BundleNotFoundError, SignatureInvalidError
from .host import host_problems
from .manifest import Manifest
from .trust import Signature, TrustPolicy, check_signature, key_id

MAX_PROBLEMS = 100


@dataclass
class VerifyReport:
    """What :func:`verify_bundle` found. ``problems`` holds one typed error per problem."""

    path: Path
    manifest: Manifest | None = None
    problems: list[BundleError] = field(default_factory=list)
    bundle_sha256: str | None = None
    members_checked: int = 0
    has_checksum: bool | None = None
    signer: str | None = None             # key id of manifest.sig, when the bundle is signed
    signature_checked: bool = False       # the signature was verified against a trust policy

    @property
    def ok(self) -> bool:
        return not self.problems


def read_manifest(path: Path | str) -> Manifest:
    """The typed, validated manifest of a bundle (cheap: the frame's block headers and the
    first member). Does not check members or the host."""
    return read_head(path).manifest


def verify_bundle(path: Path | str, *, check_host_compat: bool = True,
                  trusted_keys: Iterable[str | os.PathLike] | None = None) -> VerifyReport:
    """Run every check :func:`open_bundle` runs, writing nothing, and collect every problem
    (one typed error each; a problem that stops the stream, e.g. corruption, ends the list).

    ``trusted_keys`` (default ``$ASCENDC_PACK_RUNTIME_TRUSTED_KEYS``) applies a trust policy;
    without one a signature is reported (``signer``) but not checked."""
    path = Path(path)
    rep = VerifyReport(path)
    heads: list[Head] = []

    def collect(err: BundleError) -> None:
        rep.problems.append(err)
        if len(rep.problems) >= MAX_PROBLEMS:
            raise BundleError(f"{path}: more than {MAX_PROBLEMS} problems; stopping")

    def keep(head: Head) -> None:
        rep.manifest = head.manifest
        heads.append(head)

    try:
        policy = TrustPolicy.resolve(trusted_keys)
        check_path(path)
        result = scan(path, None, collect, keep)
        rep.bundle_sha256, rep.has_checksum, rep.members_checked = (result.bundle_sha256, result.has_checksum,
                                                                    result.members_checked)
    except BundleError as e:
        policy = None
        if not rep.problems or rep.problems[-1] is not e:
            rep.problems.append(e)
    except OSError as e:
        policy = None
        rep.problems.append(BundleNotFoundError(f"{path}: cannot read it ({e.strerror or e}); pass a readable "
                                                ".ascpack file", fix="pass a readable .ascpack file"))
    if heads:
        _check_trust(rep, heads[0], policy)
    if check_host_compat and rep.manifest is not None:
        rep.problems.extend(host_problems(rep.manifest))
    return rep


def _check_trust(rep: VerifyReport, head: Head, policy: TrustPolicy | None) -> None:
    """Without a policy a signature is only reported (``load`` neither requires nor checks it);
    with one, a trust problem comes first (``load`` refuses before anything else)."""
    if head.signature is not None:
        with contextlib.suppress(SignatureInvalidError):
            rep.signer = key_id(Signature.from_bytes(head.signature).public_key)
    if policy is None:
        return
    try:
        check_signature(head.manifest_bytes, head.signature, policy, str(rep.path))
        rep.signature_checked = True
    except BundleError as e:
        rep.problems.insert(0, e)


__all__ = ["VerifyReport", "verify_bundle", "read_manifest", "MAX_PROBLEMS"]
