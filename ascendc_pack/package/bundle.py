"""Bundle stage: graph.so + the chosen kernel libraries + weights + manifest -> ``.ascpack``.

Entry point: :func:`write_bundle` (and :func:`build_bundle`, which also reports what it did).
The format is documented in ``docs/FORMAT.md``; the reader is
:mod:`ascendc_pack_runtime.bundle`. A bundle is a zstd-compressed tar holding, in this order::

    manifest.json                              format, target, io specs, kernels, member hashes
    graph.so                                   the C++ graph (render stage), kernels found relative
    graph.cpp                                  its source, for inspection
    kernels/<kernel_name>/<kernel_key>/kernel.so   the winner of every fused kernel, nothing else
    weights.bin                                raw tensor bytes, 64-byte aligned, indexed in the manifest
    tuning.json                                every candidate's timings (PGO record)

No pickle anywhere; no path of the build machine in the manifest, graph.cpp or tuning.json.
The bundle is written to a temporary file next to ``output`` and renamed into place.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import io
import json
import os
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ascendc_pack_runtime import manifest as contract
from ascendc_pack_runtime.constants import (FORMAT_VERSION, GRAPH_ABI_VERSION, GRAPH_LIBRARY, GRAPH_SOURCE,
                                            MANIFEST_NAME, TUNING_FILE, WEIGHT_ALIGNMENT, WEIGHTS_FILE)
from ascendc_pack_runtime.manifest import check_member_name

from ascendc_pack.backends.registry import get_backend
from ascendc_pack.cache import check_component
from ascendc_pack.ir.choice import KernelChoice
from ascendc_pack.toolchain.compiler import DEFAULT_CXX, KernelLibraryError, describe_library, package_version
from ascendc_pack.config import BuildConfig
from ascendc_pack.errors import PackError
from ascendc_pack.kernels.fused.build import kernel_uses
from ascendc_pack.ir.program import ModelProgram, dtype_name
from ascendc_pack_runtime.outputs import plain_treespec
from ascendc_pack_runtime.tensor_meta import contiguous_strides

from ascendc_pack.graph.render import GraphLibrary, GraphSource, KernelRef, compile_graph, graph_flags, render_graph_cached, weight_layout
from ascendc_pack.tactics.report import kernel_libraries, manifest_tactics, tuning_tactics

ZSTD_LEVEL = 6
COPY_CHUNK = 1 << 20   # bytes per copy into the archive (tarfile's default 16 KiB costs Python calls)
TUNING_FORMAT = "ascpack-tuning"


class BundleWriteError(PackError):
    """The inputs of the bundle stage are inconsistent (missing choice, wrong library, ...)."""


@dataclass
class BundleReport:
    """What :func:`build_bundle` produced."""

    path: Path
    size: int
    members: dict                 # name -> {"size", "sha256"}
    graph: GraphLibrary
    graph_source: GraphSource
    seconds: float
    manifest: dict = field(repr=False, default_factory=dict)     # as written (JSON)
    contract: contract.Manifest | None = field(repr=False, default=None)


def kernel_member(name: str, kernel_key: str) -> str:
    """``kernels/<kernel_name>/<kernel_key>/kernel.so``."""
    check_component(name, "kernel_name")
    check_component(kernel_key, "kernel_key")
    return f"kernels/{name}/{kernel_key}/kernel.so"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _tensor_bytes(t: torch.Tensor):
    """A zero-copy buffer over a dense tensor's memory."""
    n = t.numel() * t.element_size()
    return (ctypes.c_char * n).from_address(t.data_ptr()) if n else b""


@dataclass
class WeightsBlob:
    """``weights.bin`` held in memory, never written to a staging file: the weight tensors
    (already in their bundle layout) at 64-byte aligned offsets, streamed into the archive."""

    chunks: list            # buffers and zero paddings, in file order
    size: int
    sha256: str
    tensors: list = field(default_factory=list, repr=False)   # the memory under the buffers

    def reader(self) -> io.BufferedReader:
        """A file object reading the blob (what the archive writer copies from)."""
        return io.BufferedReader(_ChunkReader(self.chunks), buffer_size=COPY_CHUNK)


