"""The ``ascendc-pack`` command line (a click group; every command calls the pipeline)."""

from __future__ import annotations

import logging
import os
import sys
import time

import click

from ascendc_pack_runtime.constants import VERSION as __version__
from ascendc_pack.cli.trust import register as register_trust_commands, sign_built_bundle
from ascendc_pack.errors import ConfigError, PackError


class PositiveInt(click.ParamType):
    """An integer >= 1 (shown as INTEGER in --help)."""

    name = "integer"

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        try:
            number = int(str(value).strip())
        except ValueError:
            number = 0
        if number < 1:
            self.fail(f"{value!r} is not a positive integer", param, ctx)
        return number


POSITIVE_INT = PositiveInt()


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
@click.option("--atol", type=click.FloatRange(min=0), default=None, help="Absolute tolerance of --check (default: per dtype).")
@click.option("--rtol", type=click.FloatRange(min=0), default=None, help="Relative tolerance of --check (default: per dtype).")
def capture(model_file: str, as_json: bool, check: bool, atol, rtol) -> None:
    """Capture MODEL_FILE with torch.export and print its Program.

    With --check (the default) the reference executor runs the Program on every input set and
    compares outputs and input mutations with eager PyTorch.
    """
    from ascendc_pack.pipeline import capture_file, check_reference

    try:
        t0 = time.perf_counter()
        loaded, captured = capture_file(model_file)
        elapsed = time.perf_counter() - t0
        if as_json:
            click.echo(captured.model.dumps())
        else:
            from ascendc_pack.ir.program import dump

            from ascendc_pack.passes.fuse import fuse
            from ascendc_pack.ir.program import fusion_summary

            click.echo(dump(captured.model), nl=False)
            click.echo(fusion_summary(fuse(captured.model)))
            click.echo(f"captured in {elapsed:.2f} s")
        if check:
            for report in check_reference(loaded, captured, atol=atol, rtol=rtol):
                click.echo(report, err=as_json)
    except PackError as exc:
        _fail(exc)


@main.command()
@click.argument("model_file", type=str)
@click.option("--topn", default=None, type=POSITIVE_INT, help="Candidates per fused kernel, 1-10 (env TORCHINDUCTOR_ASCENDC_AUTOTUNE_TOPN; default 1 = no PGO).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Bundle path (default: <model name>.ascpack).")
@click.option("--cores", default=None, type=POSITIVE_INT, help="Core limit: every kernel's block_dim <= N (default: all cores).")
@click.option("--cache-dir", default=None, type=click.Path(file_okay=False), help="Kernel cache root (env TORCHINDUCTOR_CACHE_DIR).")
@click.option("--jobs", default=None, type=POSITIVE_INT, help="Parallel candidate compiles (env TORCHINDUCTOR_COMPILE_THREADS).")
@click.option("--march", default=None, help="g++ -march target of the kernels, e.g. x86-64-v3 for fleets (default native).")
@click.option("--backend", default=None, help="Target device backend: cpu (default) or npu (AscendC kernels).")
@click.option("--emulate", is_flag=True, default=False,
              help="With --backend npu: compile the AscendC kernels against the CPU emulation and run the npu pipeline here.")
@click.option("--cann", default=None, metavar="VERSION",
              help="With --backend npu: the CANN release whose AscendC API the kernels use (8.5.0 or 9.1.0; "
                   "default: the toolkit's, else 8.5.0). Env ASCENDC_PACK_NPU_CANN.")
@click.option("--debug", is_flag=True, default=None, help="Keep kernel sources, compile commands and benchmark scripts (env TORCH_COMPILE_DEBUG=1).")
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Load the new bundle and compare it with eager on the example and calibration inputs before writing it.")
@click.option("--atol", type=click.FloatRange(min=0), default=None, help="Absolute tolerance of the eager comparison (default: per dtype).")
@click.option("--rtol", type=click.FloatRange(min=0), default=None, help="Relative tolerance of the eager comparison (default: per dtype).")
@click.option("--sign-key", default=None, type=click.Path(dir_okay=False), help="Sign the bundle with this ed25519 key (ascendc-pack keygen).")
@click.option("--dynamic-batch", default=None, metavar="MIN:MAX",
              help="Dim 0 of every input is a dynamic batch in [MIN, MAX] (a model file may instead declare its dynamic dims with get_dynamic_shapes()).")
