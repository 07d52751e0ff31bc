"""How npu kernels are compiled: against the AscendC emulation here, with CANN on an Ascend host.

**Emulation** (``--backend npu --emulate``): the generated AscendC source compiles unchanged with
g++ against ``runtime/include/ascendc_pack/ascendc_emu`` (a ``kernel_operator.h`` subset that
computes on the CPU and enforces the documented rules, docs/ASCENDC_EMU.md) plus the host shim
that implements the static kernel ABI (``kernel_abi.h``) by calling ``ap_emu_launch``::

    g++ -O1 -std=c++17 -fPIC -shared -march=<march> -I<runtime>/include/ascendc_pack/ascendc_emu \\
        -I<runtime>/include -include ap_emu_launch.h kernel.cpp -o kernel.so

**CANN** (an Ascend host with ``ASCEND_HOME_PATH`` set, e.g. by ``set_env.sh``): the BiSheng
compiler builds the kernel and its host launcher (``<<<block_dim, nullptr, stream>>>``) into one
shared library, following the ``jit_build.sh`` example of the CANN operator tools guide
(hiascend ``devaids/optool/atlasopdev_16_0164``) and the BiSheng options page
(``opdevg/BishengCompiler``: ``-xcce``, ``--std=c++17``, ``--cce-aicore-arch``): see
:func:`cann_command`. Nothing here has run against CANN: our machines have none.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from ascendc_pack.toolchain.compiler import compiler_identity, runtime_include_dir, target_flags
from ascendc_pack.errors import ConfigError

EMU_OPT = "-O1"
"""g++ optimisation of emulated kernels: -O1 compiles ~2x faster than -O2 under the emulator's
header-heavy templates and the emulated launch is dominated by its rule checks either way."""
CANN_ARCH = {"Ascend910B1": "dav-c220-vec", "Ascend910B2": "dav-c220-vec", "Ascend910B3": "dav-c220-vec",
             "Ascend910B4": "dav-c220-vec"}
"""``--cce-aicore-arch`` of the Vector cores per SoC (Atlas A2: NPU architecture 2201, dav-c220)."""


def emu_include_dir() -> Path:
    """``runtime/include/ascendc_pack/ascendc_emu`` (kernel_operator.h, ap_emu_launch.h)."""
    return runtime_include_dir() / "ascendc_pack" / "ascendc_emu"


def emulation_flags(march: str) -> list[str]:
    """g++ flags of an emulated npu kernel library (see the module docstring)."""
    return [EMU_OPT, "-std=c++17", "-fPIC", "-shared", *target_flags(march), f"-I{emu_include_dir()}",
            f"-I{runtime_include_dir()}", "-include", "ap_emu_launch.h", "-fno-math-errno", "-fno-trapping-math"]


def hashed_emulation_flags(march: str) -> str:
    """The flags with machine paths replaced by the content of the headers they name (cache key)."""
    inc = runtime_include_dir()
    flags = [f.replace(str(inc), "<ascendc_pack_runtime/include>") for f in emulation_flags(march)]
    h = hashlib.sha256()
    for p in sorted(inc.rglob("*.h")):
        h.update(p.relative_to(inc).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return " ".join(flags) + f" headers={h.hexdigest()} cxx={compiler_identity()}"


def ascend_home(env=os.environ) -> Path | None:
    """``$ASCEND_HOME_PATH`` when it names a directory (set by CANN's ``set_env.sh``)."""
    raw = env.get("ASCEND_HOME_PATH")
    return Path(raw) if raw and Path(raw).is_dir() else None


def bisheng(env=os.environ) -> str:
    """The BiSheng compiler of the CANN toolkit; ConfigError naming what is missing."""
    home = ascend_home(env)
    if home is None:
        raise ConfigError("ASCEND_HOME_PATH is not set (or not a directory), so CANN's BiSheng compiler cannot be "
                          "found: install the CANN toolkit and `source <cann>/set_env.sh`.")
    for cand in (home / "compiler" / "ccec_compiler" / "bin" / "bisheng", home / "bin" / "bisheng"):
        if cand.is_file():
            return str(cand)
    found = shutil.which("bisheng")
    if found:
        return found
    raise ConfigError(f"ASCEND_HOME_PATH={home} has no compiler/ccec_compiler/bin/bisheng; reinstall the CANN "
                      "toolkit (the compiler component) or build with --emulate")


def cann_flags(soc: str, env=os.environ) -> list[str]:
    """BiSheng's flags for one kernel library (kernel + ``<<<>>>`` host launcher); the libraries
    come before the source in the compile stage's command, hence ``--no-as-needed``."""
    home = ascend_home(env)
    arch = CANN_ARCH.get(soc)
    if home is None or arch is None:
        raise ConfigError(f"no CANN build for SoC {soc!r}: ASCEND_HOME_PATH={env.get('ASCEND_HOME_PATH')!r}, "
                          f"known SoCs {', '.join(sorted(CANN_ARCH))}")
    tik = home / "compiler" / "tikcpp"
    return ["-O2", "-fPIC", "-std=c++17", "-xcce", f"--cce-aicore-arch={arch}",
            f"-I{tik}", f"-I{tik / 'tikcfw'}", f"-I{tik / 'tikcfw' / 'impl'}", f"-I{tik / 'tikcfw' / 'interface'}",
            f"-I{home / 'include'}", f"-I{runtime_include_dir()}", "-Wno-macro-redefined", "-Wno-ignored-attributes",
            f"-L{home / 'lib64'}", "-Wl,--no-as-needed", "-lascendcl", "-lruntime", "-lstdc++", "--shared"]


def cann_command(source: Path, output: Path, soc: str, env=os.environ) -> list[str]:
    """The whole BiSheng command building one kernel library (what the compile stage runs)."""
    return [bisheng(env), *cann_flags(soc, env), "-o", str(output), str(source)]
