// ascendc_emu: DataCopy / DataCopyPad between Global Memory and the Unified Buffer, pad values and
// atomic accumulation into GM. Semantics: the DataCopy, DataCopyPad(GM->UB), DataCopyPad(UB->GM),
// SetPadValue and SetAtomicAdd pages of the AscendC API reference (docs/ASCENDC_EMU.md).
#ifndef ASCENDC_EMU_DATACOPY_H
#define ASCENDC_EMU_DATACOPY_H

#include <algorithm>
#include <cstring>

#include "tensor.h"

namespace AscendC {

struct DataCopyParams {
  DataCopyParams() {}
  DataCopyParams(const uint16_t count, const uint16_t len, const uint16_t srcStrideIn,
                 const uint16_t dstStrideIn)
      : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn) {}
  uint16_t blockCount = 1;
  uint16_t blockLen = 0;  // DataCopy: 32-byte DataBlocks; DataCopyPad: bytes
  union {
    uint16_t srcGap = 0;
    uint16_t srcStride;
  };
  union {
    uint16_t dstGap = 0;
    uint16_t dstStride;
  };
};

struct DataCopyExtParams {
  DataCopyExtParams() {}
  DataCopyExtParams(const uint16_t count, const uint32_t len, const uint32_t srcStrideIn,
                    const uint32_t dstStrideIn, const uint32_t rsvIn)
      : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn), rsv(rsvIn) {}
  uint16_t blockCount = 1;
  uint32_t blockLen = 0;   // bytes
  uint32_t srcStride = 0;  // GM->UB: bytes; UB->GM: 32-byte DataBlocks
  uint32_t dstStride = 0;  // GM->UB: 32-byte DataBlocks; UB->GM: bytes
  uint32_t rsv = 0;
};

template <class T>
struct DataCopyPadExtParams {
  DataCopyPadExtParams() {}
  DataCopyPadExtParams(const bool isPadValue, const uint8_t leftPadValue, const uint8_t rightPadValue,
                       T padValue)
      : isPad(isPadValue), leftPadding(leftPadValue), rightPadding(rightPadValue), paddingValue(padValue) {}
  bool isPad = false;
  uint8_t leftPadding = 0;   // elements
  uint8_t rightPadding = 0;  // elements
  T paddingValue = 0;
};

struct DataCopyPadParams {
  DataCopyPadParams() {}
  DataCopyPadParams(const bool isPadValue, const uint8_t leftPadValue, const uint8_t rightPadValue,
                    const uint64_t padValue)
      : isPad(isPadValue), leftPadding(leftPadValue), rightPadding(rightPadValue), paddingValue(padValue) {}
  bool isPad = false;
  uint8_t leftPadding = 0;
  uint8_t rightPadding = 0;
  uint64_t paddingValue = 0;
};

// Pad value for DataCopyPad calls with isPad == false.
template <class T, TPosition pos = TPosition::MAX>
inline void SetPadValue(T paddingValue) {
  auto& c = ascendc_emu::ctx();
  c.pad_value_bits = 0;
  std::memcpy(&c.pad_value_bits, &paddingValue, sizeof(T));
  c.pad_value_set = true;
}

// Atomic accumulation of UB->GM copies (the other blocks' writes are already in GM: blocks run in
// order, so the result is the same as on the device up to the order of floating-point additions).
#define ASCENDC_EMU_ATOMIC(NAME, MODE)                                                               \
  template <class T>                                                                              \
  inline void NAME() {                                                                            \
    static_assert(ascendc_emu::is_one_of_v<T, int8_t, int16_t, half, bfloat16_t, int32_t, float>,   \
                  #NAME ": T must be int8_t/int16_t/half/bfloat16_t/int32_t/float on Atlas A2/A3"); \
    auto& c = ascendc_emu::ctx();                                                                 \
    c.atomic = ascendc_emu::AtomicMode::MODE;                                                     \
    c.atomic_type = ascendc_emu::type_name<T>();                                                  \
  }
ASCENDC_EMU_ATOMIC(SetAtomicAdd, ADD)
ASCENDC_EMU_ATOMIC(SetAtomicMax, MAX)
ASCENDC_EMU_ATOMIC(SetAtomicMin, MIN)
#undef ASCENDC_EMU_ATOMIC
inline void SetAtomicNone() { ascendc_emu::ctx().atomic = ascendc_emu::AtomicMode::NONE; }
#if ASCENDC_CANN_VERSION >= 90000
inline void DisableDmaAtomic() { SetAtomicNone(); }  // asc-devkit declares it from 9.0
#else
template <class... A>
inline void DisableDmaAtomic(A&&...) {
  static_assert(ascendc_emu::cann_lacks<A...>, "DisableDmaAtomic does not exist in CANN 8.x (asc-devkit v8.5.0): "
                "use SetAtomicNone, or target CANN >= 9.0 (-DASCENDC_CANN_VERSION=90100)");
}
#endif

}  // namespace AscendC

