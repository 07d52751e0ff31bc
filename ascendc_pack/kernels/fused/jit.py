"""The jit path of fused kernels (docs/DESIGN.md §3.5): one library per kernel whose sizes
depend on a model's dynamic dims, taking those sizes as arguments.

The seed's two compile paths: a kernel with a size symbol among its arguments (``SizeArg``)
takes the jit path, its tiling computed on the host at each launch (``AutofuseTiling``);
static kernels take the TopN path (candidates, PGO, ``optimize_tiling``). Here a jit kernel is
the static kernel's loops (templates/kernel/fused.cpp.j2, one launch function per schedule,
``row`` and ``split``) with its sizes, strides and counts expressions over the dims it is
passed (:mod:`ascendc_pack.ir.symbolic`), and ``ap_kernel_tiling`` runs the static candidates'
cost model (runtime/include/ascendc_pack/jit_tiling.h, a port of
:func:`ascendc_pack.kernels.fused.tiling.estimate_us`) on the launch's sizes. Nothing to tune:
one candidate, ``tiling_repr`` ``lanes=16;sched=jit``.

:class:`JitKernel` launches a compiled one on torch tensors (tests, the reference); graph.so
calls the same two functions per launch.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ascendc_pack_runtime.kernels import KernelLibrary
from ascendc_pack_runtime.tensor_meta import DTYPES

from ascendc_pack.config import BuildConfig
from ascendc_pack.ir.candidate import Candidate
from ascendc_pack.ir.choice import CandidateResult, KernelChoice
from ascendc_pack.ir.fusion import KernelSpec
from ascendc_pack.ir.ops import STORAGE_TYPE
from ascendc_pack.ir.symbolic import c_expr, evaluate, is_symbolic, symbols_of
from ascendc_pack.kernels.family import generator_version
from ascendc_pack.kernels.fused.codegen import Emitter, Layout, plan_passes, store_lanes, template_env
from ascendc_pack.kernels.fused.tiling import Target, _flops_per_element, _passes, kernel_bytes
from ascendc_pack.toolchain.compiler import CandidateSource, CompiledKernel, KernelBuild

LANES = 16
SCHEDULES = (("row", "AP_JIT_ROW"), ("split", "AP_JIT_SPLIT"))
_SIZE = {"uint16_t": 2, "uint8_t": 1, "int8_t": 1, "int16_t": 2, "int32_t": 4, "float": 4, "double": 8,
         "int64_t": 8}


def is_jit(spec: KernelSpec) -> bool:
    """Whether a kernel's sizes depend on a dynamic dim (it takes the jit path)."""
    return bool(spec_dims(spec))


def spec_dims(spec: KernelSpec) -> list[str]:
    """The dynamic dims a kernel's sizes depend on, in argument order (sorted by name)."""
    parts = [spec.axes, [i.shape for i in spec.inputs], [i.stride for i in spec.inputs],
             [o.shape for o in spec.outputs], [o.strides for o in spec.outputs],
             [(n.strides, n.offset) for n in spec.loads], [n.count for n in spec.reductions]]
    return sorted(symbols_of(*parts))


def jit_candidate(spec: KernelSpec, cores: int) -> Candidate:
    """The one candidate of a jit kernel: ``block_dim`` the most threads it may use, the
    workspace the most a ``split`` tiling asks (64 B per thread and reduction)."""
    return Candidate(f"lanes={LANES};sched=jit", 64 * cores * len(spec.reductions), cores)


class _Sizes:
    """Names the dynamic sizes of one kernel: each distinct expression becomes a local ``k<i>``
    computed once per launch from the dims (``d_<name>``)."""

    def __init__(self, dims: list[str]):
        self.dims = dims
        self.names: dict[str, str] = {}
        self.lines: list[str] = []

    def __call__(self, x) -> str:
        if not is_symbolic(x):
            return str(int(x))
        key = str(x)
        if key not in self.names:
            self.names[key] = f"k{len(self.names)}"
            self.lines.append(f"const int64_t {self.names[key]} = {c_expr(x, _dim_var)};")
        return self.names[key]

    def prologue(self) -> list[str]:
        return [f"const int64_t {_dim_var(d)} = D[{i}];" for i, d in enumerate(self.dims)] + self.lines


def _dim_var(name: str) -> str:
    return f"d_{name}"


