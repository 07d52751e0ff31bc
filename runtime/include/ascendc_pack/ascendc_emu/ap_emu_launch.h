// ascendc_emu launcher: runs an emulated AscendC kernel over block_dim blocks.
//
// Include this header in exactly ONE translation unit of a kernel library (it defines the
// exported C functions below); `g++ -include ap_emu_launch.h kernel.cpp` does that without
// touching the kernel source.
//
// Execution: the blocks run one after another, each on its own thread but never two at once (a
// baton passes between them), so runs are deterministic. A block that calls SyncAll() parks; when
// every block has parked the barrier opens and the parked blocks continue, again one at a time.
//
// Failures: a broken rule throws inside the kernel; the launcher catches it, unwinds the other
// blocks, and returns a non-zero status with the message in the caller's buffer. The process does
// not die, so a test can assert on a violation. ICPU_RUN_KF (the CANN CPU-debug spelling) prints
// the message and aborts instead.
#ifndef ASCENDC_EMU_AP_EMU_LAUNCH_H
#define ASCENDC_EMU_AP_EMU_LAUNCH_H

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>
#include <thread>
#include <utility>

#include "kernel_operator.h"

extern "C" {

// One GM_ADDR argument: its address and size in bytes (0: unknown, not bounds-checked).
typedef struct ap_emu_buffer {
  void* data;
  uint64_t bytes;
} ap_emu_buffer;

typedef struct ap_emu_options {
  const char* soc;                    // SoC profile name; NULL: "Ascend910B2"
  int32_t disable_asc_reserved_ubuf;  // 1: as built with --cce-disable-asc-reserved-ubuf
} ap_emu_options;

enum {
  AP_EMU_OK = 0,
  AP_EMU_RULE_VIOLATION = 1,   // the kernel broke a documented AscendC rule
  AP_EMU_BAD_LAUNCH = 2,       // bad launch arguments (unknown SoC, block_dim, argument count)
  AP_EMU_KERNEL_EXCEPTION = 3  // the kernel threw something else
};

#define AP_EMU_ABI_VERSION 1
#define AP_EMU_MAX_ARGS 32

int32_t ap_emu_abi_version(void);
// Runs kernel(args[0].data, ..., args[n_args-1].data) on block_dim blocks. Returns an AP_EMU_*
// status; on failure the message (NUL-terminated, truncated to err_len) goes to err.
int32_t ap_emu_launch(void* kernel, uint32_t block_dim, const ap_emu_buffer* args, uint32_t n_args,
                      const ap_emu_options* options, char* err, uint64_t err_len);
// Numbers of a SoC profile; returns AP_EMU_BAD_LAUNCH for an unknown name.
int32_t ap_emu_soc_info(const char* soc, uint32_t* vector_cores, uint32_t* ub_bytes,
                        uint32_t* ub_usable);

}  // extern "C"

namespace ascendc_emu {
namespace launch {

template <size_t I>
using gm_arg = uint8_t*;

template <size_t... I>
void call_with(void* fn, uint8_t* const* a, std::index_sequence<I...>) {
  using Fn = void (*)(gm_arg<I>...);
  reinterpret_cast<Fn>(fn)(a[I]...);
}
template <size_t N>
void call_n(void* fn, uint8_t* const* a) {
  call_with(fn, a, std::make_index_sequence<N>{});
}
using Caller = void (*)(void*, uint8_t* const*);
template <size_t... N>
constexpr std::array<Caller, sizeof...(N)> make_callers(std::index_sequence<N...>) {
  return {{&call_n<N>...}};
}

struct Outcome {
  int32_t status = AP_EMU_OK;
  std::string message;
};

class Scheduler final : public SyncPoint {
 public:
  Scheduler(const Launch& launch, void* fn, Caller call, const std::vector<uint8_t*>& args)
      : launch_(launch), fn_(fn), call_(call), args_(args), blocks_(launch.block_dim) {}

