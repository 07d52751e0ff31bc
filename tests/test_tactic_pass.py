"""The tactic pass (ascendc_pack/tactics/rewrite.py, tactics/match.py, tactics/match_attention.py): which
heavy steps of a captured program become TacticSteps, with which epilogue, bindings, chains and
names; the program still computes what eager does; the IR round-trips. No compiler runs here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import ascendc_pack_runtime as rt
from torch import nn

from ascendc_pack.frontend.capture import capture
from ascendc_pack.frontend.executor import run_model
from ascendc_pack.passes.copy_elision import elide_copies
from ascendc_pack.passes.fold import fold_constants
from ascendc_pack.ir.program import ModelProgram, TacticStep, dump
from ascendc_pack.tactics.match import UNARY_PATTERNS
from ascendc_pack.kernels.target import FALLBACK, CpuTarget, HostProfile
from ascendc_pack.tactics import predict
from ascendc_pack.tactics.rewrite import candidates_for, find_tactics


class Fn(nn.Module):
    def __init__(self, fn, **mods):
        super().__init__()
        self.fn = fn
        for k, v in mods.items():
            setattr(self, k, v)

    def forward(self, *xs):
        return self.fn(self, *xs)


def _pass(model, *inputs):
    model.eval()
    cap = capture(model, inputs)
    folded = fold_constants(cap.model, cap.weights)
    res = find_tactics(folded.model, folded.weights)
    with torch.no_grad():
        want = model(*inputs)
        got = run_model(res.model, res.weights, inputs)  # the reference runs the replaced steps
    for g, w in zip(*((t,) if isinstance(t, torch.Tensor) else t for t in (got, want))):
        assert torch.allclose(g, w, atol=1e-5, rtol=1e-5)
    return res, res.model.program.tactic_steps()


ACTIVATIONS = {
    "relu": F.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "silu": F.silu, "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid,
}


def test_every_unary_pattern_is_what_capture_makes():
    assert set(UNARY_PATTERNS) == set(ACTIVATIONS)


@pytest.mark.parametrize("unary", sorted(ACTIVATIONS))
def test_conv_and_linear_absorb_each_activation(unary):
    act = ACTIVATIONS[unary]
    m = Fn(lambda s, x: act(s.fc(act(s.conv(x)).mean((2, 3)))), conv=nn.Conv2d(3, 8, 3), fc=nn.Linear(8, 4))
    _, steps = _pass(m, torch.randn(2, 3, 6, 6))
    assert [s.tactic_kind for s in steps] == ["conv", "linear"]
    assert all(s.desc["epilogue"]["unary"] == unary for s in steps)


def test_linear_forms_bias_residual_and_views():
    m = Fn(lambda s, x: s.b(F.gelu(s.a(x))) + x, a=nn.Linear(16, 32), b=nn.Linear(32, 16, bias=False))
    res, (a, b) = _pass(m, torch.randn(4, 5, 16))
    assert a.desc["m"] == 20 and a.desc["weight_layout"] == "nk" and a.desc["bias"] and a.desc["epilogue"]["unary"] == "gelu"
    assert not b.desc["bias"] and b.desc["epilogue"]["binary"] == "add" and b.shapes["other"] == (20, 16)
    assert a.bind["weight"] == "p_a_weight" and len(res.model.program.steps) == 4  # 2 views stay


def test_matmul_by_a_constant_weight_is_a_kn_linear():
    m = Fn(lambda s, x: x @ s.w, w=nn.Parameter(torch.randn(16, 8)))
    _, (s,) = _pass(m, torch.randn(4, 16))
    assert s.desc["weight_layout"] == "kn" and s.desc["n"] == 8


def test_multihead_attention_projections_and_attention():
    mha = nn.MultiheadAttention(16, 2, batch_first=True)
    _, steps = _pass(Fn(lambda s, x: s.a(x, x, x, need_weights=False)[0], a=mha), torch.randn(2, 5, 16))
    kinds = [s.tactic_kind for s in steps]
    assert kinds == ["linear", "attention", "linear"]
    assert steps[0].desc["m"] == 10 and steps[0].desc["bias"]  # the bmm by the expanded in_proj weight
    assert steps[1].desc["safe_softmax"] and steps[1].desc["mask"] is None


def test_sdpa_with_mask_and_causal_grouped_query():
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)
    mask = torch.rand(2, 1, 5, 7) > 0.3
    _, (s,) = _pass(Fn(lambda s, *a: F.scaled_dot_product_attention(a[0], a[1].repeat_interleave(2, 1),
                                                                     a[2].repeat_interleave(2, 1), attn_mask=a[3])),
                    q, k, v, mask)
    assert s.desc["mask"] == "float" and s.desc["mask_shape"] == [2, 1, 5, 7]
    k2, v2 = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    _, (g,) = _pass(Fn(lambda s, *a: F.scaled_dot_product_attention(*a, is_causal=True, enable_gqa=True)),
                    torch.randn(2, 4, 5, 8), k2, v2)
    # is_causal arrives as a folded 0/-inf mask weight, recognized as causal again (no mask read)
    assert g.desc["kv_heads"] == 2 and g.bind["k"] == "xs_1" and g.desc["mask"] is None and g.desc["causal"]
    assert [t.name for t in candidates_for(g, 10)] == ["unfused", "flash"]


def test_padding_and_causal_masks_that_broadcast_are_matched():
    """A key padding mask [B, 1, 1, S] (bool, with a sequence whose keys are all masked) and a
    2-D [L, S] mask broadcast over batch and heads: one attention step each, with the mask's shape."""
    q, k, v = (torch.randn(2, 2, 6, 8) for _ in range(3))
    keep = torch.rand(2, 1, 1, 6) > 0.3
    keep[1] = False
    sdpa = Fn(lambda s, *a: F.scaled_dot_product_attention(*a[:3], attn_mask=a[3]))
    _, (s,) = _pass(sdpa, q, k, v, keep)
    assert s.tactic_kind == "attention" and s.desc["mask"] == "float" and s.desc["mask_shape"] == [2, 1, 1, 6]
    assert s.desc["safe_softmax"]  # the fully masked sequence gives 0, as eager's
    _, (s2,) = _pass(sdpa, q, k, v, torch.randn(6, 6))
    assert s2.desc["mask_shape"] == [6, 6]
    mha = nn.MultiheadAttention(16, 2, batch_first=True)  # key_padding_mask: a [B, H, 1, S] float mask
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[0, 4:] = True
    _, (_, s3, _) = _pass(Fn(lambda s, x, p: s.a(x, x, x, key_padding_mask=p, need_weights=False)[0], a=mha),
                          torch.randn(2, 6, 16), pad)
    assert s3.tactic_kind == "attention" and s3.desc["mask_shape"] == [2, 2, 1, 6]


