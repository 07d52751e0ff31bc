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

#ifdef __cplusplus
}
#endif

#endif  // ASCENDC_PACK_KERNEL_ABI_H
