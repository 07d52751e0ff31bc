"""``python -m ascendc_pack_runtime {inspect,verify,run,extract} BUNDLE`` (runtime-only machines).

Importing the package first sets the OpenMP wait policy before torch loads libgomp
(:mod:`ascendc_pack_runtime.threads`), so these commands always run under it.

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


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number >= 0")
    return value


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
    a.add_argument("--threads", type=_positive, default=None,
                   help="cap every call at N threads (fused kernels and torch's intra-op threads)")
    a.add_argument("--check", default=None, metavar="MODEL.py",
                   help="compare the outputs with MODEL.py's eager module on the same inputs (exit 1 on mismatch)")
    a.add_argument("--atol", type=_tolerance, default=None, help="absolute tolerance of --check (default: per dtype)")
    a.add_argument("--rtol", type=_tolerance, default=None, help="relative tolerance of --check (default: per dtype)")
    a.add_argument("--save-outputs", default=None, metavar="F.npz",
                   help="write the outputs to an .npz named by the manifest's output names (needs numpy)")
    a.add_argument("--profile", type=int, default=0, metavar="N",
                   help="also profile N calls (torch.profiler): the slowest steps, time per kernel / ATen op")
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
                                        trusted_keys=args.trusted_key, threads=args.threads, check=args.check,
                                        atol=args.atol, rtol=args.rtol, save_outputs=args.save_outputs,
                                        profile=args.profile)
        print("\n".join(lines), file=sys.stderr if rc else sys.stdout)
        return rc
    text, rc = tools.extract(args.bundle, args.cache_dir, "full" if args.full else "sizes", args.trusted_key)
    print(text, file=sys.stderr if rc else sys.stdout)
    return rc


if __name__ == "__main__":
    sys.exit(main())
