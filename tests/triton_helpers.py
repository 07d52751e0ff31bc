"""A real tritonserver (from the nvidia-pytriton wheel, the ``triton`` extra) on loopback, for the
tests and the serving bench: :func:`triton_unavailable` says why it cannot run here (the tests
skip with that reason), :class:`TritonServer` starts one on free ports and stops it."""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .serve_helpers import free_port, stop_process, wait_http_ready


def triton_unavailable(backend_dir: Path) -> str | None:
    """None when tritonserver can run here (the backend directory is then prepared), else why not."""
    from ascendc_pack.package.triton_setup import TritonSetupError, prepare_backend

    try:
        prepare_backend(backend_dir)
    except TritonSetupError as e:
        return str(e)
    return None


def skip_without_triton(backend_dir: Path) -> None:
    """pytest.skip with the reason where tritonserver cannot run here."""
    import pytest

    reason = triton_unavailable(backend_dir)
    if reason is not None:
        pytest.skip(f"tritonserver cannot run here: {reason}")


@dataclass
class TritonServer:
    """tritonserver serving ``repo`` on 127.0.0.1 (HTTP and gRPC, metrics off); a context manager."""

    repo: Path
    backend_dir: Path
    log: Path
    cache_dir: Path
    ready_timeout: float = 120.0
    http_port: int = 0
    grpc_port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self) -> TritonServer:
        from ascendc_pack.package.triton_setup import prepare_backend

        setup = prepare_backend(self.backend_dir)
        self.http_port, self.grpc_port = free_port(), free_port()
        cmd = setup.command(self.repo, http_port=self.http_port, grpc_port=self.grpc_port, metrics_port=None)
        env = setup.env()
        env["ASCENDC_PACK_RUNTIME_CACHE"] = str(self.cache_dir)
        self._log_file = open(self.log, "wb")
        self.proc = subprocess.Popen(cmd + ["--exit-timeout-secs", "10"], stdout=self._log_file,
                                     stderr=subprocess.STDOUT, env=env)
        wait_http_ready(self.proc, self.http_port, self.ready_timeout, lambda: self.log_text()[-4000:], self.stop,
                        "tritonserver")
        return self

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        stop_process(self.proc, signal.SIGINT, timeout=30)   # SIGINT: tritonserver's graceful stop
        self._log_file.close()
        return self.proc.returncode

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


DYNAMIC_RANGE = (1, 16)
DYNAMIC_BUCKETS = (1, 4, 8)


def build_dynamic_bundle(tmp_path_factory):
    """``(bundle, loaded)``: examples/transformer_block.py built with a dynamic batch dim
    (``--dynamic-batch 1:16 --buckets 1,4,8``), once per test process; pytest.skip with the
    reason where this build has no dynamic shapes yet."""
    import pytest
    from click.testing import CliRunner

    import ascendc_pack_runtime as rt
    from ascendc_pack.cli.main import main
    from ascendc_pack.frontend.loader import load_model_file
    from ascendc_pack_runtime.batching import batch_spec

    from .conftest import EXAMPLES

    out = tmp_path_factory.getbasetemp() / "dynamic" / "encoder.ascpack"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        lo, hi = DYNAMIC_RANGE
        r = CliRunner().invoke(main, ["build", str(EXAMPLES / "transformer_block.py"), "--topn", "1", "-o", str(out),
                                      "--cache-dir", str(out.parent / "cache"), "--dynamic-batch", f"{lo}:{hi}",
                                      "--buckets", ",".join(map(str, DYNAMIC_BUCKETS))])
        assert r.exit_code == 0, r.output[-3000:]
    with rt.load(out, cache_dir=out.parent / "rt") as m:
        assert batch_spec(m.manifest) is not None, "the dynamic-batch bundle declares no batch dim batch_spec reads"
    return out, load_model_file(EXAMPLES / "transformer_block.py")
