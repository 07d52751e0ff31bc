"""Fuzzing the runtime's loader with mutated bundles (hypothesis).

Two generators mutate a valid bundle (add_sum):

* bytes: flips, overwrites, deletions, insertions, duplications and truncations of the
  compressed file itself;
* structure: the tar and the manifest (drop / duplicate / add / rename / retype members, change
  their bytes, sizes and hashes, delete or mistype manifest fields, host facts) and harmless
  changes that must still load (member order, tar metadata, manifest formatting, unknown fields).

Every case is loaded by a separate worker process (so a crash would be seen as a dead worker,
and the worker is restarted), with its working directory, HOME and TMPDIR in empty directories.
The oracle: a refusal is a typed ``BundleError`` of the expected class (byte mutations: a
format or integrity error), ``verify_bundle`` reports the same first problem, and a bundle
that loads computes exactly what eager PyTorch computes. At the end nothing may exist outside
the runtime cache but the case files, and the cache holds only complete extractions.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ascendc_pack_runtime as rt
from ascendc_pack_runtime.constants import FORMAT_VERSION_DYNAMIC
from ascendc_pack_runtime.tensor_meta import DTYPES

from .runtime_fixtures import eager_reference, example, families, missing_host_feature, pack, parts_of, reg

BYTE_EXAMPLES = int(os.environ.get("ASCPACK_FUZZ_BYTE_EXAMPLES", "250"))
STRUCT_EXAMPLES = int(os.environ.get("ASCPACK_FUZZ_STRUCT_EXAMPLES", "300"))

_WORKER = textwrap.dedent("""
    import json, os, sys
    import torch
    import ascendc_pack_runtime as rt

    cache, ref = sys.argv[1], torch.load(sys.argv[2])
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("max_bytes"):
            os.environ["ASCENDC_PACK_RUNTIME_MAX_BYTES"] = str(req["max_bytes"])
        else:
            os.environ.pop("ASCENDC_PACK_RUNTIME_MAX_BYTES", None)
        res = {}
        try:
            model = rt.load(req["path"], cache_dir=cache)
            try:
                got = model(*[t.clone() for t in ref["inputs"]])
                ok = isinstance(got, torch.Tensor) and got.shape == ref["expected"].shape and \\
                    bool(torch.allclose(got, ref["expected"], atol=1e-3, rtol=1e-4))
                res = {"status": "loaded", "correct": ok}
            except Exception as e:  # noqa: BLE001
                res = {"status": "call_failed", "kind": type(e).__name__, "message": str(e)[:300]}
            model.close()
        except rt.BundleError as e:
            res = {"status": "refused", "kind": type(e).__name__,
                   "families": [c.__name__ for c in type(e).__mro__], "message": str(e)[:300]}
        except Exception as e:  # noqa: BLE001 - an untyped error is a finding
            res = {"status": "untyped", "kind": type(e).__name__, "message": str(e)[:300]}
        try:
            res["verify"] = [p.kind for p in rt.verify_bundle(req["path"]).problems]
        except Exception as e:  # noqa: BLE001 - verify_bundle must never raise
            res = {"status": "untyped", "kind": "verify_bundle raised " + type(e).__name__, "message": str(e)[:300]}
        print(json.dumps(res), flush=True)
""")


class Worker:
    """A long-lived loader process; a crash is detected as EOF and the worker restarted."""

    def __init__(self, root: Path, ref: Path):
        self.root, self.ref = root, ref
        self.dirs = {k: root / k for k in ("cache", "cwd", "home", "tmp")}
        for d in self.dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        (root / "worker.py").write_text(_WORKER)
        self.proc = None
        self.crashes = []
        self.start()

    def start(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("ASCENDC_PACK_RUNTIME_")}
        env.update(HOME=str(self.dirs["home"]), TMPDIR=str(self.dirs["tmp"]), OMP_NUM_THREADS="1",
                   XDG_CACHE_HOME=str(self.dirs["home"] / "xdg"), PYTHONDONTWRITEBYTECODE="1")
        self.proc = subprocess.Popen([sys.executable, str(self.root / "worker.py"), str(self.dirs["cache"]),
                                      str(self.ref)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env, cwd=self.dirs["cwd"])

    def load(self, path: Path, max_bytes: int | None = None) -> dict:
        try:
            self.proc.stdin.write(json.dumps({"path": str(path), "max_bytes": max_bytes}) + "\n")
            self.proc.stdin.flush()
            ready, _, _ = select.select([self.proc.stdout], [], [], 120)
            line = self.proc.stdout.readline() if ready else ""
        except BrokenPipeError:
            line = ""
        if not line:
            self.proc.kill()
            code = self.proc.wait()
            self.crashes.append({"case": str(path), "returncode": code})
            self.start()
            return {"status": "crash", "returncode": code}
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


STATS: dict = {"bytes": {}, "structure": {}, "cases": 0}


class _Ctx(dict):
    """The fuzz fixture (a dict with a short repr, for hypothesis' failure reports)."""

    def __repr__(self) -> str:
        return f"<fuzz context {self['root']}>"


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory):
    b = example(tmp_path_factory, "add_sum")
    root = tmp_path_factory.mktemp("fuzz")
    inputs, expected = eager_reference(b)
    torch.save({"inputs": inputs, "expected": expected}, root / "ref.pt")
    cases = root / "cases"
    cases.mkdir()
    worker = Worker(root, root / "ref.pt")
    yield _Ctx({"bundle": b.bundle, "raw": b.bundle.read_bytes(), "parts": parts_of(b.bundle), "root": root,
           "cases": cases, "worker": worker, "feature": missing_host_feature()})
    worker.close()


