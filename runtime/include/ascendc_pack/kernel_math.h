// Vectorizable float32 math for generated fused CPU kernels.
//
// Generated kernels are built with
//   g++ -O3 -march=native -std=c++17 -fPIC -shared -fopenmp -fno-math-errno -fno-trapping-math
// (no -ffast-math: it breaks -inf/NaN semantics). Under these flags calls to libm expf/tanhf/erff/
// logf stay scalar calls, so the functions below are written in plain branch-free C++: selects are
// ternaries, bit manipulation goes through memcpy. GCC inlines them and auto-vectorizes loops like
//   #pragma omp simd
//   for (int64_t i = 0; i < n; ++i) out[i] = ap_exp(in[i]);
// No intrinsics, no torch headers, no tables. Special values follow IEEE / torch eager float32.
//
// Measured max error over ALL 2^32 float32 inputs vs a float64 libm reference (g++ 12,
// -march=native with FMA; in parentheses: -march=x86-64, no FMA), and vs torch 2.13 eager float32
// on the sweeps of tests/test_kernel_math.py. ulp = 2^(exponent(ref)-23), 2^-149 for subnormals.
// No input gives a NaN/inf/signed-zero mismatch with the reference.
//   ap_exp      1.01 ulp (0.99 no FMA) vs torch 1 ulp   subnormal results kept (gradual underflow)
//   ap_expm1    1.44 ulp (1.57 no FMA) vs torch 1 ulp
//   ap_log      0.76 ulp (0.84 no FMA) vs torch 1 ulp   subnormal inputs handled
//   ap_log1p    1.44 ulp (1.44 no FMA) vs torch 1 ulp
//   ap_tanh     1.33 ulp (1.33 no FMA) vs torch 1 ulp
//   ap_sigmoid  1.97 ulp (1.97 no FMA) vs torch 3 ulp (torch's own 1/(1+exp(-x)) is ~2 ulp off)
//   ap_erf      1.02 ulp, 6.1e-8 abs (1.13 ulp, 6.7e-8 no FMA) vs torch 1 ulp / 6e-8 abs
//   ap_gelu     absolute (see the function): tests/test_kernel_math.py
//   ap_gelu_tanh  absolute and relative (see the function): tests/test_kernel_math.py
//   conversions, ap_nearbyint: bit-exact vs torch (NaN payloads: see the functions).
#ifndef ASCENDC_PACK_KERNEL_MATH_H
#define ASCENDC_PACK_KERNEL_MATH_H

#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define AP_MATH_INLINE static inline __attribute__((always_inline))
#else
#define AP_MATH_INLINE static inline
#endif

// Fused multiply-add where the target has it in hardware (x86 FMA, AArch64); a*b+c otherwise
// (a libm fmaf call would block vectorization).
#if defined(__FP_FAST_FMAF)
#define AP_FMA(a, b, c) __builtin_fmaf((a), (b), (c))
#else
#define AP_FMA(a, b, c) ((a) * (b) + (c))
#endif

// ---------------------------------------------------------------------------------------------
// Bit helpers
// ---------------------------------------------------------------------------------------------

/// Raw bits of a float.
AP_MATH_INLINE uint32_t ap_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/// Float with the given raw bits.
AP_MATH_INLINE float ap_f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

#define AP_MATH_INF (__builtin_inff())
#define AP_MATH_NAN (__builtin_nanf(""))

// ---------------------------------------------------------------------------------------------
// Exponential family
// ---------------------------------------------------------------------------------------------

// Shared argument reduction: x = n*ln2 + r, |r| <= ln2/2 (Cody-Waite, Cephes constants).
// n is rint(x*log2e) computed with the 1.5*2^23 shifter so that its integer value is read from the
// bits (no float->int conversion, which would be undefined for NaN). Valid for |x| < 2^21.
#define AP_EXP_REDUCE(xc, nf, ni, r)                                       \
  const float ap_shift_ = 12582912.0f; /* 1.5 * 2^23 */                   \
  const float ap_t_ = AP_FMA((xc), 1.44269504088896341f, ap_shift_);      \
  const float nf = ap_t_ - ap_shift_;                                      \
  const int32_t ni = (int32_t)(ap_f32_bits(ap_t_) - 0x4B400000u);         \
  float r = AP_FMA(nf, -0.693359375f, (xc));                               \
  r = AP_FMA(nf, 2.12194440e-4f, r)

