// ascendc_emu: Vector-unit element-wise instructions in their "first n elements" (count) form:
// arithmetic, scalar forms, Duplicate, Cast, Compare/Compares and Select.
//
// Numerics: float operands compute in float. half operands compute in float and round to half
// after every instruction (correctly rounded for + - * / sqrt, like the Vector unit). bfloat16_t is
// a storage type on Atlas A2/A3: only DataCopy, Duplicate and Cast accept it, so a bf16 kernel
// Casts to float, computes and Casts back -- a static_assert says so when a kernel tries otherwise.
// The accepted types per instruction are those the API reference lists for Atlas A2/A3.
#ifndef ASCENDC_EMU_VECTOR_H
#define ASCENDC_EMU_VECTOR_H

#include <cmath>
#include <limits>

#include "tensor.h"

namespace ascendc_emu {
namespace vec {

template <class T>
T from_compute(compute_t<T> v) {
  return static_cast<T>(v);  // half/bf16: round to nearest even; integers: wrap
}

template <class D, class S, class F>
void unary(const std::string& api, const AscendC::LocalTensor<D>& dst, const AscendC::LocalTensor<S>& src,
           int64_t count, F f) {
  D* d = dst.emu_data(api, "dst", count);
  const S* s = src.emu_data(api, "src", count);
  check_overlap(api, "dst", reinterpret_cast<uint8_t*>(d), count * sizeof(D), "src",
                reinterpret_cast<const uint8_t*>(s), count * sizeof(S));
  if (sizeof(D) != sizeof(S) && reinterpret_cast<const void*>(d) == reinterpret_cast<const void*>(s)) {
    violate("operands overlap completely or not at all", api,
            "dst and src share a start address but differ in element size; use separate buffers");
  }
  for (int64_t i = 0; i < count; ++i) d[i] = f(s[i]);
}

template <class T, class F>
void binary(const std::string& api, const AscendC::LocalTensor<T>& dst, const AscendC::LocalTensor<T>& src0,
            const AscendC::LocalTensor<T>& src1, int64_t count, F f) {
  T* d = dst.emu_data(api, "dst", count);
  const T* a = src0.emu_data(api, "src0", count);
  const T* b = src1.emu_data(api, "src1", count);
  const uint64_t n = count * sizeof(T);
  auto* d8 = reinterpret_cast<uint8_t*>(d);
  check_overlap(api, "dst", d8, n, "src0", reinterpret_cast<const uint8_t*>(a), n);
  check_overlap(api, "dst", d8, n, "src1", reinterpret_cast<const uint8_t*>(b), n);
  for (int64_t i = 0; i < count; ++i) d[i] = f(a[i], b[i]);
}

template <class C>
C nan_max(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<C>::quiet_NaN();
  }
  return a < b ? b : a;
}
template <class C>
C nan_min(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<C>::quiet_NaN();
  }
  return b < a ? b : a;
}

// -------------------------------------------------------------------------------- Cast rules
enum : unsigned {
  kNone = 1u << 0, kRint = 1u << 1, kFloor = 1u << 2, kCeil = 1u << 3,
  kRound = 1u << 4, kTrunc = 1u << 5, kOdd = 1u << 6,
  kFive = kRint | kFloor | kCeil | kRound | kTrunc,
};

