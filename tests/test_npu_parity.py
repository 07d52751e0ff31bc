"""npu parity: every op family x dtype through npu candidates in the AscendC emulation vs eager.

Each case captures a function, fuses it, and for every fused kernel renders npu candidates
(AscendC Vector kernels, :mod:`ascendc_pack.backends.npu`), compiles them with g++ against the AscendC
emulation (``runtime/include/ascendc_pack/ascendc_emu``, which enforces the documented rules:
UB capacity, 32-byte alignment, queue discipline, bounds) and runs them on the kernel's real
arguments; every candidate's outputs must match the kernel's reference ATen steps, and the
whole program must match eager PyTorch (tolerances of tests/kernel_check.py: float32 2e-5,
float16 2e-3, bfloat16 1.6e-2, bool/int exact).

The families reuse tests/test_kernel_parity.py's input generators; they leave out the ops the
npu generator does not lower (floor division, log1p/expm1, general powers, sin/cos, integer
arithmetic: those kernels stay ATen, see ``test_unsupported_kernels_stay_aten``). float16 and
bfloat16 compute as the hardware does: Cast to float32, compute, Cast back where the graph's
dtype is 16-bit (bfloat16 has no Vector arithmetic on Atlas A2/A3).

Default run: per kernel, the best candidate of each kind (row resident / row streaming /
split across cores), compiled once per distinct source. ``ASCENDC_PACK_NPU_FULL=1``: every
candidate (topn 10) of every case, and the whole cpu parity list (marked ``slow``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from tests.npu_check import FULL, check_npu
from tests.test_kernel_parity import BF16, CASES, F16, F32, SHORT, cast, mask, rand, randint, randn, special

FLOATS = [F32, F16, BF16]


@dataclass
class NCase:
    id: str
    fn: object
    inputs: list
    fused: int | None = None  # fused kernels expected (None: at least one); the npu generator must express all


NPU_CASES: list[NCase] = []


def case(id, fn, *inputs, fused=None):
    NPU_CASES.append(NCase(id, fn, list(inputs), fused))


def arith(x, y):
    return (x + y, torch.sub(x, y, alpha=2), x * y, x / y, torch.div(x, y, rounding_mode="trunc"), -x,
            torch.maximum(x, y), torch.minimum(x, y), x + 2.5, 3 - x, x * 0.5, x / 3, torch.sub(x, 1.5, alpha=2))


def unary(x):
    return (torch.exp(x), torch.log(x), torch.sqrt(x), torch.rsqrt(x), torch.reciprocal(x), torch.abs(x), -x,
            torch.floor(x), torch.ceil(x), torch.round(x), torch.trunc(x), torch.relu(x), torch.sigmoid(x),
            torch.tanh(x), torch.erf(x), torch.exp2(x), torch.square(x))


def activations(x):
    return (F.gelu(x), F.gelu(x, approximate="tanh"), F.silu(x), F.relu(x), torch.sigmoid(x), torch.tanh(x),
            F.leaky_relu(x, 0.1), F.hardtanh(x), F.relu6(x))


def pow_ops(x):
    return x ** 2, x ** 3, x ** 0.5, x ** -1, torch.pow(x, 0), x ** -0.5, torch.pow(x, -2)


def clamp_where(x, y, m):
    return (torch.clamp(x, min=-0.5), torch.clamp(x, max=0.5), torch.clamp(x, -0.5, 0.5), torch.where(m, x, y),
            torch.where(x > 0, x, 0.0), torch.where(m, 1.0, y), x.masked_fill(m, float("-inf")), torch.round(x * 3))


def comparisons(x, y):
    return (x == y, x != y, x < y, x <= y, x > y, x >= y, x == 0.5, x < 0, x >= 1, torch.isnan(x), torch.isinf(x))


def logical(a, b):
    return (a & b, a | b, a ^ b, ~a, torch.logical_and(a, b), torch.logical_xor(a, b), (a & b) | ~a,
            torch.where(a, b, ~b))


def casts(x):
    return (cast(x, F16), cast(x, BF16), cast(x, F32), cast(x, torch.int32), cast(x, torch.bool),
            cast(cast(x, F16), F32), cast(cast(x, BF16), F32), cast(cast(x, F16), BF16))


def reductions(x):
    v, m = torch.var_mean(x, -1, correction=1)
    return (x.sum(-1), x.mean(-1, keepdim=True), x.var(-1, correction=0), v, m, x.amax(-1), x.amin(-1),
            (x > 0).any(-1), (x > -1).all(-1))


for dt in FLOATS:
    s = SHORT[dt]
    case(f"arith-{s}", arith, randn(37, 1001, dtype=dt), randn(37, 1001, dtype=dt))
    case(f"unary-{s}", unary, special(33, 129, dtype=dt))
    case(f"activations-{s}", activations, randn(13, 257, dtype=dt, scale=3.0))
    case(f"pow-{s}", pow_ops, rand(11, 67, lo=0.1, hi=3.0, dtype=dt))
    case(f"clamp-where-{s}", clamp_where, randn(23, 47, dtype=dt), randn(23, 47, dtype=dt), mask(23, 47))
    xx = randn(19, 53, dtype=dt)
    case(f"compare-{s}", comparisons, xx, torch.where(mask(19, 53, p=0.3), xx, randn(19, 53, dtype=dt)))
    case(f"reduce-inner-{s}", reductions, randn(6, 37, 29, dtype=dt, offset=1.0))
    case(f"softmax-{s}", lambda x: torch.softmax(x, -1), randn(16, 77, dtype=dt, scale=4))
    case(f"log-softmax-{s}", lambda x: torch.log_softmax(x, -1), randn(16, 77, dtype=dt, scale=4))
    case(f"layer-norm-{s}", lambda x, w, b: F.layer_norm(x, (96,), w, b, eps=1e-5), randn(3, 11, 96, dtype=dt),
         randn(96, dtype=dt), randn(96, dtype=dt))
    case(f"rms-norm-{s}", lambda x, w: F.rms_norm(x, (64,), w, eps=1e-6), randn(12, 64, dtype=dt), randn(64, dtype=dt))
case("unary-f32-specials-big-row", unary, special(2, 5000))
case("casts-f32", casts, randn(17, 61, scale=50.0))
case("casts-overflow-denormal", lambda x: (cast(x, F16), cast(x, BF16), cast(cast(x, F16), F32), cast(x, torch.bool)),
     torch.tensor([70000.0, -70000.0, 65504.0, 65520.0, 65519.0, 1e-8, -1e-8, 6e-8, 3e-8, 1e-40, 3.4e38,
                   float("inf"), float("-inf"), float("nan"), 0.0, -0.0]))
case("casts-from-bool-int32", lambda m, a: (cast(m, F32) * 2 - 1, cast(m, F16), cast(a, F32) * 0.5, cast(a, BF16)),
     mask(17, 61), randint(17, 61, lo=-300, hi=300, dtype=torch.int32))
case("logical-bool", logical, mask(5, 40), mask(5, 40))
case("logical-from-float", lambda x, y: (torch.logical_and(x, y), torch.logical_or(x > 0, y), torch.logical_not(x)),
     torch.where(mask(9, 31), 0.0, randn(9, 31)), torch.where(mask(9, 31), 0.0, randn(9, 31)))
case("reduce-specials", lambda x: (x.amax(-1), x.amin(-1), x.sum(-1), x.mean(-1)), special(8, 45))
case("reduce-all", lambda x: (x.sum(), x.amax(), x.mean()), randn(6, 37, 29, offset=1.0))
case("reduce-row-100k", lambda x: (x.sum(-1), x.amax(-1), x.mean(-1), x.var(-1)), randn(3, 100003))
case("reduce-rows-split", lambda x: (x.sum(-1), x - x.amax(-1, keepdim=True)), randn(2, 30000))
case("any-all-float", lambda x: (x.any(-1), x.all(-1)), torch.where(mask(6, 13), 0.0, randn(6, 13)))
case("softmax-specials", lambda x: torch.softmax(x, -1),
     torch.tensor([[0.0, 1.0, float("-inf"), 2.0, 1e-40], [float("-inf")] * 5, [1.0, float("nan"), 0.0, 1.0, 1.0],
                   [float("inf"), 1.0, 0.0, -1.0, float("-inf")], [88.0, 89.0, 100.0, -100.0, 1e-45]]))
case("softmax-masked", lambda x, m: torch.softmax(x.masked_fill(m, float("-inf")), -1),
     randn(64, 77), torch.cat([mask(63, 77, p=0.8), torch.ones(1, 77, dtype=torch.bool)]))
case("softmax-row-100k", lambda x: torch.softmax(x, -1), randn(2, 100003, scale=3))
case("layer-norm-wide", lambda x: F.layer_norm(x, (1001,)), randn(7, 1001, offset=5.0))
case("logsumexp", lambda x: torch.logsumexp(x, -1), randn(9, 55, scale=5.0))
case("add-sum-broadcast-subrows", lambda x, y: torch.add(x, y).sum(), randn(32, 1024), randn(1, 1024))
case("reduce-outer-inner-subrows", lambda x: (x.sum((0, 2), keepdim=True), x.mean((0, 2))), randn(6, 37, 29))
case("per-row-scalars", lambda x, w, b: torch.relu((x - x.mean(-1, keepdim=True)) * w + b),
     randn(4, 8, 300), randn(1, 8, 1), randn(1, 8, 1))
case("row-broadcast-store", lambda x, y: (x.sum(-1, keepdim=True).expand(-1, 5) * y + 1, torch.full((6, 5), 2.5) + y),
     randn(6, 11), randn(6, 5), fused=2)
case("mlp-epilogue-bf16", lambda x, b: cast(F.gelu(x + b, approximate="tanh"), F32).sum(-1),
     randn(8, 131, dtype=BF16), randn(131, dtype=BF16))
case("masked-mean", lambda x, m: (x * m).sum(-1) / m.sum(-1).clamp(min=1), randn(7, 29), mask(7, 29).float())
for dt in FLOATS:  # col layout: reductions over outer (strided) axes, vectors across columns
    case(f"reduce-outer-{SHORT[dt]}", lambda x: (x.sum(0), x.mean(0), x.amax(0), x.amin(0), x.var(0)),
         randn(50, 37, 29, dtype=dt, offset=1.0))
case("reduce-middle", lambda x: (x.sum(1, keepdim=True), x.mean(1), (x > 0).any(1)), randn(6, 37, 29))
case("softmax-dim0", lambda x: torch.softmax(x, 0), randn(50, 21))
case("abs-amax-dim0", lambda x, b: (x + b).abs().amax(dim=0), randn(512, 300), randn(300))
case("reduce-outer-specials", lambda x: (x.amax(0), x.amin(0), x.sum(0)), special(45, 8))
case("pointwise-flat-big", lambda x, y: (x * y + x, torch.maximum(x, y) - 1), randn(2, 100003), randn(1, 100003))


@pytest.fixture(scope="module")
def npu_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("npu_parity")


@pytest.mark.parametrize("c", NPU_CASES, ids=[c.id for c in NPU_CASES])
def test_npu_parity(c: NCase, npu_cache):
    report = check_npu(c.fn, [t.clone() for t in c.inputs], npu_cache, expect_fused=c.fused or True)
    assert not report.failures, "\n".join(map(str, report.failures[:10]))
    assert not report.unsupported, f"the npu generator should express these kernels: {report.unsupported}"
    assert report.npu_kernels == report.fused_kernels
    assert report.candidates_run >= report.npu_kernels


UNSUPPORTED = {
    "arith-f32-37x1001": "div_floor",
    "mix-f32-permuted": "stride 40",  # stored in x.permute's order (eager's), y is read across its rows
    "int-arith-i64": "int64",
    "unary-f32": "log1p",
    "reduce-f32-permuted-input": "last reduced axis with stride",
    "casts-bool": "int",
}


@pytest.mark.parametrize("case_id", sorted(UNSUPPORTED))
def test_unsupported_kernels_stay_aten(case_id, npu_cache):
    """A kernel the generator cannot express says why and runs as its ATen steps (never wrong)."""
    c = next(c for c in CASES if c.id == case_id)
    report = check_npu(c.fn, [t.clone() for t in c.inputs], npu_cache, expect_fused=c.fused)
    assert report.unsupported, "expected an unsupported kernel"
    assert all(r.startswith("unsupported: ") for r in report.unsupported.values())
    assert any(UNSUPPORTED[case_id] in r for r in report.unsupported.values()), report.unsupported
    assert not report.failures, "\n".join(map(str, report.failures[:10]))


@pytest.mark.slow
@pytest.mark.skipif(not FULL, reason="the whole cpu parity list on npu runs with ASCENDC_PACK_NPU_FULL=1")
@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_cpu_parity_cases_on_npu(c, npu_cache):
    """The whole cpu parity list: every kernel is either an npu kernel matching eager or ATen."""
    report = check_npu(c.fn, [t.clone() for t in c.inputs], npu_cache, atol=c.atol, rtol=c.rtol,
                       expect_fused=c.fused)
    assert not report.failures, "\n".join(map(str, report.failures[:10]))


def test_npu_case_ids_unique():
    ids = [c.id for c in NPU_CASES]
    assert len(ids) == len(set(ids))