@click.option("--buckets", default=None, metavar="B1,B2,...",
              help="With --dynamic-batch: batch sizes to build and tune a static plan for (default: the example's); other sizes run the generic plan.")
@click.option("--precision", default=None, type=click.Choice(["fp32", "bf16", "int8", "auto"]),
              help="Precision of the heavy steps: fp32 = the model's own dtype (default); bf16 / int8 / auto (both) add "
                   "low-precision candidates, chosen per step under --accuracy-budget; int8 scales are calibrated on "
                   "the example and calibration inputs (docs/PRECISION.md).")
@click.option("--accuracy-budget", default=None, metavar="E",
              help="With --precision bf16/int8/auto: the largest relative output error ||y - y_fp32|| / ||y_fp32|| allowed "
                   "on the example and calibration inputs (default 0.01).")
@click.option("--flush-denormals", is_flag=True, default=False,
              help="Run every call with denormal floats flushed to zero (FTZ/DAZ): much faster where a model makes "
                   "them, e.g. a masked softmax; results differ only where eager computes a denormal (docs/PRECISION.md).")
def build(model_file, topn, output, cores, cache_dir, jobs, march, backend, emulate, cann, debug, verify, atol, rtol,
          sign_key, dynamic_batch, buckets, precision, accuracy_budget, flush_denormals):
    """Capture, fuse, tune and package MODEL_FILE into one .ascpack bundle.

    Every stage reports progress on stderr (bars on a terminal, plain lines otherwise); Ctrl-C
    stops the build cleanly (exit 130): the bundle is not written, finished kernels stay cached.
    """
    from ascendc_pack.backends.registry import backend_key, check_backend_name, get_backend
    from ascendc_pack.dynamic import build_file

    try:
        t0 = time.perf_counter()
        backend = backend_key(backend, emulate)
        if cann is not None:
            from ascendc_pack.backends.npu.api import check_cann

            if backend not in ("npu", "npu-emu"):
                raise ConfigError("--cann applies to --backend npu (the AscendC API release), got --backend "
                                  f"{backend or 'cpu'}")
            os.environ["ASCENDC_PACK_NPU_CANN"] = check_cann(cann)
        if backend is not None:
            get_backend(check_backend_name(backend, "--backend"))  # fails now, before the model is loaded
        if precision is not None or accuracy_budget is not None or flush_denormals:  # bad values fail now,
            from ascendc_pack.config import BuildConfig                                  # before the model is loaded

            BuildConfig.resolve(precision=precision, accuracy_budget=accuracy_budget, cache_dir=cache_dir,
                                backend=backend, flush_denormals=flush_denormals)
        result = build_file(model_file, topn=topn, output=output, cores=cores, cache_dir=cache_dir,
                            jobs=jobs, march=march, debug=debug, backend=backend, progress=True,
                            verify=verify, atol=atol, rtol=rtol, dynamic_batch=dynamic_batch, buckets=buckets,
                            precision=precision, accuracy_budget=accuracy_budget, flush_denormals=flush_denormals)
    except PackError as exc:
        _fail(exc)
        return
    except KeyboardInterrupt:
        click.secho("interrupted: no bundle was written; kernels that finished compiling or tuning "
                    "stay in the cache", fg="yellow", err=True)
        sys.exit(130)
    click.echo(result.summary())
    stages = ", ".join(f"{k.replace('_', ' ')} {v:.2f} s" for k, v in result.seconds.items())
    size = result.output.stat().st_size
    click.echo(f"wrote {result.output} ({size / 1e6:.2f} MB) in {time.perf_counter() - t0:.1f} s ({stages}); "
               f"{result.kernels_compiled} candidate compiles, {result.cache_hits} cached, "
               f"{result.compile_failures} failed; {result.kernels_profiled} kernels profiled, "
               f"{result.candidates_disqualified} candidates disqualified"
               + (f"; {len(result.fallbacks)} kernels fell back to ATen" if result.fallbacks else ""))
    sign_built_bundle(result.output, sign_key)


