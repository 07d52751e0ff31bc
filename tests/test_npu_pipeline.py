"""The npu backend behind the seam: ``--backend npu --emulate`` end to end, and what refuses.

An emulated build compiles the generated AscendC kernels against the AscendC emulation; the
bundle (``manifest.backend = "npu"``, ``target.emulated``) loads in a fresh process with the
plain runtime and matches eager. ``--backend npu`` without torch_npu/CANN fails before the model
is loaded, naming what is missing; a device bundle is refused by the runtime's host check on a
host without torch_npu or with another SoC (torch_npu's documented API stands in for a device).
"""

from __future__ import annotations

import json
from pathlib import Path
import subprocess
import sys
import types

import pytest
import torch
from click.testing import CliRunner

import ascendc_pack_runtime as rt
from ascendc_pack.backends.protocol import Backend
from ascendc_pack.backends.registry import backend_key, get_backend
from ascendc_pack.cli.main import main
from ascendc_pack.errors import ConfigError
from ascendc_pack.pipeline import build, build_file
from ascendc_pack_runtime.manifest import Target
from ascendc_pack_runtime.npu_host import (NpuDeviceMissingError, NpuSocMismatchError, TorchNpuMissingError,
                                           npu_host_problems)

from .conftest import EXAMPLE_NAMES, EXAMPLES

FRESH = """
import importlib.util, json, sys, torch
import ascendc_pack_runtime as rt
spec = importlib.util.spec_from_file_location("m", sys.argv[1]); mod = importlib.util.module_from_spec(spec)
sys.modules["m"] = mod; spec.loader.exec_module(mod)
model = mod.get_model().eval()
sets = [mod.get_example_inputs()] + list(getattr(mod, "get_calibration_inputs", lambda: [])())
m = rt.load(sys.argv[2])
worst = 0.0
tol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-4
for inputs in sets:
    with torch.no_grad():
        exp = model(*[t.clone() for t in inputs])
    got = m(*[t.clone() for t in inputs])
    exp, got = (exp if isinstance(exp, (tuple, list)) else (exp,)), (got if isinstance(got, (tuple, list)) else (got,))
    for e, g in zip(exp, got):
        assert g.dtype == e.dtype and torch.allclose(g.float(), e.float(), atol=tol, rtol=tol), (e - g).abs().max()
        worst = max(worst, float((e.double() - g.double()).abs().max()))
print(json.dumps({"backend": m.manifest["backend"], "target": m.manifest["target"], "worst": worst}))
"""


