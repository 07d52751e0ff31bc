// ascendc_pack/task_pool.h - the graph's task pool for kernel launches (kernel_pool.h).
//
// One pool per graph library, started on the first job that wants more than one thread. A job
// is `ntasks` tasks; the caller publishes it, wakes the sleeping workers and starts on the tasks
// at once. Tasks are claimed one at a time from one atomic word that carries the job's generation
// (24 bits: a worker would have to sleep through 16 M jobs to see its own come round again), so a
// worker that wakes after the job is over claims nothing (and never touches a later job with an
// earlier job's function). The caller claims from the front, the workers from the back:
// consecutive kernels split their tasks (rows, pixel blocks, in memory order) at about the same
// place, so each core reads the part of a tensor it wrote itself, from its own L2 (claimed from
// one end they interleaved: efficientnet_b0 4.92 -> 4.53 ms, docs/DESIGN.md §4.8). A job of more
// than 2^20 - 1 tasks is claimed in that many contiguous runs. The caller returns when every task
// has run: it waits only for tasks a worker has claimed, never for a worker to wake up (the
// OpenMP barrier does: ~50 us per region on an idle VM, bench/omp_wakeup.py) or to be scheduled
// again on a busy host.
//
// Between jobs a worker first stays awake for a short while (spin_us(): 200 us by default,
// ASCENDC_PACK_POOL_SPIN_US in the environment; 0 sleeps at once), polling for the next job and
// yielding its core to any other runnable thread on every poll, then sleeps on a condition
// variable. Why: on a VM a sleeping vCPU halts, and waking it costs ~50 us (bench/omp_wakeup.py),
// so a worker that slept between the kernels of one call joined each job ~50 us late (a 128x256x256
// GEMM ran at one-thread speed). The caller still never waits for a worker to wake, and the poll
// yields; what a busy host pays is tasks an awake worker claimed while the other process held its
// core (13-23 % with one core busy, docs/DESIGN.md §4.8). One job at a time: a second caller
// that finds the pool busy (another thread's graph call) runs its tasks on its own thread. After
// fork() the child has no workers: jobs run on the calling thread. A worker computes a job in
// its caller's floating-point mode (fp_mode.h: e.g. denormals flushed for the call).
#ifndef ASCENDC_PACK_TASK_POOL_H_
#define ASCENDC_PACK_TASK_POOL_H_

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "ascendc_pack/fp_mode.h"
#include "ascendc_pack/kernel_pool.h"

namespace ascendc_pack {

class TaskPool {
 public:
  static constexpr int kMaxWorkers = 256;

  TaskPool() {
    abi_.abi_version = AP_POOL_ABI_VERSION;
    abi_.run = &TaskPool::run_abi;
    abi_.self = this;
    pthread_atfork(nullptr, nullptr, [] { forked_child().store(true, std::memory_order_relaxed); });
  }
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  const ap_pool* abi() const { return &abi_; }

  // Never destroyed: its detached workers sleep in it until the process exits.
  static TaskPool& instance() {
    static TaskPool* pool = new TaskPool();
    return *pool;
  }

  void run(int64_t ntasks, int32_t threads, ap_task_fn fn, void* ctx) {
    if (threads > kMaxWorkers) threads = kMaxWorkers;
    std::unique_lock<std::mutex> busy(run_mu_, std::defer_lock);
    if (threads <= 1 || ntasks <= 1 || ntasks >= (int64_t(1) << 31) ||
        forked_child().load(std::memory_order_relaxed) || !busy.try_lock()) {
      for (int64_t t = 0; t < ntasks; ++t) fn(ctx, t, 0);
      return;
    }
    start_workers(threads - 1);
    uint32_t gen;
    int64_t claims;
    {
      std::lock_guard<std::mutex> lk(mu_);
      gen = ++gen_;
      fn_ = fn;
      ctx_ = ctx;
      ntasks_ = ntasks;
      threads_ = threads;
      mode_ = fp_mode();
      claims = claims_of(ntasks);
      done_.store(0, std::memory_order_relaxed);
      next_.store((uint64_t(gen) & kGenMask) << kGenShift | uint64_t(claims), std::memory_order_release);
      caller_cpu_.store(sched_getcpu(), std::memory_order_relaxed);
      posted_.store(gen, std::memory_order_release);
    }
    cv_.notify_all();
    work(gen, 0, fn, ctx, ntasks);
    // every task is claimed: wait for the ones still running on a worker
    for (int spins = 0; done_.load(std::memory_order_acquire) < claims; ++spins) {
      if (spins < 2000) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      } else {
        sched_yield();  // a worker holding a task was descheduled: let it run
      }
    }
  }

  // How long a worker stays awake after a job, in microseconds (ASCENDC_PACK_POOL_SPIN_US).
  static int64_t spin_us() {
    static const int64_t us = [] {
      // digits only (as ascendc_pack_runtime.threads.pool_spin_us reads it), else the default
      const char* env = std::getenv("ASCENDC_PACK_POOL_SPIN_US");
      if (env == nullptr || *env == '\0') return int64_t(200);
      for (const char* p = env; *p != '\0'; ++p)
        if (*p < '0' || *p > '9') return int64_t(200);
      return int64_t(std::strtoll(env, nullptr, 10));
    }();
    return us;
  }

 private:
  // set in a child process after fork(): the workers stayed in the parent
  static std::atomic<bool>& forked_child() {
    static std::atomic<bool> flag{false};
    return flag;
  }