class _ChunkReader(io.RawIOBase):
    def __init__(self, chunks):
        self._chunks = iter(chunks)
        self._current = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while not len(self._current):
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._current = memoryview(chunk).cast("B")
        n = min(len(buf), len(self._current))
        buf[:n] = self._current[:n]
        self._current = self._current[n:]
        return n


def model_weights(model: ModelProgram, weights: dict[str, torch.Tensor]) -> list[tuple[str, str, torch.Tensor]]:
    """``(name, fqn, tensor)`` of every weight of ``model`` in program order, checked against the
    program's specs."""
    out = []
    for name in model.weights:
        t = weights.get(name)
        if t is None:
            raise BundleWriteError(f"weight {name!r} (parameter {model.weight_fqns.get(name, name)}) is "
                                   "missing from the weights passed to write_bundle")
        spec = model.program.values[name]
        if tuple(t.shape) != tuple(spec.shape) or dtype_name(t.dtype) != spec.dtype:
            raise BundleWriteError(f"weight {name!r} is {dtype_name(t.dtype)}{list(t.shape)}, the program "
                                   f"expects {spec.dtype}{list(spec.shape)}")
        out.append((name, model.weight_fqns.get(name, name), t))
    return out


def _weights_blob(model: ModelProgram, weights: dict[str, torch.Tensor]):
    """weights.bin (raw, every tensor at a 64-byte aligned offset), its index and layouts."""
    return weights_blob(model_weights(model, weights))


def weights_blob(named: list[tuple[str, str, torch.Tensor]]):
    """weights.bin of ``(name, fqn, tensor)`` in that order: the blob, its index
    (``contract.WeightSpec`` per tensor) and each name's stored (shape, stride)."""
    entries, layouts, chunks, tensors = [], {}, [], []
    offset = 0
    digest = hashlib.sha256()
    for name, fqn, t in named:
        t = t.detach().cpu()
        shape, stride = weight_layout(t)
        if tuple(t.stride()) != tuple(stride):  # else its bytes are already the stored layout
            dense = torch.empty_strided(shape, stride, dtype=t.dtype)
            dense.copy_(t)
            t = dense
        tensors.append(t)
        nbytes = t.numel() * t.element_size()
        pad = -offset % WEIGHT_ALIGNMENT
        for chunk in ((b"\0" * pad) if pad else b"", _tensor_bytes(t)):
            if len(chunk):
                digest.update(chunk)
                chunks.append(chunk)
        offset += pad
        entries.append(contract.WeightSpec(name, fqn, dtype_name(t.dtype), tuple(shape), tuple(stride), offset,
                                           nbytes))
        layouts[name] = (shape, stride)
        offset += nbytes
    return WeightsBlob(chunks, offset, digest.hexdigest(), tensors), entries, layouts


def _sanitize(text: str, config: BuildConfig) -> str:
    """Replace paths of the build machine by placeholders (tuning records keep error texts)."""
    for path, tag in ((str(config.cache_dir), "<cache_dir>"), (str(Path.home()), "~"),
                      (tempfile.gettempdir(), "<tmp>")):
        if path and len(path) > 1:
            text = text.replace(path, tag)
    return text


def _candidates(choice: KernelChoice) -> tuple[contract.Candidate, ...]:
    return tuple(contract.Candidate(i, r.candidate.kernel_key, r.candidate.tiling_repr, r.candidate.workspace,
                                    r.candidate.block_dim, r.median_us, r.error is not None)
                 for i, r in enumerate(choice.results))


def _tuning_json(model: ModelProgram, choices: dict[str, KernelChoice], names: list[str],
                 config: BuildConfig, tactics: dict | None = None) -> str:
    kernels = []
    for name in names:
        ch = choices[name]
        kernels.append({
            "name": name, "chosen_index": ch.chosen_index, "visited": ch.visited,
            "chosen": ch.candidate.to_json(),
            "results": [{**r.to_json(), "error": None if r.error is None else _sanitize(r.error, config)}
                        for r in ch.results],
        })
    doc = {"format": TUNING_FORMAT, "version": 1, "model": model.name, "topn": config.topn,
           "kernels": kernels}
    if tactics:
        doc["tactics"] = tuning_tactics(tactics, lambda text: _sanitize(text, config))
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(check_member_name(name))
    ti.size = size
    ti.mtime = 0
    ti.mode = 0o755 if name.endswith(".so") else 0o644
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.type = tarfile.REGTYPE
    return ti


