// Host tiling of jit kernels (docs/DESIGN.md §3.5): the schedule, threads and chunking of one
// launch, chosen from the launch's sizes by the cost model that ranks the static candidates
// (ascendc_pack/kernels/fused/tiling.py: estimate_us, schedules `row` and `split`; the tests
// compare the two). Each jit kernel's ap_kernel_tiling fills an ap_jit_problem from its sizes
// and calls ap_jit_choose: a few dozen floating-point operations, well under a microsecond.
// Header-only C, no standard headers (kernels compile without them).
#ifndef ASCENDC_PACK_JIT_TILING_H
#define ASCENDC_PACK_JIT_TILING_H

#include <stdint.h>

#include "ascendc_pack/kernel_abi.h"

typedef struct ap_jit_problem {
  int64_t rows;       // the outer (row) index space of this launch
  int64_t inner;      // elements per row (the inner axes)
  double bytes;       // unique bytes the launch reads and writes
  double flops;       // arithmetic per element (the cost model's weights)
  int32_t passes;     // passes over a row: one per reduction stage, plus the storing pass
  int32_t n_red;      // reductions
  int32_t lanes;      // vector lanes the loops were built with
  int32_t cores;      // the most threads (the library's block_dim: the build's core limit)
  // the build host (kernels/fused/tiling.Target): GB/s per core, L2 bytes, overheads in µs
  double mem_gbps, cache_gbps, l2_bytes, task_us, parallel_us, barrier_us;
} ap_jit_problem;

static inline double ap_jit_max(double a, double b) { return a > b ? a : b; }
static inline double ap_jit_min(double a, double b) { return a < b ? a : b; }
static inline int64_t ap_jit_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// estimate_us of tiling.py for one (schedule, block_dim, rows per task); only ranks.
static inline double ap_jit_estimate(const ap_jit_problem *p, int32_t sched, int32_t bd, int64_t rpt) {
  const double rows = (double)(p->rows > 1 ? p->rows : 1);
  const double passes = (double)(p->passes > 1 ? p->passes : 1);
  const double working_set = p->bytes / rows * (double)rpt;
  const double reread = p->bytes * (passes - 1) / passes;
  const double bw = p->mem_gbps * __builtin_pow((double)bd, 0.8) * 1e3;  // bytes per µs
  const double cache_bw = p->cache_gbps * bd * 1e3;
  double t = p->bytes / bw + (working_set < p->l2_bytes ? reread / cache_bw : reread / bw);
  const double elems = (double)p->rows * (double)p->inner;
  const double inner = (double)(p->inner > 1 ? p->inner : 1);
  const double tail = (double)(p->inner % p->lanes) / inner;
  const double vec_eff = ap_jit_max(0.15, ap_jit_min(1.0, (double)p->inner / (4.0 * p->lanes)) * (1 - tail * 0.5));
  t += elems * p->flops / (2.0e3 * p->lanes * vec_eff * bd);
  if (bd > 1) t += p->parallel_us;
  if (sched == AP_JIT_ROW) {
    const int64_t tasks = ap_jit_cdiv(p->rows, rpt);
    const int64_t per_thread = ap_jit_cdiv(tasks, bd);
    const double imbalance = (double)(per_thread * bd) / (double)(tasks > 1 ? tasks : 1);
    t = t * imbalance + per_thread * p->task_us;
    if (tasks < bd) t *= (double)bd / (double)(tasks > 1 ? tasks : 1);
  } else {
    const double barrier = bd > 1 ? p->barrier_us : 0.0;  // a team of one does not wait
    t += rows * (p->n_red * passes * barrier + 0.05);
    if (p->inner < 4096 * (int64_t)bd) t += rows * barrier;
  }
  return t;
}

// The cheapest tiling of the static candidates' space (tiling.py _space: block_dim 1, all,
// half from 4 cores on; row with 1, 4, 16 or 64 rows per task; split where rows are few or
// long), at most max_threads threads (<= 0: p->cores). Returns 0.
static inline int ap_jit_choose(const ap_jit_problem *p, int32_t max_threads, ap_jit_tiling *out) {
  int32_t cores = p->cores > 0 ? p->cores : 1;
  if (max_threads > 0 && max_threads < cores) cores = max_threads;
  const int32_t bds[3] = {1, cores, cores >= 4 ? cores / 2 : 1};
  const int64_t rpts[4] = {1, 4, 16, 64};
  double best = -1;
  for (int i = 0; i < 3; ++i) {
    const int32_t bd = bds[i];
    if (i > 0 && (bd == 1 || (i == 2 && bd == cores))) continue;  // a block_dim already tried
    for (int k = 0; k < 4; ++k) {
      const int64_t rpt = rpts[k];
      if ((rpt > 1 && rpt * bd > p->rows) || (bd > 1 && p->rows <= 1)) continue;
      const double t = ap_jit_estimate(p, AP_JIT_ROW, bd, rpt);
      if (best < 0 || t < best) {
        best = t;
        out->sched = AP_JIT_ROW, out->block_dim = bd, out->rows_per_task = rpt, out->tile = 0;
      }
    }
    if (p->rows < 8 * (int64_t)bd || p->inner >= 8192) {
      const double t = ap_jit_estimate(p, AP_JIT_SPLIT, bd, 1);
      if (best < 0 || t < best) {
        best = t;
        out->sched = AP_JIT_SPLIT, out->block_dim = bd, out->rows_per_task = 1;
        out->tile = p->n_red == 0 && p->inner >= 8 * 32768 ? 32768 : 4096;
      }
    }
  }
  return 0;
}

#endif  // ASCENDC_PACK_JIT_TILING_H
