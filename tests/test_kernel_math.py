"""Tests for runtime/include/ascendc_pack/kernel_math.h (vectorizable float32 math for kernels).

A small C++ library that applies each ap_* function over an array inside a `#pragma omp simd`
loop is compiled with the flags generated kernels use, loaded with ctypes and compared with torch
eager float32 (and with a float64 reference for accuracy). The same compilation runs with
-fopt-info-vec-optimized, so we also check that GCC really vectorized the loops.
"""

from __future__ import annotations

import ctypes
import platform
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

INCLUDE_DIR = Path(__file__).resolve().parents[1] / "runtime" / "include"
HEADER = INCLUDE_DIR / "ascendc_pack" / "kernel_math.h"

KERNEL_FLAGS = [
    "-O3", "-march=native", "-std=c++17", "-fPIC", "-shared", "-fopenmp",
    "-fno-math-errno", "-fno-trapping-math",
]

UNARY = ["exp", "expm1", "log", "log1p", "tanh", "sigmoid", "erf", "gelu", "gelu_tanh", "nearbyint",
         "round_bf16", "round_f16", "exp_neg_normal"]

# Each loop sits on its own line, tagged with the function name, so that -fopt-info reports can be
# mapped back to the function they vectorize.
_LOOP_F = ("extern \"C\" void t_{name}(const float* in, float* out, int64_t n) {{\n"
           "#pragma omp simd\n"
           "  for (int64_t i = 0; i < n; ++i) out[i] = ap_{name}(in[i]);  // LOOP:{name}\n"
           "}}\n")
_LOOP_TO16 = ("extern \"C\" void t_{name}(const float* in, uint16_t* out, int64_t n) {{\n"
              "#pragma omp simd\n"
              "  for (int64_t i = 0; i < n; ++i) out[i] = ap_{name}(in[i]);  // LOOP:{name}\n"
              "}}\n")
_LOOP_FROM16 = ("extern \"C\" void t_{name}(const uint16_t* in, float* out, int64_t n) {{\n"
                "#pragma omp simd\n"
                "  for (int64_t i = 0; i < n; ++i) out[i] = ap_{name}(in[i]);  // LOOP:{name}\n"
                "}}\n")


# Runs t_<name> with the floating-point exception flags cleared and returns whether it raised
# FE_UNDERFLOW: a subnormal or underflowing result, which costs a microcode assist on Intel cores.
_UNDERFLOWS = ("extern \"C\" int underflows(void (*f)(const float*, float*, int64_t), const float* in, float* out,"
               " int64_t n) {\n"
               "  feclearexcept(FE_ALL_EXCEPT);\n  f(in, out, n);\n  return fetestexcept(FE_UNDERFLOW) != 0;\n}\n")


def _source() -> str:
    parts = ["#include <fenv.h>\n#include <stdint.h>\n#include \"ascendc_pack/kernel_math.h\"\n", _UNDERFLOWS]
    parts += [_LOOP_F.format(name=n) for n in UNARY]
    parts += [_LOOP_TO16.format(name=n) for n in ("f32_to_bf16", "f32_to_f16")]
    parts += [_LOOP_FROM16.format(name=n) for n in ("bf16_to_f32", "f16_to_f32")]
    return "".join(parts)