// exp(r) - 1 - r over |r| <= ln2/2, divided by r^2 (Cephes expf minimax polynomial).
AP_MATH_INLINE float ap_exp_poly_(float r) {
  float y = 1.9875691500e-4f;
  y = AP_FMA(y, r, 1.3981999507e-3f);
  y = AP_FMA(y, r, 8.3334519073e-3f);
  y = AP_FMA(y, r, 4.1665795894e-2f);
  y = AP_FMA(y, r, 1.6666665459e-1f);
  y = AP_FMA(y, r, 5.0000001201e-1f);
  return y;
}

/// e^x. exp(-inf)=0, exp(inf)=inf, NaN->NaN, inf for x > 88.7228, gradual underflow to
/// subnormals (correctly scaled, single rounding) and 0 below about -103.97.
/// Below -104 the last scale factor is 0, so the result is an exact 0, never an underflowing
/// product: on Intel cores every subnormal or underflowing result is a microcode assist (~150
/// cycles); a softmax over inputs far below their row maximum ran 5.7x slower.
AP_MATH_INLINE float ap_exp(float x) {
  float xc = x > 88.8f ? 88.8f : x;  // comparisons are false for NaN: NaN passes through
  const bool zero = xc < -104.0f;    // e^-104 is under half the smallest subnormal: rounds to 0
  xc = zero ? -104.0f : xc;
  AP_EXP_REDUCE(xc, nf, ni, r);
  const float p = AP_FMA(ap_exp_poly_(r), r * r, r) + 1.0f;
  // 2^n as two normal factors so that n in [-151, 128] neither overflows the exponent field nor
  // flushes: p*s1 is exact, the second product rounds once (to inf / a subnormal when due).
  const int32_t n1 = ni >> 1;
  const int32_t n2 = ni - n1;
  const float s1 = ap_f32_from_bits((uint32_t)(n1 + 127) << 23);
  const float s2 = ap_f32_from_bits(zero ? 0u : (uint32_t)(n2 + 127) << 23);
  return (p * s1) * s2;
}

/// e^x - 1, relatively accurate near 0 (returns x exactly for tiny x, keeps -0).
/// expm1(-inf)=-1, expm1(inf)=inf, NaN->NaN, inf for x > 88.7228.
AP_MATH_INLINE float ap_expm1(float x) {
  float xc = x > 88.8f ? 88.8f : x;
  xc = xc < -30.0f ? -30.0f : xc;  // expm1 rounds to -1 below -17.4
  AP_EXP_REDUCE(xc, nf, ni, r);
  (void)nf;
  const float p = AP_FMA(ap_exp_poly_(r), r * r, r);  // expm1(r); == r exactly when n == 0
  const int32_t nc = ni > 127 ? 127 : ni;
  const float s = ap_f32_from_bits((uint32_t)(nc + 127) << 23);
  float y = AP_FMA(s, p, s - 1.0f);  // 2^n * expm1(r) + (2^n - 1); s - 1 exact for n <= 24
  y = ni > 127 ? y * 2.0f : y;       // n == 128: finish the scaling (overflows to inf when due)
  return x == 0.0f ? x : y;          // expm1(-0) = -0
}

/// Logistic sigmoid 1 / (1 + e^-x). sigmoid(-inf)=0, sigmoid(inf)=1, NaN->NaN.
/// Evaluated as e^x/(1+e^x) for x < 0, so results for x < -87.3 are (correct) subnormals and
/// underflow to 0 only below about -103.97; torch eager computes 1/(1+exp(-x)) and returns 0
/// already for x < -88.72 (absolute difference < 1.2e-38).
AP_MATH_INLINE float ap_sigmoid(float x) {
  const float e = ap_exp(-__builtin_fabsf(x));  // in [0, 1]
  const float d = 1.0f + e;
  const float derr = (1.0f - d) + e;  // rounding error of d (Fast2Sum, exact)
  const bool pos = x >= 0.0f;
  const float q = (pos ? 1.0f : e) / d;
  // q * d/(d + derr) ~= q - q*derr/d, where 1/d is q (x >= 0) or 1 - q (x < 0)
  return AP_FMA(-q * derr, pos ? q : 1.0f - q, q);
}

