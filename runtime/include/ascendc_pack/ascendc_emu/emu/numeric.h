// ascendc_emu: the AscendC scalar types `half` and `bfloat16_t` and the rounding used by Cast.
//
// Both types are 16-bit storage types with an implicit conversion to float and an implicit,
// round-to-nearest-even conversion from any arithmetic type. There are deliberately no half
// arithmetic operators: `a + b` on two halves converts both to float, adds in float and rounds
// back when stored into a half. For +, -, *, / and sqrt this double rounding (float, then half)
// is innocuous (float carries 24 >= 2*11+2 significand bits), so it gives the correctly rounded
// fp16 result -- what the Vector unit computes for half operands, and what torch's CPU half ops
// compute too. bfloat16_t is the same with 8 significand bits.
//
// round_to_format() implements the RoundMode table of the AscendC "precision conversion" page
// (CAST_RINT/FLOOR/CEIL/ROUND/TRUNC/ODD) for float targets of any width; docs/ASCENDC_EMU.md.
#ifndef ASCENDC_EMU_NUMERIC_H
#define ASCENDC_EMU_NUMERIC_H

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace ascendc_emu {

enum class Rounding : uint8_t { RINT, FLOOR, CEIL, ROUND, TRUNC, ODD };

// A binary floating-point format: significand bits after the point and the normal exponent range.
struct FloatFormat {
  int mant_bits;
  int emin;
  int emax;
};
inline constexpr FloatFormat kHalfFormat{10, -14, 15};
inline constexpr FloatFormat kBf16Format{7, -126, 127};
inline constexpr FloatFormat kFloatFormat{23, -126, 127};

inline double format_max(const FloatFormat& f) {
  return std::ldexp(2.0 - std::ldexp(1.0, -f.mant_bits), f.emax);
}

// Rounds x (exact in double: any float, half, bf16 or int32 value) to the format. NaN and +-inf
// pass through. A finite result beyond the format's range saturates to +-max when `saturate`
// (the precision-conversion page: "overflow is handled in saturation mode by default"),
// otherwise it overflows the IEEE way for the rounding direction.
inline double round_to_format(double x, const FloatFormat& f, Rounding r, bool saturate) {
  if (std::isnan(x) || std::isinf(x) || x == 0.0) return x;
  const bool neg = x < 0;
  const double a = std::fabs(x);
  const int e = std::ilogb(a);                       // a in [2^e, 2^(e+1))
  const int q = std::max(e, f.emin) - f.mant_bits;   // exponent of one unit in the last place
  double n = std::floor(std::ldexp(a, -q));          // both steps are exact in double
  const double frac = std::ldexp(a, -q) - n;
  const bool odd = std::fmod(n, 2.0) != 0.0;
  bool up = false;
  switch (r) {
    case Rounding::RINT: up = frac > 0.5 || (frac == 0.5 && odd); break;
    case Rounding::ROUND: up = frac >= 0.5; break;
    case Rounding::TRUNC: up = false; break;
    case Rounding::FLOOR: up = neg && frac > 0; break;
    case Rounding::CEIL: up = !neg && frac > 0; break;
    case Rounding::ODD: up = frac > 0 && !odd; break;
  }
  double v = std::ldexp(n + (up ? 1.0 : 0.0), q);
  const double maxf = format_max(f);
  if (v > maxf) {
    const bool to_inf = !saturate && (r == Rounding::RINT || r == Rounding::ROUND ||
                                      (r == Rounding::CEIL && !neg) || (r == Rounding::FLOOR && neg));
    v = to_inf ? std::numeric_limits<double>::infinity() : maxf;
  }
  return neg ? -v : v;
}

// Bits of a half that holds exactly the value v (v must come from round_to_format(kHalfFormat)).
inline uint16_t half_bits_exact(double v) {
  uint16_t sign = std::signbit(v) ? 0x8000u : 0u;
  if (std::isnan(v)) return 0x7e00u;
  const double a = std::fabs(v);
  if (std::isinf(a)) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a == 0.0) return sign;
  const int e = std::ilogb(a);
  if (e < kHalfFormat.emin) {  // subnormal: multiples of 2^-24
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::ldexp(a, 24)));
  }
  const auto mant = static_cast<uint16_t>(std::ldexp(a, kHalfFormat.mant_bits - e) - 1024.0);
  return static_cast<uint16_t>(sign | ((e + 15) << 10) | mant);
}

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    return bits_to_float(sign | float_to_bits(static_cast<float>(mant) * 5.9604644775390625e-8f));
  }
  return bits_to_float(sign | ((exp + 112) << 23) | (mant << 13));
}

// float -> half, round to nearest even, overflow to inf (the hot path of every half instruction).
inline uint16_t half_bits_from_float(float f) {
  const uint32_t x = float_to_bits(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) return static_cast<uint16_t>(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (a < 0x38800000u) {  // below 2^-14: a half subnormal (or zero), in units of 2^-24
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(bits_to_float(a) * 16777216.0f)));
  }
  uint32_t h = ((((a >> 23) - 112) << 10) | ((a & 0x7fffffu) >> 13));
  const uint32_t rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry may bump the exponent
  return static_cast<uint16_t>(sign | h);
}