class _Lib:
    def __init__(self, path: Path, src: Path, opt_info: str):
        self.dll = ctypes.CDLL(str(path))
        self.src_lines = src.read_text().splitlines()
        self.opt_info = opt_info

    def _call(self, name, x, out_dtype):
        x = np.ascontiguousarray(x)
        out = np.empty(x.shape, dtype=out_dtype)
        getattr(self.dll, "t_" + name)(
            x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p),
            ctypes.c_int64(x.size))
        return out

    def f(self, name, x):
        return self._call(name, np.asarray(x, dtype=np.float32), np.float32)

    def underflows(self, name, x) -> bool:
        """Whether ``ap_<name>`` over ``x`` raised the floating-point underflow flag."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty_like(x)
        fn = ctypes.cast(getattr(self.dll, "t_" + name), ctypes.c_void_p)
        return bool(self.dll.underflows(fn, x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p),
                                        ctypes.c_int64(x.size)))

    def to16(self, name, x):
        return self._call(name, np.asarray(x, dtype=np.float32), np.uint16)

    def from16(self, name, bits):
        return self._call(name, np.asarray(bits, dtype=np.uint16), np.float32)

    def vectorized_loops(self) -> set[str]:
        """Names of the LOOP:<name> lines that GCC reported as vectorized."""
        done = set()
        for m in re.finditer(r"test_math\.cpp:(\d+):\d+: optimized: loop vectorized", self.opt_info):
            line = self.src_lines[int(m.group(1)) - 1]
            tag = re.search(r"LOOP:(\w+)", line)
            if tag:
                done.add(tag.group(1))
        return done


# "native": the generated-kernel flags. "portable" (x86-64 only): baseline x86-64 without FMA or
# SSE4.1, which exercises the a*b+c and shifter-rint fallbacks of the header.
VARIANTS = {"native": []}
if platform.machine() in ("x86_64", "AMD64"):
    VARIANTS["portable"] = ["-march=x86-64", "-mtune=generic", "-DAP_MATH_PORTABLE_RINT"]


@pytest.fixture(scope="module", params=list(VARIANTS))
def lib(request, tmp_path_factory) -> _Lib:
    if shutil.which("g++") is None:
        pytest.skip("g++ not available")
    d = tmp_path_factory.mktemp(f"kernel_math_{request.param}")
    src = d / "test_math.cpp"
    src.write_text(_source())
    so = d / "libtest_math.so"
    cmd = ["g++", *KERNEL_FLAGS, *VARIANTS[request.param], "-Wall", "-Wextra", "-Werror",
           "-fopt-info-vec-optimized", f"-I{INCLUDE_DIR}", str(src), "-o", str(so)]
    res = subprocess.run(cmd, cwd=d, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    out = _Lib(so, src, res.stderr + res.stdout)
    out.variant = request.param
    return out


# ------------------------------------------------------------------------------------------------
# inputs and comparison helpers
# ------------------------------------------------------------------------------------------------

SPECIALS = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 1e-45, -1e-45, 1.17549435e-38,
     -1.17549435e-38, 3.4028235e38, -3.4028235e38, 1e30, -1e30, 1e-30, -1e-30, 1e-7, -1e-7,
     1.0, -1.0, 0.5, -0.5, 2.0, 88.0, 88.7, 88.72, 88.7228, 88.73, 89.0, 100.0, -87.3, -87.5,
     -88.0, -88.73, -100.0, -103.0, -103.97, -104.0, -110.0, 9.0, 9.01, 9.1, 3.9, 3.92, 4.0,
     -0.999999, -0.9999999, -1.0000001, -2.0, 0.625, -0.625, 0.875, -0.875, 17.0, -17.0, -30.0],
    dtype=np.float32)


def _rng_values(n=200_000, seed=0):
    rng = np.random.default_rng(seed)
    # log-uniform magnitudes over the whole float range, random signs
    mag = np.exp(rng.uniform(np.log(1e-44), np.log(3e38), n))
    return (mag * rng.choice([-1.0, 1.0], n)).astype(np.float32)


def _inputs(lo, hi, n_dense=200_001, extra=()):
    dense = np.linspace(lo, hi, n_dense, dtype=np.float32)
    rng = np.random.default_rng(1)
    uni = rng.uniform(lo, hi, 100_000).astype(np.float32)
    return np.concatenate([dense, uni, _rng_values(), SPECIALS, np.asarray(extra, np.float32)])


def _ulp(ref32: np.ndarray) -> np.ndarray:
    """Size of one float32 ulp at |ref| (subnormal spacing below FLT_MIN)."""
    a = np.abs(ref32.astype(np.float32))
    a = np.where(np.isfinite(a), a, np.float32(0))
    return np.spacing(a).astype(np.float64)


def _ulp_error(got, ref):
    """max ulp distance between finite results, after checking inf/nan/zero patterns match."""
    got = np.asarray(got, np.float32)
    ref = np.asarray(ref, np.float64)
    with np.errstate(over="ignore"):
        ref32 = ref.astype(np.float32)
    nan_g, nan_r = np.isnan(got), np.isnan(ref32)
    assert np.array_equal(nan_g, nan_r), f"NaN mismatch at {np.flatnonzero(nan_g != nan_r)[:5]}"
    inf_r = np.isinf(ref32)
    assert np.array_equal(got[inf_r], ref32[inf_r]), "inf mismatch"
    fin = ~nan_r & ~inf_r
    assert np.all(np.isfinite(got[fin])), "unexpected inf"
    err = np.abs(got[fin].astype(np.float64) - ref[fin]) / _ulp(ref32[fin])
    return float(err.max()) if err.size else 0.0


def _torch(fn, x):
    return getattr(torch, fn)(torch.from_numpy(np.ascontiguousarray(x))).numpy()


def _torch64(fn, x):
    return getattr(torch, fn)(torch.from_numpy(np.ascontiguousarray(x)).double()).numpy()


def _same_specials(got, ref):
    """Bit-level agreement on NaN-ness, infinities and signed zeros."""
    got = np.asarray(got, np.float32)
    ref = np.asarray(ref, np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    # (zeros: only the sign is compared; torch's log1p flushes +-1e-45 to 0, we return x)
    exact = np.isinf(ref) | ((ref == 0) & (got == 0))
    bad = exact & (got.view(np.uint32) != ref.view(np.uint32))
    assert not bad.any(), list(zip(got[bad][:5], ref[bad][:5]))


# ------------------------------------------------------------------------------------------------
# elementwise math
# ------------------------------------------------------------------------------------------------

# name, sweep range, ulp bound vs torch float32, ulp bound vs float64 reference
CASES = [
    ("exp", (-104.0, 89.0), 2.0, 1.5),
    ("expm1", (-20.0, 89.0), 2.5, 2.0),
    ("log", (0.0, 100.0), 2.0, 1.5),
    ("log1p", (-1.0, 100.0), 2.5, 2.0),
    ("tanh", (-10.0, 10.0), 2.5, 2.0),
    ("sigmoid", (-87.0, 30.0), 4.0, 2.5),  # torch's own sigmoid is up to 3 ulp off
]


@pytest.mark.parametrize("name,rng,ulp_torch,ulp_ref", CASES, ids=[c[0] for c in CASES])
def test_unary_accuracy(lib, name, rng, ulp_torch, ulp_ref):
    x = _inputs(*rng)
    if name == "sigmoid":
        # below -88.72 torch returns 0 where the exact result is subnormal (we return that);
        # compared separately in test_sigmoid_tail
        x = x[~(x < -87.0)]
    got = lib.f(name, x)
    _same_specials(got, _torch(name, x))
    assert _ulp_error(got, _torch(name, x)) <= ulp_torch
    assert _ulp_error(got, _torch64(name, x)) <= ulp_ref


def test_gelu_is_within_float_rounding_of_the_exact_gelu(lib):
    """ap_gelu (the GELU epilogue of every generated kernel) against float64 and torch's float32
    F.gelu: absolute error a few 1e-7 (the float32 accuracy rule's atol is 1e-5), relative 2e-4 at
    most where |gelu| > 1e-3 (the negative tail), specials as eager."""
    x = _inputs(-12.0, 12.0)
    x = x[np.abs(x) < 1e30]  # gelu's x/2 * (1 + erf) overflows far before
    got = lib.f("gelu", x).astype(np.float64)
    ref = torch.nn.functional.gelu(torch.from_numpy(x).double()).numpy()
    fin = np.isfinite(ref)
    assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(got[~fin & ~np.isnan(ref)],
                                                                            ref[~fin & ~np.isnan(ref)])
    bound = 4.2e-7 + 1.2e-7 * np.abs(ref[fin])     # the erfc formula's, then float rounding
    err = np.abs(got[fin] - ref[fin])
    assert (err <= bound).all(), (err - bound).max()
    big = fin & (np.abs(ref) > 1e-3)
    assert (np.abs(got[big] - ref[big]) / np.abs(ref[big])).max() < 2e-4
    eager = torch.nn.functional.gelu(torch.from_numpy(x)).numpy().astype(np.float64)
    assert (np.abs(got[fin] - eager[fin]) <= bound + np.abs(eager[fin] - ref[fin])).all()  # eager's 1 + erf cancels too



def test_gelu_tanh_is_within_float_rounding_of_the_exact_formula(lib):
    """ap_gelu_tanh (x * sigmoid(2u), the tanh-GELU epilogue) against the same function in float64:
    relative 3e-7 (1 + |2u|) down to results of 1e-30 (no cancellation in the negative tail, where
    torch's float32 1 + tanh(u) cancels and returns 0 from |gelu| < 1e-16 on), absolute 6e-7 at
    most (eager's own float32 formula: 4.3e-7), and the specials eager gives (+inf, NaN for -inf
    and NaN)."""
    x = _inputs(-12.0, 12.0)
    x = x[np.abs(x) < 1e12]  # 0.044715 x^3 overflows float32 far before; both give +-inf/NaN there
    got = lib.f("gelu_tanh", x).astype(np.float64)
    gelu = torch.nn.functional.gelu
    x64 = x.astype(np.float64)
    two_u = 2.0 * np.sqrt(2.0 / np.pi) * (x64 + 0.044715 * x64 ** 3)
    with np.errstate(over="ignore"):  # the same function without 1 + tanh's cancellation, in float64
        ref = x64 / (1.0 + np.exp(-two_u))
    eager = gelu(torch.from_numpy(x), approximate="tanh").numpy().astype(np.float64)
    big = np.abs(ref) > 1e-30  # below: x e^-2u where e^-2u nears its flush to 0 (eager: 0 from 1e-16 on)
    rel = np.abs(got[big] - ref[big]) / np.abs(ref[big])
    # e^-2u inherits 2u's float32 rounding (relative 6e-8 of 2u): a few ulp near 0, 1e-5 at 2u = -80
    assert (rel <= 3e-7 * (1 + np.abs(two_u[big]))).all(), (rel / (1 + np.abs(two_u[big]))).max()
    fin = np.isfinite(ref)
    err, eager_err = np.abs(got - ref)[fin], np.abs(eager - ref)[fin]
    assert err.max() <= 6e-7 and eager_err.max() > 4e-7  # like eager's; the float32 rule allows 1e-5
    specials = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e30, -1e30], np.float32)
    want = gelu(torch.from_numpy(specials), approximate="tanh").numpy()
    out = lib.f("gelu_tanh", specials)
    assert np.array_equal(np.isnan(out), np.isnan(want)) and out[0] == np.inf
    assert out[3] == 0 and out[5] == specials[5] and (out[6] == 0 or np.isnan(want[6]))


def test_small_arguments_relative(lib):
    # expm1 / log1p / tanh / erf keep full relative accuracy (and the sign of zero) near 0
    x = np.concatenate([np.geomspace(1e-45, 1e-2, 20_000), -np.geomspace(1e-45, 1e-2, 20_000),
                        [0.0, -0.0]]).astype(np.float32)
    for name, bound in [("expm1", 1.0), ("log1p", 2.0), ("tanh", 1.5), ("erf", 1.5)]:
        got = lib.f(name, x)
        assert _ulp_error(got, _torch64(name, x)) <= bound, name
        assert np.array_equal(np.signbit(got), np.signbit(x)), name


def test_exp_subnormal_and_overflow(lib):
    x = np.linspace(-110.0, -80.0, 50_001, dtype=np.float32)
    got = lib.f("exp", x)
    ref = _torch64("exp", x)
    # gradual underflow: within 1 ulp (= 2^-149 for subnormal results), never flushed early
    assert _ulp_error(got, ref) <= 1.0
    assert _ulp_error(got, _torch("exp", x)) <= 1.0  # torch keeps subnormals, too
    assert np.all(got[ref > 2.0 ** -149] > 0)
    assert np.all(got[ref < 2.0 ** -151] == 0)
    hi = np.array([88.72, 88.7228, np.nextafter(np.float32(88.72284), np.float32(0)), 88.72284,
                   88.7229, 89.0, 1e10], dtype=np.float32)
    np.testing.assert_array_equal(lib.f("exp", hi), _torch("exp", hi))


def test_exp_far_below_zero_computes_no_underflow(lib):
    """exp(x) for x < -104 is 0 by selection, not by an underflowing product: on Intel cores every
    subnormal or underflowing result is a microcode assist, and a vectorized loop computes every
    lane (a softmax whose inputs drifted far below their row maximum ran 5.7x slower)."""
    far = np.concatenate([np.linspace(-1e4, -104.01, 10_001), [-np.inf, -3e38]]).astype(np.float32)
    assert np.all(lib.f("exp", far) == 0)
    assert lib.underflows("exp", np.array([-95.0], dtype=np.float32))  # a true subnormal result still is one
    if lib.variant == "portable":
        # baseline x86-64 (SSE2, no blends): GCC if-converts the clamp into a select after the
        # arithmetic, which then runs on the unclamped lanes; rare inputs (52 of 62,500 sampled
        # over [-12000, -104]) still underflow there. Kernels build with -march=native by default.
        return
    assert not lib.underflows("exp", far)
    assert not lib.underflows("sigmoid", -far) and not lib.underflows("sigmoid", far)


def test_exp_neg_normal_is_exp_where_normal_and_zero_below(lib):
    """ap_exp_neg_normal(s) = e^-s within ap_exp's ulps for s <= 87 (every result normal), an exact 0
    above, never an underflow (softmax numerators, gelu's erfc); NaN stays NaN, +inf gives 0."""
    s = np.concatenate([np.linspace(0.0, 87.0, 200_001), [1e-30, 0.5, 86.999]]).astype(np.float32)
    got = lib.f("exp_neg_normal", s)
    assert _ulp_error(got, _torch64("exp", -s)) <= 1.0 and np.all(got >= np.finfo(np.float32).tiny)
    np.testing.assert_array_equal(got, lib.f("exp", -s))   # the same value as ap_exp where that is normal
    far = np.concatenate([np.linspace(87.0001, 1e4, 10_001), [np.inf, 3e38]]).astype(np.float32)
    assert np.all(lib.f("exp_neg_normal", far) == 0) and not lib.underflows("exp_neg_normal", far)
    assert np.isnan(lib.f("exp_neg_normal", np.array([np.nan], np.float32))).all()


def test_special_values(lib):
    inf, nan = np.inf, np.nan
    checks = {
        "exp": ([-inf, inf, nan, 0.0, -0.0, 89.0, -200.0], [0.0, inf, nan, 1.0, 1.0, inf, 0.0]),
        "expm1": ([-inf, inf, nan, 0.0, -0.0, 89.0], [-1.0, inf, nan, 0.0, -0.0, inf]),
        "log": ([0.0, -0.0, -1.0, -inf, inf, nan, 1.0], [-inf, -inf, nan, nan, inf, nan, 0.0]),
        "log1p": ([-1.0, -2.0, inf, -inf, nan, 0.0, -0.0], [-inf, nan, inf, nan, nan, 0.0, -0.0]),
        "tanh": ([inf, -inf, nan, 0.0, -0.0, 50.0], [1.0, -1.0, nan, 0.0, -0.0, 1.0]),
        "sigmoid": ([-inf, inf, nan, 0.0, -0.0, -200.0], [0.0, 1.0, nan, 0.5, 0.5, 0.0]),
        "erf": ([inf, -inf, nan, 0.0, -0.0, 10.0], [1.0, -1.0, nan, 0.0, -0.0, 1.0]),
    }
    for name, (xs, want) in checks.items():
        got = lib.f(name, xs)
        want = np.array(want, np.float32)
        assert np.array_equal(got.view(np.uint32)[~np.isnan(want)],
                              want.view(np.uint32)[~np.isnan(want)]), (name, got)
        assert np.array_equal(np.isnan(got), np.isnan(want)), (name, got)
        _same_specials(got, _torch(name, np.array(xs, np.float32)))
    # log of subnormals
    sub = np.array([1e-45, 1e-40, 5e-39, 1.1754942e-38], np.float32)
    assert _ulp_error(lib.f("log", sub), _torch64("log", sub)) <= 1.0


def test_sigmoid_tail(lib):
    x = np.linspace(-110.0, -80.0, 30_001, dtype=np.float32)
    got = lib.f("sigmoid", x)
    # accurate down to the subnormal range; torch flushes to 0 below -88.72: absolute agreement
    assert _ulp_error(got, _torch64("sigmoid", x)) <= 2.0
    assert np.max(np.abs(got.astype(np.float64) - _torch("sigmoid", x))) <= 1.2e-38


def test_erf(lib):
    x = _inputs(-5.0, 5.0)
    got = lib.f("erf", x)
    _same_specials(got, _torch("erf", x))
    fin = np.isfinite(x)
    # torch's float32 erf is itself only ~1e-7 accurate (Abramowitz-Stegun style)
    assert np.max(np.abs(got[fin] - _torch("erf", x)[fin])) <= 1e-6
    assert np.max(np.abs(got[fin] - _torch64("erf", x)[fin])) <= 1.5e-7
    assert _ulp_error(got, _torch64("erf", x)) <= 2.0


def test_nearbyint(lib):
    x = np.concatenate([
        np.arange(-20, 20, 0.25, dtype=np.float32), np.arange(-20, 20, 0.5, dtype=np.float32) + 0.5,
        _rng_values(50_000), SPECIALS,
        np.array([8388607.5, -8388607.5, 8388609.0, 4194304.5, 0.49999997, -0.49999997],
                 np.float32)]).astype(np.float32)
    got = lib.f("nearbyint", x)
    ref = torch.round(torch.from_numpy(x)).numpy()
    assert np.array_equal(got.view(np.uint32)[~np.isnan(ref)], ref.view(np.uint32)[~np.isnan(ref)])
    assert np.array_equal(np.isnan(got), np.isnan(ref))


# ------------------------------------------------------------------------------------------------
# bf16 / fp16 conversions
# ------------------------------------------------------------------------------------------------

def _all16():
    return np.arange(65536, dtype=np.uint32).astype(np.uint16)


def _bits32(x):
    return np.asarray(x, np.float32).view(np.uint32)


def _torch_from16(bits, dtype):
    return torch.from_numpy(bits.view(np.int16).copy()).view(dtype).float().numpy()


def _torch_to16(x, dtype):
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(dtype).view(torch.int16) \
        .numpy().view(np.uint16)


@pytest.mark.parametrize("name,dtype", [("bf16_to_f32", torch.bfloat16),
                                        ("f16_to_f32", torch.float16)])
def test_from_16bit_all_patterns(lib, name, dtype):
    bits = _all16()
    got = lib.from16(name, bits)
    ref = _torch_from16(bits, dtype)
    # bit-exact for all 65536 patterns, NaN payloads (and F16C quieting) included
    np.testing.assert_array_equal(_bits32(got), _bits32(ref))


def _f32_cases():
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 2 ** 32, 300_000, dtype=np.uint64).astype(np.uint32)
    # every bf16 / f16 value, the ties between neighbours and one float32 ulp either side
    b = _all16().astype(np.uint32) << 16
    bf_ties = np.concatenate([b, b | 0x8000, (b | 0x8000) - 1, (b | 0x8000) + 1])
    h = _torch_from16(_all16(), torch.float16)
    h = h[np.isfinite(h)].astype(np.float64)
    hs = np.sort(np.unique(h))
    mids = (hs[:-1] + hs[1:]) / 2  # exact in float32 (halves have 11 significant bits)
    mids = mids.astype(np.float32)
    f16_ties = np.concatenate([h.astype(np.float32), mids, np.nextafter(mids, np.float32(np.inf)),
                               np.nextafter(mids, np.float32(-np.inf))])
    edge = np.array([65504.0, 65519.0, 65519.996, 65520.0, 65535.0, 65536.0, 1e5, -65520.0,
                     3.3895314e38, 3.4028235e38, 2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0000001,
                     2.0 ** -14, 2.0 ** -15 * 3, 1e-40, -1e-40, 1e-45, 0.0, -0.0, np.inf, -np.inf],
                    np.float32)
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FA00000, 0x7FFFFFFF,
                     0xFF812345, 0x7F80FFFF, 0x7FBFFFFF], np.uint32).view(np.float32)
    return np.concatenate([raw.view(np.float32), bf_ties.view(np.float32), f16_ties, edge, nans,
                           SPECIALS])