/// Hyperbolic tangent. tanh(+-inf)=+-1, tanh(+-0)=+-0, NaN->NaN, relatively accurate near 0.
AP_MATH_INLINE float ap_tanh(float x) {
  const float ax = __builtin_fabsf(x);
  // |x| < 0.625: odd minimax polynomial (Cephes tanhf).
  const float z = ax * ax;
  float q = -5.70498872745e-3f;
  q = AP_FMA(q, z, 2.06390887954e-2f);
  q = AP_FMA(q, z, -5.37397155531e-2f);
  q = AP_FMA(q, z, 1.33314422036e-1f);
  q = AP_FMA(q, z, -3.33332819422e-1f);
  const float small = AP_FMA(ax * z, q, ax);
  // |x| >= 0.625: 1 - 2/(e^{2|x|} + 1); tanh rounds to 1 from |x| = 9.01 on.
  const float axc = ax > 9.1f ? 9.1f : ax;  // NaN passes through
  const float e = ap_exp(2.0f * axc);
  const float large = 1.0f - 2.0f / (e + 1.0f);
  const float y = ax < 0.625f ? small : large;
  return __builtin_copysignf(y, x);
}

// ---------------------------------------------------------------------------------------------
// Logarithms
// ---------------------------------------------------------------------------------------------

/// Natural log. log(+-0)=-inf, log(x<0)=NaN, log(inf)=inf, NaN->NaN, subnormal inputs exact-range.
/// Reduction to m in [sqrt(2)/2, sqrt(2)) and the FreeBSD/musl logf polynomial in s = f/(2+f).
AP_MATH_INLINE float ap_log(float x) {
  const bool sub = x < 1.17549435e-38f;  // subnormal (also 0 / negative, fixed up below)
  const float xs = sub ? x * 8388608.0f : x;  // * 2^23
  uint32_t ix = ap_f32_bits(xs);
  ix += 0x3f800000u - 0x3f3504f3u;
  const int32_t k = (int32_t)(ix >> 23) - 0x7f - (sub ? 23 : 0);
  ix = (ix & 0x007fffffu) + 0x3f3504f3u;
  const float f = ap_f32_from_bits(ix) - 1.0f;
  const float s = f / (2.0f + f);
  const float z = s * s;
  const float w = z * z;
  const float t1 = w * AP_FMA(w, 2.4279078841e-1f, 4.0000972152e-1f);
  const float t2 = z * AP_FMA(w, 2.8498786688e-1f, 6.6666662693e-1f);
  const float R = t2 + t1;
  const float hfsq = 0.5f * f * f;
  const float dk = (float)k;
  const float y = s * (hfsq + R) + dk * 9.0580006145e-06f - hfsq + f + dk * 6.9313812256e-01f;
  const float special = x == 0.0f ? -AP_MATH_INF : (x < 0.0f ? AP_MATH_NAN : x);  // inf, NaN: x
  return (x > 0.0f && x < AP_MATH_INF) ? y : special;
}

/// log(1 + x), relatively accurate near 0 (returns x exactly for tiny x, keeps -0).
/// log1p(-1)=-inf, log1p(x<-1)=NaN, log1p(inf)=inf, NaN->NaN.
AP_MATH_INLINE float ap_log1p(float x) {
  const float u = 1.0f + x;
  // log(u) plus the first-order correction for the rounding of 1 + x.
  float c = (x - (u - 1.0f)) / u;
  c = (u > 0.0f && u < AP_MATH_INF) ? c : 0.0f;
  const float y = ap_log(u) + c;
  return x == 0.0f ? x : y;
}

// ---------------------------------------------------------------------------------------------
// Error function
// ---------------------------------------------------------------------------------------------

/// erf(x). erf(+-inf)=+-1, erf(+-0)=+-0, NaN->NaN, relatively accurate near 0.
/// |x| < 0.875: x + x*Q(x^2); 0.875 <= |x| < 4: 1 - exp(L(|x| - 0.875)) with L ~ log(erfc);
/// erf rounds to 1 from |x| = 3.92 on. Both polynomials are minimax fits made for this header.
AP_MATH_INLINE float ap_erf(float x) {
  const float ax = __builtin_fabsf(x);
  const float z = ax * ax;
  float q = -6.222422e-04f;
  q = AP_FMA(q, z, 5.035872e-03f);
  q = AP_FMA(q, z, -2.6793955e-02f);
  q = AP_FMA(q, z, 1.12825245e-01f);
  q = AP_FMA(q, z, -3.7612557e-01f);
  q = AP_FMA(q, z, 1.2837915e-01f);
  const float small = AP_FMA(ax, q, ax);
  const float t = (ax > 4.0f ? 4.0f : ax) - 0.875f;  // NaN passes through
  float l = 1.6024856e-06f;
  l = AP_FMA(l, t, -3.413709e-05f);
  l = AP_FMA(l, t, 3.4727147e-04f);
  l = AP_FMA(l, t, -2.2981241e-03f);
  l = AP_FMA(l, t, 1.1426863e-02f);
  l = AP_FMA(l, t, -4.6936836e-02f);
  l = AP_FMA(l, t, -8.265336e-01f);
  l = AP_FMA(l, t, -2.4302204e+00f);
  l = AP_FMA(l, t, -1.5328244e+00f);
  const float large = 1.0f - ap_exp(l);
  const float y = ax < 0.875f ? small : large;
  return __builtin_copysignf(y, x);
}

