"""The bundle contract (ascendc_pack_runtime.manifest): one typed schema for the writer and every
reader, constants equal in Python and C++, and every edited field a typed refusal."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ascendc_pack
import ascendc_pack_runtime as rt
from ascendc_pack_runtime import constants, kernels, manifest as contract
from ascendc_pack_runtime.archive import read_head
from ascendc_pack_runtime.tensor_meta import DTYPES

from .conftest import ROOT
from .manifest_strategies import OPAQUE, edited, field_paths, manifests, wrong_values
from .runtime_fixtures import example

_SETTINGS = dict(deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
_OPTIONAL_RE = re.compile(r"outputs\[\d+\]\.(stride|input_index)$")
FORMAT_ERRORS = (rt.ManifestFieldError, rt.FormatNameError, rt.FormatVersionError)


# ----------------------------------------------------------------------------- round trip


def test_build_read_equal(tmp_path_factory):
    """The writer's typed manifest is what the reader reads back from the bundle, byte for byte."""
    b = example(tmp_path_factory, "add_sum")
    written = b.report.contract
    head = read_head(b.bundle)
    assert head.manifest == written
    assert head.manifest_bytes == written.dumps()
    assert rt.read_manifest(b.bundle) == written
    assert head.manifest.to_json() == head.manifest_json == b.report.manifest


@settings(max_examples=300, **_SETTINGS)
@given(m=manifests())
def test_round_trip_of_any_valid_manifest(m):
    data = m.dumps()
    back = contract.parse(data)
    assert back == m
    assert back.dumps() == data


# ----------------------------------------------------------------------------- edits


@settings(max_examples=600, **_SETTINGS)
@given(m=manifests(), data=st.data())
def test_any_edited_field_is_a_typed_refusal_naming_it(m, data):
    """Replace one field (any depth) by a value of a kind no field of its kind accepts: the
    reader refuses it with the format error class whose ``field`` is exactly that path."""
    doc = m.to_json()
    paths = [p for p in field_paths(doc) if not p[0].startswith(tuple(o + "." for o in OPAQUE))]
    path, keys = data.draw(st.sampled_from(paths), label="field")
    original = doc
    for k in keys:
        original = original[k]
    value = data.draw(st.sampled_from(wrong_values(original)), label="value")
    with pytest.raises(FORMAT_ERRORS) as ei:
        contract.parse(json.dumps(edited(doc, keys, value)).encode())
    assert ei.value.field == path, f"{path} = {value!r}: {ei.value}"
    assert path[:40] in str(ei.value) and ei.value.fix


@settings(max_examples=300, **_SETTINGS)
@given(m=manifests(), data=st.data())
def test_any_deleted_required_field_is_a_typed_refusal_naming_it(m, data):
    doc = m.to_json()
    paths = [p for p in field_paths(doc) if isinstance(p[1][-1], str) and not _OPTIONAL_RE.search(p[0])
             and not p[0].startswith(tuple(o + "." for o in OPAQUE)) and not p[0].startswith("members[")]
    path, keys = data.draw(st.sampled_from(paths), label="field")
    with pytest.raises(FORMAT_ERRORS) as ei:
        contract.parse(json.dumps(edited(doc, keys, delete=True)).encode())
    assert ei.value.field == path, f"deleting {path}: {ei.value}"


def test_consistent_edits_are_cross_checked(tmp_path_factory):
    """Well-typed edits that contradict another field are refused with the field they break."""
    doc = example(tmp_path_factory, "add_sum").report.manifest
    k0 = doc["kernels"][0]
    cases = [
        (["kernels", 0, "tiling_repr"], k0["tiling_repr"] + "x", "kernels[0].kernel_key"),
        (["kernels", 0, "block_dim"], k0["block_dim"] + 1, "kernels[0].kernel_key"),
        (["kernels", 0, "chosen_index"], len(k0["candidates"]), "kernels[0].chosen_index"),
        (["weights", "tensors", 0, "nbytes"], doc["weights"]["tensors"][0]["nbytes"] + 4,
         "weights.tensors[0].nbytes") if doc["weights"]["tensors"] else None,
        (["graph", "library"], "other.so", "graph.library"),
        (["inputs", 0, "stride"], [1], "inputs[0].stride"),
    ]
    for case in filter(None, cases):
        keys, value, field = case
        with pytest.raises(rt.ManifestFieldError) as ei:
            contract.Manifest.from_json(edited(doc, tuple(keys), value))
        assert ei.value.field == field, ei.value


def test_hostile_numbers_and_duplicate_keys_are_typed():
    """A 5,000-digit integer is a field error naming the field (not "corrupt: copy it again");
    NaN/Infinity are refused where a number is read; a duplicate key is malformed JSON (the C++
    reader refuses it too, so both readers always see the same value)."""
    doc = contract.Manifest.from_json(json.loads(_minimal().dumps())).to_json()
    text = json.dumps(doc).replace('"cores": 2', '"cores": ' + "9" * 5000)
    with pytest.raises(rt.ManifestFieldError) as ei:
        contract.parse(text.encode())
    assert ei.value.field == "cores" and "5000 digits" in str(ei.value)
    doc["kernels"] = []
    text = json.dumps(doc)
    with pytest.raises(rt.ManifestJSONError, match="duplicate key 'cores'"):
        contract.parse(text.replace('"cores": 2', '"cores": 2, "cores": 3').encode())
    with pytest.raises(rt.ManifestFieldError, match="topn"):
        contract.parse(text.replace('"topn": 1', '"topn": NaN').encode())


