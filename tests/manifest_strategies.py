"""Hypothesis strategies of valid bundle manifests (:class:`ascendc_pack_runtime.manifest.Manifest`)
and helpers to address and edit one field of a manifest's JSON (tests/test_contract.py)."""

from __future__ import annotations

import copy
import string

from hypothesis import strategies as st

from ascendc_pack_runtime import manifest as contract
from ascendc_pack_runtime.constants import FORMAT_VERSION, GRAPH_ABI_VERSION, MAX_DIM
from ascendc_pack_runtime.tensor_meta import DTYPES, contiguous_strides, itemsize, span_elems

_text = st.text(string.ascii_letters + string.digits + "_.:-= ", min_size=1, max_size=12)
_hex = st.text("0123456789abcdef", min_size=64, max_size=64)
_dims = st.lists(st.integers(0, 5), max_size=4).map(tuple)
_big_dims = st.one_of(st.lists(st.integers(0, 65535), max_size=3),   # contiguous strides stay < 2**48
                      st.lists(st.integers(0, MAX_DIM - 1), max_size=1)).map(tuple)


@st.composite
def io_specs(draw, prefix: str, n_max: int = 3) -> list[contract.IOSpec]:
    out = []
    for i in range(draw(st.integers(0, n_max))):
        shape = draw(st.one_of(_dims, _big_dims))
        stride = draw(st.one_of(st.just(contiguous_strides(shape)),
                                st.lists(st.integers(0, MAX_DIM - 1), min_size=len(shape),
                                         max_size=len(shape)).map(tuple)))
        out.append(contract.IOSpec(f"{prefix}{i}", shape, draw(st.sampled_from(sorted(DTYPES))), stride))
    return out


@st.composite
def kernels(draw, n: int) -> list[contract.Kernel]:
    out = []
    for i in range(n):
        cands = []
        for j in range(draw(st.integers(1, 3))):
            tiling = draw(_text)
            ws, bd = draw(st.integers(0, 1 << 40)), draw(st.integers(1, 256))
            cands.append(contract.Candidate(j, contract.kernel_key_of(tiling, ws, bd), tiling, ws, bd,
                                            draw(st.one_of(st.none(), st.floats(0, 1e6))), draw(st.booleans())))
        chosen = draw(st.integers(0, len(cands) - 1))
        c = cands[chosen]
        out.append(contract.Kernel(f"fused_{i}", c.kernel_key, c.tiling_repr, c.workspace, c.block_dim,
                                   f"kernels/fused_{i}/{c.kernel_key}/kernel.so", draw(st.booleans()), chosen,
                                   tuple(cands)))
    return out


@st.composite
def weight_specs(draw, alignment: int) -> tuple[list[contract.WeightSpec], int]:
    """Weights laid out one after the other at aligned offsets; (tensors, bytes they need)."""
    out, offset = [], 0
    for i in range(draw(st.integers(0, 3))):
        shape = draw(_dims)
        stride = contiguous_strides(shape)
        dtype = draw(st.sampled_from(sorted(DTYPES)))
        nbytes = span_elems(shape, stride) * itemsize(dtype)
        offset += -offset % alignment + draw(st.integers(0, 2)) * alignment
        out.append(contract.WeightSpec(f"w{i}", f"mod.w{i}", dtype, shape, stride, offset, nbytes))
        offset += nbytes
    return out, offset