  Outcome run() {
    for (uint32_t b = 0; b < launch_.block_dim && outcome_.status == AP_EMU_OK; ++b) {
      blocks_[b].thread = std::thread(&Scheduler::block_main, this, b);
      resume(b);
      if (blocks_[b].phase == Phase::DONE) blocks_[b].thread.join();
    }
    while (outcome_.status == AP_EMU_OK) {
      std::vector<uint32_t> parked, done;
      for (uint32_t b = 0; b < launch_.block_dim; ++b) {
        (blocks_[b].phase == Phase::PARKED ? parked : done).push_back(b);
      }
      if (parked.empty()) break;
      if (!done.empty()) {
        fail(AP_EMU_RULE_VIOLATION,
             str("ascendc_emu: rule 'every block reaches each SyncAll' violated by SyncAll (block ",
                 done.front(), " of ", launch_.block_dim, ", SoC ", launch_.soc->name, "): block ",
                 done.front(), " returned after ", blocks_[done.front()].syncs, " SyncAll call(s) while ",
                 parked.size(), " block(s) wait in SyncAll #", blocks_[parked.front()].syncs,
                 " (the device would hang)"));
        break;
      }
      for (uint32_t b : parked) {
        resume(b);
        if (outcome_.status != AP_EMU_OK) break;
      }
    }
    for (uint32_t b = 0; b < launch_.block_dim; ++b) {  // unwind blocks parked when something failed
      if (blocks_[b].phase == Phase::PARKED) {
        blocks_[b].cancel = true;
        resume(b);
      }
      if (blocks_[b].thread.joinable()) blocks_[b].thread.join();
    }
    return outcome_;
  }

  void sync_all(uint32_t b) override {
    std::unique_lock<std::mutex> lk(m_);
    if (blocks_[b].cancel) throw BlockCancelled{};  // the launch failed: keep unwinding
    blocks_[b].phase = Phase::PARKED;
    ++blocks_[b].syncs;
    baton_ = -1;
    cv_.notify_all();
    cv_.wait(lk, [&] { return baton_ == static_cast<int64_t>(b); });
    blocks_[b].phase = Phase::RUNNING;
    if (blocks_[b].cancel) throw BlockCancelled{};
  }

 private:
  enum class Phase { NOT_STARTED, RUNNING, PARKED, DONE };
  struct Block {
    std::thread thread;
    Phase phase = Phase::NOT_STARTED;
    bool cancel = false;
    uint32_t syncs = 0;
  };

  // Hands the baton to block b and waits until it parks or finishes.
  void resume(uint32_t b) {
    std::unique_lock<std::mutex> lk(m_);
    baton_ = b;
    cv_.notify_all();
    cv_.wait(lk, [&] { return baton_ == -1; });
  }

  void fail(int32_t status, std::string message) {
    if (outcome_.status == AP_EMU_OK) outcome_ = {status, std::move(message)};
  }

  void block_main(uint32_t b) {
    {
      std::unique_lock<std::mutex> lk(m_);
      cv_.wait(lk, [&] { return baton_ == static_cast<int64_t>(b); });
      blocks_[b].phase = Phase::RUNNING;
    }
    int32_t status = AP_EMU_OK;
    std::string message;
    {
      BlockContext c(launch_, b);
      tls_block = &c;
      try {
        call_(fn_, args_.data());
        check_end_of_kernel(c);
      } catch (const RuleViolation& e) {
        status = AP_EMU_RULE_VIOLATION;
        message = e.what();
      } catch (const BlockCancelled&) {
      } catch (const std::exception& e) {
        status = AP_EMU_KERNEL_EXCEPTION;
        message = str("ascendc_emu: the kernel threw in block ", b, ": ", e.what());
      } catch (...) {
        status = AP_EMU_KERNEL_EXCEPTION;
        message = str("ascendc_emu: the kernel threw a non-standard exception in block ", b);
      }
      tls_block = nullptr;
    }
    std::lock_guard<std::mutex> lk(m_);
    if (status != AP_EMU_OK) fail(status, std::move(message));
    blocks_[b].phase = Phase::DONE;
    baton_ = -1;
    cv_.notify_all();
  }

