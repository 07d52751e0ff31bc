"""Verification of a bundle without writing anything: every problem, one typed error each.

:func:`verify_bundle` runs the checks :func:`~ascendc_pack_runtime.extract.open_bundle` runs
(the container and members through :func:`~ascendc_pack_runtime.archive.scan`, then the host)
and collects every problem instead of stopping at the first; :func:`read_manifest` reads only
the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .archive import Head, check_path, read_head, scan
from .errors import BundleError
from .host import host_problems
from .manifest import Manifest

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

    @property
    def ok(self) -> bool:
        return not self.problems


def read_manifest(path: Path | str) -> Manifest:
    """The typed, validated manifest of a bundle (cheap: the frame's block headers and the
    first member). Does not check members or the host."""
    return read_head(path).manifest


def verify_bundle(path: Path | str, *, check_host_compat: bool = True) -> VerifyReport:
    """Run every check :func:`open_bundle` runs, writing nothing, and collect every problem
    (one typed error each; a problem that stops the stream, e.g. corruption, ends the list)."""
    path = Path(path)
    rep = VerifyReport(path)

    def collect(err: BundleError) -> None:
        rep.problems.append(err)
        if len(rep.problems) >= MAX_PROBLEMS:
            raise BundleError(f"{path}: more than {MAX_PROBLEMS} problems; stopping")

    def keep(head: Head) -> None:
        rep.manifest = head.manifest

    try:
        check_path(path)
        result = scan(path, None, collect, keep)
        rep.bundle_sha256, rep.has_checksum, rep.members_checked = (result.bundle_sha256, result.has_checksum,
                                                                    result.members_checked)
    except BundleError as e:
        if not rep.problems or rep.problems[-1] is not e:
            rep.problems.append(e)
    if check_host_compat and rep.manifest is not None:
        rep.problems.extend(host_problems(rep.manifest))
    return rep


__all__ = ["VerifyReport", "verify_bundle", "read_manifest", "MAX_PROBLEMS"]