@main.command()
@click.argument("model_file", type=str)
@click.option("--topn", default=4, show_default=True, type=int, help="Candidates per kernel of the tuned bundle.")
@click.option("--repeat", default=20, show_default=True, type=int, help="Interleaved timing rounds.")
@click.option("--cold-runs", default=5, show_default=True, type=int, help="Cold-start processes per artifact.")
@click.option("--contenders", default=None,
              help="Comma-separated subset of eager,compile,compile_freeze,compile_ascendc,aoti,ort,ov_f32,ov,bundle1,bundleN,"
                   "bundleN_bf16 (the default: all of these), and on request bundleN_ftz (built with --flush-denormals), "
                   "ort_int8 (ONNX Runtime, static int8 quantization) and bundleN_int8 (--precision int8).")
@click.option("--same-process", is_flag=True, help="Time every contender in this process (default: one process each).")
@click.option("--contention", is_flag=True, help="Also time each contender with one core kept busy by another process.")
@click.option("--busy-core", default=None, type=int, help="Pin the busy process to this core (default: not pinned).")
@click.option("--rebuild", is_flag=True, help="Also rebuild the tuned bundle on its warm cache (build-time table).")
@click.option("--idle-bursts", default=5, show_default=True, type=click.IntRange(min=0),
              help="Times per contender the first call after 0.3 s of idle is timed (0: skip).")
@click.option("--work-dir", default=None, help="Keep artifacts and worker logs here (default: a temp dir).")
@click.option("--json", "json_path", default=None, help="Also write the raw results as JSON.")
def bench(model_file, topn, repeat, cold_runs, contenders, same_process, contention, busy_core, rebuild, idle_bursts,
          work_dir, json_path):
    """Benchmark MODEL_FILE: eager, torch.compile, AOTInductor, ONNX Runtime, OpenVINO and the bundle.

    Same as `python -m ascendc_pack.bench model`; the protocol is in docs/PERFORMANCE.md.
    Needs the `bench` extra for ONNX Runtime (pip install 'ascendc-pack[bench]').
    """
    from ascendc_pack.bench.command import bench_model_main

    try:
        bench_model_main(model_file, topn=topn, repeat=repeat, cold_runs=cold_runs, contenders=contenders,
                         same_process=same_process, work_dir=work_dir, json_path=json_path,
                         contention=contention, busy_core=busy_core, rebuild=rebuild, idle_bursts=idle_bursts)
    except (PackError, ValueError) as exc:
        _fail(exc)


@main.command()
@click.argument("bundle", type=str)
@click.option("--name", default=None, help="Model name in the URLs (default: the bundle's model name).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to listen on. Loopback by default: no authentication or TLS; pass 0.0.0.0 to serve other machines (e.g. in a container).")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535), help="HTTP port.")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Model instances serving requests in parallel (each loads the bundle: own buffers).")
@click.option("--access-log/--no-access-log", default=True, show_default=True, help="Log one line per request.")
@click.option("--max-body-mb", default=None, type=click.FloatRange(min=0, min_open=True),
              help="Refuse request bodies larger than this after decompression (413); default 1 MiB + 16 x the input bytes.")
