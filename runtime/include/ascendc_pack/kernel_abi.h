// Static kernel ABI (docs/DESIGN.md §3.5): one shared library per tiling candidate.
//
// A kernel library has C linkage, no torch headers, and its tiling compiled in as constants.
// It describes itself through ap_kernel_describe() so a loader can check that it is the file a
// manifest promised (kernel_key), and it exposes one launch entry taking tensor data pointers,
// a workspace pointer and a thread cap.
#ifndef ASCENDC_PACK_KERNEL_ABI_H
#define ASCENDC_PACK_KERNEL_ABI_H

#include <stdint.h>

#define AP_KERNEL_ABI_VERSION 1

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ap_kernel_info {
  uint32_t abi_version;     // AP_KERNEL_ABI_VERSION at build time
  const char *name;         // fused kernel name
  const char *kernel_key;   // md5("tiling_repr|workspace|block_dim"), hex
  const char *tiling_repr;  // canonical tiling text
  int64_t workspace;        // bytes of scratch the caller must pass to launch
  int32_t block_dim;        // parallel blocks (threads) the tiling was built for
  const char *isa;          // ISA features the code needs, comma separated (e.g. "avx2,fma")
  int32_t n_inputs;         // number of input pointers launch reads
  int32_t n_outputs;        // number of output pointers launch writes
} ap_kernel_info;

// Returns this library's static self-description (never NULL).
const ap_kernel_info *ap_kernel_describe(void);

// Runs the kernel. inputs/outputs: data pointers in the order of the fused kernel's spec.
// workspace: at least info->workspace bytes (may be NULL when that is 0).
// max_threads: cap on threads used (<= 0 means block_dim). Returns 0 on success.
int ap_kernel_launch(void *const *inputs, void *const *outputs, void *workspace,
                     int32_t max_threads);

// ---- jit kernels (docs/DESIGN.md §3.5): the seed's jit path ------------------------------------
// A fused kernel whose sizes depend on a model's dynamic dims takes those sizes as arguments and
// picks its tiling on the host at each launch (ap_kernel_tiling, like torch_npu's
// AutofuseTiling), then runs it (ap_kernel_launch_jit, like AutofuseLaunch). It still exports
// ap_kernel_describe (tiling_repr "jit;...", block_dim = the most threads it may use,
// workspace = the most scratch any tiling asks) and an ap_kernel_launch that returns
// AP_KERNEL_NEEDS_SIZES.
#define AP_KERNEL_JIT_ABI_VERSION 1
#define AP_KERNEL_NEEDS_SIZES (-2)

enum ap_jit_sched { AP_JIT_ROW = 0, AP_JIT_SPLIT = 1 };

typedef struct ap_jit_tiling {
  int32_t sched;          // ap_jit_sched: threads take blocks of rows / share each row
  int32_t block_dim;      // threads of this launch (<= the max_threads it was asked for)
  int64_t rows_per_task;  // AP_JIT_ROW: rows per OpenMP chunk (schedule static)
  int64_t tile;           // AP_JIT_SPLIT of a kernel without reductions: elements per store tile
} ap_jit_tiling;

typedef struct ap_jit_info {
  uint32_t abi_version;   // AP_KERNEL_JIT_ABI_VERSION
  int32_t n_dims;         // how many sizes ap_kernel_tiling/launch_jit read
  const char *dims;       // their names, comma separated, in argument order ("batch,seq")
} ap_jit_info;

const ap_jit_info *ap_kernel_jit_describe(void);

// Host tiling: the schedule, threads and chunking for these sizes. max_threads <= 0: the
// library's block_dim. Returns 0 on success.
int ap_kernel_tiling(const int64_t *dims, int32_t max_threads, ap_jit_tiling *tiling);

// Runs the kernel on these sizes with that tiling; inputs/outputs as ap_kernel_launch.
int ap_kernel_launch_jit(void *const *inputs, void *const *outputs, void *workspace,
                         const int64_t *dims, const ap_jit_tiling *tiling);

#ifdef __cplusplus
}
#endif

#endif  // ASCENDC_PACK_KERNEL_ABI_H
