// ascendc_emu: reductions. ReduceSum/ReduceMax/ReduceMin in their "first n elements" form and the
// per-repeat WholeReduceSum/WholeReduceMax/WholeReduceMin.
//
// Order of operations (Atlas A2/A3, per the ReduceSum and WholeReduceSum pages): inside one
// 256-byte repeat the elements are added as a binary tree of adjacent pairs; ReduceSum's count form
// then adds the per-repeat results in order. half sums saturate at +-65504 at every addition (the
// pages' [60000, 60000, -30000, 100] example gives 35604). ReduceMax/Min return the first index of
// the extreme value. The sharedTmpBuffer sizes are the pages' formulas; the emulation writes the
// per-repeat partial results into it, as the device does, so a kernel that relies on its contents
// surviving (or that aliases it with data it still needs) sees the damage.
#ifndef ASCENDC_EMU_REDUCE_H
#define ASCENDC_EMU_REDUCE_H

#include <cmath>
#include <vector>

#include "vector.h"

namespace ascendc_emu {
namespace red {

inline uint64_t div_ceil(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// One addition of a reduction, in T's precision.
template <class T>
float add_t(float a, float b) {
  float r = a + b;
  if constexpr (std::is_same_v<T, half>) {
    if (std::isfinite(r) && std::fabs(r) > 65504.0f) r = std::copysign(65504.0f, r);
    r = static_cast<float>(half(r));
  }
  return r;
}

// Binary tree of adjacent pairs over one repeat's lanes (inactive lanes hold 0).
template <class T>
float tree_sum(std::vector<float> lanes) {
  while (lanes.size() > 1) {
    for (size_t i = 0; i < lanes.size() / 2; ++i) lanes[i] = add_t<T>(lanes[2 * i], lanes[2 * i + 1]);
    lanes.resize(lanes.size() / 2);
  }
  return lanes.empty() ? 0.0f : lanes[0];
}

// Index bits of a reduction result, stored in a T slot (read back with reinterpret_cast).
template <class T>
T index_as(uint32_t index) {
  T out;
  if constexpr (sizeof(T) == 2) {
    const auto i16 = static_cast<uint16_t>(index);
    std::memcpy(&out, &i16, 2);
  } else {
    std::memcpy(&out, &index, 4);
  }
  return out;
}

template <class T>
uint64_t check_tmp(const std::string& api, const AscendC::LocalTensor<T>& tmp, const AscendC::LocalTensor<T>& src,
                   uint64_t need) {
  if (tmp.emu_view().addr == src.emu_view().addr) return need;  // reusing src is allowed
  if (tmp.GetSize() < need) {
    violate(api + " sharedTmpBuffer size", api,
            str("sharedTmpBuffer holds ", tmp.GetSize(), " elements; the reference formula needs ", need,
                " (", need * sizeof(T), " B) for this count"));
  }
  tmp.emu_data(api, "sharedTmpBuffer", need);
  return need;
}

// Count form of ReduceMax (want_max) / ReduceMin.
template <class T>
void reduce_extreme(const std::string& api, const AscendC::LocalTensor<T>& dst, const AscendC::LocalTensor<T>& src,
                    const AscendC::LocalTensor<T>& tmp, int32_t count, bool cal_index, bool want_max) {
  ASCENDC_EMU_TYPES(T, "ReduceMax/ReduceMin: T must be half/float", half, float);
  const T* s = src.emu_data(api, "src", count);
  if (count == 0) return;
  if (cal_index && std::is_same_v<T, half> && count > 65536) {
    violate("half ReduceMax/Min index at most 65535", api, str("count ", count, " with calIndex"));
  }
  const uint64_t epb = kBlockBytes / sizeof(T), epr = kRepeatBytes / sizeof(T);
  const uint64_t repeats = div_ceil(count, epr);
  const uint64_t iter1 = repeats * 2;
  uint64_t need = div_ceil(iter1, epb) * epb;
  if (cal_index) {
    const uint64_t iter2_start = need;
    const uint64_t iter2 = div_ceil(iter1, epr) * 2;
    const uint64_t iter2_end = div_ceil(iter2, epb) * epb;
    need = iter2_start + iter2_end;
    if (iter2 > 2) {
      const uint64_t iter3 = div_ceil(iter2, epr) * 2;
      need = iter2_start + iter2_end + div_ceil(iter3, epb) * epb;
    }
  }
  check_tmp(api, tmp, src, need);
  T* d = dst.emu_data(api, "dst", cal_index ? 2 : 1, cal_index ? 2 * sizeof(T) : sizeof(T));
  std::vector<std::pair<float, uint32_t>> partial(repeats);
  for (uint64_t r = 0; r < repeats; ++r) {
    const uint64_t begin = r * epr, end = std::min<uint64_t>(count, begin + epr);
    partial[r] = {static_cast<float>(s[begin]), static_cast<uint32_t>(begin)};
    for (uint64_t i = begin + 1; i < end; ++i) {
      const float v = static_cast<float>(s[i]);
      if (want_max ? v > partial[r].first : v < partial[r].first) partial[r] = {v, static_cast<uint32_t>(i)};
    }
  }
  auto best = partial[0];
  for (const auto& p : partial) {
    if (want_max ? p.first > best.first : p.first < best.first) best = p;
  }
  T* t = reinterpret_cast<T*>(tmp.emu_view().addr);
  for (uint64_t r = 0; r < repeats; ++r) {  // first-round results: [value, index] pairs
    t[2 * r] = static_cast<T>(partial[r].first);
    t[2 * r + 1] = index_as<T>(static_cast<uint32_t>(partial[r].second - r * epr));
  }
  d[0] = static_cast<T>(best.first);
  if (cal_index) d[1] = index_as<T>(best.second);
}

struct RepeatGeometry {
  int32_t repeat_time, dst_rep_stride, src_blk_stride, src_rep_stride;
};

// The active lanes of a WholeReduce* repeat: continuous mask (first `mask` lanes) or bit mask.
template <class T>
std::vector<bool> lanes_of(const std::string& api, int64_t mask, const uint64_t* bits) {
  const uint64_t epr = kRepeatBytes / sizeof(T);
  std::vector<bool> on(epr, false);
  if (bits == nullptr) {
    if (mask < 1 || static_cast<uint64_t>(mask) > epr) {
      violate("mask in [1, 256 / sizeof(T)]", api, str("mask ", mask, " for ", type_name<T>()));
    }
    for (int64_t k = 0; k < mask; ++k) on[k] = true;
  } else {
    bool any = false;
    for (uint64_t k = 0; k < epr; ++k) any |= (on[k] = (bits[k / 64] >> (k % 64)) & 1u);
    if (!any) violate("mask selects at least one element", api, "the bit mask is all zeros");
  }
  return on;
}

inline void check_geometry(const std::string& api, const RepeatGeometry& g) {
  if (g.repeat_time < 0 || g.repeat_time > 255 || g.dst_rep_stride < 0 || g.src_blk_stride < 0 ||
      g.src_rep_stride < 0 || g.dst_rep_stride > 65535 || g.src_blk_stride > 65535 || g.src_rep_stride > 65535) {
    violate("repeatTime in [0, 255], strides in [0, 65535]", api,
            str("repeatTime ", g.repeat_time, ", dstRepStride ", g.dst_rep_stride, ", srcBlkStride ",
                g.src_blk_stride, ", srcRepStride ", g.src_rep_stride));
  }
}

// Calls f(repeat, lane values) for every repeat after checking the src bounds.
template <class T, class F>
void for_each_repeat(const std::string& api, const AscendC::LocalTensor<T>& src, const std::vector<bool>& on,
                     const RepeatGeometry& g, F f) {
  if (g.repeat_time == 0) return;
  const uint64_t epb = kBlockBytes / sizeof(T);
  auto offset = [&](uint64_t r, uint64_t k) {  // element offset of lane k in repeat r
    return (r * g.src_rep_stride + (k / epb) * g.src_blk_stride) * epb + k % epb;
  };
  uint64_t last = 0;
  for (uint64_t k = 0; k < on.size(); ++k) {
    if (on[k]) last = std::max(last, offset(g.repeat_time - 1, k));
  }
  const T* s = src.emu_data(api, "src", static_cast<int64_t>(last) + 1);
  std::vector<float> lanes(on.size());
  for (int32_t r = 0; r < g.repeat_time; ++r) {
    for (uint64_t k = 0; k < on.size(); ++k) lanes[k] = on[k] ? static_cast<float>(s[offset(r, k)]) : 0.0f;
    f(r, lanes);
  }
}

template <class T>
void whole_sum(const AscendC::LocalTensor<T>& dst, const AscendC::LocalTensor<T>& src, int64_t mask,
               const uint64_t* bits, const RepeatGeometry& g) {
  const std::string api = "WholeReduceSum";
  ASCENDC_EMU_TYPES(T, "WholeReduceSum: T must be half/float", half, float);
  check_geometry(api, g);
  const auto on = lanes_of<T>(api, mask, bits);
  T* d = g.repeat_time > 0
             ? dst.emu_data(api, "dst", static_cast<int64_t>(g.repeat_time - 1) * g.dst_rep_stride + 1, sizeof(T))
             : nullptr;
  std::vector<T> out(g.repeat_time > 0 ? g.repeat_time : 0);
  for_each_repeat(api, src, on, g, [&](int32_t r, const std::vector<float>& lanes) {
    out[r] = static_cast<T>(tree_sum<T>(lanes));
  });
  for (size_t r = 0; r < out.size(); ++r) d[r * g.dst_rep_stride] = out[r];
}

template <class T>
void whole_extreme(const std::string& api, const AscendC::LocalTensor<T>& dst, const AscendC::LocalTensor<T>& src,
                   int64_t mask, const uint64_t* bits, const RepeatGeometry& g, AscendC::ReduceOrder order,
                   bool want_max) {
  ASCENDC_EMU_TYPES(T, "WholeReduceMax/WholeReduceMin: T must be half/float", half, float);
  check_geometry(api, g);
  const auto on = lanes_of<T>(api, mask, bits);
  using O = AscendC::ReduceOrder;
  const uint64_t unit = (order == O::ORDER_ONLY_VALUE) ? sizeof(T) : (order == O::ORDER_ONLY_INDEX ? 4 : 2 * sizeof(T));
  uint8_t* d = nullptr;
  if (g.repeat_time > 0) {
    const uint64_t bytes = static_cast<uint64_t>(g.repeat_time - 1) * g.dst_rep_stride * unit + unit;
    d = reinterpret_cast<uint8_t*>(
        dst.emu_data(api, "dst", static_cast<int64_t>(div_ceil(bytes, sizeof(T))), static_cast<uint32_t>(unit)));
  }
  std::vector<std::pair<float, uint32_t>> out;
  for_each_repeat(api, src, on, g, [&](int32_t, const std::vector<float>& lanes) {
    std::pair<float, uint32_t> best{0.0f, UINT32_MAX};
    for (uint32_t k = 0; k < lanes.size(); ++k) {
      if (!on[k]) continue;
      if (best.second == UINT32_MAX || (want_max ? lanes[k] > best.first : lanes[k] < best.first)) best = {lanes[k], k};
    }
    out.push_back(best);
  });
  for (size_t r = 0; r < out.size(); ++r) {
    uint8_t* slot = d + r * g.dst_rep_stride * unit;
    const T value = static_cast<T>(out[r].first);
    const T index = index_as<T>(out[r].second);
    switch (order) {
      case O::ORDER_VALUE_INDEX:
        std::memcpy(slot, &value, sizeof(T));
        std::memcpy(slot + sizeof(T), &index, sizeof(T));
        break;
      case O::ORDER_INDEX_VALUE:
        std::memcpy(slot, &index, sizeof(T));
        std::memcpy(slot + sizeof(T), &value, sizeof(T));
        break;
      case O::ORDER_ONLY_VALUE: std::memcpy(slot, &value, sizeof(T)); break;
      case O::ORDER_ONLY_INDEX: std::memcpy(slot, &out[r].second, 4); break;
    }
  }
}

}  // namespace red
}  // namespace ascendc_emu

namespace AscendC {

template <class T, bool isSetMask = true>
inline void ReduceSum(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& sharedTmpBuffer,
                      const int32_t count) {
  namespace e = ascendc_emu;
  const std::string api = "ReduceSum";
  ascendc_emu::Insn insn_(ascendc_emu::Pipe::V, "ReduceSum");
  ASCENDC_EMU_TYPES(T, "ReduceSum: T must be half/float", half, float);
  const T* s = src.emu_data(api, "src", count);
  if (count == 0) return;
  const uint64_t epb = e::kBlockBytes / sizeof(T), epr = e::kRepeatBytes / sizeof(T);
  const uint64_t repeats = e::red::div_ceil(count, epr);
  e::red::check_tmp(api, sharedTmpBuffer, src, e::red::div_ceil(repeats, epb) * epb);
  T* d = dst.emu_data(api, "dst", 1, sizeof(T));
  std::vector<float> partial(repeats);
  for (uint64_t r = 0; r < repeats; ++r) {
    std::vector<float> lanes(epr, 0.0f);
    for (uint64_t k = 0; k < epr && r * epr + k < static_cast<uint64_t>(count); ++k) {
      lanes[k] = static_cast<float>(s[r * epr + k]);
    }
    partial[r] = e::red::tree_sum<T>(lanes);
  }
  float acc = partial[0];
  for (uint64_t r = 1; r < repeats; ++r) acc = e::red::add_t<T>(acc, partial[r]);
  T* t = reinterpret_cast<T*>(sharedTmpBuffer.emu_view().addr);
  for (uint64_t r = 0; r < repeats; ++r) t[r] = static_cast<T>(partial[r]);
  d[0] = static_cast<T>(acc);
}

template <class T, bool isSetMask = true>
inline void ReduceMax(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& sharedTmpBuffer,
                      const int32_t count, bool calIndex = false) {
  ascendc_emu::Insn insn_(ascendc_emu::Pipe::V, "ReduceMax");
  ascendc_emu::red::reduce_extreme("ReduceMax", dst, src, sharedTmpBuffer, count, calIndex, true);
}

template <class T, bool isSetMask = true>
inline void ReduceMin(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& sharedTmpBuffer,
                      const int32_t count, bool calIndex = false) {
  ascendc_emu::Insn insn_(ascendc_emu::Pipe::V, "ReduceMin");
  ascendc_emu::red::reduce_extreme("ReduceMin", dst, src, sharedTmpBuffer, count, calIndex, false);
}

#if ASCENDC_CANN_VERSION < 90100
// WholeReduceSum/Max/Min: in the basic API up to CANN 9.0; 9.1 renamed them ReduceRepeat.
template <class T, bool isSetMask = true>
inline void WholeReduceSum(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t mask,
                           const int32_t repeatTime, const int32_t dstRepStride, const int32_t srcBlkStride,
                           const int32_t srcRepStride) {
  ascendc_emu::Insn insn_(ascendc_emu::Pipe::V, "WholeReduceSum");
  ascendc_emu::red::whole_sum(dst, src, mask, nullptr, {repeatTime, dstRepStride, srcBlkStride, srcRepStride});
}

template <class T, bool isSetMask = true>
inline void WholeReduceSum(const LocalTensor<T>& dst, const LocalTensor<T>& src, const uint64_t mask[],
                           const int32_t repeatTime, const int32_t dstRepStride, const int32_t srcBlkStride,
                           const int32_t srcRepStride) {
  ascendc_emu::Insn insn_(ascendc_emu::Pipe::V, "WholeReduceSum");
  ascendc_emu::red::whole_sum(dst, src, 0, mask, {repeatTime, dstRepStride, srcBlkStride, srcRepStride});
}

#define ASCENDC_EMU_WHOLE_EXTREME(NAME, WANT_MAX)                                                       \
  template <class T, bool isSetMask = true>                                                        \
  inline void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t mask,            \
                   const int32_t repeatTime, const int32_t dstRepStride, const int32_t srcBlkStride,    \
                   const int32_t srcRepStride, ReduceOrder order = ReduceOrder::ORDER_VALUE_INDEX) {     \
    ascendc_emu::Insn insn_(ascendc_emu::Pipe::V, #NAME);                                         \
    ascendc_emu::red::whole_extreme(#NAME, dst, src, mask, nullptr,                                 \
                                    {repeatTime, dstRepStride, srcBlkStride, srcRepStride}, order, WANT_MAX); \
  }                                                                                                  \
  template <class T, bool isSetMask = true>                                                        \
  inline void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src, const uint64_t mask[],         \
                   const int32_t repeatTime, const int32_t dstRepStride, const int32_t srcBlkStride,    \
                   const int32_t srcRepStride, ReduceOrder order = ReduceOrder::ORDER_VALUE_INDEX) {     \
    ascendc_emu::Insn insn_(ascendc_emu::Pipe::V, #NAME);                                         \
    ascendc_emu::red::whole_extreme(#NAME, dst, src, 0, mask,                                       \
                                    {repeatTime, dstRepStride, srcBlkStride, srcRepStride}, order, WANT_MAX); \
  }

ASCENDC_EMU_WHOLE_EXTREME(WholeReduceMax, true)
ASCENDC_EMU_WHOLE_EXTREME(WholeReduceMin, false)
#undef ASCENDC_EMU_WHOLE_EXTREME
#else
#define ASCENDC_EMU_REFUSE(NAME)                                                                        \
  template <class... A>                                                                            \
  inline void NAME(A&&...) {                                                                       \
    static_assert(ascendc_emu::cann_lacks<A...>, #NAME " does not exist in CANN 9.1 (asc-devkit 9.1.0 "      \
                  "basic API renamed it ReduceRepeat); target CANN 8.5 (-DASCENDC_CANN_VERSION=80500)"); \
  }
ASCENDC_EMU_REFUSE(WholeReduceSum)
ASCENDC_EMU_REFUSE(WholeReduceMax)
ASCENDC_EMU_REFUSE(WholeReduceMin)
#undef ASCENDC_EMU_REFUSE
#endif

}  // namespace AscendC

#endif  // ASCENDC_EMU_REDUCE_H