@contextlib.contextmanager
def archive_writer(dest: Path, level: int = ZSTD_LEVEL):
    """Write an ``.ascpack`` container to ``dest``: yields ``add(name, size, fileobj)``, called
    in member order (``manifest.json`` first). One zstd frame with a content checksum (the
    runtime detects any corruption of the stream, docs/DESIGN.md §4.2), normalized tar headers."""
    import zstandard

    # all cores: zstd's multi-threaded frames are the same bytes whatever the number of threads
    cctx = zstandard.ZstdCompressor(level=level, write_checksum=True, threads=-1)
    with open(dest, "wb") as f:
        with cctx.stream_writer(f, closefd=False) as zw:
            with tarfile.open(fileobj=zw, mode="w", format=tarfile.PAX_FORMAT, copybufsize=COPY_CHUNK) as tar:
                yield lambda name, size, fileobj: tar.addfile(_tarinfo(name, size), fileobj)
        f.flush()
        os.fsync(f.fileno())


def _write_archive(dest: Path, manifest_bytes: bytes, files: list[tuple[str, Path | WeightsBlob]],
                   level: int) -> None:
    with archive_writer(dest, level) as add:
        add(MANIFEST_NAME, len(manifest_bytes), io.BytesIO(manifest_bytes))
        for name, src in files:
            if isinstance(src, WeightsBlob):
                add(name, src.size, src.reader())
                continue
            with open(src, "rb") as f:
                add(name, src.stat().st_size, f)


def bundle_kernels(model: ModelProgram, choices: dict[str, KernelChoice], tactics: dict | None = None,
                   dims: dict[str, tuple] | None = None):
    """Every kernel library ``model`` launches (its fused kernels' choices and the generated
    kernels of its tactics), each checked against its choice: ``(names, refs, files, entries)``:
    the fused kernels' names (sorted), a ``KernelRef`` per kernel, ``(member, library path)`` per
    library and the manifest's ``contract.Kernel`` entries. ``dims``: the dynamic dims each jit
    kernel takes (docs/DESIGN.md §3.5)."""
    steps = {}
    for s in model.program.fused_steps():
        steps.setdefault(s.name, s)
    missing = [n for n in steps if n not in choices]
    if missing:
        raise BundleWriteError(f"no KernelChoice for fused kernel(s) {', '.join(missing)}; tune (or pick "
                               "candidate 0 of) every fused kernel of the program")
    names = sorted(steps)
    uses = kernel_uses(model.program)  # identical kernels share one entry and one library
    libs = [(name, choices[name].candidate, choices[name].so_path, len(steps[name].kernel.inputs),
             len(steps[name].kernel.outputs), bool(choices[name].visited), choices[name].chosen_index,
             _candidates(choices[name]), tuple(uses[name])) for name in names]
    libs += [(name, g["candidate"], g["so_path"], g["n_inputs"], 1, bool(g["visited"]), g["chosen_index"],
              g["candidates"], tuple(g["uses"])) for name, g in kernel_libraries(model.program, tactics or {}).items()]
    refs: dict[str, KernelRef] = {}
    kernel_files: list[tuple[str, Path]] = []
    kernel_entries = []
    for name, cand, so, n_in, n_out, visited, chosen, cands, kernel_use in libs:
        so = Path(so)
        if not so.is_file():
            raise BundleWriteError(f"kernel {name}: the chosen library {so} does not exist; rebuild (the "
                                   "kernel cache was cleared after tuning)")
        try:
            info = describe_library(so, expected_key=cand.kernel_key, expected_name=name)
        except KernelLibraryError as e:
            raise BundleWriteError(f"kernel {name}: {e}") from None
        if info["workspace"] != cand.workspace or info["block_dim"] != cand.block_dim:
            raise BundleWriteError(f"kernel {name}: library {so} describes workspace {info['workspace']} / "
                                   f"block_dim {info['block_dim']}, the choice says {cand.workspace} / "
                                   f"{cand.block_dim}; rebuild")
        member = kernel_member(name, cand.kernel_key)
        refs[name] = KernelRef(name, cand.kernel_key, member, cand.workspace, n_in, n_out,
                               tuple((dims or {}).get(name, ())))
        kernel_files.append((member, so))
        kernel_entries.append(contract.Kernel(name, cand.kernel_key, cand.tiling_repr, cand.workspace,
                                              cand.block_dim, member, visited, chosen, cands, kernel_use))
    return names, refs, kernel_files, kernel_entries