// Round modes the Atlas A2/A3 Cast table accepts for src -> dst (0: pair not supported).
template <class D, class S>
constexpr unsigned cast_modes() {
  using std::is_same_v;
  if constexpr (is_same_v<S, half>) {
    if constexpr (is_same_v<D, float>) return kNone;
    if constexpr (is_one_of_v<D, int8_t, uint8_t>) return kFive | kNone;
    if constexpr (is_one_of_v<D, int16_t, int32_t>) return kFive;
  } else if constexpr (is_same_v<S, bfloat16_t>) {
    if constexpr (is_same_v<D, float>) return kNone;
    if constexpr (is_same_v<D, int32_t>) return kFive;
  } else if constexpr (is_same_v<S, float>) {
    if constexpr (is_same_v<D, half>) return kFive | kOdd | kNone;
    if constexpr (is_one_of_v<D, bfloat16_t, int16_t, int32_t, float>) return kFive;
  } else if constexpr (is_one_of_v<S, int8_t, uint8_t>) {
    if constexpr (is_same_v<D, half>) return kNone;
  } else if constexpr (is_same_v<S, int16_t>) {
    if constexpr (is_same_v<D, half>) return kFive | kNone;
    if constexpr (is_same_v<D, float>) return kNone;
  } else if constexpr (is_same_v<S, int32_t>) {
    if constexpr (is_same_v<D, float>) return kFive | kNone;
    if constexpr (is_one_of_v<D, int16_t, int64_t>) return kNone;
  }
  return 0;
}

inline Rounding to_rounding(AscendC::RoundMode m) {
  switch (m) {
    case AscendC::RoundMode::CAST_FLOOR: return Rounding::FLOOR;
    case AscendC::RoundMode::CAST_CEIL: return Rounding::CEIL;
    case AscendC::RoundMode::CAST_ROUND: return Rounding::ROUND;
    case AscendC::RoundMode::CAST_TRUNC: return Rounding::TRUNC;
    case AscendC::RoundMode::CAST_ODD: return Rounding::ODD;
    default: return Rounding::RINT;  // CAST_RINT, and CAST_NONE when the conversion is inexact
  }
}

template <class T>
constexpr FloatFormat format_of() {
  if constexpr (std::is_same_v<T, half>) return kHalfFormat;
  else if constexpr (std::is_same_v<T, bfloat16_t>) return kBf16Format;
  else return kFloatFormat;
}

inline double round_integral(double x, Rounding r) {
  switch (r) {
    case Rounding::FLOOR: return std::floor(x);
    case Rounding::CEIL: return std::ceil(x);
    case Rounding::ROUND: return std::round(x);
    case Rounding::TRUNC: return std::trunc(x);
    default: return std::nearbyint(x);  // ties to even in the default FP environment
  }
}

// One element of Cast. Out-of-range values saturate (the precision-conversion page's default);
// NaN becomes 0 for integer targets.
template <class D, class S>
D cast_one(S v, Rounding r) {
  if constexpr (std::is_same_v<D, float> && is_one_of_v<S, half, bfloat16_t, int8_t, uint8_t, int16_t>) {
    return static_cast<float>(v);  // exact widening
  } else if constexpr (is_one_of_v<D, half, bfloat16_t> && std::is_same_v<S, float>) {
    if (r == Rounding::RINT) {  // the common case, on the bit-level fast path
      const D out = D(v);
      const float back = static_cast<float>(out);
      if (std::isinf(back) && !std::isinf(v)) return D(std::copysign(static_cast<float>(format_max(format_of<D>())), v));
      return out;
    }
  }
  const double x = static_cast<double>(static_cast<std::conditional_t<is_float_like_v<S>, float, S>>(v));
  if constexpr (std::is_same_v<D, float> && std::is_same_v<S, float>) {
    return static_cast<float>(round_integral(x, r));  // float -> float rounds to an integral value
  } else if constexpr (is_float_like_v<D>) {
    const double y = round_to_format(x, format_of<D>(), r, /*saturate=*/true);
    if constexpr (std::is_same_v<D, half>) return half::from_bits(half_bits_exact(y));
    else if constexpr (std::is_same_v<D, bfloat16_t>) return bfloat16_t::from_bits(bf16_bits_from(y));
    else return static_cast<float>(y);
  } else {
    if (std::isnan(x)) return D(0);
    const double y = is_float_like_v<S> ? round_integral(x, r) : x;
    const double lo = static_cast<double>(std::numeric_limits<D>::lowest());
    const double hi = static_cast<double>(std::numeric_limits<D>::max());
    return static_cast<D>(y < lo ? lo : (y > hi ? hi : y));
  }
}