@pytest.mark.parametrize("name,dtype", [("f32_to_bf16", torch.bfloat16),
                                        ("f32_to_f16", torch.float16)])
def test_to_16bit(lib, name, dtype):
    x = _f32_cases()
    got = lib.to16(name, x)
    ref = _torch_to16(x, dtype)
    isnan_x = np.isnan(x)
    # non-NaN inputs: bit-exact (RNE, ties, subnormals, overflow to inf)
    np.testing.assert_array_equal(got[~isnan_x], ref[~isnan_x])
    # NaN stays NaN (and keeps its sign)
    exp_mask, man_mask = (0x7F80, 0x007F) if dtype == torch.bfloat16 else (0x7C00, 0x03FF)
    g = got[isnan_x]
    assert np.all((g & exp_mask) == exp_mask) and np.all((g & man_mask) != 0)
    assert np.array_equal(g >> 15, (_bits32(x[isnan_x]) >> 31).astype(np.uint16))
    if dtype == torch.float16:  # torch's fp16 NaN rule is stable: match it bit for bit
        np.testing.assert_array_equal(g, ref[isnan_x])
    # the round-trip helpers equal conversion followed by widening
    rt = "round_bf16" if dtype == torch.bfloat16 else "round_f16"
    back = "bf16_to_f32" if dtype == torch.bfloat16 else "f16_to_f32"
    np.testing.assert_array_equal(_bits32(lib.f(rt, x)), _bits32(lib.from16(back, got)))
    tr = torch.from_numpy(x[~isnan_x]).to(dtype).float().numpy()
    np.testing.assert_array_equal(_bits32(lib.f(rt, x[~isnan_x])), _bits32(tr))


