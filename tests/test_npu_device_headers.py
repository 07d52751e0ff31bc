"""The npu device path compiled against torch_npu's real headers (issue 38).

Nothing of the device path runs on our machines (no NPU, no CANN). What can be checked is that
the C++ written against torch_npu's contracts compiles against torch_npu itself: the npu launcher
(ascendc_pack/npu_launch.h: getCurrentNPUStream().stream(false), NPUCachingAllocator::
raw_alloc_with_stream/raw_delete, OpCommand::RunOpApiV2) and the graph interpreter built for a
device npu bundle (graph_interp.h with -DAP_WITH_TORCH_NPU: NPU tensors, the launcher for every
kernel), with torch_npu 2.13.0's headers from its PyPI wheel, never installed
(tools/fetch_torch_npu_headers.sh unzips it into a cache directory). Skipped, with the reason,
where those headers are absent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ascendc_pack.backends.npu.device import torch_npu_build_flags
from ascendc_pack.graph.compile import interp_flags
from ascendc_pack.toolchain.compiler import runtime_include_dir

VERSION = "2.13.0"


def _torch_npu_root() -> Path | None:
    base = os.environ.get("ASCENDC_PACK_TORCH_NPU_DIR") or str(
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ascendc-pack" / f"torch_npu-{VERSION}")
    root = Path(base) / "torch_npu"
    return root if (root / "include" / "torch_npu" / "csrc" / "core" / "npu" / "NPUStream.h").is_file() else None


ROOT = _torch_npu_root()
pytestmark = [
    pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++"),
    pytest.mark.skipif(ROOT is None, reason=f"torch_npu {VERSION} headers not found (run "
                       "tools/fetch_torch_npu_headers.sh, or set ASCENDC_PACK_TORCH_NPU_DIR)"),
]


def _syntax_check(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    cpp = tmp_path / "check.cpp"
    cpp.write_text(source)
    compile_flags, _ = torch_npu_build_flags(ROOT)
    flags = [f for f in interp_flags(None) if f != "-w"] + ["-w", *compile_flags]
    return subprocess.run(["g++", *flags, "-fsyntax-only", str(cpp)], capture_output=True, text=True, timeout=600)


def test_launcher_compiles_against_torch_npu(tmp_path):
    """npu_launch.h's TorchNpuDevice against NPUStream.h, NPUCachingAllocator.h, OpCommand.h."""
    r = _syntax_check(tmp_path, '''
#include "ascendc_pack/npu_launch.h"
static_assert(sizeof(ascendc_pack::npu::TorchNpuDevice) > 0, "the torch_npu device is compiled in");
int use(ap_npu_launch_fn fn, void* in, void* out) {
  std::string error;
  return ascendc_pack::npu::launch(ascendc_pack::npu::active_device(), "k", fn, 64, {in}, {out}, &error);
}
''')
    assert r.returncode == 0, r.stderr[-4000:]


def test_device_graph_interpreter_compiles_against_torch_npu(tmp_path):
    """The interpreter of a device npu bundle (what `build --backend npu` compiles on an Ascend
    host into graph.so, linked with -ltorch_npu)."""
    r = _syntax_check(tmp_path, '#include "ascendc_pack/graph_interp.h"\n')
    assert r.returncode == 0, r.stderr[-4000:]


def test_build_flags_name_the_wheels_directories():
    compile_flags, link_flags = torch_npu_build_flags(ROOT)
    assert compile_flags[0] == "-DAP_WITH_TORCH_NPU=1"
    assert f"-I{ROOT / 'include'}" in compile_flags and (ROOT / "include" / "acl" / "acl.h").is_file()
    assert link_flags == [f"-L{ROOT / 'lib'}", "-ltorch_npu"]
    assert (runtime_include_dir() / "ascendc_pack" / "npu_launch.h").is_file()
