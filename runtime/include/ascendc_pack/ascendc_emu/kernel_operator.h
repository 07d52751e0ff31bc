// ascendc_emu: a CPU emulation of the Vector subset of AscendC's kernel_operator.h.
//
// AscendC Vector kernels written in the documented style (extern "C" __global__ __aicore__ entries
// taking GM_ADDR arguments, TPipe/TQue/TBuf, DataCopy/DataCopyPad, the Vector instructions) compile
// unchanged with g++ (C++17) against this directory and run on the CPU one block after another,
// the role of AscendC's CPU debug mode (ICPU_RUN_KF) without CANN. The documented constraints
// (UB capacity, 32-byte alignment, queue pairing, tensor bounds, reduction work-buffer sizes, ...)
// are enforced: a kernel that breaks one stops with a message naming the rule, the block and the
// values. docs/ASCENDC_EMU.md lists every emulated function, the API reference page it follows,
// and what is not emulated.
//
// Build a kernel:
//   g++ -std=c++17 -O2 -shared -fPIC -I<this dir> -include ap_emu_launch.h kernel.cpp -o kernel.so
// and launch it with ap_emu_launch() (C ABI, in ap_emu_launch.h) or ICPU_RUN_KF().
#ifndef ASCENDC_EMU_KERNEL_OPERATOR_H
#define ASCENDC_EMU_KERNEL_OPERATOR_H

#define ASCENDC_CPU_DEBUG 1
#define ASCENDC_EMU 1

#include "emu/numeric.h"
#include "emu/enums.h"
#include "emu/context.h"
#include "emu/tensor.h"
#include "emu/datacopy.h"
#include "emu/vector.h"
#include "emu/reduce.h"

#endif  // ASCENDC_EMU_KERNEL_OPERATOR_H
