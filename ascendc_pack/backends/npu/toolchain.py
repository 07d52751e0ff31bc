"""How npu kernels are compiled: against the AscendC emulation here, with CANN on an Ascend host.

**Emulation** (``--backend npu --emulate``): the generated AscendC source compiles unchanged with
g++ against ``runtime/include/ascendc_pack/ascendc_emu`` (a ``kernel_operator.h`` subset that
computes on the CPU and enforces the documented rules, docs/ASCENDC_EMU.md) plus the host shim
that implements the static kernel ABI (``kernel_abi.h``) by calling ``ap_emu_launch``::

    g++ -O1 -std=c++17 -fPIC -shared -march=<march> -I<runtime>/include/ascendc_pack/ascendc_emu \\
        -I<runtime>/include -DASCENDC_CANN_VERSION=<80500|90100> -include ap_emu_launch.h kernel.cpp -o kernel.so

(``-DASCENDC_CANN_VERSION``: the emulation refuses an API the targeted release lacks.)

**CANN** (an Ascend host with ``ASCEND_HOME_PATH`` set, e.g. by ``set_env.sh``): the BiSheng
compiler builds the kernel and its host launcher (``<<<block_dim, nullptr, stream>>>``) into one
shared library (``-xcce``, heterogeneous compilation), with the Vector cores' options of
asc-devkit's ``cmake/asc/legacy_modules/bisheng_intf.cmake`` and the devkit found as its
``bisheng_config.cmake`` does (``<home>/<arch>-linux``, ``tools``, ``compiler``): see
:func:`cann_command` and :func:`layout_commands` (``python -m ascendc_pack.backends.npu.toolchain``
prints the command for both layouts). Nothing here has run against CANN: our machines have none.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
from pathlib import Path

from ascendc_pack.backends.npu.api import DEFAULT_CANN, version_number
from ascendc_pack.toolchain.compiler import compiler_identity, runtime_include_dir, target_flags
from ascendc_pack.errors import ConfigError

EMU_OPT = "-O1"
"""g++ optimisation of emulated kernels: -O1 compiles ~2x faster than -O2 under the emulator's
header-heavy templates and the emulated launch is dominated by its rule checks either way."""
AIV_ARCH = "dav-c220-vec"
"""``--cce-aicore-arch`` of the Atlas A2/A3 Vector cores (NPU architecture 2201, dav-c220)."""
AIV_OPTIONS = ("--cce-auto-sync", "-mllvm", "-cce-aicore-stack-size=0x8000", "-mllvm",
               "-cce-aicore-function-stack-size=0x8000", "-mllvm", "-cce-aicore-record-overflow=true", "-mllvm",
               "-cce-aicore-addr-transform", "-mllvm", "-cce-aicore-dcci-insert-for-scalar=false", "-DTILING_KEY_VAR=0")
"""The options of ``c220_aiv_intf_pub`` in asc-devkit's cmake/asc/legacy_modules/bisheng_intf.cmake
(8.5.0 and 9.1.0 alike; ``--cce-aicore-only``/``--cce-aicore-lang`` left out: the library holds the
host launcher too). ``--cce-auto-sync`` as CANN builds kernels; the generated kernels also order
their pipes explicitly and are checked without it (ascendc_pack/backends/npu/sync.py)."""
DEVKIT_INCLUDES = ("asc/impl/adv_api", "asc/impl/basic_api", "asc/impl/c_api", "asc/impl/basic_api/reg_compute",
                   "asc/impl/simt_api", "asc/impl/utils", "asc", "asc/include", "asc/include/adv_api",
                   "asc/include/basic_api", "asc/include/aicpu_api", "asc/include/c_api",
                   "asc/include/basic_api/reg_compute", "asc/include/simt_api", "asc/include/utils",
                   "tikcpp/tikcfw", "tikcpp/tikcfw/interface", "tikcpp/tikcfw/impl")
"""``device_intf_pub``'s include directories under the devkit (bisheng_intf.cmake; the 9.1.0 list,
a superset of 8.5.0's), those that exist in the toolkit."""
VERSION_HEADERS = ("include/ascendc/asc_devkit_version.h", "include/version/asc_devkit_version.h")
"""``-include``d version header of the devkit (8.5.0 path, 9.1.0 path; relative to ASCEND_HOME_PATH)."""


def emu_include_dir() -> Path:
    """``runtime/include/ascendc_pack/ascendc_emu`` (kernel_operator.h, ap_emu_launch.h)."""
    return runtime_include_dir() / "ascendc_pack" / "ascendc_emu"


def emulation_flags(march: str, cann: str = DEFAULT_CANN) -> list[str]:
    """g++ flags of an emulated npu kernel library for CANN release ``cann`` (the emulation refuses
    what that release lacks; see the module docstring)."""
    return [EMU_OPT, "-std=c++17", "-fPIC", "-shared", *target_flags(march), f"-I{emu_include_dir()}",
            f"-I{runtime_include_dir()}", f"-DASCENDC_CANN_VERSION={version_number(cann)}", "-include",
            "ap_emu_launch.h", "-fno-math-errno", "-fno-trapping-math"]


