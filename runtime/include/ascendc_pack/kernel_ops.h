// Scalar helpers the expressions of generated fused CPU kernels call (C++ only).
//
// ascendc_pack/kernels/fused/codegen.py writes each kernel as one translation unit of generated loops; the
// fixed helpers its expressions use live here instead of being re-emitted into every source:
// libm builtin wrappers (ap_sqrt, ap_floor, ap_pow, ...), ap_min, torch's floating floor division
// (ap_div_floor) and integer power (ap_ipow). The float32 transcendental functions (ap_exp,
// ap_tanh, ...) and the 16-bit conversions are in kernel_math.h. Everything has internal linkage
// (static) like the kernel's own code, so every kernel library keeps its own inlined copy.
//
// No C++ standard headers: <cmath>/<algorithm> alone cost ~0.1 s of a ~0.2 s compile. The libm
// functions below are GCC builtins (the same calls std:: makes; vectorizable under
// -fno-math-errno where the target has an instruction for them).
#ifndef ASCENDC_PACK_KERNEL_OPS_H
#define ASCENDC_PACK_KERNEL_OPS_H

#include <stdint.h>

#ifndef INFINITY
#define INFINITY (__builtin_inff())
#endif
#ifndef NAN
#define NAN (__builtin_nanf(""))
#endif

using ap_bool = int32_t;  // booleans compute as 32-bit ints so mixed loops vectorize

#define AP_UNARY(name) \
  static inline float ap_##name(float x) { return __builtin_##name##f(x); } \
  static inline double ap_##name(double x) { return __builtin_##name(x); }
#define AP_BINARY(name) \
  static inline float ap_##name(float x, float y) { return __builtin_##name##f(x, y); } \
  static inline double ap_##name(double x, double y) { return __builtin_##name(x, y); }
AP_UNARY(sqrt) AP_UNARY(floor) AP_UNARY(ceil) AP_UNARY(trunc) AP_UNARY(fabs) AP_UNARY(sin) AP_UNARY(cos)
AP_BINARY(pow) AP_BINARY(fmod) AP_BINARY(atan2) AP_BINARY(copysign)
#undef AP_UNARY
#undef AP_BINARY

static inline int64_t ap_min(int64_t a, int64_t b) { return a < b ? a : b; }

// where(c, a, b) on floating values as a bitwise select: the same bits as `c ? a : b` (NaN and
// infinities included), but g++ vectorizes it inside a reduction, where the ternary on a boolean
// loaded beside floats kept the max pass of a masked softmax scalar (4.4x slower, issue 42).
static inline float ap_select(ap_bool c, float a, float b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c != 0);
  return __builtin_bit_cast(float, (__builtin_bit_cast(uint32_t, a) & m) | (__builtin_bit_cast(uint32_t, b) & ~m));
}
static inline double ap_select(ap_bool c, double a, double b) {
  const uint64_t m = 0u - static_cast<uint64_t>(c != 0);
  return __builtin_bit_cast(double, (__builtin_bit_cast(uint64_t, a) & m) | (__builtin_bit_cast(uint64_t, b) & ~m));
}

template <typename T>
static inline T ap_keep(T x) { return x; }

// torch's floating floor division (c10::div_floor_floating): (a - fmod(a, b)) / b with fix-ups,
// not floor(a / b), which is off by one when a / b rounds up to an integer. `rnd` rounds each
// intermediate to the tensor's dtype, as torch's 16-bit kernels do.
template <typename T, typename R>
static inline T ap_div_floor(T a, T b, R rnd) {
  const T mod = ap_fmod(a, b);
  T div = rnd(rnd(a - mod) / b);
  div = (mod != 0 && ((b < 0) != (mod < 0))) ? rnd(div - T(1)) : div;
  T fl = ap_floor(div);
  fl = (div - fl > T(0.5)) ? fl + T(1) : fl;
  fl = div != 0 ? fl : ap_copysign(T(0), a / b);
  return b == 0 ? a / b : fl;
}
template <typename T>
static inline T ap_div_floor(T a, T b) { return ap_div_floor(a, b, ap_keep<T>); }

template <typename T> struct ap_unsigned;
template <> struct ap_unsigned<int32_t> { using type = uint32_t; };
template <> struct ap_unsigned<int64_t> { using type = uint64_t; };

// Integer power by squaring (wrapping like torch); negative exponents give 0 unless |base| is 1.
template <typename T>
static inline T ap_ipow(T base, T e) {
  using U = typename ap_unsigned<T>::type;
  if (e < 0) return base == 1 ? T(1) : (base == -1 ? ((e & 1) ? T(-1) : T(1)) : T(0));
  U r = 1, b = static_cast<U>(base);
  for (U k = static_cast<U>(e); k; k >>= 1) {
    if (k & 1) r *= b;
    b *= b;
  }
  return static_cast<T>(r);
}

#endif  // ASCENDC_PACK_KERNEL_OPS_H