def test_a_mask_that_does_not_broadcast_per_key_stays_aten():
    """A mask constant along the keys ([B, 1, L, 1]) is legal PyTorch but not a per-key mask: the
    attention is left to the ATen steps as captured (which still compute it)."""
    q, k, v = (torch.randn(2, 2, 6, 8) for _ in range(3))
    res, steps = _pass(Fn(lambda s, *a: F.scaled_dot_product_attention(*a[:3], attn_mask=a[3])), q, k, v,
                       torch.randn(2, 1, 6, 1))
    assert steps == []


def test_written_out_attention_keeps_unsafe_softmax():
    def f(s, q, k, v, m):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.3 + m, -1) @ v
    _, (s,) = _pass(Fn(f), *(torch.randn(2, 2, 5, 8) for _ in range(3)), torch.randn(2, 1, 5, 5))
    assert not s.desc["safe_softmax"] and s.desc["scale"] == pytest.approx(0.3)
    assert [t.name for t in candidates_for(s, 10)] == ["unfused"]  # flash would turn NaN rows into 0


class WhereMasked(nn.Module):
    """Attention written out with ``torch.where(mask, scores, -inf)`` (a Llama-style block's)."""

    def __init__(self, mask=None):
        super().__init__()
        if mask is not None:
            self.register_buffer("mask", mask)

    def forward(self, q, k, v, *m):
        s = q @ k.transpose(-2, -1) / 8.0
        s = torch.where(m[0] if m else self.mask, s, float("-inf"))
        return torch.softmax(s, dim=-1) @ v