namespace ascendc_emu {
namespace dc {

// UB->UB DataCopy moves data along the documented paths only: VECIN -> VECCALC, VECCALC -> VECOUT
// (DataCopy (UBToUB contiguous) page: "supported data paths").
template <class T>
void check_ub_path(const std::string& api, const AscendC::LocalTensor<T>& src, const AscendC::LocalTensor<T>& dst) {
  using AscendC::TPosition;
  const TPosition s = src.GetPosition(), d = dst.GetPosition();
  if (!((s == TPosition::VECIN && d == TPosition::VECCALC) || (s == TPosition::VECCALC && d == TPosition::VECOUT))) {
    violate("UB->UB DataCopy only VECIN -> VECCALC or VECCALC -> VECOUT", api,
            str(position_name(s), " -> ", position_name(d),
                " is not a documented path (AscendC API reference: DataCopy (UBToUB contiguous), supported data "
                "paths); copy with a Vector instruction (Muls by 1, Adds of 0) instead"));
  }
}

inline uint64_t round32(uint64_t n) { return (n + kBlockBytes - 1) / kBlockBytes * kBlockBytes; }

// Writes n elements to GM, honouring SetAtomicAdd/Max/Min.
template <class T>
void write_gm(const std::string& api, T* dst, const T* src, uint64_t n) {
  auto& c = ctx();
  if (c.atomic == AtomicMode::NONE) {
    std::memmove(dst, src, n * sizeof(T));
    return;
  }
  if (std::strcmp(c.atomic_type, type_name<T>()) != 0) {
    violate("atomic type matches the copied type", api,
            str("SetAtomic*<", c.atomic_type, "> is active but the copy moves ", type_name<T>()));
  }
  for (uint64_t i = 0; i < n; ++i) {
    const auto a = static_cast<compute_t<T>>(dst[i]);
    const auto b = static_cast<compute_t<T>>(src[i]);
    compute_t<T> r = a + b;
    if (c.atomic == AtomicMode::MAX) r = a < b ? b : a;
    if (c.atomic == AtomicMode::MIN) r = b < a ? b : a;
    dst[i] = static_cast<T>(r);
  }
}

inline void check_block_params(const std::string& api, uint64_t block_count, uint64_t block_len,
                               uint64_t max_count, uint64_t max_len) {
  if (block_count > max_count || block_len > max_len) {
    violate("DataCopy parameter ranges", api,
            str("blockCount=", block_count, " (max ", max_count, "), blockLen=", block_len, " (max ",
                max_len, ")"));
  }
}

template <class T>
void check_count_bytes(const std::string& api, uint32_t count) {
  const uint64_t bytes = static_cast<uint64_t>(count) * sizeof(T);
  if (bytes % kBlockBytes != 0) {
    violate("DataCopy length a multiple of 32 bytes", api,
            str("count ", count, " x ", sizeof(T), " B = ", bytes,
                " B is not a multiple of 32; the device silently copies only ", bytes / 32 * 32,
                " B. Copy tails with DataCopyPad"));
  }
}

// Fills `bytes` of UB with copies of the element whose bits are `value` (or poison when unknown).
template <class T>
void fill_pad(uint8_t* dst, uint64_t bytes, const T* value) {
  if (value == nullptr) {  // "random" on the device: all-ones bytes (NaN for float types)
    std::memset(dst, 0xff, bytes);
    return;
  }
  for (uint64_t off = 0; off + sizeof(T) <= bytes; off += sizeof(T)) std::memcpy(dst + off, value, sizeof(T));
}

template <class T>
void pad_copy_in(const AscendC::LocalTensor<T>& dst, const AscendC::GlobalTensor<T>& src,
                 const AscendC::DataCopyExtParams& p, bool is_pad, uint8_t left, uint8_t right,
                 const T& pad_value) {
  const std::string api = "DataCopyPad(GM->UB)";
  check_block_params(api, p.blockCount, p.blockLen, 4095, 2097151);
  if (p.blockLen % sizeof(T) != 0) {
    violate("DataCopyPad blockLen a multiple of sizeof(T)", api,
            str("blockLen ", p.blockLen, " B with sizeof(", type_name<T>(), ") = ", sizeof(T)));
  }
  if (left * sizeof(T) > kBlockBytes || right * sizeof(T) > kBlockBytes) {
    violate("DataCopyPad padding at most 32 bytes per side", api,
            str("leftPadding ", unsigned(left), ", rightPadding ", unsigned(right), " elements of ",
                sizeof(T), " B"));
  }
  if (p.blockCount == 0 || p.blockLen == 0) return;  // a NOP on Atlas A2/A3
  const uint64_t padded = round32(left * sizeof(T) + p.blockLen + right * sizeof(T));
  const uint64_t dst_step = padded + static_cast<uint64_t>(p.dstStride) * kBlockBytes;
  const uint64_t src_step = static_cast<uint64_t>(p.blockLen) + p.srcStride;
  const uint64_t dst_extent = (p.blockCount - 1) * dst_step + padded;
  const uint64_t src_extent = (p.blockCount - 1) * src_step + p.blockLen;
  auto* d = reinterpret_cast<uint8_t*>(dst.emu_data(api, "dst", dst_extent / sizeof(T)));
  src.emu_check(api, 0, 1);
  check_gm(api, src.GetPhyAddr(), src_extent, 1);
  if (src.emu_sized() && src_extent > src.GetSize() * sizeof(T)) {
    violate("GlobalTensor bounds", api,
            str(src_extent, " B read, SetGlobalBuffer gave ", src.GetSize() * sizeof(T), " B"));
  }
  const auto& c = ctx();
  T set_value{};
  if (c.pad_value_set) std::memcpy(&set_value, &c.pad_value_bits, sizeof(T));
  const T* side = is_pad ? &pad_value : (c.pad_value_set ? &set_value : nullptr);
  const auto* s = reinterpret_cast<const uint8_t*>(src.GetPhyAddr());
  for (uint64_t i = 0; i < p.blockCount; ++i) {
    uint8_t* row = d + i * dst_step;
    const uint8_t* in = s + i * src_step;
    fill_pad(row, left * sizeof(T), side);
    std::memcpy(row + left * sizeof(T), in, p.blockLen);
    const uint64_t data_end = left * sizeof(T) + p.blockLen;
    fill_pad(row + data_end, right * sizeof(T), side);
    // The dummy up to the 32-byte boundary: the block's first element when no padding was asked
    // for, else the same as the padding.
    const T* dummy = (left == 0 && right == 0) ? reinterpret_cast<const T*>(in) : side;
    const uint64_t used = data_end + right * sizeof(T);
    fill_pad(row + used, padded - used, dummy);
  }
}

template <class T>
void pad_copy_out(const AscendC::GlobalTensor<T>& dst, const AscendC::LocalTensor<T>& src,
                  const AscendC::DataCopyExtParams& p) {
  const std::string api = "DataCopyPad(UB->GM)";
  check_block_params(api, p.blockCount, p.blockLen, 4095, 2097151);
  if (p.blockLen % sizeof(T) != 0) {
    violate("DataCopyPad blockLen a multiple of sizeof(T)", api,
            str("blockLen ", p.blockLen, " B with sizeof(", type_name<T>(), ") = ", sizeof(T)));
  }
  if (p.blockCount == 0 || p.blockLen == 0) return;
  const uint64_t src_step = round32(p.blockLen) + static_cast<uint64_t>(p.srcStride) * kBlockBytes;
  const uint64_t dst_step = static_cast<uint64_t>(p.blockLen) + p.dstStride;
  const uint64_t src_extent = (p.blockCount - 1) * src_step + p.blockLen;
  const uint64_t dst_extent = (p.blockCount - 1) * dst_step + p.blockLen;
  const auto* s = reinterpret_cast<const uint8_t*>(src.emu_data(api, "src", src_extent / sizeof(T)));
  dst.emu_check(api, 0, 1);
  check_gm(api, dst.GetPhyAddr(), dst_extent, 1);
  if (dst.emu_sized() && dst_extent > dst.GetSize() * sizeof(T)) {
    violate("GlobalTensor bounds", api,
            str(dst_extent, " B written, SetGlobalBuffer gave ", dst.GetSize() * sizeof(T), " B"));
  }
  auto* d = reinterpret_cast<uint8_t*>(dst.GetPhyAddr());
  for (uint64_t i = 0; i < p.blockCount; ++i) {
    write_gm(api, reinterpret_cast<T*>(d + i * dst_step), reinterpret_cast<const T*>(s + i * src_step),
             p.blockLen / sizeof(T));
  }
}

// DataCopy with DataCopyParams: blocks and gaps counted in 32-byte DataBlocks on both sides.
struct BlockWalk {
  uint64_t count, len, src_step, dst_step, src_extent, dst_extent;
};
inline BlockWalk walk(const std::string& api, const AscendC::DataCopyParams& p) {
  if (p.blockCount == 0 || p.blockLen == 0) {
    violate("DataCopy parameter ranges", api,
            str("blockCount=", p.blockCount, ", blockLen=", p.blockLen, " (both must be >= 1)"));
  }
  BlockWalk w{p.blockCount, p.blockLen * uint64_t{kBlockBytes}, (p.blockLen + uint64_t{p.srcStride}) * kBlockBytes,
              (p.blockLen + uint64_t{p.dstStride}) * kBlockBytes, 0, 0};
  w.src_extent = (w.count - 1) * w.src_step + w.len;
  w.dst_extent = (w.count - 1) * w.dst_step + w.len;
  return w;
}

}  // namespace dc
}  // namespace ascendc_emu

