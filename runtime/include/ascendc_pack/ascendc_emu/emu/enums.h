// ascendc_emu: the enums, macros and small types of kernel_operator.h that kernels spell out.
// Names and enumerator orders follow the AscendC headers (kernel_utils_mode.h, kernel_event.h,
// common_types.h) so that kernels written for CANN compile unchanged.
#ifndef ASCENDC_EMU_ENUMS_H
#define ASCENDC_EMU_ENUMS_H

#include <cstdint>

// The CANN release whose API the kernel targets, MAJOR*10000 + MINOR*100 + PATCH (80500 = 8.5.0):
// an API the release lacks is refused at compile time with a message naming the release (the
// tables of ascendc_pack/backends/npu/api/cann-*.json say what each release declares). Default:
// the oldest supported release.
#ifndef ASCENDC_CANN_VERSION
#define ASCENDC_CANN_VERSION 80500
#endif
// Bytes of system workspace GetUserWorkspace skips (RESERVED_WORKSPACE of __NPU_ARCH__ 2201 in
// asc-devkit's kernel_utils_constants.h, 8.5.0 and 9.1.0 alike).
#ifndef ASCENDC_EMU_RESERVED_WORKSPACE
#define ASCENDC_EMU_RESERVED_WORKSPACE (16u * 1024u * 1024u)
#endif

// Kernel types (asc-devkit impl/basic_api/utils/kernel_utils_macros.h) and the macro that sets
// one; the emulation records it per block (SyncAll needs a MIX type).
enum KernelMetaType : uint8_t {
  KERNEL_TYPE_AIV_ONLY,
  KERNEL_TYPE_AIC_ONLY,
  KERNEL_TYPE_MIX_AIV_1_0,
  KERNEL_TYPE_MIX_AIC_1_0,
  KERNEL_TYPE_MIX_AIC_1_1,
  KERNEL_TYPE_MIX_AIC_1_2,
  KERNEL_TYPE_AICORE,
  KERNEL_TYPE_VECTORCORE,
  KERNEL_TYPE_MIX_AICORE,
  KERNEL_TYPE_MIX_VECTOR_CORE,
  KERNEL_TYPE_MAX,
};
#define KERNEL_TASK_TYPE_DEFAULT(value) ::ascendc_emu::set_kernel_type(value)

// Function and address-space qualifiers of the AscendC C++ dialect: nothing on the CPU.
#ifndef __global__
#define __global__
#endif
#ifndef __aicore__
#define __aicore__
#endif
#define __gm__
#define __ubuf__
#define __inout_pipe__(pipe)
#define GM_ADDR __gm__ uint8_t*

// The hardware pipelines (a compiler builtin in CANN) and the event ids kernels pass to SetFlag.
enum pipe_t {
  PIPE_S = 0,
  PIPE_V,
  PIPE_M,
  PIPE_MTE1,
  PIPE_MTE2,
  PIPE_MTE3,
  PIPE_ALL,
  PIPE_MTE4,
  PIPE_MTE5,
  PIPE_V2,
  PIPE_FIX,
};
enum event_t {
  EVENT_ID0 = 0,
  EVENT_ID1,
  EVENT_ID2,
  EVENT_ID3,
  EVENT_ID4,
  EVENT_ID5,
  EVENT_ID6,
  EVENT_ID7,
};

namespace AscendC {

enum class TPosition : uint8_t {
  GM,
  A1,
  A2,
  B1,
  B2,
  C1,
  C2,
  CO1,
  CO2,
  VECIN,
  VECOUT,
  VECCALC,
  LCM = VECCALC,
  SPM,
  SHM = SPM,
  TSCM,
  C2PIPE2GM,
  C2PIPE2LOCAL,
  MAX,
};
using QuePosition = TPosition;

enum class HardEvent : uint8_t {
  MTE2_MTE1,
  MTE1_MTE2,
  MTE1_M,
  M_MTE1,
  MTE2_V,
  V_MTE2,
  MTE3_V,
  V_MTE3,
  M_V,
  V_M,
  V_V,
  MTE3_MTE1,
  MTE1_MTE3,
  MTE1_V,
  MTE2_M,
  M_MTE2,
  V_MTE1,
  M_FIX,
  FIX_M,
  MTE3_MTE2,
  MTE2_MTE3,
  S_V,
  V_S,
  S_MTE2,
  MTE2_S,
  S_MTE3,
  MTE3_S,
  MTE2_FIX,
  FIX_MTE2,
  FIX_S,
  M_S,
  FIX_MTE3,
  MTE1_FIX,
  FIX_MTE1,
  FIX_FIX,
  MAX,
};

enum class RoundMode : uint8_t {
  CAST_NONE = 0,
  CAST_RINT,
  CAST_FLOOR,
  CAST_CEIL,
  CAST_ROUND,
  CAST_TRUNC,
  CAST_ODD,
  UNKNOWN = 0xFF,
};

enum class CMPMODE : uint8_t { LT = 0, GT, EQ, LE, GE, NE };

enum class SELMODE : uint8_t { VSEL_CMPMASK_SPR = 0, VSEL_TENSOR_SCALAR_MODE, VSEL_TENSOR_TENSOR_MODE };

enum class ReduceOrder : uint8_t { ORDER_VALUE_INDEX = 0, ORDER_INDEX_VALUE, ORDER_ONLY_VALUE, ORDER_ONLY_INDEX };

enum class PaddingMode : uint8_t { Normal = 0, Compact };

using TEventID = int8_t;

}  // namespace AscendC

namespace ascendc_emu {

// false for any A...: the static_assert of an API the targeted release lacks fires on use only.
template <class... A>
inline constexpr bool cann_lacks = sizeof...(A) < 0;

inline const char* position_name(AscendC::TPosition p) {
  switch (p) {
    case AscendC::TPosition::GM: return "GM";
    case AscendC::TPosition::VECIN: return "VECIN";
    case AscendC::TPosition::VECOUT: return "VECOUT";
    case AscendC::TPosition::VECCALC: return "VECCALC";
    default: return "non-vector position";
  }
}

inline const char* cmp_name(AscendC::CMPMODE m) {
  static const char* const names[] = {"LT", "GT", "EQ", "LE", "GE", "NE"};
  return static_cast<unsigned>(m) < 6 ? names[static_cast<unsigned>(m)] : "?";
}

inline const char* round_name(AscendC::RoundMode m) {
  static const char* const names[] = {"CAST_NONE", "CAST_RINT", "CAST_FLOOR", "CAST_CEIL",
                                      "CAST_ROUND", "CAST_TRUNC", "CAST_ODD"};
  return static_cast<unsigned>(m) < 7 ? names[static_cast<unsigned>(m)] : "UNKNOWN";
}

}  // namespace ascendc_emu

#endif  // ASCENDC_EMU_ENUMS_H