def test_attention_with_a_where_mask_is_one_step_and_a_constant_causal_mask_becomes_causal():
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    causal = torch.ones(16, 16, dtype=torch.bool).tril()
    res, (s,) = _pass(WhereMasked(causal), q, k, v)
    assert s.tactic_kind == "attention" and s.desc["causal"] and s.desc["mask"] is None and "mask" not in s.bind
    assert not s.desc["safe_softmax"] and s.desc["scale"] == pytest.approx(0.125)  # / 8 with head_dim 8
    assert [t.name for t in candidates_for(s, 10)] == ["unfused", "flash"]   # no fully masked row: flash applies
    other = causal.clone()
    other[5, 2] = False                          # not causal: stays a boolean mask
    _, (b,) = _pass(WhereMasked(other), q, k, v)
    assert b.desc["mask"] == "bool" and tuple(b.desc["mask_shape"]) == (16, 16) and not b.desc["causal"]
    assert [t.name for t in candidates_for(b, 10)] == ["unfused"]   # a row could be fully masked: NaN in eager
    _, (i,) = _pass(WhereMasked(), q, k, v, torch.rand(2, 1, 16, 16) > 0.2)   # a mask the caller passes
    assert i.desc["mask"] == "bool" and tuple(i.desc["mask_shape"]) == (2, 1, 16, 16) and "mask" in i.bind


def test_shifted_window_attention_with_strided_heads_is_one_step():
    """swin: q/k/v heads of one qkv projection (capture clones them contiguous before the bmm)
    and a per-window mask added to the scores viewed [N, W, H, L, S]."""
    def f(s, qkv, m):
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # [8 windows, 2 heads, 16 tokens, 8]
        a = (q * 0.35) @ k.transpose(-2, -1)
        a = a.view(2, 4, 2, 16, 16) + m.unsqueeze(1).unsqueeze(0)
        return torch.softmax(a.view(-1, 2, 16, 16), -1) @ v
    _, (s,) = _pass(Fn(f), torch.randn(8, 16, 3, 2, 8), torch.randn(4, 16, 16))
    assert s.tactic_kind == "attention" and s.desc["mask_windows"] == 4 and tuple(s.desc["mask_shape"]) == (4, 1, 16, 16)
    assert s.desc["batch"] == 8 and [t.name for t in candidates_for(s, 10)] == ["unfused"]


class ShiftedWindows(nn.Module):
    """torchvision swin's shifted block in small: the scores plus a per-head relative position
    bias, then the per-window -100 mask added through a [N, W, H, L, S] view."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.qkv = nn.Linear(16, 48)
        self.bias = nn.Parameter(torch.randn(2, 16, 16, generator=g))
        self.register_buffer("mask", torch.where(torch.rand(4, 16, 16, generator=g) > 0.5, 0.0, -100.0))

    def forward(self, x):  # x: [8 windows, 16 tokens, 16]
        q, k, v = self.qkv(x).reshape(8, 16, 3, 2, 8).permute(2, 0, 3, 1, 4)
        a = (q * 0.35) @ k.transpose(-2, -1) + self.bias
        a = a.view(2, 4, 2, 16, 16) + self.mask.unsqueeze(1).unsqueeze(0)
        return torch.softmax(a.view(-1, 2, 16, 16), -1) @ v


def test_a_shifted_window_with_a_position_bias_is_one_step_with_one_folded_mask():
    """Both additive terms are constants: the pass folds them into one [W, H, L, S] mask weight
    (it was two adds the matcher did not take, so swin_t's shifted blocks ran as ATen bmm)."""
    m = ShiftedWindows()
    res, steps = _pass(m, torch.randn(8, 16, 16))
    assert [t.tactic_kind for t in steps] == ["linear", "attention"]
    s = steps[1]
    assert s.desc["mask_windows"] == 4
    assert tuple(s.desc["mask_shape"]) == (4, 2, 16, 16) and set(s.bind) == {"q", "k", "v", "mask"}
    assert torch.equal(res.weights[s.bind["mask"]], (m.mask[:, None] + m.bias[None]).detach())


def test_a_shifted_window_bundle_matches_eager(tmp_path):
    from ascendc_pack.pipeline import build

    m, x = ShiftedWindows().eval(), torch.randn(8, 16, 16)
    res = build(m, (x,), output=tmp_path / "w.ascpack", cache_dir=tmp_path / "cache", topn=1)
    assert [ch.kind for ch in res.tactics.values()].count("attention") == 1
    with torch.no_grad():
        want = m(x)
    with rt.load(res.output) as model:
        torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)


