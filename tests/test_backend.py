"""The backend seam (issue 11.6): the cpu backend behind the Backend protocol, selected by name."""

from __future__ import annotations

import platform
from types import SimpleNamespace

import pytest
import torch
from ascendc_pack_runtime.errors import BackendUnavailableError
from ascendc_pack_runtime.manifest import TorchBuild

import ascendc_pack.backends.registry as backend_mod
from ascendc_pack.backends.protocol import Backend
from ascendc_pack.backends.registry import BACKENDS, get_backend
from ascendc_pack.backends.cpu import CpuBackend
from ascendc_pack.kernels.fused.codegen import render_kernel
from ascendc_pack.toolchain.compiler import CompileCounts
from ascendc_pack.config import BuildConfig
from ascendc_pack.errors import ConfigError
from ascendc_pack.autotune.verify import KernelSandbox

from .kernel_check import Fn


def test_registry_names_cpu_and_unknown_names_are_config_errors():
    assert dict(BACKENDS) == {"cpu": "ascendc_pack.backends.cpu:CpuBackend", "npu": "ascendc_pack.backends.npu.backend:NpuBackend",
                              "npu-emu": "ascendc_pack.backends.npu.backend:EmulatedNpuBackend"}
    cpu = get_backend("cpu")
    assert isinstance(cpu, CpuBackend) and isinstance(cpu, Backend)
    assert cpu.name == "cpu" and cpu.timing == "wall-clock" and get_backend().name == "cpu"
    with pytest.raises(ConfigError, match="backend must be one of cpu, npu, npu-emu, got: 'cuda'"):
        get_backend("cuda")
    with pytest.raises(TypeError):
        BACKENDS["npu"] = "x:y"  # the registry is read-only (no process-global mutable state)
    assert backend_mod.DEFAULT_BACKEND == "cpu"


def _one_kernel():
    from ascendc_pack.frontend.capture import capture
    from ascendc_pack.passes.fuse import fuse

    x = torch.randn(8, 64)
    fused = fuse(capture(Fn(lambda a: (a * 2).softmax(-1)), (x,)).model)
    (step,) = fused.program.fused_steps()
    return step, x


def test_cpu_backend_renders_compiles_launches_and_times_a_kernel(tmp_path):
    from ascendc_pack.toolchain.compiler import CandidateSource, KernelBuild
    from ascendc_pack.frontend.executor import run_reference_fused
    from ascendc_pack.kernels.fused.tiling import propose

    cpu = get_backend("cpu")
    config = BuildConfig(topn=2, cache_dir=tmp_path, jobs=1, cores=1)
    target = cpu.target(config)
    assert target.cores == 1
    step, x = _one_kernel()
    tilings = propose(step.kernel, target, config.topn)
    isa = ",".join(cpu.isa(config))
    srcs = [cpu.render_kernel(step.kernel, t, isa) for t in tilings]
    c = tilings[0].candidate
    assert srcs[0] == render_kernel(step.kernel, tilings[0].params, c.kernel_key, c.tiling_repr, c.workspace,
                                    c.block_dim, isa)
    ahash = cpu.artifact_hash("spec", "v1", config)
    [ck] = cpu.compile([KernelBuild(step.name, ahash, [CandidateSource(t.candidate, s)
                                                       for t, s in zip(tilings, srcs)])], config)
    assert CompileCounts.of([ck]).compiler_calls == len(tilings) and all(cc.ok for cc in ck.candidates)
    kernels = [cpu.load_kernel(step.kernel, cc.so_path, cc.candidate.kernel_key) for cc in ck.candidates]
    (ref,) = run_reference_fused(step, [x])
    for k in kernels:
        assert torch.allclose(k([x])[0], ref, atol=1e-6)
    measure = cpu.timer(kernels, [x])
    assert measure(0, 3) > 0 and measure(1, 1) > 0
    assert isinstance(cpu.sandbox(), KernelSandbox)


def test_cpu_manifest_target_and_host_check(tmp_path):
    cpu = get_backend("cpu")
    target = cpu.manifest_target(BuildConfig(cache_dir=tmp_path))
    assert target.arch == platform.machine() and target.march == "native" and target.compiler
    assert list(target.isa) == cpu.isa(BuildConfig(cache_dir=tmp_path))
    # the parts of a Manifest the host check reads
    manifest = SimpleNamespace(backend="cpu", target=target,
                               torch=TorchBuild(torch.__version__, bool(torch._C._GLIBCXX_USE_CXX11_ABI)))
    assert cpu.host_problems(manifest) == []
    problems = cpu.host_problems(SimpleNamespace(**{**vars(manifest), "backend": "npu"}))
    assert len(problems) == 1 and isinstance(problems[0], BackendUnavailableError)
