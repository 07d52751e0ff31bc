"""Helpers of the runtime hardening tests (test_verify, test_fuzz_bundle, test_cpp_api,
test_cli_runtime): one bundle per example and -march per test session, raw bundle surgery, and
the corpus of malformed bundles (one or more per broken invariant, each with its typed error).
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
import zstandard

import ascendc_pack_runtime as rt
from ascendc_pack.config import BuildConfig
from ascendc_pack_runtime.constants import FORMAT_VERSION_DYNAMIC
from ascendc_pack_runtime.host import host_cpu_flags

from . import bundle_fixtures
from .bundle_fixtures import BuiltExample, build_model_file, build_root
from .conftest import EXAMPLES

_BUILT: dict[tuple[str, str | None], BuiltExample] = {}


def example(tmp_path_factory, name: str = "add_sum", march: str | None = None) -> BuiltExample:
    """``examples/<name>.py`` built once per test session (candidate 0 of every kernel), sharing
    the kernel/graph cache of ``bundle_fixtures.build_examples`` (so a session that also runs
    test_bundle/test_runtime compiles nothing twice)."""
    if march is None and name in bundle_fixtures._BUILT:
        return bundle_fixtures._BUILT[name]
    key = (name, march)
    if key not in _BUILT:
        root = build_root(tmp_path_factory)
        config = BuildConfig.resolve(topn=1, cache_dir=root / "build_cache", jobs=2, march=march)
        out = root / "out_runtime" / f"{name}{'.' + march if march else ''}.ascpack"
        _BUILT[key] = build_model_file(EXAMPLES / f"{name}.py", out, config)
    return _BUILT[key]


def eager_reference(b: BuiltExample):
    """(inputs, expected outputs) of the example inputs, from eager PyTorch."""
    inputs = tuple(t.clone() for t in b.loaded.example_inputs)
    with torch.no_grad():
        expected = b.loaded.module(*(t.clone() for t in inputs))
    return inputs, expected


# ----------------------------------------------------------------------------- raw surgery


def reg(name: str, data: bytes, mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    return info


@dataclass
class Parts:
    """A bundle taken apart: the manifest (dict, or raw bytes when set) and the other members."""

    manifest: dict
    members: list[list]                    # [TarInfo, bytes], archive order
    manifest_bytes: bytes | None = None    # overrides json.dumps(manifest)
    prefix: list[list] = field(default_factory=list)   # members placed before manifest.json

    def copy(self) -> Parts:
        return Parts(copy.deepcopy(self.manifest), [[copy.copy(i), d] for i, d in self.members],
                     self.manifest_bytes, [[copy.copy(i), d] for i, d in self.prefix])

    def member(self, name: str) -> list:
        return next(m for m in self.members if m[0].name == name)

    def resign(self) -> Parts:
        """Recompute every listed member's size and sha256 (only regular members by name)."""
        self.manifest["members"] = {info.name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                                    for info, data in self.members if info.isreg()}
        return self

    def entries(self) -> list[tuple[tarfile.TarInfo, bytes]]:
        mb = self.manifest_bytes if self.manifest_bytes is not None else \
            (json.dumps(self.manifest, indent=1) + "\n").encode()
        return [*map(tuple, self.prefix), (reg("manifest.json", mb), mb), *map(tuple, self.members)]


def parts_of(path: Path) -> Parts:
    entries = bundle_fixtures.read_bundle(path)
    assert entries[0][0].name == "manifest.json"
    return Parts(json.loads(entries[0][1]), [[info, data] for info, data in entries[1:]])