def test_attention_with_an_eval_mode_dropout_before_the_values_is_one_step():
    """torchvision's swin: softmax(scores + relative position bias), then ``F.dropout(training=False)``
    (captured as a clone of the probabilities), then ``@ v``."""
    def f(s, q, k, v, bias):
        a = torch.softmax((q * 0.35) @ k.transpose(-2, -1) + bias, -1)
        return F.dropout(a, p=0.1, training=False) @ v
    inputs = (*(torch.randn(2, 3, 16, 8) for _ in range(3)), torch.randn(1, 3, 16, 16))
    _, (s,) = _pass(Fn(f), *inputs)
    assert s.tactic_kind == "attention" and s.desc["mask"] == "float" and tuple(s.desc["mask_shape"]) == (1, 3, 16, 16)
    assert s.desc["scale"] == pytest.approx(0.35)
    # as the pipeline runs it: copy elision first turns the clone into an alias
    folded = fold_constants(*(lambda c: (c.model, c.weights))(capture(Fn(f).eval(), inputs)))
    elided = find_tactics(elide_copies(folded.model), folded.weights).model.program.steps
    assert [t.tactic_kind for t in elided if isinstance(t, TacticStep)] == ["attention"]


def test_attention_whose_keys_are_transposed_in_one_permute_is_one_step():
    """timm's LeViT: ``k.permute(0, 2, 3, 1)`` of [B, S, H, E] keys is Kᵀ in one view; split into
    heads + transpose, the attention (with its bias) is one step reading the keys [B, H, S, E]."""
    def f(s, q, k, v, bias):
        return torch.softmax(q.permute(0, 2, 1, 3) @ k.permute(0, 2, 3, 1) * 0.25 + bias, -1) @ v
    q, k = torch.randn(2, 16, 4, 8), torch.randn(2, 16, 4, 8)
    inputs = (q, k, torch.randn(2, 4, 16, 8), torch.randn(4, 16, 16))
    res, (s,) = _pass(Fn(f), *inputs)
    assert s.tactic_kind == "attention" and s.desc["mask"] == "float" and s.desc["scale"] == pytest.approx(0.25)
    assert tuple(res.model.program.values[s.bind["k"]].shape) == (2, 4, 16, 8)   # (_pass: same result as eager)