  const Launch& launch_;
  void* fn_;
  Caller call_;
  std::vector<uint8_t*> args_;
  std::vector<Block> blocks_;
  std::mutex m_;
  std::condition_variable cv_;
  int64_t baton_ = -1;  // the block allowed to run; -1: the scheduler
  Outcome outcome_;
};

inline Outcome launch(void* kernel, uint32_t block_dim, const ap_emu_buffer* args, uint32_t n_args,
                      const ap_emu_options* options) {
  static constexpr auto callers = make_callers(std::make_index_sequence<AP_EMU_MAX_ARGS + 1>{});
  const char* soc_name = (options && options->soc) ? options->soc : kDefaultSoc;
  const SocProfile* soc = find_soc(soc_name);
  if (soc == nullptr) {
    return {AP_EMU_BAD_LAUNCH, str("ascendc_emu: unknown SoC '", soc_name, "'; known: ", soc_names())};
  }
  if (kernel == nullptr) return {AP_EMU_BAD_LAUNCH, "ascendc_emu: kernel function pointer is NULL"};
  if (block_dim == 0 || block_dim > kMaxBlockDim) {
    return {AP_EMU_BAD_LAUNCH, str("ascendc_emu: block_dim ", block_dim, " is outside [1, ", kMaxBlockDim, "]")};
  }
  if (n_args > AP_EMU_MAX_ARGS || (n_args > 0 && args == nullptr)) {
    return {AP_EMU_BAD_LAUNCH,
            str("ascendc_emu: ", n_args, " kernel arguments (at most ", AP_EMU_MAX_ARGS, ", args non-NULL)")};
  }
  const bool asc_reserve = !(options && options->disable_asc_reserved_ubuf);
  Launch l{soc, block_dim, soc->ub_bytes - kUbFrameworkReserve - (asc_reserve ? kUbAscReserve : 0), asc_reserve,
           {}, nullptr};
  std::vector<uint8_t*> ptrs;
  for (uint32_t i = 0; i < n_args; ++i) {
    ptrs.push_back(static_cast<uint8_t*>(args[i].data));
    if (args[i].data != nullptr) l.gm.push_back({static_cast<uint8_t*>(args[i].data), args[i].bytes, i});
  }
  Scheduler s(l, kernel, callers[n_args], ptrs);
  l.sync = &s;
  try {
    return s.run();
  } catch (const std::system_error& e) {
    return {AP_EMU_BAD_LAUNCH, str("ascendc_emu: could not start block threads: ", e.what())};
  }
}

inline void run_or_abort(void* kernel, uint32_t block_dim, std::initializer_list<void*> args) {
  std::vector<ap_emu_buffer> buffers;
  for (void* a : args) buffers.push_back({a, 0});
  const Outcome o = launch(kernel, block_dim, buffers.data(), static_cast<uint32_t>(buffers.size()), nullptr);
  if (o.status != AP_EMU_OK) {
    std::fprintf(stderr, "%s\n", o.message.c_str());
    std::abort();
  }
}

}  // namespace launch
}  // namespace ascendc_emu

extern "C" {

int32_t ap_emu_abi_version(void) { return AP_EMU_ABI_VERSION; }

int32_t ap_emu_launch(void* kernel, uint32_t block_dim, const ap_emu_buffer* args, uint32_t n_args,
                      const ap_emu_options* options, char* err, uint64_t err_len) {
  const auto o = ascendc_emu::launch::launch(kernel, block_dim, args, n_args, options);
  if (err != nullptr && err_len > 0) {
    const uint64_t n = std::min<uint64_t>(o.message.size(), err_len - 1);
    std::memcpy(err, o.message.data(), n);
    err[n] = '\0';
  }
  return o.status;
}

int32_t ap_emu_soc_info(const char* soc, uint32_t* vector_cores, uint32_t* ub_bytes, uint32_t* ub_usable) {
  const auto* p = ascendc_emu::find_soc(soc ? soc : ascendc_emu::kDefaultSoc);
  if (p == nullptr) return AP_EMU_BAD_LAUNCH;
  if (vector_cores) *vector_cores = p->vector_cores;
  if (ub_bytes) *ub_bytes = p->ub_bytes;
  if (ub_usable) *ub_usable = p->ub_bytes - ascendc_emu::kUbFrameworkReserve - ascendc_emu::kUbAscReserve;
  return AP_EMU_OK;
}

}  // extern "C"

namespace AscendC {
// Global Memory for host programs that use ICPU_RUN_KF (plain aligned heap memory here).
inline uint8_t* GmAlloc(size_t size) {
  return static_cast<uint8_t*>(std::aligned_alloc(64, (size + 63) / 64 * 64));
}
inline void GmFree(void* ptr) { std::free(ptr); }
}  // namespace AscendC

// The CANN CPU-debug entry point: runs func on blockDim blocks; on a violation prints it and aborts.
#define ICPU_RUN_KF(func, blockDim, ...) \
  ascendc_emu::launch::run_or_abort(reinterpret_cast<void*>(&(func)), (blockDim), {__VA_ARGS__})

#endif  // ASCENDC_EMU_AP_EMU_LAUNCH_H