def render_jit(spec: KernelSpec, cores: int, target: Target, isa: str) -> str:
    """The C++ source of a jit kernel (``cores``: its block_dim; ``target``: the cost model's
    host, baked into its tiling function)."""
    dims = spec_dims(spec)
    layout = Layout.of(spec)
    sizes = _Sizes(dims)
    em = Emitter(spec, layout, col=False, num=sizes)
    sections = plan_passes(spec, em)
    outer = [spec.axes[a] for a in layout.outer]
    inner = [spec.axes[a] for a in layout.inner]
    rows_expr = _product(outer)
    inner_expr = _product(inner)
    size_lines = [f"const int64_t X{i} = {sizes(s)};" for i, s in enumerate(outer)] + \
                 [f"const int64_t R{i} = {sizes(s)};" for i, s in enumerate(inner)] + \
                 [f"const int64_t ROWS = {sizes(rows_expr)};"]
    bytes_text = sizes(kernel_bytes(spec))
    inner_text = sizes(inner_expr)
    dim_lines = sizes.prologue() + size_lines

    def prologue(tiling: dict) -> str:
        lines = dim_lines + ["const int BD = T->block_dim;"]
        lines += ["const int64_t RPT = T->rows_per_task;"] if tiling["sched"] == "row" else \
            ["const int64_t TILE = T->tile;", "(void)TILE;"]
        lines += [f"(void){_dim_var(d)};" for d in dims] + [f"(void){n};" for n in sizes.names.values()] + \
            [f"(void)X{i};" for i in range(len(outer))] + [f"(void)R{i};" for i in range(len(inner))]
        return "\n".join("  " + line for line in lines)

    n_accs = sum(len(s["accs"]) for s in sections if s["kind"] == "pass")
    cand = jit_candidate(spec, cores)
    tilings = [{"sched": s, "code": code, "omp": "static", "rpt": "RPT", "tile": "TILE", "lanes": LANES}
               for s, code in SCHEDULES]
    t = target
    ctx = {
        "name": spec.name, "kernel_key": cand.kernel_key, "tiling_repr": cand.tiling_repr,
        "workspace": cand.workspace, "block_dim": cores, "isa": isa,
        "inputs": [{"type": STORAGE_TYPE[i.dtype]} for i in spec.inputs],
        "outputs": [{"type": STORAGE_TYPE[o.dtype]} for o in spec.outputs],
        "outer_sizes": outer, "inner_sizes": inner, "rows": "ROWS", "sections": sections,
        "row_decls": em.row_decls, "tiling": tilings[0], "n_accs": n_accs, "has_reduction": n_accs > 0,
        "store_lanes": store_lanes(spec, LANES),
        "jit": {"n_dims": len(dims), "dim_names": ",".join(dims), "tilings": tilings,
                "dim_lines": dim_lines, "rows": "ROWS", "inner": inner_text, "bytes": bytes_text,
                "flops": repr(float(_flops_per_element(spec))), "passes": max(1, _passes(spec)),
                "n_red": len(spec.reductions),
                "target": ", ".join(repr(float(x)) for x in (t.mem_gbps_per_core, t.cache_gbps_per_core, t.l2_bytes,
                                                             t.task_overhead_us, t.parallel_overhead_us,
                                                             t.barrier_us))},
        "jit_prologue": prologue,
    }
    return template_env().get_template("kernel/fused.cpp.j2").render(**ctx)


def _product(xs):
    out = 1
    for x in xs:
        out = out * x
    return out




def jit_builds(specs: list[KernelSpec], config: BuildConfig, backend) -> list[KernelBuild]:
    """One :class:`KernelBuild` (one candidate) per jit kernel, keyed like static kernels."""
    target = backend.target(config)
    isa = ",".join(backend.isa(config))
    version = generator_version("fused-jit", "ascendc_pack.kernels.fused.jit", "kernel/fused.cpp.j2")
    out = []
    for spec in specs:
        cand = jit_candidate(spec, target.cores)
        source = render_jit(spec, target.cores, target, isa)
        out.append(KernelBuild(spec.name, backend.artifact_hash(spec.canonical_json(), version, config),
                               [CandidateSource(cand, source)]))
    return out


def compile_jit(specs: list[KernelSpec], config: BuildConfig, backend, progress=None) -> dict[str, CompiledKernel]:
    """Render and compile every jit kernel into the kernel cache; name -> its compiled kernel
    (a failed compile is a :class:`~ascendc_pack.errors.PackError` naming the kernel: a jit
    kernel has no other candidate to fall back on, its steps then stay ATen)."""
    builds = jit_builds(specs, config, backend)
    compiled = backend.compile(builds, config, progress)
    return {b.kernel_name: ck for b, ck in zip(builds, compiled)}