def _minimal() -> contract.Manifest:
    return contract.Manifest(
        format_version=1, producer=contract.Producer("ascendc-pack", "0"), model_name="m", backend="cpu",
        target=contract.Target("x86_64", "native", (), "g++"), torch=contract.TorchBuild("2.13.0", True),
        core_limit=None, cores=2, topn=1, inputs=(), outputs=(), mutations=(), out_spec="[]",
        weights=contract.Weights("weights.bin", 64, ()),
        graph=contract.Graph("graph.so", "graph.cpp", "ascpack_0123456789", 1, (), {}), kernels=(),
        members={n: contract.Member(0, "0" * 64) for n in ("graph.so", "graph.cpp", "weights.bin")})


# ----------------------------------------------------------------------------- constants

_CPP_CONSTANTS = r"""
#include <cstdio>
#include <ascendc_pack/kernel_abi.h>
#include <ascendc_pack/rt/contract.hpp>
using namespace ascendc_pack;
int main() {
  std::printf("{\"FORMAT_VERSION\": %d, \"GRAPH_ABI_VERSION\": %lld, \"KERNEL_ABI_VERSION\": %d, ",
              kFormatVersion, (long long)kGraphAbi, AP_KERNEL_ABI_VERSION);
  std::printf("\"FORMAT_NAME\": \"%s\", \"MANIFEST_NAME\": \"%s\", \"SIGNATURE_NAME\": \"%s\", ",
              kFormatName, kManifestName, kSignatureName);
  std::printf("\"VERIFIED_MARKER\": \"%s\", \"MARKER_FORMAT\": \"%s\", \"MARKER_VERSION\": %d, ",
              kVerifiedMarker, kMarkerFormat, kMarkerVersion);
  std::printf("\"MAX_DIM\": %lld, \"MAX_NDIM\": %d, \"MAX_MEMBER_BYTES\": %lld, \"MAX_MANIFEST_BYTES\": %lld, ",
              (long long)kMaxDim, kMaxNdim, (long long)kMaxMemberBytes, (long long)kMaxManifestBytes);
  std::printf("\"MAX_MEMBERS\": %lld, \"MAX_NAME_CHARS\": %lld, \"MAX_COMPONENT_CHARS\": %lld, ",
              (long long)kMaxMembers, (long long)kMaxNameChars, (long long)kMaxComponentChars);
  std::printf("\"MAX_KEY_FILE_BYTES\": %lld, ", (long long)kMaxKeyFileBytes);
  std::printf("\"TRUSTED_KEYS_ENV\": \"%s\", \"REBUILD\": \"%s\", \"dtypes\": {", kTrustedKeysEnv, kRebuild);
  bool first = true;
  for (const auto& d : kDtypes) {
    std::printf("%s\"%s\": %lld", first ? "" : ", ", d.name, (long long)d.itemsize);
    first = false;
  }
  std::printf("}}\n");
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_constants_are_equal_in_python_and_cpp(tmp_path):
    """The C++ headers repeat the constants (they cannot import Python): compile them (no torch,
    well under a second) and compare every value with ascendc_pack_runtime.constants."""
    src = tmp_path / "constants.cpp"
    src.write_text(_CPP_CONSTANTS)
    exe = tmp_path / "constants"
    subprocess.run(["g++", "-std=c++17", "-Wall", "-Werror", f"-I{rt.include_dir()}", str(src), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    cpp = json.loads(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)
    dtypes = cpp.pop("dtypes")
    assert cpp == {k: getattr(constants, k) for k in cpp}
    assert dtypes == {name: DTYPES[name].itemsize for name in DTYPES}


def test_versions_and_abis_have_one_source():
    assert ascendc_pack.__version__ == rt.__version__ == constants.VERSION
    assert importlib.metadata.version("ascendc-pack") == constants.VERSION
    assert rt.KERNEL_ABI_VERSION is kernels.KERNEL_ABI_VERSION is constants.KERNEL_ABI_VERSION
    import ascendc_pack.graph.render as render  # renders the graph ABI into every graph.cpp

    assert render.GRAPH_ABI_VERSION is constants.GRAPH_ABI_VERSION
    template = (ROOT / "templates" / "graph" / "graph.cpp.j2").read_text()
    assert "AP_GRAPH_PROGRAM_VERSION, {{ graph_abi }}," in template
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'version = { attr = "ascendc_pack_runtime.constants.VERSION" }' in pyproject
    assert not re.search(r'^version\s*=\s*"', pyproject, re.M)


def test_no_test_hooks_in_shipped_code():
    shipped = [*Path(rt.__file__).parent.glob("*.py"), *(ROOT / "ascendc_pack").glob("*.py"),
               *Path(rt.include_dir()).rglob("*.h*")]
    for p in shipped:
        text = p.read_text()
        for hook in ("ASCENDC_PACK_RUNTIME_TEST_", "_pause_hook", "TEST_CPU_FLAGS"):
            assert hook not in text, f"{p} still has the test hook {hook}"