def hashed_emulation_flags(march: str, cann: str = DEFAULT_CANN) -> str:
    """The flags with machine paths replaced by the content of the headers they name (cache key)."""
    inc = runtime_include_dir()
    flags = [f.replace(str(inc), "<ascendc_pack_runtime/include>") for f in emulation_flags(march, cann)]
    h = hashlib.sha256()
    for p in sorted(inc.rglob("*.h")):
        h.update(p.relative_to(inc).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return " ".join(flags) + f" headers={h.hexdigest()} cxx={compiler_identity()}"


def ascend_home(env=os.environ) -> Path | None:
    """``$ASCEND_HOME_PATH`` when it names a directory (set by CANN's ``set_env.sh``)."""
    raw = env.get("ASCEND_HOME_PATH")
    return Path(raw) if raw and Path(raw).is_dir() else None


def devkit_dir(home: Path, machine: str | None = None) -> Path:
    """The devkit root of a toolkit, as bisheng_config.cmake finds it: ``<home>/<arch>-linux``
    (newer toolkits), ``<home>/tools``, ``<home>/compiler`` (the ``compiler/tikcpp`` layout), else
    ``<home>/ascendc_devkit`` - the first that has ``ccec_compiler``."""
    machine = machine or platform.machine()
    for cand in (home / f"{machine}-linux", home / "tools", home / "compiler"):
        if (cand / "ccec_compiler").is_dir():
            return cand
    return home / "ascendc_devkit"


def bisheng(env=os.environ) -> str:
    """The BiSheng compiler of the CANN toolkit; ConfigError naming what is missing."""
    home = ascend_home(env)
    if home is None:
        raise ConfigError("ASCEND_HOME_PATH is not set (or not a directory), so CANN's BiSheng compiler cannot be "
                          "found: install the CANN toolkit and `source <cann>/set_env.sh`.")
    cand = devkit_dir(home) / "ccec_compiler" / "bin" / "bisheng"
    if cand.is_file():
        return str(cand)
    found = shutil.which("bisheng")
    if found:
        return found
    raise ConfigError(f"ASCEND_HOME_PATH={home} has no bisheng under <arch>-linux/, tools/ or compiler/ "
                      "ccec_compiler/bin; reinstall the CANN toolkit (the compiler component) or build with --emulate")


def cann_flags(soc: str, env=os.environ, home: Path | None = None, devkit: Path | None = None) -> list[str]:
    """BiSheng's flags for one kernel library (kernel + ``<<<>>>`` host launcher) for ``soc``:
    ``-xcce``, the Vector cores' arch and the options of bisheng_intf.cmake, the devkit's include
    directories and version header, ACL and the runtime to link (``--no-as-needed``: the libraries
    come before the source in the compile stage's command). ``home``/``devkit`` name a toolkit
    layout explicitly (docs, tests); by default they come from ``ASCEND_HOME_PATH``."""
    from ascendc_pack.backends.npu.tiling import soc_profile

    arch = soc_profile(soc).arch   # refuses a SoC the Vector generator does not serve
    home = home or ascend_home(env)
    if home is None:
        raise ConfigError(f"no CANN build for SoC {soc!r}: ASCEND_HOME_PATH={env.get('ASCEND_HOME_PATH')!r} is not "
                          "a directory; `source <cann>/set_env.sh`")
    devkit = devkit or devkit_dir(home)
    exists = devkit.is_dir()
    includes = [devkit / d for d in DEVKIT_INCLUDES if not exists or (devkit / d).is_dir()]
    version = [home / h for h in VERSION_HEADERS if (home / h).is_file()]
    return ["-xcce", f"--cce-aicore-arch={arch}", "-O2", "-std=c++17", "-fPIC", *AIV_OPTIONS,
            *[a for h in version[:1] for a in ("-include", str(h))],
            *[f"-I{d}" for d in includes], f"-I{home / 'include'}", f"-I{runtime_include_dir()}",
            "-Wno-macro-redefined", "-Wno-ignored-attributes",
            f"-L{home / 'lib64'}", "-Wl,--no-as-needed", "-lascendcl", "-lruntime", "-lstdc++", "--shared"]


def cann_command(source: Path, output: Path, soc: str, env=os.environ, home: Path | None = None,
                 devkit: Path | None = None) -> list[str]:
    """The whole BiSheng command building one kernel library (what the compile stage runs)."""
    if home is not None:
        devkit = devkit or devkit_dir(home)
        compiler = str(devkit / "ccec_compiler" / "bin" / "bisheng")
    else:
        compiler = bisheng(env)
    return [compiler, *cann_flags(soc, env, home, devkit), "-o", str(output), str(source)]


def layout_commands(soc: str = "Ascend910B2", home: Path = Path("/usr/local/Ascend/ascend-toolkit/latest"),
                    machine: str = "x86_64") -> dict[str, str]:
    """The command for each toolkit layout (printed by ``build --backend npu --debug``, docs/NPU.md):
    ``compiler/`` (tikcpp layout, CANN 8.x) and ``<arch>-linux/`` (newer toolkits)."""
    import shlex

    return {layout: shlex.join(cann_command(Path("kernel.cpp"), Path("kernel.so"), soc, home=home,
                                            devkit=home / layout))
            for layout in ("compiler", f"{machine}-linux")}


if __name__ == "__main__":  # python -m ascendc_pack.backends.npu.toolchain [SOC]
    import sys

    for name, cmd in layout_commands(*(sys.argv[1:2] or ["Ascend910B2"])).items():
        print(f"# {name}/ layout\n{cmd}\n")