def jit_choice(spec: KernelSpec, compiled) -> KernelChoice:
    """The choice of a jit kernel: its one compiled candidate (nothing to time: its tiling is
    chosen per launch), unvisited by PGO."""
    return KernelChoice(name=spec.name, spec=spec, chosen_index=0, candidate=compiled.candidate,
                        so_path=compiled.so_path, visited=False, results=[CandidateResult(compiled.candidate)])


class _Tiling(ctypes.Structure):
    _fields_ = [("sched", ctypes.c_int32), ("block_dim", ctypes.c_int32), ("rows_per_task", ctypes.c_int64),
                ("tile", ctypes.c_int64)]


class JitKernel:
    """A compiled jit kernel run on torch tensors: ``kernel(inputs, sizes)`` allocates the
    outputs at those sizes, picks the tiling (``tiling(sizes)``) and launches."""

    def __init__(self, spec: KernelSpec, so_path: Path | str, kernel_key: str | None = None):
        self.spec = spec
        self.dims = spec_dims(spec)
        self.lib = KernelLibrary(so_path, kernel_key)
        raw = self.lib._lib
        self._tiling = raw.ap_kernel_tiling
        self._tiling.restype, self._tiling.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_int32,
                                                                     ctypes.POINTER(_Tiling)]
        self._launch = raw.ap_kernel_launch_jit
        self._launch.restype = ctypes.c_int
        self._launch.argtypes = [ctypes.c_void_p] * 4 + [ctypes.POINTER(_Tiling)]
        self._workspace = torch.empty(self.lib.workspace, dtype=torch.uint8) if self.lib.workspace else None

    def _dims(self, sizes: dict[str, int]):
        return (ctypes.c_int64 * max(1, len(self.dims)))(*[int(sizes[d]) for d in self.dims])

    def tiling(self, sizes: dict[str, int], max_threads: int = 0) -> dict:
        """The host tiling of a launch at ``sizes`` (dim name -> size)."""
        t = _Tiling()
        rc = self._tiling(self._dims(sizes), max_threads, ctypes.byref(t))
        if rc != 0:
            raise RuntimeError(f"kernel {self.spec.name}: ap_kernel_tiling failed with status {rc}")
        return {"sched": ("row", "split")[t.sched], "block_dim": t.block_dim, "rows_per_task": t.rows_per_task,
                "tile": t.tile}

    def __call__(self, inputs: list[torch.Tensor], sizes: dict[str, int], max_threads: int = 0) -> list[torch.Tensor]:
        for k, (t, spec) in enumerate(zip(inputs, self.spec.inputs)):
            shape = tuple(evaluate(s, sizes) for s in spec.shape)
            stride = tuple(evaluate(s, sizes) for s in spec.stride)
            if tuple(t.shape) != shape or t.dtype != DTYPES[spec.dtype]:
                raise ValueError(f"kernel {self.spec.name}: input {k} is {t.dtype}{list(t.shape)}, expected "
                                 f"{spec.dtype}{list(shape)}")
            if any(a != b for a, b, n in zip(t.stride(), stride, shape) if n != 1):
                raise ValueError(f"kernel {self.spec.name}: input {k} has strides {t.stride()}, expected {stride}")
        outs = [torch.empty_strided(tuple(evaluate(s, sizes) for s in o.shape),
                                    tuple(evaluate(s, sizes) for s in o.layout), dtype=DTYPES[o.dtype])
                for o in self.spec.outputs]
        dims = self._dims(sizes)
        t = _Tiling()
        if self._tiling(dims, max_threads, ctypes.byref(t)) != 0:
            raise RuntimeError(f"kernel {self.spec.name}: ap_kernel_tiling failed")
        ins = (ctypes.c_void_p * max(1, len(inputs)))(*[x.data_ptr() for x in inputs])
        ptrs = (ctypes.c_void_p * max(1, len(outs)))(*[x.data_ptr() for x in outs])
        ws = self._workspace.data_ptr() if self._workspace is not None else None
        rc = self._launch(ins, ptrs, ws, dims, ctypes.byref(t))
        if rc != 0:
            raise RuntimeError(f"kernel {self.spec.name} failed with status {rc}")
        return outs
