"""The runtime's threading policy (ascendc_pack_runtime.threads): the OpenMP wait policy set
before torch loads libgomp (checked in fresh processes through libgomp's own OMP_DISPLAY_ENV
report), the user's setting respected, and per-model thread caps on the fused kernels and
torch's intra-op threads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ascendc_pack_runtime as rt
from ascendc_pack.config import BuildConfig
from ascendc_pack_runtime.threads import apply_wait_policy, intra_op_threads, per_instance_threads

from .bundle_fixtures import build_model_file, build_root
from .runtime_fixtures import example

OMP_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "OMP_DISPLAY_ENV")

WIDE = '''
import torch


class Wide(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x * 2, -1)


def get_model():
    return Wide()


def get_example_inputs():
    return (torch.randn(2048, 1024, generator=torch.Generator().manual_seed(0)),)
'''


def _python(code_or_args, extra_env=None, timeout=300):
    """Run a fresh Python with no OpenMP variables but ``extra_env``, libgomp reporting its
    settings (OMP_DISPLAY_ENV=verbose); returns (stdout, libgomp's GOMP_SPINCOUNT, wait policy)."""
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARS}
    env.update({"OMP_DISPLAY_ENV": "verbose", **(extra_env or {})})
    args = ["-c", code_or_args] if isinstance(code_or_args, str) else code_or_args
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    spin = re.search(r"GOMP_SPINCOUNT = '(\d+)'", proc.stderr)
    policy = re.search(r"OMP_WAIT_POLICY = '(\w+)'", proc.stderr)
    assert spin and policy, "libgomp printed no OMP_DISPLAY_ENV report:\n" + proc.stderr[-3000:]
    return proc.stdout, int(spin.group(1)), policy.group(1)


PROBE = "import os, ascendc_pack_runtime as rt, torch; print(os.environ.get('OMP_WAIT_POLICY'), rt.WAIT_POLICY.source)"


def test_importing_the_runtime_before_torch_makes_libgomp_passive():
    out, spin, policy = _python(PROBE)
    assert out.split() == ["PASSIVE", "runtime"]
    assert (policy, spin) == ("PASSIVE", 0)   # libgomp itself: threads sleep at once, never spin


def test_command_line_entry_points_run_passive(tmp_path_factory):
    bundle = example(tmp_path_factory, "add_sum").bundle
    _, spin, _ = _python(["-m", "ascendc_pack_runtime", "inspect", str(bundle)])
    assert spin == 0
    _, spin, _ = _python(["-m", "ascendc_pack", "inspect", str(bundle)])
    assert spin == 0
    script = Path(sys.executable).parent / "ascendc-pack"   # the console script: ascendc_pack.cli.main:main
    if script.exists():
        _, spin, _ = _python([str(script), "inspect", str(bundle)])
        assert spin == 0


def test_the_users_wait_policy_is_respected():
    out, spin, policy = _python(PROBE, {"OMP_WAIT_POLICY": "ACTIVE"})
    assert out.split() == ["ACTIVE", "user"] and policy == "ACTIVE" and spin > 10**9
    out, spin, _ = _python(PROBE, {"GOMP_SPINCOUNT": "1000"})
    assert out.split() == ["None", "user"] and spin == 1000


def test_torch_imported_first_is_reported_not_pretended():
    code = "import os, torch, ascendc_pack_runtime as rt; print(os.environ.get('OMP_WAIT_POLICY'), rt.WAIT_POLICY.source)"
    out, spin, _ = _python(code)
    assert out.split() == ["None", "too", "late"] and spin == 300000   # libgomp's default spinning
    assert "too late" in rt.threads.apply_wait_policy({}, loaded=True).describe()


def test_apply_wait_policy_decisions():
    env: dict = {}
    assert apply_wait_policy(env, loaded=False).source == "runtime" and env == {"OMP_WAIT_POLICY": "PASSIVE"}
    env = {"GOMP_SPINCOUNT": "0"}
    p = apply_wait_policy(env, loaded=False)
    assert p.source == "user" and env == {"GOMP_SPINCOUNT": "0"} and p.settings == (("GOMP_SPINCOUNT", "0"),)
    env = {}
    assert apply_wait_policy(env, loaded=True).source == "too late" and env == {}