@click.option("--header-timeout", default=10.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds for a request's line and headers to arrive (408 and close after).")
@click.option("--body-timeout", default=60.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds for a request's whole body to arrive after its headers (408 and close after).")
@click.option("--keep-alive", default=15.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds an idle kept-alive connection stays open (behind a proxy: above the proxy's idle timeout).")
@click.option("--limit-concurrency", default=64, show_default=True, type=click.IntRange(1),
              help="Requests in progress; beyond it a request gets 503 at once (idle connections do not count).")
@click.option("--max-connections", default=512, show_default=True, type=click.IntRange(1),
              help="Open connections; one more closes the longest-idle connection (idle sockets cannot starve the server).")
@click.option("--threads", default=None, type=POSITIVE_INT,
              help="Thread cap of each instance's calls: fused kernels and torch's intra-op threads (default: none for one worker, torch's threads // workers for several).")
@click.option("--batching/--no-batching", default=True, show_default=True,
              help="Bundles with a batch dim: run concurrent requests as one call (static bundles never batch).")
@click.option("--max-batch-delay-ms", default=2.0, show_default=True, type=click.FloatRange(min=0),
              help="How long a request waits for others to batch with (requests queued behind busy instances batch anyway).")
@click.option("--eager", "eager_model", default=None, metavar="MODEL.py",
              help="Comparison baseline: serve MODEL.py's eager PyTorch module (same signature, same server) instead of the bundle's graph.")
def serve(bundle, name, host, port, workers, access_log, max_body_mb, header_timeout, body_timeout, keep_alive,
          limit_concurrency, max_connections, threads, batching, max_batch_delay_ms, eager_model):
    """Serve BUNDLE over the Open Inference Protocol (V2 REST) with KServe's model server.

    Needs the `serve` extra (pip install 'ascendc-pack[serve]'). Works with tritonclient's
    HTTP client in JSON and binary mode; ready once every instance is loaded and warmed up.
    Prints a start line, a ready line and (unless --no-access-log) one line per request.
    OpenMP threads sleep while they wait (OMP_WAIT_POLICY=PASSIVE unless you set
    OMP_WAIT_POLICY or GOMP_SPINCOUNT): see the README's runtime threading section.
    """
    from ascendc_pack_runtime.errors import BundleError
    from ascendc_pack_runtime.server import ServeOptions, serve as serve_bundle
    from ascendc_pack_runtime.threads import per_instance_threads

    factory = None
    try:
        options = ServeOptions(host=host, port=port, workers=workers, threads=threads, access_log=access_log,
                               max_body_bytes=None if max_body_mb is None else int(max_body_mb * 2**20),
                               header_timeout_s=header_timeout, body_timeout_s=body_timeout,
                               keep_alive_s=keep_alive, limit_concurrency=limit_concurrency,
                               max_connections=max_connections, batching=batching,
                               max_batch_delay_s=max_batch_delay_ms / 1e3)
        if eager_model is not None:
            factory = _eager_runner_factory(eager_model, per_instance_threads(workers, threads))
        serve_bundle(bundle, options, name=name, runner_factory=factory,
                     platform="pytorch_eager" if eager_model else None)
    except (BundleError, PackError, ValueError, ImportError) as exc:
        _fail(exc)


def _eager_runner_factory(model_file: str, threads: int | None = None):
    """Runners that call the eager module of MODEL_FILE (one module shared: eval, no_grad), with
    the bundle's thread cap on torch's intra-op threads."""
    import torch
    from torch.utils import _pytree as pytree

    from ascendc_pack_runtime.threads import intra_op_threads

    from ascendc_pack.frontend.loader import load_model_file

    module = load_model_file(model_file).module

    def make():
        def run(*inputs):
            with torch.no_grad(), intra_op_threads(threads):
                return pytree.tree_leaves(module(*inputs))
        return run

    return make


@main.command("export-triton")
@click.argument("bundle", type=str)
@click.option("-o", "--output", "repo", required=True, type=click.Path(file_okay=False),
              help="Model repository directory (created if missing); the model goes to REPO/NAME/.")
@click.option("--name", default=None, help="Model name (default: the bundle's model name).")
@click.option("--instances", default=1, show_default=True, type=click.IntRange(1, 64),
              help="instance_group count (KIND_CPU): Triton runs one Python stub process per instance.")
@click.option("--threads", default=None, type=POSITIVE_INT,
              help="Thread cap of each instance's calls (default: torch's threads // instances, in each instance).")
@click.option("--max-queue-delay-us", default=None, type=click.IntRange(0),
              help="Bundles with a batch dim: how long Triton's dynamic batcher holds a request for others (default 2000).")
@click.option("--dynamic-batching/--no-dynamic-batching", default=True, show_default=True,
              help="Bundles with a batch dim: let Triton's dynamic batcher group requests into one call.")
@click.option("--vendor-runtime/--no-vendor-runtime", default=True, show_default=True,
              help="Copy ascendc_pack_runtime next to model.py (Triton's Python then needs only torch, numpy<2 and zstandard).")
@click.option("--force", is_flag=True, help="Replace REPO/NAME if it exists.")
def export_triton(bundle, repo, name, instances, threads, max_queue_delay_us, dynamic_batching, vendor_runtime, force):
    """Write a Triton Inference Server model repository (Python backend) for BUNDLE."""
    import importlib.util

    from ascendc_pack_runtime.errors import BundleError
    from ascendc_pack_runtime.triton_config import DEFAULT_QUEUE_DELAY_US

    from ascendc_pack.package.triton_export import export_triton as export
    from ascendc_pack.package.triton_setup import INSTALL

    try:
        result = export(bundle, repo, name=name, instances=instances, vendor_runtime=vendor_runtime, force=force,
                        threads=threads, max_queue_delay_us=DEFAULT_QUEUE_DELAY_US if max_queue_delay_us is None
                        else max_queue_delay_us, dynamic_batching=dynamic_batching)
    except (BundleError, PackError, ValueError) as exc:
        _fail(exc)
        return
    if result.max_batch_size == 0:
        batching = "max_batch_size 0: static shapes, one call per request"
    else:
        batching = f"max_batch_size {result.max_batch_size}, " + (
            "dynamic_batching on" if result.batching else "no dynamic_batching: one call per request")
    click.echo(f"wrote {result.model_dir} (config.pbtxt, 1/model.py, 1/{result.bundle.name}"
               f"{', 1/ascendc_pack_runtime/' if vendor_runtime else ''}); {batching}")
    click.echo("next:")
    if importlib.util.find_spec("pytriton") is None:
        click.echo(f"  {INSTALL}")
    click.echo(f"  ascendc-pack triton-setup triton_backend --repo {result.repo}   # prepares Triton's Python backend "
               "and prints the tritonserver command")


@main.command("triton-setup")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--repo", default="model_repository", show_default=True,
              help="Model repository the printed command serves (written by export-triton).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address tritonserver listens on.")
@click.option("--http-port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--grpc-port", default=8001, show_default=True, type=click.IntRange(1, 65535))
@click.option("--metrics-port", default=8002, show_default=True, type=click.IntRange(1, 65535))
def triton_setup(directory, repo, host, http_port, grpc_port, metrics_port):
    """Prepare DIRECTORY as Triton's Python backend directory (from the nvidia-pytriton wheel) and
    print the tritonserver command that serves REPO with this Python."""
    from ascendc_pack.package.triton_setup import prepare_backend

    try:
        setup = prepare_backend(directory)
    except PackError as exc:
        _fail(exc)
        return
    click.echo(f"prepared {setup.backend_dir}/python (Triton's Python backend; the stub runs {setup.python_bin}/python3)")
    click.echo("serve the repository with:")
    click.echo("  " + setup.shell(repo, host=host, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port))


# --- runtime tools: inspect / verify / run a bundle (ascendc_pack_runtime.tools; no compiler) ---


@main.command()
@click.argument("bundle", type=click.Path(dir_okay=False, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def inspect(bundle: str, as_json: bool) -> None:
    """Summarize BUNDLE: model, target, inputs/outputs, per-kernel choice with every candidate's
    timing and whether PGO visited it (reads the manifest only)."""
    from ascendc_pack_runtime.tools import inspect_bundle

    text, rc = inspect_bundle(bundle, as_json)
    click.echo(text, err=rc != 0)
    sys.exit(rc)


@main.command()
@click.argument("bundle", type=click.Path(dir_okay=False, path_type=str))
@click.option("--trusted-key", "trusted_keys", multiple=True, help="Require a signature by this public key (ed25519:<hex> or a .pub file; repeatable; default $ASCENDC_PACK_RUNTIME_TRUSTED_KEYS).")
def verify(bundle: str, trusted_keys: tuple[str, ...]) -> None:
    """Run every load-time check on BUNDLE without loading it: zstd frame and checksum, member
    list, sizes, sha256, safe names and types, size caps, manifest fields, and this host's CPU
    features, torch and C++ ABI. Exit 0 when it would load, else 1 with one line per problem."""
    from ascendc_pack_runtime.tools import verify_lines

    lines, rc = verify_lines(bundle, list(trusted_keys) or None)
    click.echo("\n".join(lines))
    sys.exit(rc)


@main.command()
@click.argument("bundle", type=click.Path(dir_okay=False, path_type=str))
@click.option("--inputs", "inputs_file", default=None, type=click.Path(dir_okay=False),
              help="An .npz with one array per model input (named after the inputs, or in order).")
@click.option("--random", "random_inputs", is_flag=True, help="Random inputs of the manifest's shapes (the default).")
@click.option("--repeat", default=20, show_default=True, type=int, help="Timed calls.")
@click.option("--warmup", default=1, show_default=True, type=int, help="Untimed calls first.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the random inputs.")
@click.option("--threads", default=None, type=POSITIVE_INT,
              help="Cap every call at N threads: the fused kernels and torch's intra-op threads (default: no cap).")
@click.option("--check", "check_file", default=None, metavar="MODEL.py", type=click.Path(dir_okay=False),
              help="Compare the outputs with MODEL.py's eager module on the same inputs; exit 1 on a mismatch.")
@click.option("--atol", type=click.FloatRange(min=0), default=None, help="Absolute tolerance of --check (default: per dtype).")
@click.option("--rtol", type=click.FloatRange(min=0), default=None, help="Relative tolerance of --check (default: per dtype).")
@click.option("--save-outputs", default=None, metavar="F.npz", type=click.Path(dir_okay=False),
              help="Write the outputs to an .npz, one array per output named as in the manifest (needs numpy).")
@click.option("--profile", default=0, show_default=True, type=click.IntRange(min=0), metavar="N",
              help="Also profile N calls (torch.profiler) and print the slowest steps and the time per kernel / ATen op.")
def run(bundle: str, inputs_file: str | None, random_inputs: bool, repeat: int, warmup: int, seed: int,
        threads: int | None, check_file: str | None, atol, rtol, save_outputs: str | None, profile: int) -> None:
    """Load BUNDLE with the minimal runtime, run it and print the outputs' dtypes and shapes and
    the latency percentiles p50/p90/p99; with --check, the error of every output against the
    eager model (and the allowed error); with --profile N, where the time of a call goes, step
    by step."""
    from ascendc_pack_runtime.tools import run_bundle

    if inputs_file and random_inputs:
        _fail(ValueError("pass either --inputs FILE.npz or --random, not both"))
    lines, rc, _ = run_bundle(bundle, inputs_file=inputs_file, repeat=repeat, warmup=warmup, seed=seed,
                              threads=threads, check=check_file, atol=atol, rtol=rtol, save_outputs=save_outputs,
                              profile=profile)
    click.echo("\n".join(lines), err=rc != 0)
    sys.exit(rc)


register_trust_commands(main)   # keygen, sign (ascendc_pack/cli/trust.py)
