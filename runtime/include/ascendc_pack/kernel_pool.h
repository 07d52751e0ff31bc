// Task-pool extension of the static kernel ABI (kernel_abi.h; docs/DESIGN.md §4.8).
//
// A kernel library may export, besides ap_kernel_launch, the same kernel with its parallel loop
// run by a caller's task pool:
//   int ap_kernel_launch_pool(inputs, outputs, workspace, max_threads, const ap_pool *pool)
// The graph (graph_interp.h, task_pool.h) passes its pool; Python callers (the build's sandbox
// and PGO) call ap_kernel_launch, which runs the same tasks on OpenMP.
//
// Why: an OpenMP region ends at a barrier every thread of the team must reach, so the caller
// waits for a worker that has not even woken up yet. Under OMP_WAIT_POLICY=PASSIVE that wake-up
// is a futex wake plus, on a VM, a halted vCPU's exit: ~50 us per region on an idle 2-vCPU KVM
// guest (bench/omp_wakeup.py), more than many kernels take. A pool run only waits for the tasks
// a worker actually claimed: the caller starts on the tasks at once, a worker that wakes late
// finds fewer (or none) left, and a worker descheduled by a busy host never stalls the call.
#ifndef ASCENDC_PACK_KERNEL_POOL_H
#define ASCENDC_PACK_KERNEL_POOL_H

#include <stdint.h>

#define AP_POOL_ABI_VERSION 1

#ifdef __cplusplus
extern "C" {
#endif

// One task of a job: `worker` in [0, threads) is unique among the tasks running at the same
// time (the caller is worker 0), so it may index per-thread scratch.
typedef void (*ap_task_fn)(void *ctx, int64_t task, int32_t worker);

typedef struct ap_pool {
  uint32_t abi_version;  // AP_POOL_ABI_VERSION
  // Runs fn(ctx, t, w) once for every t in [0, ntasks) on at most `threads` workers, the calling
  // thread included, and returns when every task has run. Never fails: with no worker free it
  // runs the tasks on the calling thread.
  void (*run)(const struct ap_pool *pool, int64_t ntasks, int32_t threads, ap_task_fn fn, void *ctx);
} ap_pool;

int ap_kernel_launch_pool(void *const *inputs, void *const *outputs, void *workspace, int32_t max_threads,
                          const ap_pool *pool);

#ifdef __cplusplus
}

#ifdef _OPENMP
#include <omp.h>
#endif
#include "ascendc_pack/fp_mode.h"

// Kernel side: body(task, worker) for every task in [0, ntasks) on nt threads, on `pool` when
// the caller gave one, else an OpenMP team (dynamic schedule, one task at a time); on the calling
// thread alone when nt or ntasks is 1.
template <class F>
static inline void ap_run_tasks(const ap_pool *pool, int64_t ntasks, int nt, F &body) {
  if (nt <= 1 || ntasks <= 1) {
    for (int64_t t = 0; t < ntasks; ++t) body(t, 0);
  } else if (pool != nullptr) {
    pool->run(pool, ntasks, nt, [](void *ctx, int64_t t, int32_t w) { (*static_cast<F *>(ctx))(t, w); }, &body);
  } else {
#ifdef _OPENMP
    ascendc_pack::CallerFpMode caller;  // every thread computes in the caller's fp mode (fp_mode.h)
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) firstprivate(caller)
    for (int64_t t = 0; t < ntasks; ++t) body(t, omp_get_thread_num());
#else
    for (int64_t t = 0; t < ntasks; ++t) body(t, 0);  // built without OpenMP: the calling thread
#endif
  }
}

// Defines both entry points of a kernel from its
//   int launch(void *const *inputs, void *const *outputs, void *workspace, int32_t max_threads,
//              const ap_pool *pool)
// (pool null: OpenMP).
#define AP_KERNEL_ENTRY_POINTS(launch)                                                              \
  extern "C" int ap_kernel_launch(void *const *inputs, void *const *outputs, void *workspace,       \
                                  int32_t max_threads) {                                            \
    return launch(inputs, outputs, workspace, max_threads, nullptr);                                \
  }                                                                                                 \
  extern "C" int ap_kernel_launch_pool(void *const *inputs, void *const *outputs, void *workspace,  \
                                       int32_t max_threads, const ap_pool *pool) {                  \
    return launch(inputs, outputs, workspace, max_threads, pool);                                   \
  }
#endif

#endif  // ASCENDC_PACK_KERNEL_POOL_H