namespace AscendC {

// ---------------------------------------------------------------- DataCopy, contiguous count
template <class T>
inline void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const uint32_t count) {
  const std::string api = "DataCopy(GM->UB)";
  ascendc_emu::Insn insn_(ascendc_emu::Pipe::MTE2, "DataCopy(GM->UB)");
  ascendc_emu::dc::check_count_bytes<T>(api, count);
  T* d = dst.emu_data(api, "dst", count);
  src.emu_check(api, count);
  std::memcpy(d, src.GetPhyAddr(), static_cast<uint64_t>(count) * sizeof(T));
}

template <class T>
inline void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const uint32_t count) {
  const std::string api = "DataCopy(UB->GM)";
  ascendc_emu::Insn insn_(ascendc_emu::Pipe::MTE3, "DataCopy(UB->GM)");
  ascendc_emu::dc::check_count_bytes<T>(api, count);
  const T* s = src.emu_data(api, "src", count);
  dst.emu_check(api, count);
  ascendc_emu::dc::write_gm(api, dst.GetPhyAddr(), s, count);
}

template <class T>
inline void DataCopy(const LocalTensor<T>& dst, const LocalTensor<T>& src, const uint32_t count) {
  const std::string api = "DataCopy(UB->UB)";
  ascendc_emu::Insn insn_(ascendc_emu::Pipe::V, "DataCopy(UB->UB)");
  ascendc_emu::dc::check_ub_path(api, src, dst);
  ascendc_emu::dc::check_count_bytes<T>(api, count);
  T* d = dst.emu_data(api, "dst", count);
  const T* s = src.emu_data(api, "src", count);
  std::memmove(d, s, static_cast<uint64_t>(count) * sizeof(T));
}