def build_bundle(model: ModelProgram, weights: dict[str, torch.Tensor], choices: dict[str, KernelChoice],
                 output: Path | str, config: BuildConfig, *, cxx: str = DEFAULT_CXX,
                 zstd_level: int = ZSTD_LEVEL, tactics: dict | None = None,
                 call_threads: contract.CallThreads | None = None, precision=None) -> BundleReport:
    """Render and compile the graph, then write the ``.ascpack`` bundle to ``output``.

    ``model`` is the fused program, ``weights`` its weight tensors by program input name,
    ``choices`` the tuned winner of every fused kernel (by kernel name), ``tactics`` the outcome
    of every tactic step (:class:`~ascendc_pack.tactics.tune.TacticChoice` by step name; their
    choices are already applied to ``model``), ``call_threads`` the tuned thread cap of a call
    (:mod:`ascendc_pack.tune.call_threads`; None: not tuned, no record), ``precision`` the
    :class:`~ascendc_pack.tactics.precision.PrecisionReport` of ``--precision`` (None: no record;
    the CPU features its low-precision steps need join ``target.isa``).
    Raises BundleWriteError (inconsistent inputs), RenderError, CompileError.
    """
    t0 = time.perf_counter()
    output = Path(output)
    if output.is_dir():
        raise BundleWriteError(f"output {output} is a directory; pass a file path such as "
                               f"{output / (model.name + '.ascpack')}")
    names, refs, kernel_files, kernel_entries = bundle_kernels(model, choices, tactics)

    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".ascpack-", dir=output.parent) as staging:
        staging = Path(staging)
        blob, weight_entries, layouts = _weights_blob(model, weights)
        graph_src = render_graph_cached(model, refs, layouts, config.cache_dir, config.flush_denormals)
        graph = compile_graph(graph_src, config, cxx)
        tuning_path = staging / TUNING_FILE
        tuning_path.write_text(_tuning_json(model, choices, names, config, tactics))

        files = [(GRAPH_LIBRARY, graph.path), (GRAPH_SOURCE, graph.source_path), *kernel_files,
                 (WEIGHTS_FILE, blob), (TUNING_FILE, tuning_path)]
        members = {name: contract.Member(blob.size, blob.sha256) if src is blob else
                   contract.Member(src.stat().st_size, _sha256(src)) for name, src in files}
        manifest = _manifest(model, config, graph_src, weight_entries, kernel_entries, members,
                             manifest_tactics(tactics) if tactics else None, call_threads, precision)
        manifest_bytes = manifest.dumps()
        tmp = output.parent / f".{output.name}.{os.getpid()}.tmp"
        try:
            _write_archive(tmp, manifest_bytes, files, zstd_level)
            os.replace(tmp, output)
        finally:
            tmp.unlink(missing_ok=True)
    return BundleReport(output, output.stat().st_size, {k: v.to_json() for k, v in members.items()}, graph,
                        graph_src, time.perf_counter() - t0, manifest.to_json(), manifest)


