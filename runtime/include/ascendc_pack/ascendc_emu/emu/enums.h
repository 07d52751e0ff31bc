// ascendc_emu: the enums, macros and small types of kernel_operator.h that kernels spell out.
// Names and enumerator orders follow the AscendC headers (kernel_utils_mode.h, kernel_event.h,
// common_types.h) so that kernels written for CANN compile unchanged.
#ifndef ASCENDC_EMU_ENUMS_H
#define ASCENDC_EMU_ENUMS_H

#include <cstdint>

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
