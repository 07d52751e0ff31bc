"""The AscendC CPU emulation (runtime/include/ascendc_pack/ascendc_emu, docs/ASCENDC_EMU.md).

Hand-written AscendC kernels (tests/ascendc_kernels/*.cpp, the documented style) are compiled with
g++ against the emulation's kernel_operator.h and run through the ap_emu_launch C ABI on torch
tensors. Results are checked against eager torch (and, for rounding, against the worked examples of
the AscendC precision-conversion page); kernels that break a documented rule must come back with a
non-zero status and a message naming the rule. Each kernel file is compiled once per module.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from ascendc_pack.toolchain.compiler import runtime_include_dir

KERNELS = Path(__file__).resolve().parent / "ascendc_kernels"
CXX_FLAGS = ["-std=c++17", "-O1", "-shared", "-fPIC", "-Wall", "-Wextra", "-Wno-unused-parameter",
             "-Werror"]
RULE_VIOLATION, BAD_LAUNCH = 1, 2

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def emu_include() -> Path:
    return runtime_include_dir() / "ascendc_pack" / "ascendc_emu"


class _Buffer(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("bytes", ctypes.c_uint64)]


class _Options(ctypes.Structure):
    _fields_ = [("soc", ctypes.c_char_p), ("disable_asc_reserved_ubuf", ctypes.c_int32)]


class EmuKernels:
    """A compiled kernel library and its ap_emu_launch entry point."""

    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        self.lib.ap_emu_launch.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.POINTER(_Buffer),
                                           ctypes.c_uint32, ctypes.POINTER(_Options), ctypes.c_char_p,
                                           ctypes.c_uint64]
        self.lib.ap_emu_launch.restype = ctypes.c_int32

    def launch(self, kernel: str, block_dim: int, *tensors: torch.Tensor, soc: str | None = None,
               disable_asc_reserved_ubuf: bool = False) -> tuple[int, str]:
        """Runs `kernel` on block_dim blocks with each tensor as one GM_ADDR; (status, message)."""
        fn = ctypes.cast(getattr(self.lib, kernel), ctypes.c_void_p)
        bufs = (_Buffer * len(tensors))(*[_Buffer(t.data_ptr(), t.numel() * t.element_size())
                                          for t in tensors])
        opts = _Options(soc.encode() if soc else None, int(disable_asc_reserved_ubuf))
        err = ctypes.create_string_buffer(4096)
        status = self.lib.ap_emu_launch(fn, block_dim, bufs, len(tensors), ctypes.byref(opts), err,
                                        len(err))
        return status, err.value.decode()

    def run(self, kernel: str, block_dim: int, *tensors: torch.Tensor, **kw) -> None:
        status, message = self.launch(kernel, block_dim, *tensors, **kw)
        assert status == 0, message


def compile_kernel(src: Path, out: Path, std: str = "c++17", shared: bool = True, defines=(),
                   expect_error: bool = False):
    """Compile a kernel library; with ``expect_error`` return the compiler's stderr (it must fail)."""
    flags = [f if f != "-std=c++17" else f"-std={std}" for f in CXX_FLAGS]
    if not shared:
        flags = [f for f in flags if f not in ("-shared", "-fPIC")]
    cmd = ["g++", *flags, *[f"-D{d}" for d in defines], f"-I{emu_include()}", "-include", "ap_emu_launch.h",
           str(src), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if expect_error:
        assert proc.returncode != 0, f"{' '.join(cmd)} compiled, expected a refusal"
        return proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
    return out


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """kernels("name") -> EmuKernels for tests/ascendc_kernels/name.cpp, compiled once."""
    out_dir = tmp_path_factory.mktemp("ascendc_emu")
    cache: dict[str, EmuKernels] = {}

    def get(name: str) -> EmuKernels:
        if name not in cache:
            cache[name] = EmuKernels(compile_kernel(KERNELS / f"{name}.cpp", out_dir / f"{name}.so"))
        return cache[name]

    return get


def i32(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def probe_params(n: int, arg0: int = 0, arg1: int = 0, arg2: int = 0, value: float = 0.0):
    """The ProbeParams struct of ops_probe.cpp (four uint32 and a float)."""
    p = torch.zeros(5, dtype=torch.int32)
    p[:4] = torch.tensor([n, arg0, arg1, arg2], dtype=torch.int32)
    p[4:].view(torch.float32)[0] = value
    return p


def split(total: int, block_dim: int, align: int) -> int:
    """Elements per block: ceil(total / block_dim) rounded up to `align`."""
    return (-(-total // block_dim) + align - 1) // align * align


# --------------------------------------------------------------------------- packaging / ABI

def test_headers_are_package_data():
    # pyproject ships runtime/include/**/*.h and **/*.hpp as package data: every emulation
    # header must carry one of those suffixes, and the installed include dir must have them.
    inc = emu_include()
    headers = sorted(p.relative_to(inc).as_posix() for p in inc.rglob("*") if p.is_file())
    assert "kernel_operator.h" in headers and "ap_emu_launch.h" in headers
    assert all(h.endswith((".h", ".hpp")) for h in headers), headers
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert '"ascendc_pack_runtime.include" = ["**/*.h", "**/*.hpp"]' in pyproject


def test_soc_profiles_and_bad_launches(kernels):
    lib = kernels("add_custom").lib
    vec, ub, usable = ctypes.c_uint32(), ctypes.c_uint32(), ctypes.c_uint32()
    assert lib.ap_emu_soc_info(b"Ascend910B2", ctypes.byref(vec), ctypes.byref(ub),
                               ctypes.byref(usable)) == 0
    assert (vec.value, ub.value, usable.value) == (48, 192 * 1024, 192 * 1024 - 256 - 8192)
    assert lib.ap_emu_soc_info(b"Ascend910B4", ctypes.byref(vec), None, None) == 0
    assert vec.value == 40
    assert lib.ap_emu_soc_info(b"Ascend310P3", None, None, None) == BAD_LAUNCH
    add = kernels("add_custom")
    x = torch.zeros(8)
    tiling = i32(8, 8, 8)
    status, message = add.launch("add_custom", 1, x, x, x, tiling, soc="Ascend999")
    assert status == BAD_LAUNCH and "unknown SoC 'Ascend999'" in message and "Ascend910B2" in message
    status, message = add.launch("add_custom", 0, x, x, x, tiling)
    assert status == BAD_LAUNCH and "block_dim 0" in message


# ---------------------------------------------------------------------------- the kernels

@pytest.mark.parametrize("total,block_dim,tile", [
    (1000, 4, 64),    # tails inside every block
    (4096, 8, 128),   # whole tiles only (DataCopy)
    (37, 3, 16),      # short blocks, last block short
    (1, 1, 8),
    (5000, 48, 64),   # one block per vector core
    (100, 20, 8),     # more blocks than data: trailing blocks idle
])
def test_add_double_buffered_with_tail(kernels, total, block_dim, tile):
    torch.manual_seed(total)
    x, y = torch.randn(total), torch.randn(total)
    z = torch.full((total,), float("nan"))
    kernels("add_custom").run("add_custom", block_dim, x, y, z,
                              i32(total, split(total, block_dim, 8), tile))
    assert torch.equal(z, x + y)


def test_add_builds_as_cxx20(tmp_path):
    lib = EmuKernels(compile_kernel(KERNELS / "add_custom.cpp", tmp_path / "add20.so", std="c++20"))
    x, y, z = torch.randn(300), torch.randn(300), torch.empty(300)
    lib.run("add_custom", 2, x, y, z, i32(300, 152, 64))
    assert torch.equal(z, x + y)


@pytest.mark.parametrize("rows,cols,block_dim", [(3, 1000, 8), (2, 77, 4), (4, 64, 1), (2, 100, 48)])
def test_softmax_with_cross_core_partials(kernels, rows, cols, block_dim):
    torch.manual_seed(cols)
    x = torch.randn(rows, cols) * 3
    out = torch.full_like(x, float("nan"))
    workspace = torch.full((2 * rows * block_dim,), float("nan"))
    chunk = split(cols, block_dim, 8)
    kernels("softmax_cross_core").run("softmax_cross_core", block_dim, x, out, workspace,
                                      i32(rows, cols, chunk))
    torch.testing.assert_close(out, torch.softmax(x, dim=-1), rtol=1e-5, atol=1e-7)
    # The workspace holds every block's partial row maximum (-inf for blocks without columns).
    padded = torch.full((rows, chunk * block_dim), float("-inf"))
    padded[:, :cols] = x
    partial_max = padded.view(rows, block_dim, chunk).amax(-1)
    assert torch.equal(workspace[:rows * block_dim].view(rows, block_dim), partial_max)


def test_syncall_needs_all_blocks_resident(kernels):
    x, out = torch.randn(2, 100), torch.empty(2, 100)
    lib = kernels("softmax_cross_core")
    for soc, cores in [("Ascend910B2", 48), ("Ascend910B4", 40)]:
        ws = torch.zeros(2 * 2 * (cores + 1))
        lib.run("softmax_cross_core", cores, x, out, ws, i32(2, 100, 8), soc=soc)
        status, message = lib.launch("softmax_cross_core", cores + 1, x, out, ws, i32(2, 100, 8), soc=soc)
        assert status == RULE_VIOLATION
        assert f"block_dim {cores + 1} > the {cores} vector cores of {soc}" in message


def test_float16_kernel_matches_eager_bitwise(kernels):
    torch.manual_seed(0)
    n = 3001
    x, y = (torch.randn(n) * 2).half(), (torch.randn(n) * 2).half()
    out = torch.full((n,), float("nan")).half()
    kernels("half_fused").run("half_fused", 4, x, y, out, i32(n, split(n, 4, 16), 256))
    t = (x * y + x).clamp(-4, 4)  # eager half ops round after every op, like the Vector unit
    ref = (torch.exp(t.float()) * 0.5).half()
    assert torch.equal(out, ref)


def _directed(x: torch.Tensor, dtype: torch.dtype, mode: str) -> torch.Tensor:
    """float32 x rounded to dtype (half/bfloat16) toward floor/ceil/trunc/round-away/odd."""
    rne = x.to(dtype)
    xd, r = x.double(), rne.double()
    down = torch.where(r > xd, torch.nextafter(rne, torch.full_like(rne, -float("inf"))), rne)
    up = torch.where(r < xd, torch.nextafter(rne, torch.full_like(rne, float("inf"))), rne)
    exact = r == xd
    if mode == "floor":
        return down
    if mode == "ceil":
        return up
    if mode == "trunc":
        return torch.where(xd >= 0, down, up)
    if mode == "round":  # ties away from zero
        tie = (xd - down.double()) == (up.double() - xd)
        return torch.where(exact, rne, torch.where(tie, torch.where(xd > 0, up, down), rne))
    if mode == "odd":
        odd_down = (down.view(torch.int16) & 1) == 1
        return torch.where(exact, rne, torch.where(odd_down, down, up))
    raise ValueError(mode)


ROUND = {"none": 0, "rint": 1, "floor": 2, "ceil": 3, "round": 4, "trunc": 5, "odd": 6}


@pytest.mark.parametrize("mode", ["rint", "floor", "trunc"])
def test_bfloat16_kernel_with_cast(kernels, mode):
    torch.manual_seed(1)
    n = 2000
    x, y = (torch.randn(n) * 4).bfloat16(), (torch.randn(n) * 4).bfloat16()
    out = torch.full((n,), float("nan")).bfloat16()
    kernels("bf16_fused").run("bf16_fused", 3, x, y, out, i32(n, split(n, 3, 16), 256, ROUND[mode]))
    body = (x.float() - y.float()).relu() * x.float()  # the float body, exact in float32
    ref = body.bfloat16() if mode == "rint" else _directed(body, torch.bfloat16, mode)
    assert torch.equal(out, ref)
    # Eager bfloat16 rounds after every op; the fused kernel rounds once.
    torch.testing.assert_close(out, (x - y).relu() * x, rtol=1.6e-2, atol=1e-5)


# ------------------------------------------------------------------------- instruction probes

# Worked examples of the AscendC precision-conversion page.
@pytest.mark.parametrize("kernel,value,expected", [
    ("cast_f32_f16", 0.5 + 2**-12, {"rint": 0.5, "floor": 0.5, "ceil": 0.5 + 2**-11,
                                    "round": 0.5 + 2**-11, "trunc": 0.5, "odd": 0.5 + 2**-11}),
    ("cast_f32_bf16", 0.5 + 2**-9 + 2**-11, {"rint": 0.5 + 2**-8, "floor": 0.5, "ceil": 0.5 + 2**-8,
                                             "round": 0.5 + 2**-8, "trunc": 0.5}),
    ("cast_f32_i32", 2**22 + 0.5, {"rint": 2**22, "floor": 2**22, "ceil": 2**22 + 1,
                                   "round": 2**22 + 1, "trunc": 2**22}),
    ("cast_i32_f32", 2**25 + 3, {"rint": 2**25 + 4, "floor": 2**25, "ceil": 2**25 + 4,
                                 "round": 2**25 + 4, "trunc": 2**25}),
])
def test_cast_reference_examples(kernels, kernel, value, expected):
    src_dtype = torch.int32 if kernel == "cast_i32_f32" else torch.float32
    dst_dtype = {"cast_f32_f16": torch.float16, "cast_f32_bf16": torch.bfloat16,
                 "cast_f32_i32": torch.int32, "cast_i32_f32": torch.float32}[kernel]
    lib = kernels("ops_probe")
    for mode, want in expected.items():
        x = torch.tensor([value, -value], dtype=src_dtype)
        out = torch.zeros(2, dtype=dst_dtype)
        lib.run(kernel, 1, x, out, probe_params(2, ROUND[mode]))
        assert out[0].item() == want, mode
        neg = {"floor": "ceil", "ceil": "floor"}.get(mode, mode)  # -x rounds mirrored
        assert out[1].item() == -expected[neg], mode


@pytest.mark.parametrize("dtype,kernel", [(torch.float16, "cast_f32_f16"),
                                          (torch.bfloat16, "cast_f32_bf16")])
@pytest.mark.parametrize("mode", ["none", "rint", "floor", "ceil", "round", "trunc", "odd"])
def test_cast_float_round_modes(kernels, dtype, kernel, mode):
    torch.manual_seed(2)
    x = torch.cat([torch.randn(900) * 100, torch.randn(100) * 1e-6, torch.tensor([0.0, -0.0, 1.0])])
    out = torch.zeros(x.numel(), dtype=dtype)
    if dtype == torch.bfloat16 and mode in ("none", "odd"):  # not in the A2/A3 Cast table
        status, message = kernels("ops_probe").launch(kernel, 1, x, out, probe_params(x.numel(), ROUND[mode]))
        assert status == RULE_VIOLATION and "is not accepted for float -> bfloat16_t" in message
        return
    kernels("ops_probe").run(kernel, 1, x, out, probe_params(x.numel(), ROUND[mode]))
    ref = x.to(dtype) if mode in ("none", "rint") else _directed(x, dtype, mode)
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16))


def test_cast_saturates_out_of_range(kernels):
    # "Overflow is handled in saturation mode by default" (precision-conversion page): finite
    # values beyond half's range give +-65504 where torch gives inf; inf and NaN pass through.
    x = torch.tensor([1e6, -1e6, 70000.0, float("inf"), -float("inf"), float("nan")])
    out = torch.zeros(6, dtype=torch.float16)
    lib = kernels("ops_probe")
    lib.run("cast_f32_f16", 1, x, out, probe_params(6, ROUND["rint"]))
    assert out[:5].tolist() == [65504.0, -65504.0, 65504.0, float("inf"), -float("inf")]
    assert out[5].isnan()
    ints = torch.zeros(4, dtype=torch.int32)
    lib.run("cast_f32_i32", 1, torch.tensor([3e9, -3e9, float("nan"), -2.5]), ints,
            probe_params(4, ROUND["round"]))
    assert ints.tolist() == [2**31 - 1, -2**31, 0, -3]


def assert_same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit-identical, except that any NaN matches any NaN."""
    bits = {2: torch.int16, 4: torch.int32}[want.element_size()]
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan].view(bits), want[~nan].view(bits))


def test_half_conversions_match_torch_bitwise(kernels):
    # Every half value, in UB-sized chunks (a 65536-element float buffer would not fit the UB).
    lib = kernels("ops_probe")
    every_half = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16)
    chunk = 8192
    widened = torch.empty(65536)
    for off in range(0, 65536, chunk):
        lib.run("cast_f16_f32", 1, every_half[off:off + chunk], widened[off:off + chunk],
                probe_params(chunk, ROUND["none"]))
    assert_same_bits(widened, every_half.float())
    # A half instruction rounds its float result like torch's half ops (overflow to inf,
    # subnormal results, ties to even).
    for scale in (3.0, 0.37, 1e-3, 65504.0):
        product = torch.empty(65536, dtype=torch.float16)
        for off in range(0, 65536, chunk):
            lib.run("muls_f16", 1, every_half[off:off + chunk], product[off:off + chunk],
                    probe_params(chunk, value=scale))
        assert_same_bits(product, every_half * torch.tensor(scale, dtype=torch.float16))


def test_cast_half_to_int32(kernels):
    x = torch.tensor([2.5, -2.5, 3.5, 1000.5, -0.25, 65504.0], dtype=torch.float16)
    expected = {"rint": [2, -2, 4, 1000, 0, 65504], "floor": [2, -3, 3, 1000, -1, 65504],
                "ceil": [3, -2, 4, 1001, 0, 65504], "round": [3, -3, 4, 1001, 0, 65504],
                "trunc": [2, -2, 3, 1000, 0, 65504]}
    for mode, want in expected.items():
        out = torch.zeros(6, dtype=torch.int32)
        kernels("ops_probe").run("cast_f16_i32", 1, x, out, probe_params(6, ROUND[mode]))
        assert out.tolist() == want, mode


CMP = {"LT": (0, torch.lt), "GT": (1, torch.gt), "EQ": (2, torch.eq), "LE": (3, torch.le),
       "GE": (4, torch.ge), "NE": (5, torch.ne)}


@pytest.mark.parametrize("cmp", list(CMP))
def test_compare_and_select(kernels, cmp):
    torch.manual_seed(3)
    n = 512  # whole 256-byte repeats
    x, y = torch.randn(n).round(decimals=1), torch.randn(n).round(decimals=1)
    y[::7] = x[::7]
    value = 0.2
    out, out2 = torch.empty(n), torch.empty(n)
    mode, op = CMP[cmp]
    kernels("ops_probe").run("compare_select", 1, x, y, out, out2, probe_params(n, mode, value=value))
    assert torch.equal(out, torch.where(op(x, y), x, y))
    v = torch.tensor(value, dtype=torch.float32)
    assert torch.equal(out2, torch.where(op(x, v), x, 2 * v))


def test_select_mode0_reuses_one_repeat_of_mask_bits(kernels):
    # VSEL_CMPMASK_SPR: "selMask's valid bits are limited to 256/sizeof(T); every repeat uses the
    # same bits" -- elements 64..127 of a float Select follow mask bits 0..63 again.
    torch.manual_seed(4)
    n = 128
    x, y = torch.randn(n), torch.randn(n)
    mask = torch.randint(0, 256, (32,), dtype=torch.uint8)
    out = torch.empty(n)
    kernels("ops_probe").run("select_mode0", 1, x, y, mask, out, probe_params(n))
    bits = ((mask[:8, None].int() >> torch.arange(8)) & 1).flatten().bool()  # bits 0..63
    assert torch.equal(out, torch.where(bits.repeat(2), x, y))


@pytest.mark.parametrize("n", [1, 7, 64, 65, 1000, 4000])
def test_count_form_reductions(kernels, n):
    torch.manual_seed(n)
    x = torch.randn(n)
    x[n // 2] = x.max() if n > 2 else x[n // 2]  # a repeated maximum: the first index wins
    out = torch.zeros(6)
    kernels("ops_probe").run("reductions", 1, x, out, probe_params(n))
    torch.testing.assert_close(out[0], x.sum(), rtol=1e-5, atol=1e-5)
    bits = out.view(torch.int32)  # the index is stored as int bits in a float slot
    assert (out[2].item(), bits[3].item()) == (x.max().item(), x.argmax().item())
    assert (out[4].item(), bits[5].item()) == (x.min().item(), x.argmin().item())


def test_half_reduce_sum_saturates_like_the_reference_example(kernels):
    # ReduceSum page: [60000, 60000, -30000, 100] -> 60000 + 60000 saturates to 65504 (not inf),
    # -30000 + 100 = -29900, 65504 - 29900 = 35604. The page does the arithmetic in exact
    # decimals; every partial is a half on the device: -29900 -> -29904, 65504 - 29904 = 35600
    # -> 35584 (ties to even at a spacing of 32). Eager torch.sum gives inf here.
    x = torch.tensor([60000, 60000, -30000, 100], dtype=torch.float16)
    out = torch.zeros(1, dtype=torch.float16)
    kernels("ops_probe").run("reduce_sum_half", 1, x, out, probe_params(4))
    assert out.item() == 35584.0
    assert x.sum().isinf()


@pytest.mark.parametrize("mask", [64, 10])
def test_whole_reduce_per_row(kernels, mask):
    torch.manual_seed(mask)
    rows = 5
    x = torch.randn(rows, 64)
    sums, maxes = torch.empty(rows), torch.empty(2 * rows)
    kernels("ops_probe").run("whole_reduce", 1, x, sums, maxes, probe_params(0, rows, mask))
    active = x[:, :mask]
    torch.testing.assert_close(sums, active.sum(1), rtol=1e-5, atol=1e-6)
    pairs = maxes.view(rows, 2)
    assert torch.equal(pairs[:, 0], active.amax(1))
    assert torch.equal(pairs[:, 1].view(torch.int32), active.argmax(1).int())


def test_data_copy_pad_layout(kernels):
    lib = kernels("ops_probe")
    x = torch.arange(1.0, 6.0)  # 5 floats = 20 bytes
    out = torch.full((256,), -1.0)
    lib.run("pad_layout", 1, x, out, probe_params(5, 2, 1, 1, value=9.5))  # isPad with a value
    assert out[:8].tolist() == [9.5, 9.5, 1, 2, 3, 4, 5, 9.5]
    lib.run("pad_layout", 1, x, out, probe_params(5, 2, 1, 2, value=9.5))  # SetPadValue(10.5)
    assert out[:8].tolist() == [10.5, 10.5, 1, 2, 3, 4, 5, 10.5]
    lib.run("pad_layout", 1, x, out, probe_params(5, 2, 1, 0))  # no value: "random" (poison)
    assert out[2:7].tolist() == [1, 2, 3, 4, 5] and out[[0, 1, 7]].isnan().all()
    lib.run("pad_layout", 1, x, out, probe_params(5, 0, 0, 0))  # dummy = the block's first element
    assert out[:8].tolist() == [1, 2, 3, 4, 5, 1, 1, 1]


def test_atomic_add_accumulates_across_blocks(kernels):
    torch.manual_seed(5)
    n, blocks = 100, 6
    x = torch.randn(blocks * n)
    out = torch.zeros(1)
    lib = kernels("ops_probe")
    lib.run("atomic_sum", blocks, x, out, probe_params(n))
    torch.testing.assert_close(out[0], x.sum(), rtol=1e-5, atol=1e-5)
    status, message = lib.launch("atomic_sum", blocks, x, out, probe_params(n, 1))
    assert status == RULE_VIOLATION and "rule 'SetAtomicNone after atomic accumulation'" in message


# ------------------------------------------------------------------------------ violations

VIOLATIONS = [
    ("v_datacopy_length", 1, ["rule 'DataCopy length a multiple of 32 bytes'", "count 10 x 4 B = 40 B"]),
    ("v_datacopy_ub_address", 1, ["32-byte alignment of UB operands", "starts at UB offset 12"]),
    ("v_ub_capacity", 1, ["rule 'Unified Buffer capacity'", "needs 204800 B", "188160 usable UB bytes"]),
    ("v_ub_186k", 1, ["rule 'Unified Buffer capacity'", "needs 190464 B"]),
    ("v_deque_empty", 1, ["rule 'EnQue/DeQue pairing'", "DeQue of an empty queue"]),
    ("v_enque_depth", 1, ["rule 'queue depth'", "depth 1"]),
    ("v_alloc_beyond_num", 1, ["rule 'AllocTensor needs an idle buffer'", "all 1 buffers"]),
    ("v_not_freed", 1, ["FreeTensor'd (and every EnQue DeQue'd) by kernel end", "buffer 0 enqueued"]),
    ("v_use_while_queued", 1, ["rule 'EnQue/DeQue pairing' violated by Adds", "EnQue'd, not yet DeQue'd"]),
    ("v_use_after_free", 1, ["rule 'no use after FreeTensor' violated by Duplicate"]),
    ("v_vector_count_oob", 1, ["rule 'LocalTensor bounds' violated by Add", "holds 1024 B",
                               "touches 1200 B"]),
    ("v_vector_offset_oob", 1, ["rule 'LocalTensor bounds' violated by Exp", "touches 512 B"]),
    ("v_partial_overlap", 1, ["overlap completely or not at all"]),
    ("v_reduce_work", 1, ["rule 'ReduceMax sharedTmpBuffer size'", "holds 64 elements",
                          "needs 128"]),
    ("v_compare_count", 1, ["rule 'Compare count covers whole 256-byte repeats' violated by CompareScalar",
                            "count 100 x 4 B"]),
    ("v_waitflag", 1, ["rule 'SetFlag/WaitFlag pairing'", "no pending SetFlag"]),
    ("v_setflag_unpaired", 1, ["rule 'SetFlag/WaitFlag pairing'", "never waited"]),
    ("v_syncall_skipped", 4, ["rule 'every block reaches each SyncAll'", "block 1 returned after 0",
                              "3 block(s) wait in SyncAll #1"]),
    ("v_cast_round_mode", 1, ["CAST_NONE is not accepted for float -> bfloat16_t"]),
    ("v_two_pipes", 1, ["rule 'one TPipe per kernel'"]),
    ("v_gm_oob", 1, ["rule 'GM access inside a kernel argument'", "bytes [0, 4128) of kernel argument 0",
                     "holds 4096 B"]),
    ("v_que_buffers", 1, ["rule 'TQue buffers per TPosition'", "9 TQue buffers on VECIN"]),
    ("v_block_two", 4, ["(block 2 of 4, SoC Ascend910B2)", "TBuf::Get length within InitBuffer length"]),
    ("v_global_index", 1, ["rule 'GlobalTensor bounds'", "17 elements accessed, SetGlobalBuffer gave 16"]),
    ("v_global_empty", 1, ["rule 'GlobalTensor bounds'", "8 elements accessed, SetGlobalBuffer gave 0"]),
    ("v_queue_after_reset", 1, ["rule 'TPipe::InitBuffer before queue use'", "Reset or destroyed"]),
]


@pytest.mark.parametrize("kernel,block_dim,fragments", VIOLATIONS, ids=[v[0] for v in VIOLATIONS])
def test_rule_violation_is_caught(kernels, kernel, block_dim, fragments):
    x, out = torch.zeros(1024), torch.zeros(1024)
    status, message = kernels("violations").launch(kernel, block_dim, x, out)
    assert status == RULE_VIOLATION, message
    assert message.startswith("ascendc_emu: rule '")
    for fragment in fragments:
        assert fragment in message, message


def test_reserved_ub_options(kernels):
    lib = kernels("violations")
    x, out = torch.zeros(1024), torch.zeros(1024)
    # 186 KiB fits once the 8 KiB ASC scratch area is given to the kernel ...
    lib.run("v_ub_186k", 1, x, out, disable_asc_reserved_ubuf=True)
    # ... but then Select modes 1/2, which need that area, are refused.
    lib.run("v_select_scalar", 1, x, out)
    status, message = lib.launch("v_select_scalar", 1, x, out, disable_asc_reserved_ubuf=True)
    assert status == RULE_VIOLATION and "Select modes 1/2 need the 8 KiB reserved UB" in message


def test_pipe_reset_and_destroy_release_the_ub(kernels):
    kernels("violations").run("ok_pipe_reset", 2, torch.zeros(1024), torch.zeros(1024))


def test_syncall_block_limit_per_soc(kernels):
    lib = kernels("violations")
    x, out = torch.zeros(1024), torch.zeros(1024)
    lib.run("v_syncall_ok", 48, x, out, soc="Ascend910B2")
    status, message = lib.launch("v_syncall_ok", 48, x, out, soc="Ascend910B3")
    assert status == RULE_VIOLATION and "48 > the 40 vector cores of Ascend910B3" in message


ICPU_MAIN = r"""
#include <cstring>
extern "C" __global__ __aicore__ void copy8(GM_ADDR x, GM_ADDR y) {
  AscendC::TPipe pipe;
  AscendC::TBuf<AscendC::TPosition::VECCALC> b;
  pipe.InitBuffer(b, 32);
  AscendC::GlobalTensor<float> gx, gy;
  gx.SetGlobalBuffer((__gm__ float*)x, 8);
  gy.SetGlobalBuffer((__gm__ float*)y, 8);
  AscendC::DataCopy(b.Get<float>(), gx, AscendC::GetBlockIdx() == 1 ? 6 : 8);
  AscendC::DataCopy(gy, b.Get<float>(), 8);
}
int main(int argc, char** argv) {
  uint8_t* x = AscendC::GmAlloc(32);
  uint8_t* y = AscendC::GmAlloc(32);
  for (int i = 0; i < 8; ++i) reinterpret_cast<float*>(x)[i] = i;
  ICPU_RUN_KF(copy8, std::strcmp(argv[1], "good") == 0 ? 1 : 2, x, y);
  std::printf("y[7]=%g\n", reinterpret_cast<float*>(y)[7]);
  AscendC::GmFree(x);
  AscendC::GmFree(y);
  return 0;
}
"""


def test_icpu_run_kf_runs_and_aborts_on_violation(tmp_path):
    src = tmp_path / "icpu_main.cpp"
    src.write_text(ICPU_MAIN)
    exe = compile_kernel(src, tmp_path / "icpu_main", shared=False)
    good = subprocess.run([str(exe), "good"], capture_output=True, text=True)
    assert good.returncode == 0 and "y[7]=7" in good.stdout
    bad = subprocess.run([str(exe), "bad"], capture_output=True, text=True)
    assert bad.returncode != 0
    assert "rule 'DataCopy length a multiple of 32 bytes'" in bad.stderr
    assert "block 1 of 2" in bad.stderr


# ------------------------------------------------- pipe ordering, kernel type, workspace (issue 38)

SYNC_RACES = [
    ("r_mte2_then_vector", ["rule 'a Vector instruction touches UB only after the MTE2 copy into it is "
                            "synchronised' violated by Add", "in flight from DataCopyPad(GM->UB)",
                            "SetFlag/WaitFlag<HardEvent::MTE2_V>", "PipeBarrier(ISASI), SetFlag/WaitFlag, TQue"]),
    ("r_vector_then_scalar", ["rule 'a scalar read of UB the Vector unit wrote waits for "
                              "SetFlag/WaitFlag<HardEvent::V_S>' violated by LocalTensor::GetValue",
                              "written by Duplicate"]),
    ("r_vector_chain", ["rule 'dependent Vector instructions are ordered by PipeBarrier<PIPE_V>() (auto-sync off)' "
                        "violated by Mul", "reads what Add wrote", "PipeBarrier(ISASI)"]),
    ("r_vector_then_mte3", ["waits for EnQue/DeQue (VECOUT) or SetFlag/WaitFlag<HardEvent::V_MTE3>' violated by "
                            "DataCopyPad(UB->GM)", "written by Duplicate"]),
    ("r_syncall_not_mix", ["rule 'SyncAll needs a MIX kernel type' violated by SyncAll",
                           "KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIV_1_0)", "SyncAll constraints"]),
    ("r_user_workspace_unset", ["rule 'GetUserWorkspace needs a system workspace'",
                                "nullptr + RESERVED_WORKSPACE (16777216 B)", "GetUserWorkspace"]),
    ("r_ub_copy_veccalc", ["rule 'UB->UB DataCopy only VECIN -> VECCALC or VECCALC -> VECOUT'",
                           "VECCALC -> VECCALC is not a documented path"]),
]


@pytest.mark.parametrize("kernel,fragments", SYNC_RACES, ids=[r[0] for r in SYNC_RACES])
def test_sync_rule_race_aborts_naming_the_rule(kernels, kernel, fragments):
    x, out, ws = torch.zeros(256), torch.zeros(256), torch.zeros(64)
    status, message = kernels("sync_rules").launch(kernel, 1, x, out, ws)
    assert status == RULE_VIOLATION, message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize("kernel", ["ok_mte2_then_vector", "ok_vector_then_scalar", "ok_vector_chain",
                                    "ok_syncall_mix"])
def test_sync_rule_fixed_twin_runs(kernels, kernel):
    kernels("sync_rules").run(kernel, 2, torch.zeros(256), torch.zeros(256))


def test_auto_sync_build_leaves_vector_ordering_to_the_compiler(tmp_path):
    """-DASCENDC_EMU_AUTO_SYNC=1 emulates --cce-auto-sync: the compiler orders the pipes."""
    lib = EmuKernels(compile_kernel(KERNELS / "sync_rules.cpp", tmp_path / "auto.so",
                                    defines=["ASCENDC_EMU_AUTO_SYNC=1"]))
    lib.run("r_vector_chain", 1, torch.zeros(256), torch.zeros(256))


def test_user_workspace_starts_past_the_system_reserve(kernels):
    """SetSysWorkspace + GetUserWorkspace: the device skips RESERVED_WORKSPACE (16 MiB on 2201)."""
    lib = kernels("sync_rules")
    reserve = 16 * 1024 * 1024
    ws = torch.zeros((reserve + 32) // 4)
    lib.run("ws_user_workspace", 1, torch.zeros(256), torch.zeros(256), ws)
    assert torch.equal(ws[reserve // 4:], torch.full((8,), 7.0)) and not ws[:reserve // 4].any()
    status, message = lib.launch("ws_user_workspace", 1, torch.zeros(256), torch.zeros(256), torch.zeros(8))
    assert status == RULE_VIOLATION
    assert "rule 'the host allocates system + user workspace'" in message and "holds 32 B" in message


def test_compares_is_refused_when_targeting_cann_8(tmp_path):
    """CANN 8.5's basic API has CompareScalar only; 9.x adds Compares (tables: api/cann-*.json)."""
    err = compile_kernel(KERNELS / "sync_rules.cpp", tmp_path / "c85.so", defines=["SYNC_RULES_COMPARES"],
                         expect_error=True)
    assert "Compares does not exist in CANN 8.x" in err and "use CompareScalar" in err
    lib = EmuKernels(compile_kernel(KERNELS / "sync_rules.cpp", tmp_path / "c91.so",
                                    defines=["SYNC_RULES_COMPARES", "ASCENDC_CANN_VERSION=90100"]))
    lib.run("compares_9x", 1, torch.zeros(256), torch.zeros(256))


def test_whole_reduce_is_refused_when_targeting_cann_9_1(tmp_path):
    """9.1 renamed WholeReduceSum/Max/Min to ReduceRepeat: a 9.1 build refuses the old names."""
    err = compile_kernel(KERNELS / "ops_probe.cpp", tmp_path / "p91.so", defines=["ASCENDC_CANN_VERSION=90100"],
                         expect_error=True)
    assert "WholeReduceSum does not exist in CANN 9.1" in err
