"""The ``npu`` backend: AscendC Vector kernels from the same fused-kernel specs as ``cpu``.

* :mod:`.layout`   - what the generator can express (rows x a contiguous inner range), else
                     ``unsupported: <reason>`` and the kernel stays ATen;
* :mod:`.emit`     - spec ops -> AscendC Vector instructions;
* :mod:`.planner`  - the kernel class's member functions: tile passes, UB slots, row values;
* :mod:`.codegen`  - a mode's kernel plan, its Unified Buffer, the source of one candidate
                     (templates/kernel/npu/);
* :mod:`.tiling`   - candidate tilings ranked by the npu cost model (UB capacity, alignment,
                     DMA vs Vector time);
* :mod:`.toolchain`- the emulation build (g++ against runtime/include/ascendc_pack/ascendc_emu)
                     and the CANN build command;
* :mod:`.device`   - torch_npu: SoC name, device limit, event timer, stream launcher;
* :mod:`.backend`  - the :class:`~ascendc_pack.backends.protocol.Backend` implementations
                     (``npu`` on a device, ``npu-emu`` for ``--backend npu --emulate``).

Nothing here imports torch_npu at import time: the emulated path runs on any CPU host.
"""