// ------------------------------------------------------------- DataCopy with DataCopyParams
template <class T>
inline void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyParams& params) {
  const std::string api = "DataCopy(GM->UB, DataCopyParams)";
  ascendc_emu::Insn insn_(ascendc_emu::Pipe::MTE2, "DataCopy(GM->UB)");
  const auto w = ascendc_emu::dc::walk(api, params);
  auto* d = reinterpret_cast<uint8_t*>(dst.emu_data(api, "dst", w.dst_extent / sizeof(T)));
  src.emu_check(api, w.src_extent / sizeof(T));
  const auto* s = reinterpret_cast<const uint8_t*>(src.GetPhyAddr());
  for (uint64_t i = 0; i < w.count; ++i) std::memcpy(d + i * w.dst_step, s + i * w.src_step, w.len);
}

template <class T>
inline void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyParams& params) {
  const std::string api = "DataCopy(UB->GM, DataCopyParams)";
  ascendc_emu::Insn insn_(ascendc_emu::Pipe::MTE3, "DataCopy(UB->GM)");
  const auto w = ascendc_emu::dc::walk(api, params);
  const auto* s = reinterpret_cast<const uint8_t*>(src.emu_data(api, "src", w.src_extent / sizeof(T)));
  dst.emu_check(api, w.dst_extent / sizeof(T));
  auto* d = reinterpret_cast<uint8_t*>(dst.GetPhyAddr());
  for (uint64_t i = 0; i < w.count; ++i) {
    ascendc_emu::dc::write_gm(api, reinterpret_cast<T*>(d + i * w.dst_step),
                              reinterpret_cast<const T*>(s + i * w.src_step), w.len / sizeof(T));
  }
}