// Compare/Select bit streams: bit i of the mask is bit (i % 8) of byte i / 8 (little endian).
inline bool mask_bit(const uint8_t* bits, uint64_t i) { return (bits[i / 8] >> (i % 8)) & 1u; }

template <class C>
bool compare(C a, C b, AscendC::CMPMODE m) {
  switch (m) {
    case AscendC::CMPMODE::LT: return a < b;
    case AscendC::CMPMODE::GT: return a > b;
    case AscendC::CMPMODE::EQ: return a == b;
    case AscendC::CMPMODE::LE: return a <= b;
    case AscendC::CMPMODE::GE: return a >= b;
    case AscendC::CMPMODE::NE: return a != b;
  }
  return false;
}

template <class U, class T, class Pred>
void compare_into(const std::string& api, const AscendC::LocalTensor<U>& dst, const AscendC::LocalTensor<T>& src0,
                  uint32_t count, AscendC::CMPMODE mode, Pred pred) {
  static_assert(is_one_of_v<T, half, float, int32_t>, "Compare: T must be half, float or int32_t on Atlas A2/A3");
  static_assert(is_one_of_v<U, uint8_t, int8_t>, "Compare: the result tensor must be uint8_t or int8_t");
  if (std::is_same_v<T, int32_t> && mode != AscendC::CMPMODE::EQ) {
    violate("Compare on int32_t supports CMPMODE::EQ only", api, str("CMPMODE::", cmp_name(mode)));
  }
  if ((static_cast<uint64_t>(count) * sizeof(T)) % kRepeatBytes != 0) {
    violate("Compare count covers whole 256-byte repeats", api,
            str("count ", count, " x ", sizeof(T), " B is not a multiple of 256 B; the device leaves "
                "the elements of the partial repeat uncompared"));
  }
  const T* a = src0.emu_data(api, "src0", count);
  auto* d = reinterpret_cast<uint8_t*>(dst.emu_data(api, "dst", count / 8 / sizeof(U)));
  for (uint32_t byte = 0; byte < count / 8; ++byte) {
    uint8_t bits = 0;
    for (uint32_t j = 0; j < 8; ++j) bits |= static_cast<uint8_t>(pred(a[byte * 8 + j], byte * 8 + j) << j);
    d[byte] = bits;
  }
}

}  // namespace vec
}  // namespace ascendc_emu

