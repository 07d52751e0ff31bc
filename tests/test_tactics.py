"""Tactics (ascendc_pack/tactics): every candidate of every tactic kind against eager on small
shapes, every epilogue the oneDNN ops fuse, the data model (JSON round trip, stages), and that
every op a tactic calls is reached through the dispatcher by its qualified name (in C++ too)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap

import pytest
import torch

import ascendc_pack.tactics.dispatch as T
from ascendc_pack.tactics.dispatch import AttentionStep, ConvStep, Epilogue, LinearStep, PoolStep

from .conftest import ROOT

E = Epilogue
UNARIES = sorted(T.UNARY)
BINARIES = sorted(T.BINARY)


def _run(tactic, env):
    weights, acts = T.split(env)
    return T.run(tactic, acts, T.prepare(tactic, weights))


def _all_match(step, seed: int = 0, expect: set[str] | None = None) -> list[T.Tactic]:
    env = T.random_env(step, seed)
    cands = T.candidates(step)
    assert cands[0].name in ("aten", "unfused"), "candidate 0 must be the step as captured"
    if expect is not None:
        assert {t.name for t in cands} == expect
    problems = [p for t in cands if (p := T.check(step, t, env))]
    assert not problems, problems
    return cands


needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
LINEAR_ALL = {"aten", "onednn", "mkl"} if torch._C.has_mkl and torch.backends.mkldnn.is_available() else None
CONV_ALL = {"aten", "aten_cl", "onednn", "onednn_cl"} if torch.backends.mkldnn.is_available() else None


# ---- GEMM --------------------------------------------------------------------------------------

@pytest.mark.parametrize("unary", [None, *UNARIES])
def test_linear_unary_epilogues(unary):
    _all_match(LinearStep(24, 40, 56, epilogue=E(unary=unary)), expect=LINEAR_ALL)


@pytest.mark.parametrize("binary", BINARIES)
@pytest.mark.parametrize("unary", [None, "relu", "gelu_tanh"])
def test_linear_binary_epilogues(binary, unary):
    _all_match(LinearStep(16, 32, 48, epilogue=E(binary=binary, unary=unary)), expect=LINEAR_ALL)


@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("affine", [False, True])
def test_linear_layouts_bias_affine(layout, bias, affine):
    _all_match(LinearStep(8, 72, 24, bias=bias, weight_layout=layout, epilogue=E(affine=affine, unary="silu")))


def test_linear_model_shapes_one_row_and_wide():
    """A single row (batch-1 classifier head) and the BERT FFN shape."""
    _all_match(LinearStep(1, 64, 100, epilogue=E()))
    _all_match(LinearStep(128, 256, 1024, epilogue=E(unary="gelu")))


BF16 = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


@pytest.mark.skipif(not BF16, reason="this CPU has no oneDNN bf16 support")
def test_bf16_every_kind():
    """bf16: oneDNN linear/conv and flash attention, no MKL (float32 only)."""
    cands = _all_match(LinearStep(16, 64, 32, dtype="bfloat16", epilogue=E(binary="add", unary="relu")))
    assert {t.name for t in cands} == {"aten", "onednn"}
    _all_match(ConvStep((1, 16, 10, 10), 16, (3, 3), padding=(1, 1), dtype="bfloat16",
                        epilogue=E(affine=True, binary="add", unary="relu")), expect=CONV_ALL)
    _all_match(AttentionStep(1, 4, 16, 16, 32, kv_heads=2, mask="bool", mask_shape=(1, 1, 1, 16), dtype="bfloat16"),
               expect={"unfused", "flash"})


# ---- convolution -------------------------------------------------------------------------------

CONVS = {
    "3x3": dict(x_shape=(2, 8, 10, 10), out_channels=16, kernel=(3, 3), padding=(1, 1)),
    "3x3_stride2": dict(x_shape=(1, 8, 11, 11), out_channels=12, kernel=(3, 3), stride=(2, 2), padding=(1, 1)),
    "1x1": dict(x_shape=(2, 16, 7, 7), out_channels=24, kernel=(1, 1)),
    "1x1_stride2": dict(x_shape=(1, 16, 8, 8), out_channels=32, kernel=(1, 1), stride=(2, 2)),
    "grouped": dict(x_shape=(1, 16, 9, 9), out_channels=32, kernel=(3, 3), padding=(1, 1), groups=4),
    "depthwise": dict(x_shape=(1, 24, 12, 12), out_channels=24, kernel=(3, 3), padding=(1, 1), groups=24),
    "depthwise_5x5_s2": dict(x_shape=(1, 16, 13, 13), out_channels=16, kernel=(5, 5), stride=(2, 2),
                             padding=(2, 2), groups=16),
    "dilated": dict(x_shape=(1, 8, 12, 12), out_channels=8, kernel=(3, 3), padding=(2, 2), dilation=(2, 2)),
    "7x7_stem": dict(x_shape=(1, 3, 32, 32), out_channels=16, kernel=(7, 7), stride=(2, 2), padding=(3, 3)),
}


@pytest.mark.parametrize("shape", sorted(CONVS))
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_conv_shapes_and_layouts(shape, layout):
    _all_match(ConvStep(**CONVS[shape], layout=layout, epilogue=E(unary="relu")), expect=CONV_ALL)


@pytest.mark.parametrize("unary", [None, *UNARIES])
def test_conv_unary_epilogues(unary):
    _all_match(ConvStep(**CONVS["3x3"], bias=False, epilogue=E(affine=True, unary=unary)))


@pytest.mark.parametrize("binary", BINARIES)
@pytest.mark.parametrize("unary", [None, "relu", "hardswish"])
def test_conv_binary_epilogues(binary, unary):
    _all_match(ConvStep(**CONVS["3x3"], epilogue=E(binary=binary, unary=unary)))


@pytest.mark.parametrize("other_layout", ["contiguous", "channels_last"])
def test_conv_residual_operand_in_either_layout(other_layout):
    """resnet's relu(bn(conv(x)) + identity): the identity may come in either memory format."""
    step = ConvStep(**CONVS["3x3"], bias=False, epilogue=E(affine=True, binary="add", unary="relu"))
    env = T.random_env(step)
    if other_layout == "channels_last":
        env["other"] = env["other"].contiguous(memory_format=torch.channels_last)
    assert not [p for t in T.candidates(step) if (p := T.check(step, t, env))]


