"""The .ascpack bundle: layout, kernels, portability, parity in a fresh process, refusals.

Every example is built once per test process (candidate 0 of each kernel, no PGO) by
``bundle_fixtures.build_examples``; graph.so compiles dominate the runtime of this module.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch

import ascendc_pack_runtime as rt
from ascendc_pack.package.bundle import build_bundle
from ascendc_pack.pipeline import compare_outputs

from .bundle_fixtures import (build_examples, build_model_file, build_root, clone_inputs, manifest_of,
                              read_bundle, reg, repack, write_raw)
from .conftest import EXAMPLE_NAMES, ROOT


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_examples(tmp_path_factory)


# ----------------------------------------------------------------------------- layout


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_members_order_hashes_and_one_kernel_per_fused_kernel(built, name, tmp_path):
    b = built[name]
    entries = read_bundle(b.bundle)
    names = [info.name for info, _ in entries]
    assert names[0] == "manifest.json"
    assert names[1:3] == ["graph.so", "graph.cpp"]
    assert names[-2:] == ["weights.bin", "tuning.json"]
    kernels = names[3:-2]
    assert all(k.startswith("kernels/") and k.endswith("/kernel.so") for k in kernels)
    assert all(info.isreg() and info.mtime == 0 for info, _ in entries)

    manifest = json.loads(entries[0][1])
    assert manifest["format"] == "ascpack" and manifest["format_version"] == 1
    assert list(manifest["members"]) == names[1:]
    for info, data in entries[1:]:
        assert manifest["members"][info.name] == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    fused = {s.name for s in b.fused.program.fused_steps()}
    assert len(kernels) == len(fused) == len(manifest["kernels"])
    data = dict((info.name, d) for info, d in entries)
    from ascendc_pack.toolchain.compiler import describe_library

    for entry in manifest["kernels"]:
        c = b.choices[entry["name"]].candidate
        key = hashlib.md5(f"{c.tiling_repr}|{c.workspace}|{c.block_dim}".encode()).hexdigest()
        assert entry["kernel_key"] == key
        assert entry["file"] == f"kernels/{entry['name']}/{key}/kernel.so" and entry["file"] in kernels
        assert (entry["tiling_repr"], entry["workspace"], entry["block_dim"]) == (c.tiling_repr, c.workspace,
                                                                                c.block_dim)
        assert entry["visited"] is False and entry["candidates"][0]["kernel_key"] == key
        so = tmp_path / f"{entry['name']}.so"
        so.write_bytes(data[entry["file"]])
        assert describe_library(so, expected_key=key, expected_name=entry["name"])["kernel_key"] == key

    # weights: raw, 64-byte aligned, exactly the program's weights
    w = manifest["weights"]
    assert [t["name"] for t in w["tensors"]] == b.fused.weights
    for t in w["tensors"]:
        assert t["offset"] % 64 == 0
        raw = data["weights.bin"][t["offset"]:t["offset"] + t["nbytes"]]
        flat = torch.frombuffer(bytearray(raw), dtype=getattr(torch, t["dtype"])) if raw else None
        ref = b.weights[t["name"]]
        if flat is not None:
            assert torch.equal(flat.as_strided(t["shape"], t["stride"]), ref)

    # io specs and the rest of the manifest
    assert [i["name"] for i in manifest["inputs"]] == b.fused.user_inputs
    assert [o["name"] for o in manifest["outputs"]] == b.fused.output_names
    assert manifest["torch"] == {"version": torch.__version__, "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI)}
    assert manifest["backend"] == "cpu" and manifest["target"]["isa"]
    tuning = json.loads(data["tuning.json"])
    assert {k["name"] for k in tuning["kernels"]} == fused


_ABS_PATH = re.compile(r"(?<![\w.])/(?:home|tmp|root|usr|work|opt|var|srv|mnt)/")


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_no_build_machine_paths(built, name, tmp_path_factory):
    b = built[name]
    data = {info.name: d for info, d in read_bundle(b.bundle)}
    forbidden = {str(ROOT), str(b.config.cache_dir), str(build_root(tmp_path_factory)), sys.prefix,
                 str(Path(torch.__file__).parent), str(Path.home()), tempfile.gettempdir()}
    for member in ("graph.cpp", "manifest.json", "tuning.json"):
        text = data[member].decode()
        for path in forbidden:
            assert path not in text, f"{member} holds the build path {path}"
        if member != "tuning.json":
            assert not _ABS_PATH.search(text), f"{member}: {_ABS_PATH.search(text).group(0)}"


# ----------------------------------------------------------------------------- parity


_CHILD = textwrap.dedent("""
    import json, sys
    import torch
    from torch.utils import _pytree as pytree
    import ascendc_pack_runtime as rt

    cases = torch.load(sys.argv[1])
    report = {}
    for name, case in cases.items():
        model = rt.load(case["bundle"])
        problems = []
        for k, (inputs, expected, after) in enumerate(zip(case["inputs"], case["expected"], case["after"])):
            got = model(*inputs)
            e_flat, e_spec = pytree.tree_flatten(expected)
            g_flat, g_spec = pytree.tree_flatten(got)
            if e_spec != g_spec:
                problems.append(f"set {k}: structure {g_spec} != {e_spec}")
                continue
            for i, (e, g) in enumerate(zip(e_flat, g_flat)):
                if e.shape != g.shape or e.dtype != g.dtype or not torch.allclose(e, g, atol=1e-4, rtol=1e-4):
                    problems.append(f"set {k} output {i} differs")
            for i, (e, g) in enumerate(zip(after, inputs)):
                if not torch.allclose(e, g, atol=1e-5, rtol=1e-5):
                    problems.append(f"set {k}: input {i} after the call differs from eager's")
        report[name] = problems
    forbidden = sorted(m for m in sys.modules
                       if m.split(".")[0] in ("ascendc_pack", "jinja2", "click"))
    print(json.dumps({"report": report, "forbidden_modules": forbidden}))
