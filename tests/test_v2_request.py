"""The strict V2 request decoder and the HTTP edge's decompression, without a server.

The served behaviour (every case answered over HTTP, the server still right afterwards) is in
test_serve.py; here each rule is pinned down on its own, fast.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib

import numpy as np
import pytest
import torch

pytest.importorskip("orjson")
from ascendc_pack_runtime.model import TensorSpec  # noqa: E402
from ascendc_pack_runtime.v2 import RequestError, short  # noqa: E402
from ascendc_pack_runtime.v2_request import (MAX_ID_CHARS, Signature, decode_request, encode_response,  # noqa: E402
                                              json_length, parse_json)

SIG = Signature("m", (TensorSpec("x", (2, 3), torch.float32), TensorSpec("i", (4,), torch.int32),
                      TensorSpec("b", (2,), torch.bool)),
                (TensorSpec("y", (2, 3), torch.float32), TensorSpec("h", (2,), torch.float16)))


def _inputs(**override):
    x = {"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1.5, 2, 3, 4, 5, 6]}
    i = {"name": "i", "shape": [4], "datatype": "INT32", "data": [1, -2, 3, 2**31 - 1]}
    b = {"name": "b", "shape": [2], "datatype": "BOOL", "data": [True, False]}
    return [dict(x, **override), i, b]


def _decode(req, binary: bytes = b"", raw: bytes | None = None):
    if isinstance(req, dict) and "outputs" not in req and "parameters" not in req:
        req = dict(req, outputs=[{"name": "y"}])  # 'h' is FP16: JSON cannot carry it
    body = raw if raw is not None else json.dumps(req).encode()
    if binary:
        return decode_request(SIG, body + binary, len(body))
    return decode_request(SIG, body, None)


def test_json_request_flat_and_nested():
    r = _decode({"id": "7", "inputs": _inputs()})
    assert r.id == "7" and r.outputs == ((0, False),)
    x, i, b = r.tensors
    assert x.dtype == torch.float32 and x.tolist() == [[1.5, 2, 3], [4, 5, 6]]
    assert i.dtype == torch.int32 and i.tolist() == [1, -2, 3, 2**31 - 1]
    assert b.dtype == torch.bool and b.tolist() == [True, False]
    nested = _decode({"inputs": _inputs(data=[[1.5, 2, 3], [4, 5, 6]])}).tensors[0]
    assert torch.equal(nested, x)
    every = _decode({"inputs": _inputs(), "parameters": {"binary_data_output": True}})
    assert every.outputs == ((0, True), (1, True))


def test_binary_request_and_sizes_checked_before_slicing():
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    head = {"inputs": [dict(_inputs()[0], parameters={"binary_data_size": 24}), *_inputs()[1:]],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}
    head["inputs"][0].pop("data")
    r = _decode(head, x.numpy().tobytes())
    assert torch.equal(r.tensors[0], x) and r.outputs == ((0, True),)
    head["inputs"][0]["parameters"]["binary_data_size"] = 2**40  # refused from the header alone
    with pytest.raises(RequestError, match=r"1099511627776 bytes of binary data, expected 24"):
        _decode(head, x.numpy().tobytes())


@pytest.mark.parametrize("override, words", [
    ({"datatype": "fp32"}, ["'fp32', which is not a V2 datatype", "BOOL, UINT8", "FP32, FP64, BF16, BYTES", "expected 'FP32'"]),
    ({"datatype": "FP64"}, ["'FP64'", "expected 'FP32'"]),
    ({"shape": ["2", "3"]}, ["shape ['2', '3']", "list of integers"]),
    ({"shape": [True, 3]}, ["shape [True, 3]"]),
    ({"shape": [2.0, 3]}, ["shape [2.0, 3]"]),
    ({"data": [True, 2, 3, 4, 5, 6]}, ["bool values such as True", "expected numbers"]),
    ({"data": ["1", 2, 3, 4, 5, 6]}, ["str values such as '1'"]),
    ({"data": [None] * 6}, ["NoneType values"]),
    ({"data": [1, 2, 3]}, ["3 values in 'data', expected 6"]),
    ({"data": [[1, 2], [3, 4, 5]]}, ["nested but not as shape [2, 3]"]),
    ({"data": [[[1, 2, 3]], [[4, 5, 6]]]}, ["at depth 1: an array of 1, expected an array of 3"]),
    ({"data": [1, [2], 3, 4, 5, 6]}, ["list values such as [2]"]),
    ({"data": [1e39, 0, 0, 0, 0, 0]}, ["1e+39", "out of range for FP32", "Infinity"]),
    ({"name": "z" * (10 * 2**20)}, ["no input 'zzz", "(10485760 characters)", "'x' (FP32 [2, 3])"]),
])
def test_json_input_refusals(override, words):
    with pytest.raises(RequestError) as e:
        _decode({"inputs": _inputs(**override)})
    msg = str(e.value)
    assert all(w in msg for w in words), msg
    assert len(msg) < 1000


@pytest.mark.parametrize("data, words", [
    ([1.5, 2, 3, 4], ["float values such as 1.5", "integers"]),
    ([1, 2, 3, 2**31], ["out of range for INT32", "-2147483648..2147483647"]),
    ([1, 2, 3, True], ["bool values"]),
])
def test_integer_data_is_strict(data, words):
    inputs = _inputs()
    inputs[1] = dict(inputs[1], data=data)
    with pytest.raises(RequestError) as e:
        _decode({"inputs": inputs})
    assert all(w in str(e.value) for w in words), str(e.value)


def test_bool_data_is_strict():
    inputs = _inputs()
    inputs[2] = dict(inputs[2], data=[1, 0])
    with pytest.raises(RequestError, match="int values such as 1; expected true or false"):
        _decode({"inputs": inputs})


def test_non_finite_literals_round_trip():
    """NaN/Infinity/-Infinity literals in, the same literals out; 1e999 refused (README Serving)."""
    raw = (b'{"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [NaN, Infinity, -Infinity, '
           b'1, 2, 3]}, {"name": "i", "shape": [4], "datatype": "INT32", "data": [1, 2, 3, 4]}, '
           b'{"name": "b", "shape": [2], "datatype": "BOOL", "data": [true, false]}], "outputs": [{"name": "y"}]}')
    x = _decode(None, raw=raw).tensors[0].flatten().tolist()
    assert math.isnan(x[0]) and x[1:3] == [math.inf, -math.inf] and x[3:] == [1, 2, 3]
    enc = encode_response(SIG, "r", [torch.tensor(x).reshape(2, 3), torch.zeros(2, dtype=torch.float16)],
                          ((0, False),))
    assert enc.json_length is None and b"null" not in enc.body
    assert b'"data":[NaN,Infinity,-Infinity,1.0,2.0,3.0]' in enc.body
    back = parse_json(enc.body, "the response")["outputs"][0]["data"]
    assert math.isnan(back[0]) and back[1:] == [math.inf, -math.inf, 1.0, 2.0, 3.0]
    finite = encode_response(SIG, "r", [torch.ones(2, 3), torch.zeros(2, dtype=torch.float16)], ((0, False),))
    assert json.loads(finite.body)["outputs"][0]["data"] == [1.0] * 6
    for number in (b"1e999", b"-1e999"):
        with pytest.raises(RequestError, match="too large for a double|out of range of a 64-bit float"):
            _decode(None, raw=raw.replace(b"1, 2, 3]", number + b", 2, 3]"))
    with pytest.raises(RequestError, match="out of range of a 64-bit float"):  # the literal-aware parser too
        _decode(None, raw=raw.replace(b"1, 2, 3]", b"1e999, 2, 3]"))


def test_nan_is_refused_where_it_is_no_number():
    raw = json.dumps({"inputs": _inputs(), "outputs": [{"name": "y"}]}).encode().replace(
        b'"data": [1, -2, 3, 2147483647]',
                                                             b'"data": [1, NaN, 3, 4]')
    with pytest.raises(RequestError, match="INT32.*float values such as nan"):
        _decode(None, raw=raw)


@pytest.mark.parametrize("nan", [False, True], ids=["orjson", "literal-aware"])
def test_deep_nesting_is_a_request_error(nan):
    deep = b"[" * 5000 + b"]" * 5000
    raw = json.dumps({"inputs": _inputs(), "parameters": {"p": "@"}}).encode().replace(b'"@"', deep)
    if nan:
        raw = raw.replace(b"1.5", b"NaN")
    with pytest.raises(RequestError, match="not valid JSON"):
        _decode(None, raw=raw)
    with pytest.raises(RequestError, match="not valid JSON"):
        decode_request(SIG, raw + b"\0" * 8, len(raw))  # the binary extension's JSON part


def test_framing_header_is_plain_decimal():
    assert json_length(None, "183") == 183 and json_length("application/json; charset=utf-8", None) is None
    assert json_length(None, None) is None  # tritonclient's JSON mode sends no Content-Type
    for bad in (" 183 ", "183 ", "+183", "18_3", "-1", "0x10", "1e3", "\uff11", ""):
        with pytest.raises(RequestError, match="plain decimal digits"):
            json_length(None, bad)
    with pytest.raises(RequestError, match="Inference-Header-Content-Length"):
        json_length("text/plain", None)


def test_value_count_is_checked_before_parsing():
    raw = b'{"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [' + b"0," * 5000 + b"0]}]}"
    with pytest.raises(RequestError, match=r"holds 500\d commas, more JSON values than a request to model 'm' can need"):
        _decode(None, raw=raw)


@pytest.mark.parametrize("req, words", [
    ({"id": 7}, ["'id' must be a string, got 7"]),
    ({"id": "x" * (MAX_ID_CHARS + 1)}, [f"{MAX_ID_CHARS + 1} characters long"]),
    ({"parameters": []}, ["'parameters' must be an object"]),
    ({"outputs": [{"name": "h"}]}, ["FP16, which JSON cannot carry", "binary_data = true"]),
    ({"outputs": [{"name": "y"}, {"name": "y"}]}, ["requested twice"]),
    ({"outputs": [{"name": "q" * 5000}]}, ["no output 'qqq", "(5000 characters)"]),
    ({"outputs": {"name": "y"}}, ["'outputs' must be an array"]),
    ({"parameters": {"binary_data_output": "yes"}}, ["true or false, got 'yes'"]),
])
def test_request_fields(req, words):
    with pytest.raises(RequestError) as e:
        _decode({"inputs": _inputs(), **req})
    assert all(w in str(e.value) for w in words), str(e.value)


def test_lone_surrogate_id_is_refused():
    raw = json.dumps({"inputs": _inputs(), "id": "@"}).encode().replace(b'"@"', b'"\\ud800"').replace(b"1.5", b"NaN")
    with pytest.raises(RequestError, match="lone surrogate"):
        _decode(None, raw=raw)


def test_short_is_bounded():
    assert len(short("a" * 10**7)) < 120 and "10000000 characters" in short("a" * 10**7)
    deep: list = []
    cur = deep
    for _ in range(10000):
        cur.append([])
        cur = cur[0]
    assert len(short(deep)) < 100  # no RecursionError either


# ----------------------------------------------------------------------------- decompression


def test_inflater_is_bounded_and_strict():
    from ascendc_pack_runtime.http_edge import _Inflater, _Refused

    plain = b'{"inputs": []}' * 100
    for encoding, packed in (("gzip", gzip.compress(plain)), ("deflate", zlib.compress(plain))):
        inf = _Inflater(encoding, 10_000)
        out = b"".join(inf.feed(packed[k:k + 7]) for k in range(0, len(packed), 7))
        inf.finish()
        assert out == plain
        with pytest.raises(_Refused, match=f"bytes after the end of its {encoding} stream") as e:
            _Inflater(encoding, 10_000).feed(packed + b"garbage")
        assert e.value.status == 400
        inf = _Inflater(encoding, 10_000)
        inf.feed(packed[:-4])
        with pytest.raises(_Refused, match="truncated|not valid"):
            inf.feed(b"")
            inf.finish()
    bomb = gzip.compress(b"0," * (45 * 2**20), 9)  # ~90 KB -> 90 MiB
    inf, produced = _Inflater("gzip", 2**20), 0
    with pytest.raises(_Refused, match="decompressed request body is more than") as e:
        for k in range(0, len(bomb), 4096):
            produced += len(inf.feed(bomb[k:k + 4096]))
    assert e.value.status == 413 and produced <= 2**20  # refused while inflating, not after


def test_nan_output_encoding_matches_numpy():
    y = np.array([[np.nan, 1.25, -np.inf], [0.1, 2, np.inf]], np.float32)
    enc = encode_response(SIG, "", [torch.from_numpy(y), torch.zeros(2, dtype=torch.float16)], ((0, False),))
    got = np.asarray(parse_json(enc.body, "r")["outputs"][0]["data"], np.float32).reshape(2, 3)
    np.testing.assert_array_equal(got, y)


@pytest.mark.parametrize("where", ["name", "datatype", "shape", "data", "id", "parameters", "outputs", "binary_data_output"])
def test_structures_under_the_parser_limit_are_refused_without_recursion(where):
    """A 1000-deep array (orjson parses up to 1024) in any field the decoder reads: a 400, never a
    RecursionError from a check or an error message."""
    deep = b"[" * 1000 + b"]" * 1000
    req = {"inputs": _inputs(), "outputs": [{"name": "y"}]}
    if where in ("name", "datatype", "shape", "data"):
        req["inputs"][0][where] = "@"
    elif where == "binary_data_output":
        req["parameters"] = {"binary_data_output": "@"}
    elif where == "outputs":
        req["outputs"] = [{"name": "@"}]
    else:
        req[where] = "@"
    raw = json.dumps(req).encode().replace(b'"@"', deep)
    with pytest.raises(RequestError) as e:
        _decode(None, raw=raw)
    assert len(str(e.value)) < 1000