def tar_bytes(entries, tail: bytes = b"") -> bytes:
    """A pax tar of ``entries`` (any member type); ``tail`` is appended after the archive."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            if info.isreg() and info.type != tarfile.GNUTYPE_SPARSE:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            elif info.type == tarfile.GNUTYPE_SPARSE:
                info.size = len(data)
                buf.write(info.tobuf(tarfile.GNU_FORMAT))
                buf.write(data + b"\0" * (-len(data) % 512))
                tar.offset = buf.tell()
            else:
                tar.addfile(info)
    return buf.getvalue() + tail


def zstd(data: bytes, checksum: bool = True) -> bytes:
    return zstandard.ZstdCompressor(level=3, write_checksum=checksum).compress(data)


def pack(parts: Parts, *, checksum: bool = True, tail: bytes = b"") -> bytes:
    return zstd(tar_bytes(parts.entries(), tail), checksum)


# ----------------------------------------------------------------------------- the corpus


@dataclass
class Case:
    """A malformed bundle and the error it must be refused with."""

    name: str
    data: bytes
    expected: type
    env: dict = field(default_factory=dict)
    before_load: bool = True     # refused before anything is dlopen()ed (verify_bundle sees it too)


def missing_host_feature() -> str:
    """A CPU feature name this host does not have (a real x86 one when possible)."""
    flags = host_cpu_flags() or set()
    for cand in ("avx512_fp16", "amx_tile", "avx512_vp2intersect", "avx512ifma", "sve", "avx512f"):
        if cand not in flags:
            return cand
    return "avx10_2_fake"


def corpus(valid: Path) -> list[Case]:
    """One malformed bundle per broken invariant (several where the invariant has variants)."""
    base = parts_of(valid)
    raw = valid.read_bytes()
    cases: list[Case] = []

    def add(name, data, expected, **kw):
        cases.append(Case(name, data, expected, **kw))

    def edited(fn, *, resign=False, checksum=True, tail=b""):
        p = base.copy()
        fn(p)
        if resign:
            p.resign()
        return pack(p, checksum=checksum, tail=tail)

    def set_manifest_bytes(data):
        def fn(p):
            p.manifest_bytes = data
        return fn

    # --- not a bundle / format
    add("not_zstd", b"PK\x03\x04" + b"\0" * 64, rt.NotABundleError)
    add("empty_file", b"", rt.NotABundleError)
    add("zstd_not_tar", zstd(b"this is not a tar archive " * 40), rt.NotABundleError)
    add("empty_tar", zstd(tar_bytes([])), rt.NotABundleError)

    def manifest_not_first(p):
        p.prefix, p.members = [p.members[0]], p.members[1:]
    add("manifest_not_first", edited(manifest_not_first), rt.NotABundleError)
    add("format_name", edited(lambda p: p.manifest.update(format="zip")), rt.FormatNameError)
    add("format_version_newer", edited(lambda p: p.manifest.update(format_version=FORMAT_VERSION_DYNAMIC + 1)),
        rt.FormatVersionError)
    add("format_version_older", edited(lambda p: p.manifest.update(format_version=0)), rt.FormatVersionError)
    add("format_version_text", edited(lambda p: p.manifest.update(format_version="1")), rt.FormatVersionError)
    add("manifest_truncated_json", edited(set_manifest_bytes(b'{"format": "ascpack", "format_version": 1,')),
        rt.ManifestJSONError)
    add("manifest_not_utf8", edited(set_manifest_bytes(b'\xff\xfe{"format": "ascpack"}')), rt.ManifestJSONError)
    add("manifest_not_object", edited(set_manifest_bytes(b"[1, 2, 3]")), rt.ManifestJSONError)
    add("manifest_too_large", edited(set_manifest_bytes(b" " * (16 << 20) + json.dumps(base.manifest).encode())),
        rt.ManifestJSONError)
    for key in ("backend", "target", "torch", "inputs", "outputs", "mutations", "out_spec", "weights", "graph",
                "kernels", "members"):
        add(f"manifest_missing_{key}", edited(lambda p, key=key: p.manifest.pop(key)), rt.ManifestFieldError)
    kfile = base.manifest["kernels"][0]["file"]

    def setter(path, value):
        def fn(p):
            obj = p.manifest
            for k in path[:-1]:
                obj = obj[k]
            obj[path[-1]] = value
        return fn
    for name, path, value in [
        ("inputs_not_list", ["inputs"], {"x": 1}),
        ("input_dtype_unknown", ["inputs", 0, "dtype"], "float8"),
        ("input_shape_negative", ["inputs", 0, "shape"], [-1, 4]),
        ("input_name_missing", ["inputs", 0, "name"], None),
        ("output_input_index_out_of_range", ["outputs", 0, "input_index"], 7),
        ("mutation_names_no_input", ["mutations"], [{"input": "nope", "index": 0, "value": "add"}]),
        ("member_sha_not_hex", ["members", "graph.cpp", "sha256"], "XYZ"),
        ("member_size_negative", ["members", "graph.cpp", "size"], -1),
        ("member_size_bool", ["members", "graph.cpp", "size"], True),
        ("kernel_file_not_a_member", ["kernels", 0, "file"], "kernels/x/y/kernel.so"),
        ("kernel_key_missing", ["kernels", 0, "kernel_key"], None),
        ("weights_file_not_a_member", ["weights", "file"], "other.bin"),
        ("weights_tensors_missing", ["weights", "tensors"], None),
        ("graph_library_not_a_member", ["graph", "library"], "libother.so"),
        ("graph_namespace_missing", ["graph", "namespace"], None),
        ("torch_version_missing", ["torch", "version"], None),
        ("torch_abi_not_bool", ["torch", "cxx11_abi"], "yes"),
        ("target_isa_not_list", ["target", "isa"], "avx2"),
        ("manifest_lists_itself", ["members", "manifest.json"], {"size": 1, "sha256": "0" * 64}),
    ]:
        add(f"field_{name}", edited(setter(path, value)), rt.ManifestFieldError)

    # --- hostile manifests (issue 14): consistent lies, numbers no field holds, duplicate keys
    add("output_aliases_unmutated_input", edited(lambda p: p.manifest["outputs"][0].update(input_index=0)),
        rt.ManifestFieldError)
    add("manifest_lists_signature", edited(setter(["members", "manifest.sig"], {"size": 1, "sha256": "0" * 64})),
        rt.ManifestFieldError)
    text = json.dumps(base.manifest, indent=1)
    add("integer_of_5000_digits", edited(set_manifest_bytes(text.replace('"topn": 1', '"topn": ' + "9" * 5000)
                                                            .encode())), rt.ManifestFieldError)
    add("duplicate_key", edited(set_manifest_bytes(text.replace('"topn": 1', '"topn": 1, "topn": 2').encode())),
        rt.ManifestJSONError)
    add("declared_ratio_bomb", edited(lambda p: p.manifest["members"]["tuning.json"].update(size=60 << 30)),
        rt.SizeLimitError)
    add("signature_not_second", edited(lambda p: p.members.append([reg("manifest.sig", b"{}"), b"{}"])),
        rt.ExtraMemberError)

    # --- corrupt / truncated stream
    add("truncated_half", raw[:len(raw) // 2], rt.CorruptArchiveError)
    add("truncated_checksum", raw[:-2], rt.CorruptArchiveError)
    add("truncated_to_header", raw[:5], rt.CorruptArchiveError)
    add("trailing_bytes", raw + b"\0" * 16, rt.CorruptArchiveError)
    add("appended_zstd_frame", raw + zstd(b"x" * 100), rt.CorruptArchiveError)
    flipped = bytearray(raw)
    flipped[-1] ^= 0x01
    add("checksum_mismatch", bytes(flipped), rt.CorruptArchiveError)
    tar = bytearray(tar_bytes(base.entries()))
    second = 512 + (len(json.dumps(base.manifest, indent=1)) + 1 + 511) // 512 * 512  # 2nd header (no pax)
    tar[second + 3] ^= 0x20     # a name byte: the header checksum no longer matches
    add("corrupt_tar_header", zstd(bytes(tar)), rt.CorruptArchiveError)

    # --- size caps (decompression bombs)
    def big_member(p):
        p.members.append([reg("pad.bin", b"\0" * (2 << 20)), b"\0" * (2 << 20)])
    add("declared_size_over_cap", edited(big_member, resign=True), rt.SizeLimitError,
        env={"ASCENDC_PACK_RUNTIME_MAX_BYTES": str(1 << 20)})
    add("zeros_after_archive", pack(base, tail=b"\0" * (8 << 20)), rt.SizeLimitError)

    def huge_pax(p):
        info, data = p.members[1]
        info = copy.copy(info)
        info.pax_headers = {"comment": "x" * (2 << 20)}
        p.members[1] = [info, data]
    add("huge_pax_header", edited(huge_pax), rt.SizeLimitError)

    def member_bigger_than_declared(p):
        m = p.member("graph.cpp")
        m[1] = b"\0" * (8 << 20)
    add("member_bigger_than_declared", edited(member_bigger_than_declared), rt.MemberSizeError)

    # --- member list, sizes, hashes
    add("missing_member", edited(lambda p: p.members.pop()), rt.MissingMemberError)
    add("extra_member", edited(lambda p: p.members.append([reg("extra.txt", b"x"), b"x"])), rt.ExtraMemberError)
    add("duplicate_member", edited(lambda p: p.members.insert(2, list(p.member("graph.cpp")))),
        rt.DuplicateMemberError)
    mb = (json.dumps(base.manifest, indent=1) + "\n").encode()
    add("duplicate_manifest", edited(lambda p: p.members.append([reg("manifest.json", mb), mb])),
        rt.DuplicateMemberError)

    def grow(p):
        p.member("graph.cpp")[1] += b" "
    add("member_size_mismatch", edited(grow), rt.MemberSizeError)

    def flip(p):
        m = p.member("graph.cpp")
        m[1] = m[1][:100] + bytes([m[1][100] ^ 1]) + m[1][101:]
    add("member_hash_mismatch", edited(flip), rt.MemberHashError)
    add("declared_size_wrong", edited(lambda p: p.manifest["members"]["tuning.json"].update(
        size=p.manifest["members"]["tuning.json"]["size"] + 1)), rt.MemberSizeError)
    add("declared_hash_wrong", edited(lambda p: p.manifest["members"]["tuning.json"].update(sha256="0" * 64)),
        rt.MemberHashError)
    add("path_conflict", edited(lambda p: p.members.append([reg("graph.so/x", b"x"), b"x"]), resign=True),
        rt.MemberPathConflictError)

    # --- unsafe names and member types
    for bad in ("../evil", "/abs/evil", "kernels/../../evil", "./graph.so", ".hidden", "a//b", "a\\b",
                "sp ace", "graph.so/"):
        add(f"unsafe_name_{bad}", edited(lambda p, bad=bad: p.members.append([reg(bad, b"x"), b"x"])),
            rt.UnsafeMemberNameError)

    def listed_unsafe(p):
        p.manifest["members"]["../x"] = {"size": 1, "sha256": "0" * 64}
    add("unsafe_name_listed", edited(listed_unsafe), rt.UnsafeMemberNameError)
    for kind in ("symlink", "hardlink", "chardev", "blockdev", "fifo", "directory", "contiguous", "sparse"):
        def typed(p, kind=kind):
            info = tarfile.TarInfo("graph.cpp")
            data = b""
            if kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            elif kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, "manifest.json"
            elif kind == "chardev":
                info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
            elif kind == "blockdev":
                info.type, info.devmajor, info.devminor = tarfile.BLKTYPE, 8, 0
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            elif kind == "directory":
                info.type = tarfile.DIRTYPE
            elif kind == "contiguous":
                info.type, data = tarfile.CONTTYPE, b"x"
            elif kind == "sparse":
                info.type, data = tarfile.GNUTYPE_SPARSE, b"x"
            p.member("graph.cpp")[:] = [info, data]
        add(f"member_type_{kind}", edited(typed), rt.UnsafeMemberTypeError)

    # --- host compatibility (hashes consistent: only the host check fires)
    feature = missing_host_feature()
    add("isa_feature_missing", edited(lambda p: p.manifest["target"]["isa"].append(feature)),
        rt.MissingCpuFeaturesError)
    add("arch_other", edited(lambda p: p.manifest["target"].update(arch="riscv64")), rt.ArchMismatchError)
    add("torch_other", edited(lambda p: p.manifest["torch"].update(version="1.13.0")), rt.TorchVersionMismatchError)
    add("cxx_abi_other", edited(lambda p: p.manifest["torch"].update(
        cxx11_abi=not bool(torch._C._GLIBCXX_USE_CXX11_ABI))), rt.CxxAbiMismatchError)
    add("backend_unavailable", edited(lambda p: p.manifest.update(backend="cuda")), rt.BackendUnavailableError)

    # --- load stage (verified content, mismatched files: refused at load, never crash)
    def garbage_graph(p):
        p.member("graph.so")[1] = b"this is not an ELF file"
        p.manifest["graph"]["namespace"] = "ascpack_" + "0" * 20   # not loaded in this process yet
    add("graph_so_garbage", edited(garbage_graph, resign=True), rt.GraphLoadError, before_load=False)

    def garbage_kernel(p):
        p.member(kfile)[1] = b"\x7fELF but not really"
    add("kernel_so_garbage", edited(garbage_kernel, resign=True), rt.GraphLoadError, before_load=False)
    # consistent manifest (kernel_key is still md5 of its tiling), another kernel than graph.so's
    add("kernel_name_mismatch", edited(lambda p: p.manifest["kernels"][0].update(name="fused_other")),
        rt.KernelMismatchError, before_load=False)
    add("io_count_mismatch", edited(_one_more_output), rt.KernelMismatchError, before_load=False)
    return cases


def _one_more_output(p) -> None:
    """A manifest that agrees with itself (outputs and out_tree) but not with its graph.so."""
    p.manifest["outputs"].append({"name": "extra", "shape": [1], "dtype": "float32"})
    tree = p.manifest["out_tree"]
    p.manifest["out_tree"] = {"kind": "tuple", "items": [tree, {"kind": "leaf"}]}


def families(cls: type) -> set[str]:
    return {c.__name__ for c in cls.__mro__}


# ----------------------------------------------------------------------------- the cache, as an attacker


def run_bundle_binary(tmp_path_factory) -> Path:
    """examples/cpp/run_bundle built once per session (g++ against this libtorch)."""
    import os
    import subprocess
    import sys

    from .conftest import ROOT

    out = build_root(tmp_path_factory) / "cpp" / "run_bundle"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["sh", str(ROOT / "examples" / "cpp" / "build.sh"), str(out)], capture_output=True,
                              text=True, env={**os.environ, "PYTHON": sys.executable}, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return out


def signing_keys(tmp_path_factory, names=("alice", "mallory")) -> dict:
    """Fresh ed25519 key pairs ``{name: (private key file, public key file, key id)}``."""
    from ascendc_pack.package.signing import generate_key

    d = tmp_path_factory.mktemp("keys")
    return {name: generate_key(d / name) for name in names}


def refix_marker(directory: Path) -> None:
    """Make the extraction's marker name the sha256 of its (edited) manifest.json, as an
    attacker who can write the cache would."""
    marker = directory / rt.bundle.VERIFIED_MARKER
    doc = json.loads(marker.read_text())
    doc["manifest_sha256"] = hashlib.sha256((directory / "manifest.json").read_bytes()).hexdigest()
    marker.write_text(json.dumps(doc))


def evil_library(tmp: Path, size: int, flag: Path) -> bytes | None:
    """A shared library of exactly ``size`` bytes whose constructor creates ``flag`` (None when
    a minimal library is larger than ``size`` or no C compiler is there)."""
    import shutil
    import subprocess

    cc = shutil.which("gcc") or shutil.which("g++")
    if cc is None:
        return None
    src = tmp / "evil.c"
    src.write_text('#include <fcntl.h>\n#include <unistd.h>\n__attribute__((constructor)) static void evil(void) '
                   f'{{ int fd = open("{flag}", O_CREAT | O_WRONLY, 0644); if (fd >= 0) close(fd); }}\n')
    so = tmp / "evil.so"
    subprocess.run([cc, "-x", "c", "-shared", "-fPIC", "-Os", "-s", str(src), "-o", str(so)], check=True)
    data = so.read_bytes()
    return data + b"\0" * (size - len(data)) if len(data) <= size else None


__all__ = ["example", "eager_reference", "Parts", "parts_of", "pack", "tar_bytes", "zstd", "reg", "Case",
           "corpus", "missing_host_feature", "families", "run_bundle_binary", "refix_marker", "evil_library",
           "signing_keys"]