def test_batchnorm_residual_relu_chain_and_derived_affine():
    bn = nn.BatchNorm2d(8)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)

    def f(s, x):
        y = F.relu(s.bn(s.c1(x)) + x)
        y = F.max_pool2d(y, 2)
        return s.dw(y) + s.pw(y)
    m = Fn(f, c1=nn.Conv2d(8, 8, 3, padding=1, bias=False), bn=bn, dw=nn.Conv2d(8, 8, 3, padding=1, groups=8),
           pw=nn.Conv2d(8, 8, 1))
    res, (c1, pool, dw, pw) = _pass(m, torch.randn(2, 8, 6, 6))
    assert c1.desc["epilogue"] == {"affine": True, "binary": "add", "unary": "relu"}
    assert {c1.desc["position"], dw.desc["position"], pw.desc["position"]} == {"entry", "interior"}
    assert dw.desc["position"] == "interior" and c1.chain == dw.chain == pw.chain  # through the max pool
    assert pool.tactic_kind == "pool" and pool.desc["position"] == "interior" and pool.bind == {"x": c1.outputs[0]}
    assert pool.desc["kernel"] == [2, 2] and pool.desc["stride"] == [2, 2] and pool.name.startswith("pool_c8k2x2s2x2_")
    scale, shift = res.weights[c1.bind["scale"]], res.weights[c1.bind["shift"]]
    s = bn.weight / (bn.running_var + bn.eps).sqrt()
    assert torch.allclose(scale, s.detach()) and torch.allclose(shift, (bn.bias - bn.running_mean * s).detach())
    assert [t.name for t in candidates_for(dw, 10)] == ["aten", "onednn_cl", "aten_cl"]
    assert [t.name for t in candidates_for(c1, 10)][:2] == ["aten", "onednn"]
    assert len(candidates_for(c1, 2)) == 2  # --topn caps the candidates
    # ordered by the cost model: candidate 0 is the predicted best, the as-captured one always kept
    target = CpuTarget.detect(2, profile=FALLBACK)
    for step in (c1, dw, pw):
        ranked = candidates_for(step, 10, target)
        us = [predict.predict_us("conv", step.desc, t.name, target) for t in ranked]
        assert us == sorted(us) and {t.name for t in ranked} == {t.name for t in candidates_for(step, 10)}
        first = candidates_for(step, 1, target)   # topn 1: the pick, plus the as-captured fallback
        assert first[0].name == ranked[0].name and first[-1].name == "aten" and len(first) == 1 + (first[0].name != "aten")


def test_a_library_depthwise_or_1x1_convolution_pays_its_measured_inefficiency(monkeypatch):
    target = CpuTarget.detect(2, profile=FALLBACK)
    dw = {"x_shape": [1, 96, 56, 56], "out_channels": 96, "groups": 96, "kernel": [3, 3], "padding": [1, 1],
          "position": "interior"}
    steps = {"depthwise": dw, "1x1": {**dw, "groups": 1, "kernel": [1, 1], "padding": [0, 0]},
             "grouped": {**dw, "groups": 48}, "3x3": {**dw, "groups": 1}}   # the last two: no generated rival
    with_factor = {k: predict.predict_us("conv", d, "onednn_cl", target) for k, d in steps.items()}
    monkeypatch.setattr(predict, "LIBRARY_CONV", 1.0)
    without = {k: predict.predict_us("conv", d, "onednn_cl", target) for k, d in steps.items()}
    assert with_factor["depthwise"] == pytest.approx(2.0 * without["depthwise"])
    assert with_factor["1x1"] == pytest.approx(2.0 * without["1x1"])
    assert with_factor["grouped"] == without["grouped"] and with_factor["3x3"] == without["3x3"]


def test_a_dense_convolution_over_few_input_channels_pays_its_short_dot_products():
    # a network's first layer (3 input channels, 3x3: 27-long dot products) runs oneDNN at 27/64 of
    # its rate, as a depthwise convolution does: PGO measured it 358-429 µs on mobilenet_v3_small
    # where the roofline said 154 and the generated direct convolution took 75-209 µs
    target = CpuTarget.detect(2, profile=FALLBACK)
    first = {"x_shape": [1, 3, 224, 224], "out_channels": 16, "kernel": [3, 3], "stride": [2, 2],
             "padding": [1, 1], "position": "entry"}
    flops = 2.0 * 16 * 112 * 112 * 27
    at_depth = flops / (27 / 64) / (predict.RATES["onednn"].efficiency * predict.peak_flops_per_us(target))
    assert predict.predict_us("conv", first, "onednn", target) > at_depth
    deep = {**first, "x_shape": [1, 64, 224, 224]}   # 576-long dot products: the full rate
    deep_flops = flops * 64 / 3
    assert predict.predict_us("conv", deep, "onednn", target) < 1.5 * deep_flops / (
        predict.RATES["onednn"].efficiency * predict.peak_flops_per_us(target))