@needs_onednn
def test_onednn_conv_output_layout_is_recorded():
    step = ConvStep(**CONVS["3x3"])
    for t in T.candidates(step):
        out = _run(t, T.random_env(step))
        fmt = "channels_last" if out.is_contiguous(memory_format=torch.channels_last) else "contiguous"
        assert t.param("out_layout") == fmt, t.name


# ---- max pooling -------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_max_pooling_keeps_the_values_of_the_captured_op(layout, dtype):
    step = PoolStep((2, 5, 9, 11), (3, 2), (2, 1), (1, 1), (1, 2), layout, dtype)
    (aten,) = _all_match(step, expect={"aten"})
    out = _run(aten, T.random_env(step))
    assert out.shape == step.out_shape and out.dtype == getattr(torch, dtype)
    assert T.step_from_json(json.loads(json.dumps(step.to_json()))) == step


# ---- attention ---------------------------------------------------------------------------------

ATTN = {
    "plain": dict(batch=2, heads=4, q_len=16, kv_len=16, head_dim=32),
    "gqa_causal": dict(batch=1, heads=8, kv_heads=2, q_len=24, kv_len=24, head_dim=16, causal=True),
    "bool_padding": dict(batch=2, heads=4, q_len=16, kv_len=16, head_dim=32, mask="bool", mask_shape=(2, 1, 1, 16)),
    "float_full": dict(batch=1, heads=2, q_len=12, kv_len=20, head_dim=16, mask="float", mask_shape=(1, 1, 12, 20)),
    "gqa_mask_causal": dict(batch=1, heads=6, kv_heads=3, q_len=16, kv_len=16, head_dim=8, mask="bool",
                            mask_shape=(1, 1, 16, 16), causal=True, scale=0.3),
    "cross_shorter_q": dict(batch=1, heads=2, q_len=8, kv_len=20, head_dim=16, causal=True),
    "v_dim_differs": dict(batch=1, heads=2, q_len=8, kv_len=8, head_dim=16, v_head_dim=24),
    "shifted_windows": dict(batch=8, heads=2, q_len=16, kv_len=16, head_dim=8, mask="float", mask_shape=(4, 1, 16, 16),
                            mask_windows=4),
}


@pytest.mark.parametrize("case", sorted(ATTN))
def test_attention_candidates(case):
    # the flash kernel wants one head size for Q, K, V and a 4-D [B, ...] mask
    flash = ATTN[case].get("v_head_dim") is None and not ATTN[case].get("mask_windows")
    _all_match(AttentionStep(**ATTN[case]), expect={"unfused", "flash"} if flash else {"unfused"})


def test_attention_fully_masked_rows_are_zero_like_safe_softmax():
    step = AttentionStep(**ATTN["bool_padding"])
    env = T.random_env(step)
    env["mask"][1] = False  # the second sequence has every key masked
    for t in _all_match(step):
        assert _run(t, env)[1].abs().max() == 0, t.name