def _fresh(model_file, bundle, tol: float = 1e-4) -> dict:
    """Load and run the bundle in a fresh process with the npu launcher's trace on; the report
    has the launcher's lines (``launches``)."""
    import os

    env = {**os.environ, "ASCENDC_PACK_NPU_TRACE": "1"}
    out = subprocess.run([sys.executable, "-c", FRESH, str(model_file), str(bundle), str(tol)], capture_output=True,
                         text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    report["launches"] = [line for line in out.stderr.splitlines() if line.startswith("ascendc_pack npu launch: ")]
    return report


def _build_example(name, tmp_path, topn=2):
    bundle = tmp_path / f"{name}.ascpack"
    result = build_file(EXAMPLES / f"{name}.py", topn=topn, output=bundle, cache_dir=tmp_path / "cache",
                        backend="npu-emu", jobs=2)
    return result, bundle


def test_core_limit_is_the_npu_vector_cores(tmp_path):
    """--cores caps block_dim on the npu's vector cores (not this host's CPU cores)."""
    from ascendc_pack.config import BuildConfig

    emu = get_backend("npu-emu")
    assert emu.target(BuildConfig.resolve(cache_dir=tmp_path)).cores == 48
    assert emu.target(BuildConfig.resolve(cores=8, backend="npu-emu", cache_dir=tmp_path)).cores == 8
    with pytest.raises(ConfigError, match="--cores 64 exceeds the 48 vector cores of Ascend910B2"):
        emu.target(BuildConfig.resolve(cores=64, backend="npu-emu", cache_dir=tmp_path))
    with pytest.raises(ConfigError, match="--cores must be a positive integer"):
        BuildConfig.resolve(cores=0, backend="npu-emu", cache_dir=tmp_path)


def test_emulated_backend_is_a_backend():
    b = get_backend("npu-emu")
    assert isinstance(b, Backend) and b.name == "npu" and b.timing == "emulated"
    assert backend_key("npu", True) == "npu-emu" and backend_key("npu", False) == "npu"
    with pytest.raises(ConfigError, match="--emulate applies to --backend npu"):
        backend_key(None, True)


@pytest.mark.parametrize("name", ["add_sum", "inplace"])
def test_emulated_build_loads_in_a_fresh_process_and_matches_eager(name, tmp_path):
    result, bundle = _build_example(name, tmp_path)
    assert result.choices and not result.fallbacks
    for ch in result.choices.values():
        assert ch.candidate.tiling_repr.startswith("mode=")
    tuning = json.loads(next((tmp_path / "cache").rglob("tuning.json")).read_text())
    assert tuning["protocol"]["timing"] == "emulated"
    report = _fresh(EXAMPLES / f"{name}.py", bundle)
    assert report["backend"] == "npu"
    assert report["target"]["soc"] == "Ascend910B2" and report["target"]["emulated"] is True
    assert report["worst"] < 1e-3
    # every fused kernel ran through the npu launcher (npu_launch.h): the device plumbing up to the
    # final call (ap_npu_launch), with the emulated device's stream and workspace
    launched = {line.split(": ", 1)[1].split(" on ")[0] for line in report["launches"]}
    assert launched == {ch.name for ch in result.choices.values()}, report["launches"]
    assert all(" on emulated (AscendC emulation on the CPU), stream (nil)" in line for line in report["launches"])


GELU_SOFTMAX = """
import torch

class M(torch.nn.Module):
    def forward(self, x, b):
        y = torch.nn.functional.gelu(x + b)
        return torch.softmax(y, dim=-1), torch.where(x > 0, y, -0.5 * y)

def get_model():
    return M()

def get_example_inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(16, 300, generator=g).half(), torch.randn(300, generator=g).half())
"""


@pytest.mark.parametrize("cann", ["8.5.0", "9.1.0"])
def test_float16_gelu_softmax_on_emulated_npu_for_each_cann(cann, tmp_path, monkeypatch):
    """Issue 38's second new-user build: erf, a 16-bit result (Round16), a comparison - kernels
    with CompareScalar (8.5.0) or Compares (9.1.0) - built, loaded in a fresh process, run
    through the npu launcher and matching eager."""
    monkeypatch.setenv("ASCENDC_PACK_NPU_CANN", cann)
    model = tmp_path / "gelu_softmax.py"
    model.write_text(GELU_SOFTMAX)
    bundle = tmp_path / "m.ascpack"
    result = build_file(model, topn=2, output=bundle, cache_dir=tmp_path / "cache", backend="npu-emu", jobs=2)
    assert result.choices and not result.fallbacks
    sources = [p.read_text() for p in (tmp_path / "cache").rglob("*.cpp") if "Generated by ascendc-pack (npu" in
               p.read_text()]
    assert sources and all(f"CANN {cann}" in src for src in sources)
    assert any(("Compares(" if cann == "9.1.0" else "CompareScalar(") in src for src in sources)
    assert cann == "9.1.0" or not any("Compares(" in src for src in sources)
    report = _fresh(model, bundle, tol=2e-3)
    assert {line.split(": ", 1)[1].split(" on ")[0] for line in report["launches"]} == set(result.choices)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in EXAMPLE_NAMES if n not in ("add_sum", "inplace")])
def test_every_example_on_emulated_npu(name, tmp_path):
    _, bundle = _build_example(name, tmp_path, topn=4)
    assert _fresh(EXAMPLES / f"{name}.py", bundle)["backend"] == "npu"


class _Transposed(torch.nn.Module):
    def forward(self, x, y):
        return torch.softmax(x, -1) + 1, x.t() * y


def test_a_kernel_the_generator_cannot_express_stays_aten(tmp_path, caplog):
    inputs = (torch.randn(40, 33), torch.randn(33, 40))
    bundle = tmp_path / "t.ascpack"
    with caplog.at_level("WARNING", logger="ascendc_pack"):
        result = build(_Transposed(), inputs, topn=1, output=bundle, cache_dir=tmp_path / "cache", backend="npu-emu")
    assert any("stays ATen on the npu backend: unsupported: " in r.message and "stride" in r.message
               for r in caplog.records)
    assert len(result.choices) == 1  # the softmax is an npu kernel, the transposed product is ATen
    m = rt.load(bundle)
    got = m(*[t.clone() for t in inputs])
    exp = _Transposed()(*inputs)
    assert all(torch.allclose(g, e, atol=1e-5, rtol=1e-5) for g, e in zip(got, exp))


