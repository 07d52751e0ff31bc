"""The ``npu`` backend: AscendC Vector kernels from the same fused-kernel specs as ``cpu``.

* :mod:`.layout`   - what the generator can express (rows x a contiguous inner range), else
                     ``unsupported: <reason>`` and the kernel stays ATen;
* :mod:`.emit`     - spec ops -> AscendC Vector instructions;
* :mod:`.planner`  - the kernel class's member functions: tile passes, UB slots, row values;
* :mod:`.sync`     - explicit pipe ordering: ``PipeBarrier<PIPE_V>()`` before dependent vector
                     instructions;
* :mod:`.api`      - the real AscendC API per CANN release (tables extracted from asc-devkit by
                     tools/extract_ascendc_api.py), the call checker, the target release;
* :mod:`.codegen`  - a mode's kernel plan, its Unified Buffer, the source of one candidate
                     (templates/kernel/npu/);
* :mod:`.tiling`   - candidate tilings ranked by the npu cost model (UB capacity, alignment,
                     DMA vs Vector time);
* :mod:`.toolchain`- the emulation build (g++ against runtime/include/ascendc_pack/ascendc_emu)
                     and the CANN build command;
* :mod:`.device`   - torch_npu: SoC and cores, device limit, profiler timer, ctypes launcher (PGO);
* :mod:`.backend`  - the :class:`~ascendc_pack.backends.protocol.Backend` implementations
                     (``npu`` on a device, ``npu-emu`` for ``--backend npu --emulate``).

Nothing here imports torch_npu at import time: the emulated path runs on any CPU host. No NPU
or CANN toolkit exists on our machines: the device path is written to the documented contracts
and compile-checked against torch_npu's headers only (docs/NPU.md: what ran, what did not).
"""