def _manifest(model: ModelProgram, config: BuildConfig, graph_src: GraphSource,
              weights: list[contract.WeightSpec], kernels: list[contract.Kernel],
              members: dict[str, contract.Member], tactics=None, call_threads=None,
              precision=None) -> contract.Manifest:
    """The bundle's manifest (validated: the writer is held to the contract the reader checks)."""
    p = model.program
    mutated_values = {v: k for k, v in model.mutations.items()}
    outputs = []
    for o, out_name in zip(model.user_outputs, model.output_names):
        spec = p.values[o]
        index = model.user_inputs.index(mutated_values[o]) if o in mutated_values else None
        outputs.append(contract.IOSpec(out_name, tuple(spec.shape), spec.dtype, input_index=index))
    inputs = [contract.IOSpec(n, tuple(p.values[n].shape), p.values[n].dtype,
                              tuple(p.values[n].stride or contiguous_strides(p.values[n].shape)))
              for n in model.user_inputs]
    return contract.Manifest(
        format_version=FORMAT_VERSION, **manifest_common(model, config, precision), inputs=tuple(inputs),
        outputs=tuple(outputs), weights=contract.Weights(WEIGHTS_FILE, WEIGHT_ALIGNMENT, tuple(weights)),
        graph=manifest_graph(GRAPH_LIBRARY, GRAPH_SOURCE, graph_src, config),
        kernels=tuple(kernels), members=members, tactics=tactics, call_threads=call_threads,
    ).validate()


def manifest_common(model: ModelProgram, config: BuildConfig, precision=None) -> dict:
    """The manifest fields every bundle has the same way: the producer, the model's name,
    backend and target, torch, cores, topn, mutations, output structure and the ``precision``
    record of a :class:`~ascendc_pack.tactics.precision.PrecisionReport` (None: none; the CPU
    features its low-precision steps need join ``target.isa``)."""
    backend = get_backend(config.backend)
    target, record = backend.manifest_target(config), None
    if precision is not None:
        target = dataclasses.replace(target, isa=tuple(sorted(set(target.isa) | set(precision.requires))))
        record = contract.Precision(precision.requested, precision.budget, "relative_l2", precision.error,
                                    precision.computes, tuple(precision.requires), precision.input_sets)
    return dict(producer=contract.Producer("ascendc-pack", package_version()), model_name=model.name,
                backend=backend.name, target=target,
                torch=contract.TorchBuild(torch.__version__, bool(torch._C._GLIBCXX_USE_CXX11_ABI)),
                core_limit=config.cores, cores=backend.target(config).cores, topn=config.topn,
                mutations=tuple(contract.Mutation(k, model.user_inputs.index(k), v) for k, v in model.mutations.items()),
                out_spec=plain_treespec(model.out_tree), out_tree=model.out_tree, precision=record)


def manifest_graph(library: str, source: str, graph_src: GraphSource, config: BuildConfig) -> contract.Graph:
    """The manifest entry of a graph.so (member names, namespace, flags, memory report, ATen calls,
    whether its calls flush denormals)."""
    return contract.Graph(library, source, graph_src.namespace, GRAPH_ABI_VERSION,
                          tuple(f for f in graph_flags(config.march) if not f.startswith("-I")), graph_src.stats,
                          dict(graph_src.aten_ops), graph_src.flush_denormals)


def write_bundle(model: ModelProgram, weights: dict[str, torch.Tensor], choices: dict[str, KernelChoice],
                 output: Path | str, config: BuildConfig) -> Path:
    """Write the ``.ascpack`` bundle of a fused, tuned model to ``output`` and return its path
    (see :func:`build_bundle` for the details and the report)."""
    return build_bundle(model, weights, choices, output, config).path


def choices_from_candidate0(model: ModelProgram, prepared: dict) -> dict[str, KernelChoice]:
    """A KernelChoice per kernel taking its first compiled candidate, unvisited (what a build
    with ``--topn 1`` records). ``prepared``: :func:`ascendc_pack.kernels.fused.build.prepare_kernels`."""
    from ascendc_pack.ir.choice import CandidateResult

    out = {}
    for name, kc in prepared.items():
        ok = [(i, c) for i, c in enumerate(kc.compiled.candidates) if c.ok]
        if not ok:
            raise BundleWriteError(f"kernel {name}: no candidate compiled; see the compile errors in the cache")
        i, c = ok[0]
        results = [CandidateResult(cc.candidate, None, [], cc.error) for cc in kc.compiled.candidates]
        out[name] = KernelChoice(name=name, spec=kc.step.kernel, chosen_index=i, candidate=c.candidate,
                                 so_path=c.so_path, visited=False, results=results)
    return out


__all__ = ["write_bundle", "build_bundle", "BundleReport", "BundleWriteError", "kernel_member",
           "choices_from_candidate0"]