def _run_case(fuzz, data: bytes, group: str, label: str, max_bytes: int | None = None, lie: bool = False) -> dict:
    STATS["cases"] += 1
    path = fuzz["cases"] / f"{STATS['cases']:05d}.ascpack"
    path.write_bytes(data)
    res = fuzz["worker"].load(path, max_bytes)
    outcome = res["status"] if res["status"] != "refused" else f"refused:{res['kind']}"
    counts = STATS[group].setdefault(label, {})
    counts[outcome] = counts.get(outcome, 0) + 1
    assert res["status"] != "crash", f"{label}: the loader process died ({res}); case kept at {path}"
    assert res["status"] != "untyped", f"{label}: untyped {res['kind']}: {res['message']} ({path})"
    if res["status"] == "refused" and res["kind"] not in ("GraphLoadError", "KernelMismatchError"):
        assert res["verify"] and res["verify"][0] == res["kind"], f"{label}: verify {res['verify']} vs {res}"
    if res["status"] == "call_failed" and lie:   # the manifest lies about the io specs: a clean refusal
        assert res["kind"] in ("ValueError", "RuntimeError"), f"{label}: {res}"
    elif res["status"] in ("loaded", "call_failed"):
        assert res["status"] == "loaded" and res["correct"], f"{label}: loaded but {res} ({path})"
        assert res["verify"] == [], f"{label}: loads but verify says {res['verify']}"
    path.unlink()
    return res


# ----------------------------------------------------------------------------- bytes

_byte_op = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 30), st.integers(0, 7)),
    st.tuples(st.just("set"), st.integers(0, 1 << 30), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 30), st.integers(1, 64)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 30), st.binary(min_size=1, max_size=32)),
    st.tuples(st.just("duplicate"), st.integers(0, 1 << 30), st.integers(1, 512)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 30), st.just(0)),
)


def _apply_bytes(data: bytes, ops) -> bytes:
    b = bytearray(data)
    for kind, pos, arg in ops:
        if not b:
            break
        # positions favour the start (frame header, manifest) and the end (checksum)
        p = pos % len(b) if pos % 3 else (pos % min(len(b), 600) if pos % 2 else len(b) - 1 - pos % min(len(b), 16))
        if kind == "flip":
            b[p] ^= 1 << arg
        elif kind == "set":
            b[p] = arg if b[p] != arg else (arg + 1) % 256
        elif kind == "delete":
            del b[p:p + arg]
        elif kind == "insert":
            b[p:p] = arg
        elif kind == "duplicate":
            b[p:p] = b[p:p + arg]
        else:
            del b[p:]
    return bytes(b)


