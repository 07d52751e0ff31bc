"""``python -m ascendc_pack_runtime {inspect,verify,run,extract} BUNDLE`` (runtime-only machines).

The same commands as ``ascendc-pack inspect|verify|run``, plus ``extract``, which verifies a
bundle, extracts it into the runtime cache and prints the directory (what the C++ API loads).
"""

from __future__ import annotations

import argparse
import sys

from . import tools


def _trust_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trusted-key", action="append", default=None, metavar="KEY",
                        help="refuse the bundle unless signed by this public key (ed25519:<hex> or a .pub file; "
                             "repeatable; default: $ASCENDC_PACK_RUNTIME_TRUSTED_KEYS)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ascendc_pack_runtime", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("inspect", help="print a summary of the manifest")
    a.add_argument("bundle")
    a.add_argument("--json", action="store_true", help="print the manifest as JSON")
    a = sub.add_parser("verify", help="run every check; exit 1 with one line per problem")
    a.add_argument("bundle")
    _trust_option(a)
    a = sub.add_parser("run", help="load, run, print outputs and latency percentiles")
    a.add_argument("bundle")
    src = a.add_mutually_exclusive_group()
    src.add_argument("--inputs", default=None, help="an .npz with one array per input (by name or in order)")
    src.add_argument("--random", action="store_true", help="random inputs (the default)")
    a.add_argument("--repeat", type=int, default=20)
    a.add_argument("--warmup", type=int, default=1)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--cache-dir", default=None)
    _trust_option(a)
    a = sub.add_parser("extract", help="verify and extract into the cache; print the directory")
    a.add_argument("bundle")
    a.add_argument("--cache-dir", default=None)
    a.add_argument("--full", action="store_true", help="rehash an earlier extraction before reusing it")
    _trust_option(a)
    args = p.parse_args(argv)

    if args.cmd == "inspect":
        text, rc = tools.inspect_bundle(args.bundle, args.json)
        print(text, file=sys.stderr if rc else sys.stdout)
        return rc
    if args.cmd == "verify":
        lines, rc = tools.verify_lines(args.bundle, args.trusted_key)
        print("\n".join(lines))
        return rc
    if args.cmd == "run":
        lines, rc, _ = tools.run_bundle(args.bundle, inputs_file=args.inputs, repeat=args.repeat,
                                        warmup=args.warmup, seed=args.seed, cache_dir=args.cache_dir,
                                        trusted_keys=args.trusted_key)
        print("\n".join(lines), file=sys.stderr if rc else sys.stdout)
        return rc
    text, rc = tools.extract(args.bundle, args.cache_dir, "full" if args.full else "sizes", args.trusted_key)
    print(text, file=sys.stderr if rc else sys.stdout)
    return rc


if __name__ == "__main__":
    sys.exit(main())