""")


def test_fresh_process_parity_after_moving_bundles_and_deleting_build_cache(built, tmp_path):
    """Every example, on its example and calibration inputs (both cond branches, the in-place
    mutation), in a fresh process that never imports the compiler, from bundles moved elsewhere
    while the build cache is gone."""
    cond = built["cond_model"].loaded
    assert {bool(s[0].mean() > 0) for s in cond.all_input_sets} == {True, False}  # both branches

    moved = tmp_path / "elsewhere"
    moved.mkdir()
    cases = {}
    for name, b in built.items():
        target = moved / f"{name}.ascpack"
        target.write_bytes(b.bundle.read_bytes())
        inputs, expected, after = [], [], []
        for s in b.loaded.all_input_sets:
            eager_in = clone_inputs(s)
            with torch.no_grad():
                expected.append(b.loaded.module(*eager_in))
            inputs.append(clone_inputs(s))
            after.append(eager_in)
        cases[name] = {"bundle": str(target), "inputs": inputs, "expected": expected, "after": after}
    torch.save(cases, tmp_path / "cases.pt")
    (tmp_path / "child.py").write_text(_CHILD)

    cache = built["add_sum"].config.cache_dir
    hidden = cache.with_name(cache.name + ".hidden")
    os.rename(cache, hidden)
    try:
        env = {**os.environ, "ASCENDC_PACK_RUNTIME_CACHE": str(tmp_path / "runtime_cache")}
        proc = subprocess.run([sys.executable, str(tmp_path / "child.py"), str(tmp_path / "cases.pt")],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    finally:
        os.rename(hidden, cache)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["forbidden_modules"] == []
    assert result["report"] == {name: [] for name in built}
    extracted = [p for p in (tmp_path / "runtime_cache").iterdir()]
    assert len(extracted) == len(built) and all(len(p.name) == 64 for p in extracted)


def _count_allocations(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    try:
        events = prof.profiler.kineto_results.events()
    except AttributeError:  # pragma: no cover - profiler internals moved
        pytest.skip("this torch's profiler does not expose raw memory events")
    return sum(1 for e in events if e.name() == "[memory]" and e.nbytes() > 0)


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_a_call_allocates_only_its_outputs(built, name, tmp_path):
    b = built[name]
    model = rt.load(b.bundle, cache_dir=tmp_path)
    inputs = clone_inputs(b.loaded.example_inputs)
    model(*inputs)  # first call: lazily initialized state in ATen / OpenMP
    allocs = _count_allocations(lambda: model(*inputs))
    with torch.no_grad():
        eager = _count_allocations(lambda: b.loaded.module(*inputs))
    n_out = sum(1 for o in model.manifest["outputs"] if "input_index" not in o)
    if name == "conv_block":  # mkldnn convolution allocates its result and scratch itself
        assert allocs < eager
    else:
        assert allocs == n_out, f"{allocs} allocations per call, {n_out} outputs (eager: {eager})"
    memory = model.manifest["graph"]["memory"]
    assert memory["arena_bytes"] <= memory["arena_unshared_bytes"]


def test_memory_plan_shares_buffers(built):
    memory = built["transformer_block"].report.graph_source.stats
    assert memory["arena_bytes"] < memory["arena_unshared_bytes"] / 2
    assert memory["steps"]["aten_out"] > 0 and memory["steps"]["fused"] == 10


def test_rebuild_reuses_graph_and_is_byte_identical(built, tmp_path):
    b = built["add_sum"]
    again = build_bundle(b.fused, b.weights, b.choices, tmp_path / "again.ascpack", b.config)
    assert again.graph.cached and again.graph.compile_seconds == 0.0
    assert again.path.read_bytes() == b.bundle.read_bytes()


ZOO = '''
"""ATen fallbacks with every kind of argument, dict outputs, a mutated input."""
import torch
from torch import nn


class Zoo(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.lin = nn.Linear(16, 16)
        self.register_buffer("wt", torch.randn(16, 8).t())  # non-contiguous weight

    def forward(self, x, idx, y):
        y.mul_(2.0)
        e = self.emb(idx)
        h = self.lin(e).relu()
        a, b = torch.split(h, 8, dim=-1)
        c = torch.cat([a, b * 2, x], dim=-1)
        p, i = nn.functional.max_pool1d(c, 2, return_indices=True)
        s = torch.sort(c, dim=-1).values
        g = c[:, idx[0] % 10]
        q = torch.floor_divide(idx, 3)
        t = torch.clamp(c, min=x.mean(), max=torch.tensor(0.5))
        m = c[..., :8] @ self.wt
        u = torch.sort(x.transpose(1, 2) * 3, dim=-1).values + 1
        return {"u": u, "p": p, "i": i, "s": s, "g": g, "q": q, "t": t, "m": m,
                "w": torch.where(c > 0, c, 0.25), "y": y}


def get_model():
    torch.manual_seed(0)
    return Zoo()


def get_example_inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(4, 10, 8, generator=g), torch.randint(0, 50, (4, 10), generator=g),
            torch.randn(3, generator=g))
'''


@pytest.fixture(scope="module")
def zoo(built, tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo")
    path = root / "zoo.py"
    path.write_text(ZOO)
    return build_model_file(path, root / "zoo.ascpack", built["add_sum"].config)


def test_aten_fallbacks_of_every_argument_kind(zoo, tmp_path):
    stats = zoo.report.graph_source.stats
    # the transposed product is stored as eager lays it out, so the sort and the `+ 1` after it
    # read it as planned: no relayout (a kernel output stored contiguously cost one here)
    assert stats["steps"]["relayout"] == 0 and stats["steps"]["aten_out"] > 0
    model = rt.load(zoo.bundle, cache_dir=tmp_path)
    eager_in, run_in = clone_inputs(zoo.loaded.example_inputs), clone_inputs(zoo.loaded.example_inputs)
    with torch.no_grad():
        expected = zoo.loaded.module(*eager_in)
    got = model(*run_in)
    assert compare_outputs(expected, got, atol=1e-5, rtol=1e-5) is None
    assert all(torch.equal(a, b) for a, b in zip(eager_in, run_in))
    assert got["y"] is run_in[2]  # a mutated input that is returned is the caller's tensor


# ----------------------------------------------------------------------------- refusals


def _no_leftovers(cache: Path) -> None:
    assert not cache.exists() or not any(cache.iterdir()), sorted(p.name for p in cache.iterdir())


def test_corrupted_member_is_refused(built, tmp_path):
    def flip(manifest, members):
        for m in members:
            if m[0] == "graph.cpp":
                m[1] = m[1][:-2] + bytes([m[1][-2] ^ 1]) + m[1][-1:]

    bad = repack(built["add_sum"].bundle, tmp_path / "bad.ascpack", flip)
    cache = tmp_path / "cache"
    with pytest.raises(rt.BundleIntegrityError, match=r"graph\.cpp.*sha256"):
        rt.load(bad, cache_dir=cache)
    _no_leftovers(cache)


def test_wrong_size_missing_and_extra_members_are_refused(built, tmp_path):
    src = built["add_sum"].bundle

    def grow(manifest, members):
        members[-1][1] += b" "

    with pytest.raises(rt.BundleIntegrityError, match=r"tuning\.json.*bytes"):
        rt.load(repack(src, tmp_path / "a.ascpack", grow), cache_dir=tmp_path / "c")
    with pytest.raises(rt.BundleIntegrityError, match=r"tuning\.json.*missing"):
        rt.load(repack(src, tmp_path / "b.ascpack", lambda m, ms: ms.pop()), cache_dir=tmp_path / "c")
    with pytest.raises(rt.BundleIntegrityError, match=r"extra\.txt.*not listed"):
        rt.load(repack(src, tmp_path / "c.ascpack", lambda m, ms: ms.append(["extra.txt", b"x"])),
                cache_dir=tmp_path / "c")
    with pytest.raises(rt.BundleIntegrityError, match=r"appears twice"):
        rt.load(repack(src, tmp_path / "d.ascpack", lambda m, ms: ms.append(list(ms[0]))),
                cache_dir=tmp_path / "c")
    with pytest.raises(rt.BundleIntegrityError, match=r"graph\.so/x.*cannot be created"):
        rt.load(repack(src, tmp_path / "e.ascpack", lambda m, ms: ms.append(["graph.so/x", b"x"]),
                       fix_hashes=True), cache_dir=tmp_path / "c")
    _no_leftovers(tmp_path / "c")


@pytest.mark.parametrize("cut", [0.95, 0.5, 0.02])
def test_truncated_bundle_is_refused(built, tmp_path, cut):
    data = built["mlp"].bundle.read_bytes()
    bad = tmp_path / "cut.ascpack"
    bad.write_bytes(data[:int(len(data) * cut)])
    with pytest.raises(rt.BundleIntegrityError, match="truncated|corrupt|missing"):
        rt.load(bad, cache_dir=tmp_path / "cache")
    _no_leftovers(tmp_path / "cache")


def _unsafe_entries(kind: str, manifest_bytes: bytes):
    entries = [reg("manifest.json", manifest_bytes)]
    if kind in ("../evil", "/abs/evil", "kernels/../../evil", "./graph.so", ".hidden"):
        entries.append(reg(kind, b"x"))
        return entries
    info = tarfile.TarInfo("graph.so")
    if kind == "symlink":
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    elif kind == "hardlink":
        info.type, info.linkname = tarfile.LNKTYPE, "manifest.json"
    elif kind == "device":
        info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
    elif kind == "fifo":
        info.type = tarfile.FIFOTYPE
    elif kind == "dir":
        info.type = tarfile.DIRTYPE
    entries.append((info, b""))
    return entries


@pytest.mark.parametrize("kind", ["../evil", "/abs/evil", "kernels/../../evil", "./graph.so", ".hidden",
                                  "symlink", "hardlink", "device", "fifo", "dir"])
def test_unsafe_members_are_refused(built, tmp_path, kind):
    manifest_bytes = json.dumps(manifest_of(built["add_sum"].bundle)).encode()
    bad = write_raw(tmp_path / "bad.ascpack", _unsafe_entries(kind, manifest_bytes))
    with pytest.raises(rt.UnsafeMemberError):
        rt.load(bad, cache_dir=tmp_path / "cache")
    _no_leftovers(tmp_path / "cache")
    assert not (tmp_path / "evil").exists() and not Path("/abs/evil").exists()


def test_unsafe_name_in_manifest_is_refused(built, tmp_path):
    def edit(manifest, members):
        manifest["members"]["../x"] = {"size": 1, "sha256": "0" * 64}

    with pytest.raises(rt.UnsafeMemberError, match=r"\.\./x"):
        rt.load(repack(built["add_sum"].bundle, tmp_path / "bad.ascpack", edit), cache_dir=tmp_path / "c")


def test_not_a_bundle_and_bad_manifest_are_refused(built, tmp_path):
    junk = tmp_path / "junk.ascpack"
    junk.write_bytes(b"PK\x03\x04 not zstd")
    with pytest.raises(rt.BundleFormatError, match="not a zstd"):
        rt.load(junk, cache_dir=tmp_path / "c")
    with pytest.raises(rt.BundleNotFoundError):
        rt.load(tmp_path / "missing.ascpack", cache_dir=tmp_path / "c")
    src = built["add_sum"].bundle

    def newer(m, ms):
        m["format_version"] = 3   # 2 is a dynamic bundle (FORMAT_VERSION_DYNAMIC)

    def other(m, ms):
        m["format"] = "zip"

    with pytest.raises(rt.BundleFormatError, match="newer"):
        rt.load(repack(src, tmp_path / "v2.ascpack", newer), cache_dir=tmp_path / "c")
    with pytest.raises(rt.BundleFormatError, match="not an ascendc-pack bundle"):
        rt.load(repack(src, tmp_path / "fmt.ascpack", other), cache_dir=tmp_path / "c")
    entries = read_bundle(src)
    swapped = write_raw(tmp_path / "order.ascpack", [entries[1], entries[0], *entries[2:]])
    with pytest.raises(rt.BundleFormatError, match="first member"):
        rt.load(swapped, cache_dir=tmp_path / "c")


def test_incompatible_host_is_refused(built, tmp_path):
    src = built["add_sum"].bundle

    def old_torch(m, ms):
        m["torch"]["version"] = "1.13.0"

    def exotic_isa(m, ms):
        m["target"]["isa"] = m["target"]["isa"] + ["avx9000"]

    def other_arch(m, ms):
        m["target"]["arch"] = "riscv64"

    with pytest.raises(rt.IncompatibleBundleError, match="torch 1.13.0"):
        rt.load(repack(src, tmp_path / "a.ascpack", old_torch), cache_dir=tmp_path / "c")
    with pytest.raises(rt.IncompatibleBundleError, match="avx9000"):
        rt.load(repack(src, tmp_path / "b.ascpack", exotic_isa), cache_dir=tmp_path / "c")
    with pytest.raises(rt.IncompatibleBundleError, match="riscv64"):
        rt.load(repack(src, tmp_path / "d.ascpack", other_arch), cache_dir=tmp_path / "c")


def test_kernel_key_mismatch_is_refused_by_the_graph(built, tmp_path):
    """Two kernels' libraries swapped (hashes fixed up): the graph's baked kernel_key catches it."""
    def swap(manifest, members):
        ks = [m for m in members if m[0].startswith("kernels/")]
        assert len(ks) == 2
        ks[0][1], ks[1][1] = ks[1][1], ks[0][1]

    bad = repack(built["inplace"].bundle, tmp_path / "swapped.ascpack", swap, fix_hashes=True)
    with pytest.raises(rt.BundleLoadError, match="kernel_key"):
        rt.load(bad, cache_dir=tmp_path / "c")