  struct Abi : ap_pool {
    TaskPool* self;
  };

  static void run_abi(const ap_pool* p, int64_t ntasks, int32_t threads, ap_task_fn fn, void* ctx) {
    static_cast<const Abi*>(p)->self->run(ntasks, threads, fn, ctx);
  }

  // Claim and run tasks of job `gen` until none is left: the caller (worker 0) from the front,
  // the workers from the back (unless ASCENDC_PACK_POOL_LOCALITY=0: all from the front).
  void work(uint32_t gen, int32_t worker, ap_task_fn fn, void* ctx, int64_t ntasks) {
    const uint64_t want = uint64_t(gen) & kGenMask;
    const int64_t claims = claims_of(ntasks);
    const bool front = worker == 0 || !locality();
    uint64_t v = next_.load(std::memory_order_acquire);
    for (;;) {
      const int64_t lo = int64_t((v >> kEndBits) & kEndMask), hi = int64_t(v & kEndMask);
      if ((v >> kGenShift) != want || lo >= hi) return;
      const uint64_t claimed = front ? v + (uint64_t(1) << kEndBits) : v - 1;
      if (!next_.compare_exchange_weak(v, claimed, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      const int64_t c = front ? lo : hi - 1;  // claim c: tasks [c*n/claims, (c+1)*n/claims)
      for (int64_t t = c * ntasks / claims, end = (c + 1) * ntasks / claims; t < end; ++t) fn(ctx, t, worker);
      done_.fetch_add(1, std::memory_order_release);
      v = next_.load(std::memory_order_acquire);
    }
  }

  static int64_t claims_of(int64_t ntasks) { return ntasks < kMaxClaims ? ntasks : kMaxClaims; }

  // ASCENDC_PACK_POOL_LOCALITY=0: every thread claims from the front (the order before 2026-12-07)
  static bool locality() {
    static const bool on = [] {
      const char* env = std::getenv("ASCENDC_PACK_POOL_LOCALITY");
      return env == nullptr || env[0] != '0';
    }();
    return on;
  }

  void start_workers(int want) {
    while (started_ < want) {
      int index = ++started_;  // workers are 1..; the caller is 0
      std::thread([this, index] { loop(index); }).detach();
    }
  }

  // A worker the scheduler put on the caller's CPU (a VM packs threads that were idle onto one
  // vCPU) would only run the caller's tasks when the caller is preempted: move it to another
  // allowed CPU (unpinned again at once, so the scheduler stays free to move it later).
  void leave_callers_cpu() {
    const int here = sched_getcpu();
    if (here < 0 || here != caller_cpu_.load(std::memory_order_relaxed)) return;
    cpu_set_t allowed, others;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
    others = allowed;
    CPU_CLR(here, &others);
    if (CPU_COUNT(&others) == 0 || sched_setaffinity(0, sizeof(others), &others) != 0) return;
    sched_setaffinity(0, sizeof(allowed), &allowed);
  }

  // Poll for a job after `seen` for up to spin_us(), yielding the core on every poll.
  void stay_awake(uint32_t seen) {
    const int64_t us = spin_us();
    if (us <= 0) return;
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
    leave_callers_cpu();
    while (posted_.load(std::memory_order_acquire) == seen) {
      for (int i = 0; i < 32; ++i) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      }
      if (posted_.load(std::memory_order_acquire) != seen) return;
      sched_yield();
      if (std::chrono::steady_clock::now() >= until) return;
    }
  }

  void loop(int32_t index) {
    uint32_t seen = 0;
    for (;;) {
      stay_awake(seen);
      ap_task_fn fn;
      void* ctx;
      int64_t ntasks;
      uint64_t mode;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return gen_ != seen; });
        seen = gen_;
        if (index >= threads_) continue;  // this job wants fewer threads
        fn = fn_;
        ctx = ctx_;
        ntasks = ntasks_;
        mode = mode_;
      }
      adopt_fp_mode(mode);
      leave_callers_cpu();
      work(seen, index, fn, ctx, ntasks);
    }
  }

  Abi abi_;
  std::mutex run_mu_;  // one job at a time
  int started_ = 0;    // workers started (under run_mu_)
  std::mutex mu_;      // guards the job fields below and gen_
  std::condition_variable cv_;
  uint32_t gen_ = 0;
  ap_task_fn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t ntasks_ = 0;
  int32_t threads_ = 0;
  uint64_t mode_ = 0;  // the caller's floating-point mode (fp_mode.h)
  // The job's unclaimed claims [front, back) and its generation: gen << kGenShift | front <<
  // kEndBits | back. A job of more than kMaxClaims tasks is claimed in that many contiguous runs.
  static constexpr int kEndBits = 20, kGenShift = 2 * kEndBits;
  static constexpr uint64_t kEndMask = (uint64_t(1) << kEndBits) - 1, kGenMask = (uint64_t(1) << (64 - kGenShift)) - 1;
  static constexpr int64_t kMaxClaims = int64_t(kEndMask);
  std::atomic<uint64_t> next_{0};
  std::atomic<int64_t> done_{0};   // claims of the current job that have finished
  std::atomic<uint32_t> posted_{0};  // gen_ of the newest job, read without mu_ by waking workers
  std::atomic<int> caller_cpu_{-1};  // the CPU the newest job's caller ran on
};

}  // namespace ascendc_pack

#endif  // ASCENDC_PACK_TASK_POOL_H_
