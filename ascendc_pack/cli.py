"""The ``ascendc-pack`` command line (a click group; every command calls the pipeline)."""

from __future__ import annotations

import logging
import sys
import time

import click

from . import __version__
from .errors import PackError


def _fail(exc: Exception) -> None:
    click.secho(f"error: {exc}", fg="red", err=True)
    sys.exit(1)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ascendc-pack")
@click.option("-v", "--verbose", is_flag=True, help="Log progress at info level (logger `ascendc_pack`).")
def main(verbose: bool) -> None:
    """Tune a PyTorch model's fused CPU kernels on real inputs and package them."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(name)s: %(message)s")


@main.command()
@click.argument("model_file", type=click.Path(dir_okay=True, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the program as JSON instead of text.")
@click.option("--check/--no-check", default=True, show_default=True,
              help="Run the reference executor on the example and calibration inputs and compare with eager.")
def capture(model_file: str, as_json: bool, check: bool) -> None:
    """Capture MODEL_FILE with torch.export and print its Program.

    With --check (the default) the reference executor runs the Program on every input set and
    compares outputs and input mutations with eager PyTorch.
    """
    from .pipeline import capture_file, check_reference

    try:
        t0 = time.perf_counter()
        loaded, captured = capture_file(model_file)
        elapsed = time.perf_counter() - t0
        if as_json:
            click.echo(captured.model.dumps())
        else:
            from .program import dump

            click.echo(dump(captured.model), nl=False)
            click.echo(f"captured in {elapsed:.2f} s")
        if check:
            for report in check_reference(loaded, captured):
                click.echo(report, err=as_json)
    except PackError as exc:
        _fail(exc)


@main.command()
@click.argument("model_file", type=str)
@click.option("--topn", default=None, help="Candidates per fused kernel, 1-10 (env TORCHINDUCTOR_ASCENDC_AUTOTUNE_TOPN; default 1 = no PGO).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Bundle path (default: <model name>.ascpack).")
@click.option("--cores", default=None, help="Core limit: every kernel's block_dim <= N (default: all cores).")
@click.option("--cache-dir", default=None, help="Kernel cache root (env TORCHINDUCTOR_CACHE_DIR).")
@click.option("--jobs", default=None, help="Parallel candidate compiles (env TORCHINDUCTOR_COMPILE_THREADS).")
@click.option("--march", default=None, help="g++ -march target of the kernels, e.g. x86-64-v3 for fleets (default native).")
@click.option("--debug", is_flag=True, default=None, help="Keep kernel sources, compile commands and benchmark scripts (env TORCH_COMPILE_DEBUG=1).")
def build(model_file, topn, output, cores, cache_dir, jobs, march, debug):
    """Capture, fuse, tune and package MODEL_FILE into one .ascpack bundle."""
    from .pipeline import build_file

    try:
        t0 = time.perf_counter()
        result = build_file(model_file, topn=topn, output=output, cores=cores, cache_dir=cache_dir,
                            jobs=jobs, march=march, debug=debug, progress=True)
    except PackError as exc:
        _fail(exc)
        return
    click.echo(result.summary())
    stages = ", ".join(f"{k} {v:.2f} s" for k, v in result.seconds.items())
    size = result.output.stat().st_size
    click.echo(f"wrote {result.output} ({size / 1e6:.2f} MB) in {time.perf_counter() - t0:.1f} s ({stages}); "
               f"{result.kernels_compiled} candidate compiles, {result.kernels_profiled} kernels profiled")