def test_attention_written_out_softmax_keeps_nan_and_gets_no_flash():
    """A written-out softmax gives NaN on a fully masked row: flash (0 there) is not offered."""
    step = AttentionStep(**ATTN["bool_padding"], safe_softmax=False)
    assert [t.name for t in T.candidates(step)] == ["unfused"]
    env = T.random_env(step)
    env["mask"][0] = False
    assert T.check(step, T.candidates(step)[0], env) is None
    assert _run(T.candidates(step)[0], env)[0].isnan().all()
    unmasked = AttentionStep(**ATTN["gqa_causal"], safe_softmax=False)
    assert [t.name for t in T.candidates(unmasked)] == ["unfused", "flash"]


# ---- the data model ----------------------------------------------------------------------------

def _every_tactic():
    steps = [LinearStep(8, 16, 12, bias=False, weight_layout="kn", epilogue=E(affine=True, binary="add", unary="gelu")),
             ConvStep(**CONVS["grouped"], epilogue=E(affine=True, binary="add", unary="relu")),
             AttentionStep(**ATTN["gqa_mask_causal"])]
    return [(s, t) for s in steps for t in T.candidates(s)]


def test_json_round_trip_runs_the_same():
    """A tactic rebuilt from its JSON (what a manifest holds) runs and matches eager: nothing
    about it lives in Python code."""
    for step, t in _every_tactic():
        text = json.dumps(t.to_json())
        back = T.Tactic.from_json(json.loads(text))
        assert back == t and back.key == t.key
        assert T.check(step, back, T.random_env(step, seed=3)) is None


def test_stages_build_then_load_equal_all_and_isa_dependent_only_at_load():
    for step, t in _every_tactic():
        assert all(p.when == "load" for p in t.prepack if p.isa_dependent)
        weights, acts = T.split(T.random_env(step))
        built = T.prepare(t, weights, "build")
        loaded = T.prepare(t, built, "load")
        assert set(loaded) == set(T.prepare(t, weights))
        assert torch.allclose(T.run(t, acts, loaded), T.run(t, acts, T.prepare(t, weights)))
        # a build-stage derived weight is an ordinary dense tensor that a bundle can store
        assert all(not v.is_mkldnn for k, v in built.items())
    with pytest.raises(ValueError, match="at load"):
        T.Prepack(T.Call("mkldnn::_reorder_linear_weight", (T.Ref("weight"),)), "build", isa_dependent=True)


def test_stored_weights_are_what_load_and_calls_read():
    step = ConvStep(**CONVS["3x3"], epilogue=E(affine=True, unary="relu"))
    by_name = {t.name: T.stored_weights(t) for t in T.candidates(step)}
    assert by_name["aten"] == ("bias", "scale_b", "shift_b", "weight")
    assert by_name["aten_cl"] == ("bias_f", "weight_cl")
    if "onednn" in by_name:
        assert by_name["onednn"] == ("bias_f", "weight_f")  # packed at load from these
    causal = T.candidates(AttentionStep(**ATTN["gqa_causal"]))[0]
    assert T.stored_weights(causal) == ("causal_keep",)
    # what is stored plus the activations is enough to run: build the rest at load
    weights, acts = T.split(T.random_env(step))
    for t in T.candidates(step):
        built = T.prepare(t, weights, "build")
        kept = {n: built[n] for n in T.stored_weights(t)}
        assert T.check(step, t, T.random_env(step)) is None
        assert torch.allclose(T.run(t, acts, T.prepare(t, kept, "load")), T.run(t, acts, T.prepare(t, weights)))


def test_packed_tactics_pack_at_load():
    names = {(s.kind, t.name): [p.call.op for p in t.prepack if p.when == "load"] for s, t in _every_tactic()}
    if torch.backends.mkldnn.is_available():
        assert names[("linear", "onednn")] == ["mkldnn::_reorder_linear_weight"]
        assert names[("conv", "onednn_cl")] == ["mkldnn::_reorder_convolution_weight"]
    if torch._C.has_mkl:
        assert names[("linear", "mkl")] == ["mkl::_mkl_reorder_linear_weight"]


def test_every_op_is_reachable_by_qualified_name():
    ops = {op for _, t in _every_tactic() for op in t.ops}
    assert {"aten::convolution", "aten::_scaled_dot_product_flash_attention_for_cpu"} <= ops
    assert all(T.reachable(op) is None for op in ops), [T.reachable(op) for op in ops]


def test_unreachable_op_is_reported_and_never_offered(monkeypatch):
    assert "no operator 'mkldnn::_nope'" in T.reachable("mkldnn::_nope")
    assert "not a qualified operator name" in T.reachable("relu")
    with pytest.raises(T.TacticError, match="_nope"):
        T.execute([T.Call("mkldnn::_nope", ())], {})
    step = LinearStep(4, 8, 4)
    real = T.reachable
    monkeypatch.setattr("ascendc_pack.tactics.dispatch.dispatcher.reachable",
                        lambda op: "gone" if op.startswith("mkl::") else real(op))
    assert "mkl" not in {t.name for t in T.candidates(step)}