template <class T>
inline void DataCopy(const LocalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyParams& params) {
  const std::string api = "DataCopy(UB->UB, DataCopyParams)";
  ascendc_emu::Insn insn_(ascendc_emu::Pipe::V, "DataCopy(UB->UB)");
  ascendc_emu::dc::check_ub_path(api, src, dst);
  const auto w = ascendc_emu::dc::walk(api, params);
  auto* d = reinterpret_cast<uint8_t*>(dst.emu_data(api, "dst", w.dst_extent / sizeof(T)));
  const auto* s = reinterpret_cast<const uint8_t*>(src.emu_data(api, "src", w.src_extent / sizeof(T)));
  for (uint64_t i = 0; i < w.count; ++i) std::memmove(d + i * w.dst_step, s + i * w.src_step, w.len);
}

// ----------------------------------------------------------------------------- DataCopyPad
template <class T, PaddingMode mode = PaddingMode::Normal>
inline void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src,
                        const DataCopyExtParams& dataCopyParams, const DataCopyPadExtParams<T>& padParams) {
  static_assert(mode == PaddingMode::Normal, "PaddingMode::Compact exists on Ascend 950 only");
  ascendc_emu::Insn insn_(ascendc_emu::Pipe::MTE2, "DataCopyPad(GM->UB)");
  ascendc_emu::dc::pad_copy_in(dst, src, dataCopyParams, padParams.isPad, padParams.leftPadding,
                               padParams.rightPadding, padParams.paddingValue);
}

template <class T, PaddingMode mode = PaddingMode::Normal>
inline void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src,
                        const DataCopyExtParams& dataCopyParams) {
  static_assert(mode == PaddingMode::Normal, "PaddingMode::Compact exists on Ascend 950 only");
  ascendc_emu::Insn insn_(ascendc_emu::Pipe::MTE3, "DataCopyPad(UB->GM)");
  ascendc_emu::dc::pad_copy_out(dst, src, dataCopyParams);
}

// The older DataCopyParams/DataCopyPadParams forms (same units: blockLen in bytes).
template <class T>
inline void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src,
                        const DataCopyParams& dataCopyParams, const DataCopyPadParams& padParams) {
  ascendc_emu::Insn insn_(ascendc_emu::Pipe::MTE2, "DataCopyPad(GM->UB)");
  T value;
  std::memcpy(&value, &padParams.paddingValue, sizeof(T));
  const DataCopyExtParams ext(dataCopyParams.blockCount, dataCopyParams.blockLen,
                              dataCopyParams.srcStride, dataCopyParams.dstStride, 0);
  ascendc_emu::dc::pad_copy_in(dst, src, ext, padParams.isPad, padParams.leftPadding,
                               padParams.rightPadding, value);
}

template <class T>
inline void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src,
                        const DataCopyParams& dataCopyParams) {
  const DataCopyExtParams ext(dataCopyParams.blockCount, dataCopyParams.blockLen,
                              dataCopyParams.srcStride, dataCopyParams.dstStride, 0);
  ascendc_emu::Insn insn_(ascendc_emu::Pipe::MTE3, "DataCopyPad(UB->GM)");
  ascendc_emu::dc::pad_copy_out(dst, src, ext);
}

}  // namespace AscendC

#endif  // ASCENDC_EMU_DATACOPY_H