@st.composite
def manifests(draw) -> contract.Manifest:
    """A valid manifest (every cross-reference consistent)."""
    inputs = draw(io_specs("x"))
    mutated = draw(st.lists(st.integers(0, max(len(inputs) - 1, 0)), unique=True, max_size=len(inputs))) \
        if inputs else []
    mutations = tuple(contract.Mutation(inputs[i].name, i, f"v{i}") for i in mutated)
    outputs = draw(io_specs("y"))
    for i in mutated:   # a mutated input may also be returned
        if draw(st.booleans()):
            src = inputs[i]
            outputs.append(contract.IOSpec(f"out_{src.name}", src.shape, src.dtype, input_index=i))
    alignment = draw(st.sampled_from([1, 16, 64, 4096]))
    weights, needed = draw(weight_specs(alignment))
    ks = draw(kernels(draw(st.integers(0, 3))))
    members = {"graph.so": draw(st.integers(0, 1 << 30)), "graph.cpp": draw(st.integers(0, 1 << 20)),
               **{k.file: draw(st.integers(0, 1 << 20)) for k in ks},
               "weights.bin": needed + draw(st.integers(0, 100)), "tuning.json": draw(st.integers(0, 1 << 20))}
    return contract.Manifest(
        format_version=FORMAT_VERSION,
        producer=contract.Producer("ascendc-pack", draw(_text)),
        model_name=draw(_text),
        backend="cpu",
        target=contract.Target(draw(st.sampled_from(["x86_64", "aarch64"])), draw(_text),
                               tuple(draw(st.lists(_text, max_size=4))), draw(_text)),
        torch=contract.TorchBuild(draw(_text), draw(st.one_of(st.none(), st.booleans()))),
        core_limit=draw(st.one_of(st.none(), st.integers(1, 512))),
        cores=draw(st.integers(1, 512)),
        topn=draw(st.integers(1, 10)),
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        mutations=mutations,
        out_spec=draw(_text),
        weights=contract.Weights("weights.bin", alignment, tuple(weights)),
        graph=contract.Graph("graph.so", "graph.cpp", "ascpack_" + draw(_hex)[:20], GRAPH_ABI_VERSION,
                             tuple(draw(st.lists(_text, max_size=3))), {"arena_bytes": draw(st.integers(0, 99))}),
        kernels=tuple(ks),
        members={name: contract.Member(size, draw(_hex)) for name, size in members.items()},
    ).validate()


# ----------------------------------------------------------------------------- field edits

OPAQUE = ("graph.memory",)
"""Informational subtrees the reader does not interpret (editing inside them is not refused)."""
OPTIONAL = ("input_index",)
"""Keys that may be absent."""


def field_paths(doc: dict) -> list[tuple[str, tuple]]:
    """Every field of a manifest JSON as (path in the reader's notation, key path)."""
    out: list[tuple[str, tuple]] = []

    def walk(value, name: str, keys: tuple):
        if name in OPAQUE:
            out.append((name, keys))
            return
        if keys:
            out.append((name, keys))
        if isinstance(value, dict):
            for k, v in value.items():
                sub = f"{name}[{k!r}]" if name == "members" else (f"{name}.{k}" if name else k)
                walk(v, sub, keys + (k,))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{name}[{i}]", keys + (i,))

    walk(doc, "", ())
    return out


def wrong_values(value) -> list:
    """JSON values of another kind than ``value`` that no field of its kind accepts."""
    if isinstance(value, bool):
        return [0, "true", [], {}]
    if isinstance(value, int):
        return ["1", [], {}, True, -1]
    if isinstance(value, float):
        return ["1.5", [], {}, True, -1.0]
    if isinstance(value, str):
        return [1, [], {}, None, True]
    if isinstance(value, list):
        return ["x", {}, 1]
    if isinstance(value, dict):
        return ["x", [], 1]
    return ["x", [], {}]   # null: nullable fields are numbers, booleans or integers


def edited(doc: dict, keys: tuple, value=None, delete: bool = False) -> dict:
    """A deep copy of ``doc`` with the field at ``keys`` replaced by ``value`` (or deleted)."""
    out = copy.deepcopy(doc)
    obj = out
    for k in keys[:-1]:
        obj = obj[k]
    if delete:
        del obj[keys[-1]]
    else:
        obj[keys[-1]] = value
    return out


__all__ = ["manifests", "field_paths", "wrong_values", "edited", "OPAQUE", "OPTIONAL"]
