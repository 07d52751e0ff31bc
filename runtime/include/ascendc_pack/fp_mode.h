// ascendc_pack/fp_mode.h - a thread's floating-point mode, and flushing denormals for a call.
//
// A graph built with --flush-denormals runs every call with denormal results flushed to zero and
// denormal operands read as zero (x86: MXCSR FTZ | DAZ; aarch64: FPCR FZ). Denormal arithmetic
// takes a microcode assist on x86 - up to ~100x a normal multiply - and a masked softmax
// (exp(-100) = 3.7e-44) fills whole attention rows with denormals: a Swin-style window attention
// ran 0.82 ms, flushed 0.15 ms (docs/PRECISION.md "Denormals").
//
// The mode is a per-thread setting. The graph sets it on the calling thread for the call and
// restores it after (FlushDenormals); every thread of a generated kernel's parallel region
// computes in its caller's mode (CallerFpMode) and every task-pool worker in its job's
// (task_pool.h), so a kernel gives the same result on any number of threads. ATen steps that
// torch parallelizes on its own OpenMP threads keep those threads' mode (the process default:
// denormals kept). Plain C++ with inline assembly: no intrinsics, no standard headers, so the
// kernel templates may include it.
#ifndef ASCENDC_PACK_FP_MODE_H_
#define ASCENDC_PACK_FP_MODE_H_

#include <stdint.h>

namespace ascendc_pack {

#if defined(__x86_64__) || defined(__i386__)
constexpr uint64_t kFlushDenormalBits = 0x8040;  // MXCSR FTZ (bit 15) | DAZ (bit 6)
constexpr uint64_t kFpControlBits = 0xffc0;      // DAZ, exception masks, rounding, FTZ (not the status flags)
inline uint64_t fp_mode() {
  uint32_t m;
  __asm__ __volatile__("stmxcsr %0" : "=m"(m));
  return m;
}
inline void set_fp_mode(uint64_t mode) {
  uint32_t m = static_cast<uint32_t>(mode);
  __asm__ __volatile__("ldmxcsr %0" : : "m"(m));
}
#elif defined(__aarch64__)
constexpr uint64_t kFlushDenormalBits = uint64_t(1) << 24;  // FPCR FZ
constexpr uint64_t kFpControlBits = ~uint64_t(0);           // FPCR holds no status flags (FPSR does)
inline uint64_t fp_mode() {
  uint64_t v;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(v));
  return v;
}
inline void set_fp_mode(uint64_t mode) { __asm__ __volatile__("msr fpcr, %0" : : "r"(mode)); }
#else
constexpr uint64_t kFlushDenormalBits = 0;  // no known control word: denormals are kept
constexpr uint64_t kFpControlBits = 0;
inline uint64_t fp_mode() { return 0; }
inline void set_fp_mode(uint64_t) {}
#endif

// This thread's mode with the control bits of `mode` (rounding, flushing), its own status flags;
// returns the mode it had, for restoring.
inline uint64_t adopt_fp_mode(uint64_t mode) {
  const uint64_t before = fp_mode();
  const uint64_t want = (before & ~kFpControlBits) | (mode & kFpControlBits);
  if (want != before) set_fp_mode(want);
  return before;
}

// Flushes denormals on this thread while alive when `on`; restores the thread's mode after.
class FlushDenormals {
 public:
  explicit FlushDenormals(bool on) : on_(on && kFlushDenormalBits != 0), before_(on_ ? fp_mode() : 0) {
    if (on_) set_fp_mode(before_ | kFlushDenormalBits);
  }
  ~FlushDenormals() {
    if (on_) adopt_fp_mode(before_);
  }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  bool on_;
  uint64_t before_;
};

// The caller's mode, carried into a parallel region: `firstprivate(caller)` on the region's
// pragma makes each thread's copy (constructed on that thread) adopt the caller's control bits,
// and its destructor gives the thread its own mode back when the region ends.
class CallerFpMode {
 public:
  CallerFpMode() : mode_(fp_mode()), before_(mode_), copy_(false) {}
  CallerFpMode(const CallerFpMode& caller) : mode_(caller.mode_), before_(adopt_fp_mode(caller.mode_)), copy_(true) {}
  ~CallerFpMode() {
    if (copy_) adopt_fp_mode(before_);
  }
  CallerFpMode& operator=(const CallerFpMode&) = delete;

 private:
  uint64_t mode_;
  uint64_t before_;
  bool copy_;
};

}  // namespace ascendc_pack

#endif  // ASCENDC_PACK_FP_MODE_H_