# ------------------------------------------------------------------------------------------------
# vectorization
# ------------------------------------------------------------------------------------------------

def test_loops_vectorized(lib):
    done = lib.vectorized_loops()
    want = {"exp", "expm1", "log", "log1p", "tanh", "sigmoid", "erf", "nearbyint", "exp_neg_normal"}
    if lib.variant == "native":
        want |= {"round_bf16", "round_f16", "f32_to_bf16", "f32_to_f16", "bf16_to_f32",
                 "f16_to_f32"}
    missing = want - done
    assert not missing, f"not vectorized: {sorted(missing)}\n{lib.opt_info[-3000:]}"


def test_header_compiles_strict(tmp_path):
    """The header alone compiles cleanly as C++17 with -Wall -Wextra (-pedantic), no torch."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not available")
    src = tmp_path / "only.cpp"
    src.write_text('#include "ascendc_pack/kernel_math.h"\n'
                   '#include "ascendc_pack/kernel_math.h"\n'  # include guard
                   "float f(float x) { return ap_exp(x) + ap_log(x) + ap_erf(x); }\n")
    res = subprocess.run(["g++", "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-Wshadow",
                          "-fsyntax-only", f"-I{INCLUDE_DIR}", str(src)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    includes = re.findall(r"^\s*#\s*include\s*[<\"]([^>\"]+)", HEADER.read_text(), re.M)
    assert set(includes) <= {"stdint.h", "string.h"}, includes
