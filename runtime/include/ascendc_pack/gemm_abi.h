// GEMM kernel extension of the static kernel ABI (kernel_abi.h).
//
// A generated GEMM candidate (templates/kernel/gemm.cpp.j2) is an ordinary static kernel
// library: ap_kernel_describe() / ap_kernel_launch() with
//   inputs  = [A, B, bias (if any), one residual per "add" epilogue step (in order)]
//   outputs = [C]  (contiguous [batch, M, N])
// and additionally exports the two functions below, so a loader can pack a constant B (a
// weight) once, at load time, for the candidates that read B pre-packed.
//
// Packed B layout (float32, whatever the input dtype; 16-bit weights are widened exactly):
//   panels of NR columns over the full K: panel p of B-batch q holds B[q][k][p*NR + j] at
//     packed[((q * n_panels + p) * K + k) * NR + j],   n_panels = ceil(N / NR),
//   columns past N are zero. The layout depends only on NR (the candidate's register block
//   width) and the shapes: any candidate with the same NR reads the same packed buffer.
#ifndef ASCENDC_PACK_GEMM_ABI_H
#define ASCENDC_PACK_GEMM_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ap_gemm_info {
  int32_t b_packed;        // 1: inputs[1] of ap_kernel_launch is B packed by ap_gemm_pack_b
  int32_t nr;              // panel width of the packed layout
  int64_t packed_b_bytes;  // bytes ap_gemm_pack_b writes (16-byte aligned buffer suffices)
  int64_t b_batches;       // B-batches held in the packed buffer (1 for a shared weight)
} ap_gemm_info;

// This candidate's packing contract (never NULL).
const ap_gemm_info *ap_gemm_describe(void);

// Packs B (as given: the layout and strides the kernel was generated for) into `packed`
// (packed_b_bytes). Run once per weight; max_threads <= 0 means the candidate's block_dim.
// Returns 0 on success.
int ap_gemm_pack_b(const void *b, void *packed, int32_t max_threads);

#ifdef __cplusplus
}
#endif

#endif  // ASCENDC_PACK_GEMM_ABI_H