@settings(max_examples=BYTE_EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(ops=st.lists(_byte_op, min_size=1, max_size=3))
def test_fuzz_compressed_bytes(fuzz, ops):
    data = _apply_bytes(fuzz["raw"], ops)
    label = "+".join(op[0] for op in ops)
    res = _run_case(fuzz, data, "bytes", label)
    if data == fuzz["raw"]:
        assert res["status"] == "loaded"
    elif res["status"] == "refused":
        assert {"BundleFormatError", "BundleIntegrityError"} & set(res["families"]), res


# ----------------------------------------------------------------------------- structure

_REQUIRED = ["backend", "target", "torch", "inputs", "outputs", "mutations", "out_spec", "weights", "graph",
             "kernels", "members"]
# manifest paths the runtime validates -> classify(value) as "invalid" (must be refused with
# ManifestFieldError), "lie" (well typed but not what graph.so was built with: any typed refusal, a
# clean refusal of the call, or a correct run) or "valid"; the original value is always "valid".
def _is_uint(v):
    return type(v) is int and v >= 0


def _uints(v):
    return isinstance(v, list) and all(_is_uint(x) for x in v)


_TYPED = {
    ("backend",): lambda v: "lie" if isinstance(v, str) else "invalid",
    ("inputs",): lambda v: "lie" if v == [] else "invalid",
    ("outputs",): lambda v: "lie" if v == [] else "invalid",
    ("kernels",): lambda v: "lie" if v == [] else "invalid",
    ("inputs", 0, "name"): lambda v: "valid" if isinstance(v, str) else "invalid",
    ("inputs", 0, "dtype"): lambda v: "lie" if isinstance(v, str) and v in DTYPES else "invalid",
    ("inputs", 0, "shape"): lambda v: "lie" if _uints(v) and len(v) != 1 else "invalid",
    ("outputs", 0, "dtype"): lambda v: "lie" if isinstance(v, str) and v in DTYPES else "invalid",
    ("weights", "file"): lambda v: "invalid",
    ("graph", "library"): lambda v: "invalid",
    ("graph", "namespace"): lambda v: "invalid",
    ("graph", "abi"): lambda v: "lie" if type(v) is int else "invalid",
    ("torch", "version"): lambda v: "lie" if isinstance(v, str) and v else "invalid",
    ("target", "isa"): lambda v: "lie" if isinstance(v, list) and all(isinstance(x, str) for x in v) else "invalid",
    ("kernels", 0, "file"): lambda v: "invalid",
    ("kernels", 0, "name"): lambda v: "lie" if isinstance(v, str) else "invalid",
    ("members", "graph.cpp", "size"): lambda v: "lie" if _is_uint(v) else "invalid",
    ("members", "graph.cpp", "sha256"): lambda v: "invalid",
}
_json_values = st.recursive(st.none() | st.booleans() | st.integers(-5, 1 << 40) | st.floats(allow_nan=False)
                            | st.text(max_size=8), lambda c: st.lists(c, max_size=3)
                            | st.dictionaries(st.text(max_size=4), c, max_size=3), max_leaves=5)
_UNSAFE = ["../evil", "/abs/evil", "a/../../evil", "./x", ".hidden", "a//b", "a\\b", "sp ace", "x/", "-dash",
           "\u00e9t\u00e9", "a" * 300]

# every kind equally likely (hypothesis would otherwise favour the kinds with large value spaces)
_STRUCT_OPS = {
    "drop_member": st.tuples(st.just("drop_member"), st.integers(0, 99)),
    "duplicate_member": st.tuples(st.just("duplicate_member"), st.integers(0, 99)),
    "extra_member": st.tuples(st.just("extra_member"),
                              st.from_regex(r"[a-z][a-z0-9_]{0,8}(/[a-z][a-z0-9_.]{0,8}){0,2}", fullmatch=True),
                              st.binary(max_size=64)),
    "member_bytes": st.tuples(st.just("member_bytes"), st.integers(0, 99), st.integers(0, 1 << 20),
                              st.integers(1, 255)),
    "member_resize": st.tuples(st.just("member_resize"), st.integers(0, 99), st.integers(-64, 64).filter(bool)),
    "declared_size": st.tuples(st.just("declared_size"), st.integers(0, 99), st.integers(-1000, 1000).filter(bool)),
    "declared_sha": st.tuples(st.just("declared_sha"), st.integers(0, 99),
                              st.from_regex(r"[0-9a-f]{64}", fullmatch=True)),
    "unsafe_name": st.tuples(st.just("unsafe_name"), st.integers(0, 99), st.sampled_from(_UNSAFE)),
    "member_type": st.tuples(st.just("member_type"), st.integers(0, 99),
                             st.sampled_from(["sym", "lnk", "chr", "blk", "fifo", "dir", "cont"])),
    "delete_field": st.tuples(st.just("delete_field"), st.sampled_from(_REQUIRED)),
    "mistype_field": st.tuples(st.just("mistype_field"), st.sampled_from(sorted(_TYPED)), _json_values),
    "format_version": st.tuples(st.just("format_version"), st.integers(-3, 5).filter(lambda v: v != 1)),
    "host": st.tuples(st.just("host"), st.sampled_from(["isa", "arch", "torch", "abi", "backend"])),
    "size_cap": st.tuples(st.just("size_cap"), st.integers(1, 150_000)),
    "reorder": st.tuples(st.just("reorder"), st.permutations(range(5))),
    "tar_metadata": st.tuples(st.just("tar_metadata"), st.integers(0, 99), st.integers(0, 1 << 30)),
    "reformat": st.tuples(st.just("reformat"), st.sampled_from([None, 0, 2, 4]), st.booleans()),
    "unknown_field": st.tuples(st.just("unknown_field"), st.text(min_size=1, max_size=10), _json_values),
}
_struct_op = st.sampled_from(sorted(_STRUCT_OPS)).flatmap(lambda kind: _STRUCT_OPS[kind])

_HOST = {"isa": rt.MissingCpuFeaturesError, "arch": rt.ArchMismatchError, "torch": rt.TorchVersionMismatchError,
         "abi": rt.CxxAbiMismatchError, "backend": rt.BackendUnavailableError}


def _mutate(fuzz, op):
    """Apply one structural mutation; returns (bytes, expected class or None for valid, max_bytes)."""
    p = fuzz["parts"].copy()
    kind = op[0]
    n = len(p.members)
    expected, max_bytes, checksum = None, None, True
    if kind == "drop_member":
        p.members.pop(op[1] % n)
        expected = rt.MissingMemberError
    elif kind == "duplicate_member":
        i = op[1] % n
        p.members.insert(i + 1, list(p.members[i]))
        expected = rt.DuplicateMemberError
    elif kind == "extra_member":
        name = op[1]
        listed = set(p.manifest["members"])
        if name in listed or any(name.startswith(m + "/") or m.startswith(name + "/") for m in listed):
            name = "extra_" + name.replace("/", "_")
        p.members.insert(op[1].__len__() % (n + 1), [reg(name, op[2]), op[2]])
        expected = rt.ExtraMemberError
    elif kind == "member_bytes":
        m = p.members[op[1] % n]
        if not m[1]:
            m[1] = bytes([op[3]])
            expected = rt.MemberSizeError
        else:
            i = op[2] % len(m[1])
            m[1] = m[1][:i] + bytes([m[1][i] ^ op[3]]) + m[1][i + 1:]
            expected = rt.MemberHashError
    elif kind == "member_resize":
        m = p.members[op[1] % n]
        m[1] = m[1] + b"\0" * op[2] if op[2] > 0 else m[1][:op[2]]
        expected = rt.MemberSizeError if len(m[1]) != p.manifest["members"][m[0].name]["size"] else None
    elif kind == "declared_size":
        name = p.members[op[1] % n][0].name
        info = p.manifest["members"][name]
        info["size"] += op[2]
        expected = rt.ManifestFieldError if info["size"] < 0 else rt.MemberSizeError
    elif kind == "declared_sha":
        name = p.members[op[1] % n][0].name
        same = p.manifest["members"][name]["sha256"] == op[2]
        p.manifest["members"][name]["sha256"] = op[2]
        expected = None if same else rt.MemberHashError
    elif kind == "unsafe_name":
        m = p.members[op[1] % n]
        m[0] = reg(op[2], m[1])
        expected = rt.UnsafeMemberNameError
    elif kind == "member_type":
        m = p.members[op[1] % n]
        info = tarfile.TarInfo(m[0].name)
        info.type = {"sym": tarfile.SYMTYPE, "lnk": tarfile.LNKTYPE, "chr": tarfile.CHRTYPE,
                     "blk": tarfile.BLKTYPE, "fifo": tarfile.FIFOTYPE, "dir": tarfile.DIRTYPE,
                     "cont": tarfile.CONTTYPE}[op[2]]
        info.linkname = "manifest.json" if op[2] in ("sym", "lnk") else ""
        m[:] = [info, m[1] if op[2] == "cont" else b""]
        expected = rt.UnsafeMemberTypeError
    elif kind == "delete_field":
        del p.manifest[op[1]]
        expected = rt.ManifestFieldError
    elif kind == "mistype_field":
        path, value = op[1], op[2]
        obj = p.manifest
        for k in path[:-1]:
            obj = obj[k]
        same = type(obj[path[-1]]) is type(value) and obj[path[-1]] == value
        obj[path[-1]] = value
        verdict = "valid" if same else _TYPED[path](value)
        expected = {"valid": None, "lie": "lie", "invalid": rt.ManifestFieldError}[verdict]
    elif kind == "format_version":
        p.manifest["format_version"] = op[1]
        # 2 is the version of a dynamic bundle: a static manifest under it lacks `dynamic`
        expected = rt.ManifestFieldError if op[1] == FORMAT_VERSION_DYNAMIC else rt.FormatVersionError
    elif kind == "host":
        t = p.manifest["target"]
        if op[1] == "isa":
            t["isa"].append(fuzz["feature"])
        elif op[1] == "arch":
            t["arch"] = "riscv64"
        elif op[1] == "torch":
            p.manifest["torch"]["version"] = "2.0.1"
        elif op[1] == "abi":
            p.manifest["torch"]["cxx11_abi"] = not p.manifest["torch"]["cxx11_abi"]
        else:
            p.manifest["backend"] = "cuda"
        expected = _HOST[op[1]]
    elif kind == "size_cap":   # (a fresh extraction each time: a reused one is not capped again)
        p.manifest["x_nonce"] = STATS["cases"]
        declared = sum(i["size"] for i in p.manifest["members"].values())
        max_bytes = op[1] * 2
        expected = rt.SizeLimitError if declared > max_bytes else None
    elif kind == "reorder":
        order = [i for i in op[1] if i < n]
        p.members = [p.members[i] for i in order]
    elif kind == "tar_metadata":
        m = p.members[op[1] % n]
        info = reg(m[0].name, m[1], mode=0o600 | (op[2] & 0o177))
        info.mtime, info.uid, info.gid = op[2], op[2] % 65536, op[2] % 1000
        info.uname, info.gname = "user%d" % (op[2] % 7), "g"
        m[0] = info
    elif kind == "reformat":
        p.manifest_bytes = json.dumps(p.manifest, indent=op[1], sort_keys=op[2]).encode()
        checksum = op[2]
    elif kind == "unknown_field":
        key = "x_" + op[1]
        p.manifest[key] = op[2]
    return pack(p, checksum=checksum), expected, max_bytes


@settings(max_examples=STRUCT_EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(op=_struct_op)
def test_fuzz_structure(fuzz, op):
    data, expected, max_bytes = _mutate(fuzz, op)
    res = _run_case(fuzz, data, "structure", op[0], max_bytes, lie=expected == "lie")
    if expected == "lie":
        return
    if expected is None:
        assert res["status"] == "loaded", f"{op}: a valid bundle was refused: {res}"
    else:
        assert res["status"] == "refused" and res["kind"] == expected.__name__, f"{op}: {res}"
        assert expected.__name__ in res["families"] and families(expected) <= set(res["families"])


def test_fuzz_summary_no_crash_and_nothing_written_outside_the_cache(fuzz):
    worker = fuzz["worker"]
    root = fuzz["root"]
    summary = {"cases": STATS["cases"], "crashes": len(worker.crashes)}
    for group in ("bytes", "structure"):
        total = refused = loaded = 0
        for outcomes in STATS[group].values():
            for k, v in outcomes.items():
                total += v
                refused += v if k.startswith("refused") else 0
                loaded += v if k == "loaded" else 0
        summary[group] = {"cases": total, "refused": refused, "loaded_and_correct": loaded}
    summary["refusals_by_class"] = {}
    for group in ("bytes", "structure"):
        for outcomes in STATS[group].values():
            for k, v in outcomes.items():
                if k.startswith("refused:"):
                    cls = k.split(":", 1)[1]
                    summary["refusals_by_class"][cls] = summary["refusals_by_class"].get(cls, 0) + v
    (root / "summary.json").write_text(json.dumps({**summary, "detail": STATS}, indent=1))
    print("\nfuzz summary:", json.dumps(summary, indent=1))
    assert summary["cases"] >= 1 and worker.crashes == []
    # nothing outside the runtime cache: the worker's cwd, HOME and TMPDIR stay empty, the case
    # files were deleted, and the cache holds only complete extractions (no temporary trees)
    for d in ("cwd", "home", "tmp", "cases"):
        leftovers = sorted(str(p.relative_to(root)) for p in (root / d).rglob("*"))
        assert leftovers == [], leftovers
    assert sorted(p.name for p in root.iterdir()) == ["cache", "cases", "cwd", "home", "ref.pt", "summary.json",
                                                      "tmp", "worker.py"]
    for p in (root / "cache").iterdir():
        assert p.is_dir() and len(p.name) == 64 and (p / rt.bundle.VERIFIED_MARKER).is_file(), p
    assert not Path("/abs/evil").exists()