def test_backend_npu_without_torch_npu_or_cann_fails_at_once(tmp_path, monkeypatch):
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    result = CliRunner().invoke(main, ["build", str(tmp_path / "not_even_loaded.py"), "--backend", "npu",
                                       "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 1
    out = result.output
    assert "torch_npu is not installed" in out and "ASCEND_HOME_PATH is not set" in out and "--emulate" in out
    assert "torch-npu 2.14.0, which requires torch 2.14.0" in out
    assert not (tmp_path / "cache").exists()


def test_emulate_needs_backend_npu(tmp_path):
    result = CliRunner().invoke(main, ["build", str(EXAMPLES / "add_sum.py"), "--emulate",
                                       "--cache-dir", str(tmp_path)])
    assert result.exit_code == 1 and "use `--backend npu --emulate`" in result.output


@pytest.mark.parametrize("layout,includes", [
    ("compiler", ["tikcpp/tikcfw", "tikcpp/tikcfw/interface", "tikcpp/tikcfw/impl"]),
    ("x86_64-linux", ["asc/include", "asc/include/basic_api", "asc/impl/basic_api", "asc/impl/utils"]),
])
def test_cann_command_follows_the_cann_build_files(tmp_path, monkeypatch, layout, includes):
    """The device build's command (not run here: no CANN) for both toolkit layouts: BiSheng of the
    devkit bisheng_config.cmake finds, the c220_aiv_intf_pub options of bisheng_intf.cmake, the
    devkit's include directories that exist, the version header, ACL."""
    import ascendc_pack.backends.npu.toolchain as toolchain

    monkeypatch.setattr(toolchain.platform, "machine", lambda: "x86_64")
    devkit = tmp_path / layout
    (devkit / "ccec_compiler" / "bin").mkdir(parents=True)
    (devkit / "ccec_compiler" / "bin" / "bisheng").write_text("")
    for d in includes:
        (devkit / d).mkdir(parents=True)
    (tmp_path / "include" / "ascendc").mkdir(parents=True)
    (tmp_path / "include" / "ascendc" / "asc_devkit_version.h").write_text('#define ASC_DEVKIT_VERSION_STR "8.5.0"\n')
    env = {"ASCEND_HOME_PATH": str(tmp_path)}
    cmd = toolchain.cann_command(tmp_path / "k.cpp", tmp_path / "k.so", "Ascend910B1", env)
    assert cmd[0] == str(devkit / "ccec_compiler" / "bin" / "bisheng")
    assert cmd[-3:] == ["-o", str(tmp_path / "k.so"), str(tmp_path / "k.cpp")]
    for opt in ("-xcce", "-std=c++17", "--cce-aicore-arch=dav-c220-vec", "--cce-auto-sync", "--shared",
                "-cce-aicore-stack-size=0x8000", "-cce-aicore-dcci-insert-for-scalar=false", "-lascendcl",
                f"-L{tmp_path}/lib64", str(tmp_path / "include" / "ascendc" / "asc_devkit_version.h"),
                *[f"-I{devkit / d}" for d in includes]):
        assert opt in cmd, opt
    assert not [f for f in cmd if f.startswith("-I") and str(devkit) in f and not Path(f[2:]).is_dir()]
    from ascendc_pack.backends.npu.api import detect_cann
    assert detect_cann(env) == "8.5.0"
    with pytest.raises(ConfigError, match="ASCEND_HOME_PATH is not set"):
        toolchain.bisheng({})


def test_cann_command_for_both_layouts_is_printed():
    import ascendc_pack.backends.npu.toolchain as toolchain

    cmds = toolchain.layout_commands("Ascend910B2", home=Path("/opt/cann"))
    assert set(cmds) == {"compiler", "x86_64-linux"}
    assert "/opt/cann/compiler/ccec_compiler/bin/bisheng" in cmds["compiler"]
    assert "-I/opt/cann/x86_64-linux/asc/include/basic_api" in cmds["x86_64-linux"]
    assert all("--cce-aicore-arch=dav-c220-vec" in c and "--cce-auto-sync" in c for c in cmds.values())


@pytest.mark.parametrize("soc", ["Ascend910B1", "Ascend910B4", "Ascend910_9392", "Ascend910_9362"])
def test_soc_table_covers_atlas_a2_and_a3(soc):
    from ascendc_pack.backends.npu.tiling import soc_profile

    p = soc_profile(soc)
    assert p.arch == "dav-c220-vec" and p.vector_cores in (40, 48)
    assert p.with_cores(20).vector_cores == 20


@pytest.mark.parametrize("soc,why", [("Ascend310P3", "no hard SyncAll"), ("Ascend950", "3510"),
                                     ("Ascend310B1", "SyncAll")])
def test_socs_the_vector_generator_does_not_serve_are_refused_by_name(soc, why):
    from ascendc_pack.backends.npu.tiling import soc_profile

    with pytest.raises(ConfigError, match=f"{soc} is not supported by the npu backend: .*{why}"):
        soc_profile(soc)


def _manifest(emulated: bool, soc: str = "Ascend910B2"):
    """The part of a typed manifest the npu host check reads."""
    return types.SimpleNamespace(backend="npu", target=Target("x86_64", "native", (), "g++", soc, emulated))


def test_emulated_bundles_need_no_npu():
    assert npu_host_problems(_manifest(True)) == []


def test_device_bundle_without_torch_npu_is_refused():
    def no_torch_npu(name):
        raise ImportError(f"No module named {name!r}")
    (p,) = npu_host_problems(_manifest(False), import_module=no_torch_npu)
    assert isinstance(p, TorchNpuMissingError) and isinstance(p, rt.BackendUnavailableError)
    assert "torch_npu" in str(p) and "--emulate" in p.fix and p.field == "backend"


def _fake_npu(monkeypatch, available: bool, name: str = "Ascend910B2"):
    """torch.npu as torch_npu documents it (is_available, device_count, current_device, get_device_name)."""
    fake = types.SimpleNamespace(is_available=lambda: available, device_count=lambda: int(available),
                                 current_device=lambda: 0, get_device_name=lambda i: name)
    monkeypatch.setattr(torch, "npu", fake, raising=False)
    return lambda module: types.ModuleType(module)


def test_device_bundle_without_an_npu_is_refused(monkeypatch):
    (p,) = npu_host_problems(_manifest(False), import_module=_fake_npu(monkeypatch, available=False))
    assert isinstance(p, NpuDeviceMissingError) and "no NPU" in str(p)


def test_device_bundle_on_another_soc_is_refused(monkeypatch):
    importer = _fake_npu(monkeypatch, available=True, name="Ascend910B4")
    (p,) = npu_host_problems(_manifest(False, soc="Ascend910B2"), import_module=importer)
    assert isinstance(p, NpuSocMismatchError) and p.field == "target.soc"
    assert "Ascend910B2" in str(p) and "Ascend910B4" in str(p)
    assert npu_host_problems(_manifest(False, soc="Ascend910B4"), import_module=importer) == []


KERNEL_DETAILS = """Step Id,Model ID,Task ID,Stream ID,Name,Type,Accelerator Core,Start Time(us),Duration(us),Wait Time(us)
1,4294967295,12,2,fused_softmax_1a2b,KERNEL_AIVEC,AI_VECTOR_CORE,1700000000.1,12.5,0.0
1,4294967295,13,2,aclnnAdd_AddAiCore_Add,Add,AI_VECTOR_CORE,1700000000.3,3.0,0.1
1,4294967295,14,2,fused_softmax_1a2b,KERNEL_AIVEC,AI_VECTOR_CORE,1700000000.5,11.5,0.0
"""


def test_device_timing_reads_kernel_durations_like_the_seed():
    """PGO on a device times each candidate by its device Duration(us) in torch_npu.profiler's
    kernel_details.csv (the seed's _autotune.py), not by host time around a ctypes call."""
    from ascendc_pack.backends.npu.device import kernel_durations_us

    assert kernel_durations_us(KERNEL_DETAILS, "fused_softmax_1a2b") == [12.5, 11.5]
    assert kernel_durations_us(KERNEL_DETAILS, "fused_other") == []
    seed = _seed_autotune()
    if seed is not None:  # the columns and file the seed reads (torch_npu's own wheel)
        assert "kernel_details.csv" in seed and "'Duration(us)'" in seed and "row.get('Name'" in seed


def _seed_autotune() -> str | None:
    import os

    base = Path(os.environ.get("ASCENDC_PACK_TORCH_NPU_DIR") or Path.home() / ".cache" / "ascendc-pack" / "torch_npu-2.13.0")
    p = base / "torch_npu" / "_inductor" / "ascendc" / "compiler" / "_autotune.py"
    return p.read_text() if p.is_file() else None


def test_cann_option_names_the_supported_releases(tmp_path):
    """--cann picks the AscendC API release; an unknown one or a cpu build is refused at once."""
    runner = CliRunner()
    bad = runner.invoke(main, ["build", str(tmp_path / "never_loaded.py"), "--backend", "npu", "--emulate",
                               "--cann", "7.0.0", "--cache-dir", str(tmp_path / "c")])
    assert bad.exit_code == 1 and "CANN '7.0.0' has no AscendC API table here; supported: 8.5.0, 9.1.0" in bad.output
    cpu = runner.invoke(main, ["build", str(tmp_path / "never_loaded.py"), "--cann", "9.1.0",
                               "--cache-dir", str(tmp_path / "c")])
    assert cpu.exit_code == 1 and "--cann applies to --backend npu" in cpu.output
    from ascendc_pack.backends.npu.api import resolve_cann

    assert resolve_cann(None, {}) == "8.5.0" and resolve_cann("9.1", {}) == "9.1.0"