// float -> bfloat16, round to nearest even.
inline uint16_t bf16_bits_from_float(float f) {
  const uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline uint16_t half_bits_from(double x, Rounding r = Rounding::RINT, bool saturate = false) {
  return half_bits_exact(round_to_format(x, kHalfFormat, r, saturate));
}

inline uint16_t bf16_bits_from(double x, Rounding r = Rounding::RINT, bool saturate = false) {
  if (std::isnan(x)) return std::signbit(x) ? 0xffc0u : 0x7fc0u;
  const auto f = static_cast<float>(round_to_format(x, kBf16Format, r, saturate));  // exact
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_bits_to_float(uint16_t b) { return bits_to_float(static_cast<uint32_t>(b) << 16); }

template <class U>
uint16_t half_bits_of(U v) {
  if constexpr (std::is_same_v<U, float>) return half_bits_from_float(v);
  else return half_bits_from(static_cast<double>(v));
}
template <class U>
uint16_t bf16_bits_of(U v) {
  if constexpr (std::is_same_v<U, float>) return bf16_bits_from_float(v);
  else return bf16_bits_from(static_cast<double>(v));
}

}  // namespace ascendc_emu

// IEEE binary16, the AscendC `half`.
struct half {
  uint16_t bits_;
  half() = default;
  template <class U, std::enable_if_t<std::is_arithmetic_v<U>, int> = 0>
  half(U v) : bits_(ascendc_emu::half_bits_of(v)) {}
  operator float() const { return ascendc_emu::half_bits_to_float(bits_); }
  static half from_bits(uint16_t b) {
    half h;
    h.bits_ = b;
    return h;
  }
  half& operator+=(float v) { return *this = half(static_cast<float>(*this) + v); }
  half& operator-=(float v) { return *this = half(static_cast<float>(*this) - v); }
  half& operator*=(float v) { return *this = half(static_cast<float>(*this) * v); }
  half& operator/=(float v) { return *this = half(static_cast<float>(*this) / v); }
};

// bfloat16 (8 exponent bits, 7 fraction bits), the AscendC `bfloat16_t`.
struct bfloat16_t {
  uint16_t bits_;
  bfloat16_t() = default;
  template <class U, std::enable_if_t<std::is_arithmetic_v<U>, int> = 0>
  bfloat16_t(U v) : bits_(ascendc_emu::bf16_bits_of(v)) {}
  operator float() const { return ascendc_emu::bf16_bits_to_float(bits_); }
  static bfloat16_t from_bits(uint16_t b) {
    bfloat16_t h;
    h.bits_ = b;
    return h;
  }
  bfloat16_t& operator+=(float v) { return *this = bfloat16_t(static_cast<float>(*this) + v); }
  bfloat16_t& operator-=(float v) { return *this = bfloat16_t(static_cast<float>(*this) - v); }
  bfloat16_t& operator*=(float v) { return *this = bfloat16_t(static_cast<float>(*this) * v); }
  bfloat16_t& operator/=(float v) { return *this = bfloat16_t(static_cast<float>(*this) / v); }
};

static_assert(sizeof(half) == 2 && sizeof(bfloat16_t) == 2, "16-bit storage types");

namespace ascendc_emu {

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, half>;
template <class T>
inline constexpr bool is_bf16_v = std::is_same_v<T, bfloat16_t>;
template <class T>
inline constexpr bool is_float_like_v = std::is_floating_point_v<T> || is_half_v<T> || is_bf16_v<T>;

// The type a Vector instruction computes T in before rounding the result back to T.
template <class T>
using compute_t = std::conditional_t<is_float_like_v<T>, float,
                                     std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>;

template <class T, class... Ts>
inline constexpr bool is_one_of_v = (std::is_same_v<T, Ts> || ...);

// Short type names for messages.
template <class T>
constexpr const char* type_name() {
  if constexpr (std::is_same_v<T, float>) return "float";
  else if constexpr (std::is_same_v<T, half>) return "half";
  else if constexpr (std::is_same_v<T, bfloat16_t>) return "bfloat16_t";
  else if constexpr (std::is_same_v<T, double>) return "double";
  else if constexpr (std::is_same_v<T, int8_t>) return "int8_t";
  else if constexpr (std::is_same_v<T, uint8_t>) return "uint8_t";
  else if constexpr (std::is_same_v<T, int16_t>) return "int16_t";
  else if constexpr (std::is_same_v<T, uint16_t>) return "uint16_t";
  else if constexpr (std::is_same_v<T, int32_t>) return "int32_t";
  else if constexpr (std::is_same_v<T, uint32_t>) return "uint32_t";
  else if constexpr (std::is_same_v<T, int64_t>) return "int64_t";
  else if constexpr (std::is_same_v<T, uint64_t>) return "uint64_t";
  else return "T";
}

}  // namespace ascendc_emu

#endif  // ASCENDC_EMU_NUMERIC_H