# ---------------------------------------------------------------------------- thread caps


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """One fused softmax kernel of ~ms: the cost model gives it 2 threads (block_dim 2)."""
    src = tmp_path_factory.mktemp("wide") / "wide_softmax.py"
    src.write_text(WIDE)
    root = build_root(tmp_path_factory)
    config = BuildConfig.resolve(topn=1, cache_dir=root / "build_cache", jobs=2, cores=2)
    built = build_model_file(src, root / "out_threads" / "wide_softmax.ascpack", config)
    (kernel,) = built.report.manifest["kernels"]
    assert kernel["block_dim"] == 2, kernel
    return built, src


COUNT = """
import sys
import ascendc_pack_runtime as rt
import torch

def os_threads():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))

torch.set_num_threads(2)
threads = None if sys.argv[2] == "none" else int(sys.argv[2])
model = rt.load(sys.argv[1], threads=threads, cache_dir=sys.argv[3])
x = torch.randn(2048, 1024)
before = os_threads()
for _ in range(3):
    model(x)
print(before, os_threads(), torch.get_num_threads())
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="counts threads in /proc")
def test_kernel_threads_honour_the_cap(wide, tmp_path):
    """The graph is one block_dim-2 kernel: uncapped, its first call starts an OpenMP worker
    thread; capped at 1 (the kernel's max_threads), none is ever started."""
    built, _ = wide
    counts = {}
    for cap in ("none", "1", "2"):
        out, _, _ = _python(["-c", COUNT, str(built.bundle), cap, str(tmp_path / "cache")])
        before, after, torch_threads = map(int, out.split())
        counts[cap] = after - before
        assert torch_threads == 2   # the caller's setting is restored after every call
    assert counts["1"] == 0 and counts["none"] >= 1 and counts["2"] >= 1, counts


def test_torch_threads_are_capped_during_a_call_and_restored(wide, tmp_path, monkeypatch):
    built, _ = wide
    torch.set_num_threads(2)
    model = rt.load(built.bundle, cache_dir=tmp_path, threads=1)
    assert model.threads == 1
    seen = []
    graph_run = model._run

    def recording_run(handle, inputs):
        seen.append(torch.get_num_threads())
        return graph_run(handle, inputs)

    monkeypatch.setattr(model, "_run", recording_run)
    x = torch.randn(2048, 1024)
    torch.testing.assert_close(model(x), torch.softmax(x * 2, -1))
    assert seen == [1] and torch.get_num_threads() == 2
    uncapped = rt.load(built.bundle, cache_dir=tmp_path)
    monkeypatch.setattr(uncapped, "_run", recording_run)
    uncapped(x)
    assert uncapped.threads is None and seen == [1, 2]
    model.close()
    uncapped.close()


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_thread_cap_must_be_a_positive_int(wide, tmp_path, bad):
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        rt.load(wide[0].bundle, cache_dir=tmp_path, threads=bad)


def test_intra_op_threads_is_per_call_and_restores():
    torch.set_num_threads(2)
    with intra_op_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with intra_op_threads(None):
        assert torch.get_num_threads() == 2


def test_serving_instances_share_the_cores(wide, tmp_path):
    from ascendc_pack_runtime.kserve_model import AscpackModel
    from ascendc_pack_runtime.server import ServeOptions

    torch.set_num_threads(2)
    assert per_instance_threads(1) is None and per_instance_threads(2) == 1 and per_instance_threads(4) == 1
    assert per_instance_threads(4, 3) == 3
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        ServeOptions(threads=0)
    m = AscpackModel(wide[0].bundle, workers=2, threads=1, cache_dir=tmp_path)
    try:
        assert m.load()
        runners = [m._pool._free.get_nowait() for _ in range(2)]
        assert m._pool._free.empty() and all(r.__self__.threads == 1 for r in runners)   # Model.run_flat
        for r in runners:
            m._pool._free.put(r)
    finally:
        m.stop()


def test_eager_serving_baseline_gets_the_same_cap(write_model):
    from ascendc_pack.cli.main import _eager_runner_factory

    path = write_model("""
import torch


class Probe(torch.nn.Module):
    def forward(self, x):
        return x + torch.get_num_threads()


def get_model():
    return Probe()


def get_example_inputs():
    return (torch.zeros(2),)
""")
    torch.set_num_threads(2)
    (out,) = _eager_runner_factory(str(path), 1)()(torch.zeros(2))
    assert out.tolist() == [1.0, 1.0] and torch.get_num_threads() == 2


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="counts threads in /proc")
def test_cpp_load_options_threads_cap_the_kernels(wide, tmp_path_factory, tmp_path):
    """The C++ API (LoadOptions::threads) through examples/cpp/run_bundle --threads N."""
    import shutil

    import numpy as np

    from ascendc_pack_runtime.bundle import open_bundle

    from .runtime_fixtures import run_bundle_binary

    if shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("needs g++")
    binary = run_bundle_binary(tmp_path_factory)
    built, _ = wide
    directory = open_bundle(built.bundle, cache_dir=tmp_path / "cache").directory
    x = torch.randn(2048, 1024)
    x.numpy().tofile(tmp_path / "in0.bin")
    process = {}
    for cap in (1, 2):
        env = {k: v for k, v in os.environ.items() if not k.startswith("ASCENDC_PACK_RUNTIME_")}
        proc = subprocess.run([str(binary), str(directory), "--inputs", str(tmp_path / "in"), "--outputs",
                               str(tmp_path / f"out{cap}_"), "--repeat", "3", "--threads", str(cap)],
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        m = re.search(r"threads: cap (\d+), process (\d+)", proc.stdout)
        assert m and int(m.group(1)) == cap, proc.stdout
        process[cap] = int(m.group(2))
        out = torch.from_numpy(np.fromfile(tmp_path / f"out{cap}_0.bin", dtype=np.float32).reshape(2048, 1024))
        torch.testing.assert_close(out, torch.softmax(x * 2, -1))
    assert process[1] < process[2], process   # capped at 1: the kernel never started an OpenMP worker


def test_the_graph_is_loaded_under_the_thread_cap(wide, tmp_path, monkeypatch):
    """Load-time packing (oneDNN reorders) runs under the calls' thread count: oneDNN packs a
    weight for the threads it was reordered under, and a mismatch made a convolution 4.6x slower."""
    import ascendc_pack_runtime.model as rt_model

    built, _ = wide
    torch.set_num_threads(2)
    seen = []
    real = rt_model._graph_ops

    class Recording:
        def __init__(self, ops):
            self._ops = ops

        def __getattr__(self, name):
            return getattr(self._ops, name)

        def init(self, *args):
            seen.append(torch.get_num_threads())
            return self._ops.init(*args)

    monkeypatch.setattr(rt_model, "_graph_ops", lambda *a: Recording(real(*a)))
    rt.load(built.bundle, cache_dir=tmp_path, threads=1).close()
    rt.load(built.bundle, cache_dir=tmp_path).close()
    assert seen == [1, 2] and torch.get_num_threads() == 2


@pytest.mark.parametrize("value,expected", [(None, 200), ("0", 0), ("3000", 3000), ("fast", 200), ("-5", 200),
                                            ("+5", 200), ("", 200)])
def test_the_task_pool_wait_is_read_and_reported_as_the_pool_reads_it(value, expected):
    from ascendc_pack_runtime.threads import pool_spin_us, pool_wait

    env = {} if value is None else {"ASCENDC_PACK_POOL_SPIN_US": value}
    assert pool_spin_us(env) == expected  # tests/test_task_pool.py checks task_pool.h on the same values
    assert ("sleep between jobs" in pool_wait(env)) == (expected == 0)
    assert f"stay awake {expected} µs" in pool_wait(env) or expected == 0
    assert "task pool:" in apply_wait_policy({}, loaded=False).describe()