/// e^-s for s >= 0 where the result is a normal float (s <= 87), else 0; NaN -> NaN, +inf -> 0.
/// One scale factor, no subnormal or overflow handling: ~30 % cheaper than ap_exp(-s) for the
/// terms whose tiny values do not matter (a softmax numerator, gelu's erfc: a share below 1e-38
/// of the row sum or of x) and never a denormal, whose arithmetic costs ~100 cycles an operation.
AP_MATH_INLINE float ap_exp_neg_normal(float s) {
  const float xc = -(s > 87.0f ? 87.0f : s);  // NaN passes
  AP_EXP_REDUCE(xc, nf, ni, r);
  (void)nf;
  const float p = AP_FMA(ap_exp_poly_(r), r * r, r) + 1.0f;
  return s > 87.0f ? 0.0f : p * ap_f32_from_bits((uint32_t)(ni + 127) << 23);
}

/// gelu(x) = x/2 (1 + erf(x / sqrt 2)), torch's approximate="none". 1 + erf(z) is 2 - erfc(|z|)
/// for z >= 0 and erfc(|z|) below, erfc by Abramowitz & Stegun 7.1.26 (one exp, one division,
/// absolute error 1.5e-7): gelu only multiplies that by x/2, so the result is within 4.2e-7 of
/// float64 over [-12, 12] (x/2 (1 + ap_erf): 4.5e-7); relative 1.7e-4 at most where |gelu| > 1e-3
/// (the negative tail, where 1 + erf cancels; x/2 (1 + ap_erf): 5e-5), far inside float32's
/// accuracy rule (atol 1e-5); at ~2/3 of the cost (182 vs 274 µs for 302 K floats on one Xeon
/// core: vit_s16's fc1 epilogue). Its exp(-z^2) is ap_exp_neg_normal (0 past |x| 13.2, where
/// gelu is below 1e-38 anyway): 30 % cheaper than ap_exp's subnormal-exact path (151 K floats on
/// one core: 102 -> 74 µs), the same error bound.
/// gelu(+inf) = +inf, gelu(-inf) and NaN give NaN, as x/2 (1 + erf) does in float32.
AP_MATH_INLINE float ap_gelu(float x) {
  const float z = __builtin_fabsf(x) * 0.70710678118654752f;
  const float t = 1.0f / AP_FMA(0.3275911f, z, 1.0f);
  float p = 1.061405429f;
  p = AP_FMA(p, t, -1.453152027f);
  p = AP_FMA(p, t, 1.421413741f);
  p = AP_FMA(p, t, -0.284496736f);
  p = AP_FMA(p, t, 0.254829592f);
  const float q = p * t * ap_exp_neg_normal(z * z);  // erfc(|z|)
  return x * (x >= 0.0f ? 1.0f - 0.5f * q : 0.5f * q);
}

