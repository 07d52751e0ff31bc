// ascendc_pack/npu_launch.h - the launcher of npu kernel libraries (issue 38).
//
// An npu kernel library (--backend npu, and --backend npu --emulate) exports, besides
// kernel_abi.h's ap_kernel_describe, the device entry
//
//   int ap_npu_launch(void *stream, void *const *inputs, void *const *outputs, void *workspace);
//
// which runs the kernel on `stream` (on a device: `kernel<<<block_dim, nullptr, stream>>>(...)`,
// returning aclrtGetLastError; emulated: the AscendC emulation on the CPU). launch() below is
// everything around that call, the same code for both: the current stream, the workspace from the
// device's stream-ordered allocator (the kernel's ap_kernel_info::workspace bytes), the launch
// enqueued in the device runtime's task queue, the workspace handed back after the enqueue (the
// caching allocator reuses it only after the stream has passed it), every failure a message.
//
// Device implementations:
//  * TorchNpuDevice (compiled with -DAP_WITH_TORCH_NPU, torch_npu's headers and -ltorch_npu):
//    c10_npu::getCurrentNPUStream().stream(false), c10_npu::NPUCachingAllocator::
//    raw_alloc_with_stream / raw_delete, at_npu::native::OpCommand::RunOpApiV2 - the contracts the
//    seed's generated wrapper (torch_npu/_inductor/ascendc, codegen/_asc_codegen.py) uses.
//    NOT RUN on our machines (no NPU): compile-checked against torch_npu 2.13.0's headers only.
//  * EmulatedDevice (otherwise): no stream (nullptr), 64-byte aligned host memory, the call made
//    at once. Every emulated bundle's graph goes through launch() with it.
#ifndef ASCENDC_PACK_NPU_LAUNCH_H_
#define ASCENDC_PACK_NPU_LAUNCH_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#ifdef AP_WITH_TORCH_NPU
#include "torch_npu/csrc/core/npu/NPUCachingAllocator.h"
#include "torch_npu/csrc/core/npu/NPUFunctions.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"
#include "torch_npu/csrc/framework/OpCommand.h"
#endif

extern "C" typedef int (*ap_npu_launch_fn)(void *stream, void *const *inputs, void *const *outputs,
                                           void *workspace);

namespace ascendc_pack {
namespace npu {

// What a launch needs from the device runtime.
class Device {
 public:
  virtual ~Device() = default;
  virtual const char *name() const = 0;
  // The stream kernels of the calling thread run on.
  virtual void *stream() = 0;
  // `bytes` of device memory usable by work enqueued on `stream` (nullptr: out of memory).
  virtual void *alloc_workspace(size_t bytes, void *stream) = 0;
  // Hands memory from alloc_workspace back; work already enqueued on its stream still owns it.
  virtual void free_workspace(void *ptr) = 0;
  // Runs `launch` in stream order (a device runtime may queue it); its status, 0 = enqueued.
  virtual int enqueue(const char *kernel, const std::function<int()> &launch) = 0;
};

class EmulatedDevice final : public Device {
 public:
  const char *name() const override { return "emulated (AscendC emulation on the CPU)"; }
  void *stream() override { return nullptr; }
  void *alloc_workspace(size_t bytes, void *) override {
    return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  }
  void free_workspace(void *ptr) override { std::free(ptr); }
  int enqueue(const char *, const std::function<int()> &launch) override { return launch(); }
};

#ifdef AP_WITH_TORCH_NPU
class TorchNpuDevice final : public Device {
 public:
  const char *name() const override { return "torch_npu"; }
  // stream(false): the stream without draining torch_npu's task queue (the launch is queued below)
  void *stream() override { return c10_npu::getCurrentNPUStream().stream(false); }
  void *alloc_workspace(size_t bytes, void *stream) override {
    return c10_npu::NPUCachingAllocator::raw_alloc_with_stream(bytes, static_cast<aclrtStream>(stream));
  }
  void free_workspace(void *ptr) override { c10_npu::NPUCachingAllocator::raw_delete(ptr); }
  int enqueue(const char *kernel, const std::function<int()> &launch) override {
    at_npu::native::OpCommand::RunOpApiV2(kernel, launch);
    return 0;
  }
};
#endif

// The device of this build: torch_npu's when compiled with it, else the emulation's.
inline Device &active_device() {
#ifdef AP_WITH_TORCH_NPU
  static TorchNpuDevice device;
#else
  static EmulatedDevice device;
#endif
  return device;
}

// Runs one npu kernel: `fn` is the library's ap_npu_launch, `workspace` its ap_kernel_info
// workspace bytes, `inputs`/`outputs` the data pointers (copied: a queued launch runs later).
// Returns 0, or a status with the reason in `error`. A queued launch's own status surfaces
// through the device runtime (torch_npu's task queue reports a non-zero return).
inline int launch(Device &device, const char *kernel, ap_npu_launch_fn fn, int64_t workspace,
                  std::vector<void *> inputs, std::vector<void *> outputs, std::string *error) {
  static const bool trace = [] {  // ASCENDC_PACK_NPU_TRACE=1: one stderr line per launch
    const char *v = std::getenv("ASCENDC_PACK_NPU_TRACE");
    return v != nullptr && v[0] == '1';
  }();
  void *stream = device.stream();
  if (trace) {
    std::fprintf(stderr, "ascendc_pack npu launch: %s on %s, stream %p, workspace %lld B\n", kernel, device.name(),
                 stream, static_cast<long long>(workspace));
  }
  void *ws = nullptr;
  if (workspace > 0) {
    ws = device.alloc_workspace(static_cast<size_t>(workspace), stream);
    if (ws == nullptr) {
      if (error) *error = std::string("cannot allocate ") + std::to_string(workspace) + " bytes of workspace on " +
                          device.name();
      return -2;
    }
  }
  inputs.push_back(nullptr);  // never an empty array
  outputs.push_back(nullptr);
  const int status = device.enqueue(kernel, [fn, stream, ws, inputs = std::move(inputs),
                                             outputs = std::move(outputs)]() {
    return fn(stream, inputs.data(), outputs.data(), ws);
  });
  if (ws != nullptr) device.free_workspace(ws);  // stream-ordered: the queued launch keeps it
  if (status != 0 && error) {
    *error = std::string("npu kernel ") + kernel + " failed on " + device.name() + " with status " +
             std::to_string(status);
  }
  return status;
}

}  // namespace npu
}  // namespace ascendc_pack

#endif  // ASCENDC_PACK_NPU_LAUNCH_H_
