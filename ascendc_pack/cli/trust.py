"""``ascendc-pack keygen`` and ``ascendc-pack sign``: ed25519 keys and signed bundles.

Registered on the main click group by :func:`register` (``ascendc_pack.cli.main``). ``build
--sign-key`` and ``verify --trusted-key`` are options of those commands (they call
:func:`sign_built_bundle` and the runtime's ``verify_lines``). Needs the ``sign`` extra.
"""

from __future__ import annotations

import sys

import click


@click.command()
@click.option("-o", "--output", "key", required=True, type=click.Path(dir_okay=False),
              help="Private key file to write (mode 0600); the public key goes to KEY.pub.")
@click.option("--force", is_flag=True, help="Replace existing key files.")
def keygen(key: str, force: bool) -> None:
    """Create an ed25519 key pair for signing bundles. Give KEY.pub (one line `ed25519:<hex>`)
    to deployments: `verify --trusted-key`, `rt.load(..., trusted_keys=...)` or
    ASCENDC_PACK_RUNTIME_TRUSTED_KEYS."""
    from ascendc_pack.package.signing import SigningError, generate_key

    try:
        private, public, kid = generate_key(key, force=force)
    except SigningError as exc:
        click.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(1)
    click.echo(f"wrote {private} (private, keep it secret) and {public} (public); key id {kid}")


@click.command()
@click.argument("bundle", type=click.Path(dir_okay=False, exists=True))
@click.option("--key", required=True, type=click.Path(dir_okay=False), help="Private key (from `ascendc-pack keygen`).")
@click.option("-o", "--output", default=None, type=click.Path(dir_okay=False),
              help="Write the signed bundle here (default: sign BUNDLE in place).")
def sign(bundle: str, key: str, output: str | None) -> None:
    """Verify BUNDLE and sign its manifest (which hashes every member) with an ed25519 key."""
    from ascendc_pack.package.signing import SigningError, sign_bundle

    try:
        out, kid = sign_bundle(bundle, key, output)
    except SigningError as exc:
        click.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(1)
    click.echo(f"signed {out} with key {kid}")


def sign_built_bundle(path, key: str | None) -> None:
    """``build --sign-key``: sign the bundle just written (no-op without a key)."""
    if key is None:
        return
    from ascendc_pack.package.signing import SigningError, sign_bundle

    try:
        _, kid = sign_bundle(path, key)
    except SigningError as exc:
        click.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(1)
    click.echo(f"signed {path} with key {kid}")


def register(group: click.Group) -> None:
    """Add ``keygen`` and ``sign`` to the ``ascendc-pack`` command group."""
    group.add_command(keygen)
    group.add_command(sign)


__all__ = ["keygen", "sign", "sign_built_bundle", "register"]