/// gelu(x, approximate="tanh") = x/2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed
/// as the equal x * sigmoid(2u) = x / (1 + e^-2u): one exp and one division where tanh's form
/// pays tanh's polynomial, its exp, its division and a select (0.40 vs 0.76 ns a float on one Xeon
/// core: the GEMM epilogue of a transformer's fc1). e^-|2u| is ap_exp_neg_normal, so no exp
/// overflows and x < 0 takes x e/(1 + e); past |2u| = 87 the result is x or -0 (|gelu| < 1e-37).
/// No cancellation (torch's 1 + tanh cancels in the negative tail): within float rounding of
/// float64 (tests/test_kernel_math.py). gelu_tanh(+inf) = +inf, gelu_tanh(-inf) and NaN give NaN
/// as torch's float32 formula does.
AP_MATH_INLINE float ap_gelu_tanh(float x) {
  const float s = 1.5957691216057308f * AP_FMA(0.044715f * x, x * x, x);  // 2u
  const float e = ap_exp_neg_normal(__builtin_fabsf(s));
  return x * (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}

// ---------------------------------------------------------------------------------------------
// Rounding
// ---------------------------------------------------------------------------------------------

/// Round to nearest integer, ties to even (torch.round). Keeps -0, +-inf, NaN.
AP_MATH_INLINE float ap_nearbyint(float x) {
#if !defined(AP_MATH_PORTABLE_RINT) && \
    (defined(__SSE4_1__) || defined(__aarch64__) || defined(__ARM_NEON) || defined(__VSX__))
  // One instruction (roundps / vrndscaleps / frintx) and vectorized under -fno-math-errno.
  return __builtin_rintf(x);
#else
  // Shifter trick: adding 2^23 rounds to an integer in the default (nearest-even) mode.
  const float ax = __builtin_fabsf(x);
  const float r = __builtin_copysignf((ax + 8388608.0f) - 8388608.0f, x);
  return ax < 8388608.0f ? r : x;  // |x| >= 2^23, inf and NaN are already "integral"
#endif
}

// ---------------------------------------------------------------------------------------------
// bf16 / fp16 conversions (bit patterns carried in uint16_t)
// ---------------------------------------------------------------------------------------------

/// bfloat16 bits -> float (exact; NaN payloads kept).
AP_MATH_INLINE float ap_bf16_to_f32(uint16_t h) { return ap_f32_from_bits((uint32_t)h << 16); }

/// float -> bfloat16 bits, round to nearest even (bit-exact with torch .to(torch.bfloat16) for
/// every non-NaN input, subnormals and overflow to inf included). NaN -> quiet NaN keeping sign and
/// top payload bits (as the vcvtneps2bf16 instruction); torch itself is not consistent here
/// (0xFFFF on contiguous tensors, 0x7FC0 on strided ones).
AP_MATH_INLINE uint16_t ap_f32_to_bf16(float f) {
  const uint32_t u = ap_f32_bits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t qnan = (u >> 16) | 0x0040u;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? qnan : rounded);
}

/// IEEE half bits -> float (exact; subnormals handled; signaling NaNs quieted like F16C vcvtph2ps,
/// i.e. bit-exact with torch .to(torch.float32)).
AP_MATH_INLINE float ap_f16_to_f32(uint16_t h) {
  const uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
  const uint32_t em = (uint32_t)h & 0x7fffu;
  const uint32_t normal = (em << 13) + 0x38000000u;  // rebias exponent 15 -> 127
  const float subf = (float)(int32_t)em * 5.9604644775390625e-08f;  // em * 2^-24, exact
  const uint32_t infnan = 0x7f800000u | ((em & 0x3ffu) << 13) | (em > 0x7c00u ? 0x00400000u : 0u);
  const uint32_t mag = em < 0x400u ? ap_f32_bits(subf) : (em >= 0x7c00u ? infnan : normal);
  return ap_f32_from_bits(mag | sign);
}

/// float -> IEEE half bits, round to nearest even, overflow to inf, subnormal results rounded
/// correctly, NaN -> quiet NaN keeping sign and top payload bits (bit-exact with torch
/// .to(torch.float16), NaNs included).
AP_MATH_INLINE uint16_t ap_f32_to_f16(float f) {
  const uint32_t u = ap_f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  const uint32_t nanv = 0x7e00u | ((a >> 13) & 0x3ffu);
  // |f| < 2^-14 (half subnormal or zero): adding 0.5 leaves the rounded count of 2^-24 units in
  // the low mantissa bits (RNE by the FPU).
  const uint32_t subv = ap_f32_bits(ap_f32_from_bits(a) + 0.5f) - 0x3f000000u;
  // Normal: rebias 127 -> 15 and round the 13 dropped bits to nearest even; a carry out of the
  // top exponent (|f| >= 65520) gives 0x7c00 = inf.
  const uint32_t normv = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
  const uint32_t mag = a > 0x7f800000u ? nanv
                       : a >= 0x47800000u ? 0x7c00u
                       : a < 0x38800000u  ? subv
                                          : normv;
  return (uint16_t)(mag | sign);
}

/// Round a float to the nearest bfloat16 value (RNE) and back: "round where the graph casts".
AP_MATH_INLINE float ap_round_bf16(float x) { return ap_bf16_to_f32(ap_f32_to_bf16(x)); }

/// Round a float to the nearest IEEE half value (RNE, overflow to inf) and back.
AP_MATH_INLINE float ap_round_f16(float x) { return ap_f16_to_f32(ap_f32_to_f16(x)); }

#undef AP_EXP_REDUCE

#endif  // ASCENDC_PACK_KERNEL_MATH_H