namespace AscendC {

#define ASCENDC_EMU_TYPES(T, msg, ...)                                                            \
  static_assert(ascendc_emu::is_one_of_v<T, __VA_ARGS__>,                                          \
                msg " (Atlas A2/A3 Vector unit; compute bfloat16_t in float: Cast, compute, Cast back)")

#define ASCENDC_EMU_BINARY(NAME, TYPES_MSG, EXPR, ...)                                                \
  template <class T, bool isSetMask = true>                                                       \
  inline void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,  \
                   const int32_t& count) {                                                        \
    ASCENDC_EMU_TYPES(T, #NAME ": T must be " TYPES_MSG, __VA_ARGS__);                               \
    ascendc_emu::Insn insn_(ascendc_emu::Pipe::V, #NAME);                                         \
    using C = ascendc_emu::compute_t<T>;                                                          \
    ascendc_emu::vec::binary(#NAME, dst, src0, src1, count, [](T x, T y) {                        \
      const C a = static_cast<C>(x), b = static_cast<C>(y);                                        \
      return ascendc_emu::vec::from_compute<T>(EXPR);                                              \
    });                                                                                            \
  }

ASCENDC_EMU_BINARY(Add, "int16_t/half/int32_t/float", a + b, int16_t, half, int32_t, float)
ASCENDC_EMU_BINARY(Sub, "int16_t/half/int32_t/float", a - b, int16_t, half, int32_t, float)
ASCENDC_EMU_BINARY(Mul, "int16_t/half/int32_t/float", a * b, int16_t, half, int32_t, float)
ASCENDC_EMU_BINARY(Div, "half/float", a / b, half, float)
ASCENDC_EMU_BINARY(Max, "int16_t/half/int32_t/float", ascendc_emu::vec::nan_max(a, b), int16_t, half, int32_t, float)
ASCENDC_EMU_BINARY(Min, "int16_t/half/int32_t/float", ascendc_emu::vec::nan_min(a, b), int16_t, half, int32_t, float)
#undef ASCENDC_EMU_BINARY

#define ASCENDC_EMU_UNARY(NAME, TYPES_MSG, EXPR, ...)                                                 \
  template <class T, bool isSetMask = true>                                                       \
  inline void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count) {      \
    ASCENDC_EMU_TYPES(T, #NAME ": T must be " TYPES_MSG, __VA_ARGS__);                               \
    ascendc_emu::Insn insn_(ascendc_emu::Pipe::V, #NAME);                                         \
    using C = ascendc_emu::compute_t<T>;                                                          \
    ascendc_emu::vec::unary(#NAME, dst, src, count, [](T x) {                                     \
      const C a = static_cast<C>(x);                                                               \
      return ascendc_emu::vec::from_compute<T>(EXPR);                                              \
    });                                                                                            \
  }

ASCENDC_EMU_UNARY(Exp, "half/float", std::exp(a), half, float)
ASCENDC_EMU_UNARY(Ln, "half/float", std::log(a), half, float)
ASCENDC_EMU_UNARY(Abs, "half/float", std::fabs(a), half, float)
ASCENDC_EMU_UNARY(Sqrt, "half/float", std::sqrt(a), half, float)
ASCENDC_EMU_UNARY(Rsqrt, "half/float", static_cast<C>(1.0 / std::sqrt(static_cast<double>(a))), half, float)
ASCENDC_EMU_UNARY(Reciprocal, "half/float", C(1) / a, half, float)
ASCENDC_EMU_UNARY(Relu, "half/int32_t/float", (a < C(0) ? C(0) : a), half, int32_t, float)
#undef ASCENDC_EMU_UNARY

// Scalar forms: the scalar is converted to T first (a half kernel's scalar is a half).
#define ASCENDC_EMU_SCALAR(NAME, EXPR)                                                                \
  template <class T, class U, bool isSetMask = true>                                              \
  inline void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src, const U& scalarValue,        \
                   const int32_t& count) {                                                        \
    ASCENDC_EMU_TYPES(T, #NAME ": T must be int16_t/half/int32_t/float", int16_t, half, int32_t, float); \
    ascendc_emu::Insn insn_(ascendc_emu::Pipe::V, #NAME);                                         \
    using C = ascendc_emu::compute_t<T>;                                                          \
    const C b = static_cast<C>(static_cast<T>(scalarValue));                                       \
    ascendc_emu::vec::unary(#NAME, dst, src, count, [b](T x) {                                    \
      const C a = static_cast<C>(x);                                                               \
      return ascendc_emu::vec::from_compute<T>(EXPR);                                              \
    });                                                                                            \
  }

ASCENDC_EMU_SCALAR(Adds, a + b)
ASCENDC_EMU_SCALAR(Muls, a * b)
ASCENDC_EMU_SCALAR(Maxs, ascendc_emu::vec::nan_max(a, b))
ASCENDC_EMU_SCALAR(Mins, ascendc_emu::vec::nan_min(a, b))
#undef ASCENDC_EMU_SCALAR

template <class T, class U, bool isSetMask = true>
inline void Duplicate(const LocalTensor<T>& dst, const U& scalarValue, const int32_t& count) {
  ASCENDC_EMU_TYPES(T, "Duplicate: T must be int16_t/uint16_t/half/bfloat16_t/int32_t/uint32_t/float",
                    int16_t, uint16_t, half, bfloat16_t, int32_t, uint32_t, float);
  ascendc_emu::Insn insn_(ascendc_emu::Pipe::V, "Duplicate");
  T* d = dst.emu_data("Duplicate", "dst", count);
  const T v = static_cast<T>(scalarValue);
  for (int32_t i = 0; i < count; ++i) d[i] = v;
}

template <class T, class U>
inline void Cast(const LocalTensor<T>& dst, const LocalTensor<U>& src, const RoundMode& round_mode,
                 const uint32_t count) {
  constexpr unsigned modes = ascendc_emu::vec::cast_modes<T, U>();
  static_assert(modes != 0, "Cast: this source/destination type pair is not supported on Atlas A2/A3 "
                            "(see the Cast type table in docs/ASCENDC_EMU.md)");
  const auto m = static_cast<unsigned>(round_mode);
  if (m > 6 || !(modes & (1u << m))) {
    ascendc_emu::violate("Cast round mode supported for the type pair", "Cast",
                         ascendc_emu::str(ascendc_emu::round_name(round_mode), " is not accepted for ",
                                          ascendc_emu::type_name<U>(), " -> ", ascendc_emu::type_name<T>()));
  }
  ascendc_emu::Insn insn_(ascendc_emu::Pipe::V, "Cast");
  const auto r = ascendc_emu::vec::to_rounding(round_mode);
  ascendc_emu::vec::unary("Cast", dst, src, count, [r](U x) { return ascendc_emu::vec::cast_one<T>(x, r); });
}

template <class T, class U, bool isSetMask = true>
inline void Compare(const LocalTensor<U>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,
                    CMPMODE cmpMode, uint32_t count) {
  ascendc_emu::Insn insn_(ascendc_emu::Pipe::V, "Compare");
  const T* b = src1.emu_data("Compare", "src1", count);
  ascendc_emu::vec::compare_into("Compare", dst, src0, count, cmpMode, [&](T x, uint32_t i) {
    using C = ascendc_emu::compute_t<T>;
    return ascendc_emu::vec::compare(static_cast<C>(x), static_cast<C>(b[i]), cmpMode);
  });
}

namespace detail_compare {
template <class T, class U, class S>
void compare_scalar(const char* api, const LocalTensor<U>& dst, const LocalTensor<T>& src0, const S src1Scalar,
                    CMPMODE cmpMode, uint32_t count) {
  ascendc_emu::Insn insn_(ascendc_emu::Pipe::V, api);
  using C = ascendc_emu::compute_t<T>;
  const C b = static_cast<C>(static_cast<T>(src1Scalar));
  ascendc_emu::vec::compare_into(api, dst, src0, count, cmpMode, [&](T x, uint32_t) {
    return ascendc_emu::vec::compare(static_cast<C>(x), b, cmpMode);
  });
}
}  // namespace detail_compare

// CompareScalar: in every supported release (CANN 8.5: the only scalar compare; 9.x: deprecated
// in favour of Compares).
template <class T, class U, class S, bool isSetMask = true>
inline void CompareScalar(const LocalTensor<U>& dst, const LocalTensor<T>& src0, const S src1Scalar,
                          CMPMODE cmpMode, uint32_t count) {
  detail_compare::compare_scalar("CompareScalar", dst, src0, src1Scalar, cmpMode, count);
}

#if ASCENDC_CANN_VERSION >= 90000
// Compares: asc-devkit's basic API declares it from CANN 9.0 on.
template <class T, class U, class S, bool isSetMask = true>
inline void Compares(const LocalTensor<U>& dst, const LocalTensor<T>& src0, const S src1Scalar,
                     CMPMODE cmpMode, uint32_t count) {
  detail_compare::compare_scalar("Compares", dst, src0, src1Scalar, cmpMode, count);
}
#else
// Refusal: the targeted release has no Compares (its header declares CompareScalar only).
template <class... A>
inline void Compares(A&&...) {
  static_assert(ascendc_emu::cann_lacks<A...>,
                "Compares does not exist in CANN 8.x (asc-devkit v8.5.0 basic API: CompareScalar(dst, src0, "
                "scalar, cmpMode, count)); use CompareScalar, or target CANN >= 9.0 (-DASCENDC_CANN_VERSION=90100)");
}
#endif

namespace detail_select {
// mode 0 reuses the first 256/sizeof(T) mask bits for every repeat; modes 1 and 2 consume the
// mask continuously.
template <class T, class U>
const uint8_t* mask_bits(const std::string& api, const LocalTensor<U>& selMask, SELMODE mode, uint32_t count) {
  ASCENDC_EMU_TYPES(T, "Select: T must be half/float", half, float);
  static_assert(ascendc_emu::is_one_of_v<U, uint8_t, uint16_t, uint32_t, uint64_t>,
                "Select: selMask must be uint8_t/uint16_t/uint32_t/uint64_t");
  const uint64_t per_repeat = ascendc_emu::kRepeatBytes / sizeof(T);
  const uint64_t bits = mode == SELMODE::VSEL_CMPMASK_SPR ? std::min<uint64_t>(count, per_repeat) : count;
  const uint64_t elems = ((bits + 7) / 8 + sizeof(U) - 1) / sizeof(U);
  if (mode != SELMODE::VSEL_CMPMASK_SPR && ascendc_emu::ctx().launch().asc_reserve == false) {
    ascendc_emu::violate("Select modes 1/2 need the 8 KiB reserved UB", api,
                         "the kernel was launched with the ASC reserved UB disabled "
                         "(--cce-disable-asc-reserved-ubuf)");
  }
  return reinterpret_cast<const uint8_t*>(selMask.emu_data(api, "selMask", elems));
}
inline uint64_t bit_index(SELMODE mode, uint64_t i, uint64_t per_repeat) {
  return mode == SELMODE::VSEL_CMPMASK_SPR ? i % per_repeat : i;
}
}  // namespace detail_select

template <class T, class U>
inline void Select(const LocalTensor<T>& dst, const LocalTensor<U>& selMask, const LocalTensor<T>& src0,
                   const LocalTensor<T>& src1, SELMODE selMode, uint32_t count) {
  const std::string api = "Select";
  ascendc_emu::Insn insn_(ascendc_emu::Pipe::V, "Select");
  if (selMode == SELMODE::VSEL_TENSOR_SCALAR_MODE) {
    ascendc_emu::violate("Select mode matches its operands", api,
                         "VSEL_TENSOR_SCALAR_MODE takes a scalar src1, not a tensor");
  }
  const uint8_t* bits = detail_select::mask_bits<T>(api, selMask, selMode, count);
  const T* b = src1.emu_data(api, "src1", count);
  const uint64_t per = ascendc_emu::kRepeatBytes / sizeof(T);
  uint64_t i = 0;
  ascendc_emu::vec::binary(api, dst, src0, src0, count, [&](T x, T) {
    const T y = b[i];
    const bool take0 = ascendc_emu::vec::mask_bit(bits, detail_select::bit_index(selMode, i++, per));
    return take0 ? x : y;
  });
}

template <class T, class U, class S, std::enable_if_t<std::is_arithmetic_v<S> || std::is_same_v<S, T>, int> = 0>
inline void Select(const LocalTensor<T>& dst, const LocalTensor<U>& selMask, const LocalTensor<T>& src0,
                   S src1, SELMODE selMode, uint32_t count) {
  const std::string api = "Select";
  ascendc_emu::Insn insn_(ascendc_emu::Pipe::V, "Select");
  if (selMode != SELMODE::VSEL_TENSOR_SCALAR_MODE) {
    ascendc_emu::violate("Select mode matches its operands", api,
                         "a scalar src1 needs SELMODE::VSEL_TENSOR_SCALAR_MODE");
  }
  const uint8_t* bits = detail_select::mask_bits<T>(api, selMask, selMode, count);
  const T y = static_cast<T>(src1);
  uint64_t i = 0;
  ascendc_emu::vec::unary(api, dst, src0, count, [&](T x) {
    return ascendc_emu::vec::mask_bit(bits, i++) ? x : y;
  });
}

}  // namespace AscendC

#endif  // ASCENDC_EMU_VECTOR_H