def test_candidate_order_follows_the_cost_model():
    """A GEMM with many rows goes to oneDNN's packed weight first; a 1-row GEMV (every candidate
    streams the weight) to the cheapest call; attention to flash; the host profile scales it."""
    target = CpuTarget.detect(2, profile=FALLBACK)
    gemm = {"m": 128, "k": 256, "n": 1024, "epilogue": {"unary": "gelu"}}
    gemv = {"m": 1, "k": 512, "n": 1000, "epilogue": {}}
    us = {n: predict.predict_us("linear", gemm, n, target) for n in ("aten", "onednn", "mkl")}
    assert us["onednn"] < us["aten"] and us["onednn"] < us["mkl"]
    us = {n: predict.predict_us("linear", gemv, n, target) for n in ("aten", "onednn", "mkl")}
    assert min(us, key=us.get) != "onednn"
    attn = {"batch": 1, "heads": 4, "q_len": 128, "kv_len": 128, "head_dim": 64}
    assert predict.predict_us("attention", attn, "flash", target) < predict.predict_us("attention", attn, "unfused",
                                                                                        target)
    fast = CpuTarget.detect(2, profile=HostProfile(ghz=6.0, mem_gbps=40.0, l2_gbps=120.0, source="test"))
    assert predict.predict_us("linear", gemm, "onednn", fast) < predict.predict_us("linear", gemm, "onednn", target)
    assert predict.predict_us("nope", gemm, "aten", target) == float("inf")
    m = Fn(lambda s, x: F.gelu(s.fc(x)), fc=nn.Linear(256, 1024))
    _, (fc,) = _pass(m, torch.randn(128, 256))
    assert [t.name for t in candidates_for(fc, 4, target)][0] == "onednn"
    assert [t.name for t in candidates_for(fc, 4)][0] == "aten"   # without a host profile: as captured first


def test_a_value_read_elsewhere_is_not_absorbed():
    m = Fn(lambda s, x: (F.relu(s.fc(x)), s.fc(x).sum()), fc=nn.Linear(8, 8))
    cap = capture(m.eval(), (torch.randn(3, 8),))
    res = find_tactics(cap.model, cap.weights)
    for s in res.model.program.tactic_steps():
        assert s.desc["epilogue"]["unary"] in (None, "relu")
    mm = Fn(lambda s, x: (s.c(x), F.relu(s.c(x))), c=nn.Conv2d(3, 4, 1))
    _, steps = _pass(mm.eval(), torch.randn(1, 3, 4, 4))
    assert any(s.desc["epilogue"]["unary"] is None for s in steps)


def test_identical_steps_share_a_name_and_the_ir_round_trips():
    m = Fn(lambda s, x: F.relu(s.b(F.relu(s.a(x)))), a=nn.Linear(16, 16), b=nn.Linear(16, 16))
    res, (a, b) = _pass(m, torch.randn(4, 16))
    assert a.name == b.name and a.name.startswith("linear_m4k16n16_")
    again = ModelProgram.loads(res.model.dumps())
    (a2, _) = again.program.tactic_steps()
    assert isinstance(a2, TacticStep) and a2.desc == a.desc and a2.bind == a.bind and a2.shapes == a.shapes
    assert [x.op for x in a2.steps] == [x.op for x in a.steps]
    text = dump(res.model)
    assert "2 tactic steps, 1 distinct" in text and f"tactic {a.name}(" in text


def test_cond_branches_get_tactics_with_their_weights():
    def f(s, x):
        return torch.cond(x.sum() > 0, lambda y: F.relu(s.a(y)), lambda y: torch.sigmoid(s.a(y)), (x,))
    _, steps = _pass(Fn(f, a=nn.Linear(8, 8)), torch.randn(3, 8))
    assert sorted(s.desc["epilogue"]["unary"] for s in steps) == ["relu", "sigmoid"]