def test_unbound_tensor_names_the_known_ones():
    with pytest.raises(T.TacticError, match="'x' is not bound"):
        T.execute([T.Call("aten::relu", (T.Ref("x"),))], {"y": torch.ones(1)})


def test_bad_step_descriptions_raise():
    with pytest.raises(ValueError, match="unknown unary"):
        E(unary="swish")
    with pytest.raises(ValueError, match="weight_layout"):
        LinearStep(1, 2, 3, weight_layout="tn")
    with pytest.raises(ValueError, match="must divide"):
        ConvStep((1, 6, 4, 4), 8, (1, 1), groups=4)
    with pytest.raises(ValueError, match="must divide heads"):
        AttentionStep(1, 6, 4, 4, 8, kv_heads=4)


# ---- the C++ side: the same names through c10::Dispatcher -------------------------------------

CPP = r"""
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <iostream>
#include <string>
// argv: qualified op names; each must be found by c10::Dispatcher; then one boxed
// reorder + linear_pointwise (the oneDNN tactic's load and call) checked against at::linear.
int main(int argc, char** argv) {
  auto& d = c10::Dispatcher::singleton();
  for (int i = 1; i < argc; ++i) {
    std::string q = argv[i];
    auto dot = q.find('.');
    auto h = d.findSchemaOrThrow(q.substr(0, dot).c_str(), dot == std::string::npos ? "" : q.substr(dot + 1).c_str());
    std::cout << "found " << h.schema().name() << "\n";
  }
  at::manual_seed(0);
  auto x = at::randn({8, 16}), w = at::randn({12, 16}), b = at::randn({12});
  torch::jit::Stack s{w, int64_t(8)};
  d.findSchemaOrThrow("mkldnn::_reorder_linear_weight", "").callBoxed(&s);
  auto packed = s[0].toTensor();
  s = {x, packed, b, std::string("relu"), c10::List<std::optional<at::Scalar>>(), std::optional<std::string>()};
  d.findSchemaOrThrow("mkldnn::_linear_pointwise", "").callBoxed(&s);
  bool ok = at::allclose(s[0].toTensor(), at::relu(at::linear(x, w, b)), 1e-5, 1e-5);
  std::cout << (ok ? "boxed linear ok" : "boxed linear MISMATCH") << "\n";
  return ok ? 0 : 1;
}
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None or not torch.backends.mkldnn.is_available(),
                    reason="needs g++ and a oneDNN build of torch")
def test_cpp_dispatcher_finds_every_tactic_op(tmp_path):
    from torch.utils import cpp_extension as ce

    src = tmp_path / "find_ops.cpp"
    src.write_text(textwrap.dedent(CPP))
    exe = tmp_path / "find_ops"
    flags = [f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    flags += [f"-I{p}" for p in ce.include_paths()]
    flags += [x for p in ce.library_paths() for x in (f"-L{p}", f"-Wl,-rpath,{p}")]
    cc = subprocess.run([os.environ.get("CXX", "g++"), "-std=c++20", "-O0", "-w", *flags, str(src), "-o", str(exe),
                         "-lc10", "-ltorch_cpu"], capture_output=True, text=True, timeout=600)
    assert cc.returncode == 0, cc.stderr[-4000:]
    ops = sorted({op for _, t in _every_tactic() for op in t.ops})
    proc = subprocess.run([str(exe), *ops], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("found ") == len(ops) and "boxed linear ok" in proc.stdout


# ---- the real-architecture bench models (optional `bench` extra) -------------------------------

BENCH_MODELS = {"resnet18": "torchvision", "mobilenet_v3_small": "torchvision", "efficientnet_b0": "torchvision",
                "vit_s16": "timm", "bert_4l": "transformers", "llama_gqa_4l": "transformers"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BENCH_MODELS))
def test_bench_model_loads_and_runs(name):
    """Each bench model file meets the model-file contract and runs eagerly (no downloads)."""
    pytest.importorskip(BENCH_MODELS[name], reason=f"bench/models/{name}.py needs the `bench` extra")
    from ascendc_pack.frontend.loader import load_model_file

    path = ROOT / "bench" / "models" / f"{name}.py"
    loaded, again = load_model_file(path), load_model_file(path)
    with torch.no_grad():
        out = loaded.module(*loaded.example_inputs)
        out2 = again.module(*again.example_inputs)
    assert isinstance(out, torch.Tensor) and out.isfinite().all()
    assert out.shape[0] == 1
    # every load builds the same weights: the bench loads a model file once per contender
    assert torch.equal(out, out2)
