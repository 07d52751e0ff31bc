"""Attention inputs read through the copy that made them contiguous
(ascendc_pack/tactics/attention_sources.py): the recipe of views rebuilds exactly the tensor the
copy's views gave and refuses what views of the source cannot give; a batch_first
``nn.MultiheadAttention`` bundle whose generated attention kernel won reads the packed projection
in place (the 3-way copy is gone from the graph) and matches eager in a fresh process; a copy
something else reads, or a candidate that is not a generated kernel, keeps the copy."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ascendc_pack_runtime as rt
from ascendc_pack.autotune.protocol import Protocol
from ascendc_pack.frontend.capture import capture
from ascendc_pack.passes.fold import fold_constants
from ascendc_pack.pipeline import build
from ascendc_pack.tactics.attention_sources import _recipe, apply_recipe
from ascendc_pack.tactics.rewrite import find_tactics
from ascendc_pack.tactics.tune import TacticTuner

from .bundle_fixtures import build_root, read_bundle
from .test_tactic_pipeline import _fresh_process_matches

FAST = Protocol(warmup=1, min_rounds=2, max_rounds=3, time_cap_s=0.05, min_sample_us=20.0)


def _packed_projection(seq=16, batch=2, dim=32):
    """What nn.MultiheadAttention makes of its packed in-projection: P [3, L, B, E] (a view)."""
    x = torch.randn(seq, batch, 3 * dim)
    return x.view(seq, batch, 3, dim).unsqueeze(0).transpose(0, -2).squeeze(-2)


@pytest.mark.parametrize("part", [0, 1, 2])
def test_the_recipe_rebuilds_the_heads_view_of_the_copy(part):
    p = _packed_projection()
    q = p.contiguous()[part].view(16, 8, 8).transpose(0, 1).view(2, 4, 16, 8)  # [B, H, L, Eh]
    recipe = _recipe(tuple(p.shape), tuple(q.shape), q.stride(), q.storage_offset())
    assert recipe is not None and recipe[0] == ["select", [0, part]]
    got = apply_recipe(p, recipe)
    assert torch.equal(got, q) and got.data_ptr() != q.data_ptr()
    assert got.untyped_storage().data_ptr() == p.untyped_storage().data_ptr()  # a view of P, no copy


def test_the_recipe_takes_size_one_dims_and_refuses_what_views_cannot_give():
    p = torch.randn(4, 1, 6, 8).transpose(0, 2)  # [6, 1, 4, 8], a size-1 dim
    c = p.contiguous()
    for view in (c.squeeze(1).permute(1, 0, 2), c[2].permute(2, 0, 1).unsqueeze(1), c.view(6, 4, 2, 4)):
        recipe = _recipe(tuple(p.shape), tuple(view.shape), view.stride(), view.storage_offset())
        assert recipe is not None and torch.equal(apply_recipe(p, recipe), view)
    # a slice, a step, a merge of dims P does not hold mergeable (4 x 8 at strides 48, 1), a broadcast
    for view in (c[1:3], c[:, :, :, ::2], c.view(6, 32), c[:, :, :1].expand(6, 1, 4, 8)):
        assert _recipe(tuple(p.shape), tuple(view.shape), view.stride(), view.storage_offset()) is None


class Block(nn.Module):
    """Pre-norm self-attention, batch_first (the packed projection + its copy + the heads views)."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x):
        h = self.ln(x)
        return x + self.attn(h, h, h, need_weights=False)[0]


class ManualPacked(nn.Module):
    """nn.MultiheadAttention's packed split written out; ``share``: the copy is an output too."""

    def __init__(self, share: bool, dim=32, heads=4):
        super().__init__()
        self.proj = nn.Linear(dim, 3 * dim)
        self.share, self.dim, self.heads = share, dim, heads

    def forward(self, x):
        b, l, e = x.shape
        packed = self.proj(x.transpose(0, 1)).unflatten(-1, (3, e)).unsqueeze(0).transpose(0, -2).squeeze(-2)
        packed = packed.contiguous()
        q, k, v = (packed[i].view(l, b * self.heads, e // self.heads).transpose(0, 1)
                   .view(b, self.heads, l, e // self.heads) for i in range(3))
        y = nn.functional.scaled_dot_product_attention(q, k, v)
        return (y, packed.sum(0)) if self.share else y


def _forced(prefer):
    real = TacticTuner.decisions

    def decisions(self):
        out = real(self)
        for s in self.instances:
            names = [t.name for t in self.choices[s.name].candidates]
            if s.tactic_kind == "attention":
                out[id(s)] = names.index(prefer)
        return out

    return decisions


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return build_root(tmp_path_factory) / "build_cache"


@pytest.mark.parametrize("prefer", ["attention#0", "flash"])
def test_a_multihead_attention_bundle_reads_the_packed_projection_in_place(tmp_path, cache, monkeypatch, prefer):
    monkeypatch.setattr(TacticTuner, "decisions", _forced(prefer))
    torch.manual_seed(0)
    model = Block().eval()
    inputs = (torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(1)),)
    out = tmp_path / "m.ascpack"
    res = build(model, inputs, output=out, cache_dir=cache, jobs=2, protocol=FAST, topn=2)  # verified vs eager
    (attn,) = [ch for ch in res.tactics.values() if ch.kind == "attention"]
    assert set(attn.desc["sources"]) == {"q", "k", "v"} and all(r.error is None for r in attn.results)
    graph = next(data for info, data in read_bundle(out) if info.name == "graph.cpp").decode()
    # the captured copy of q/k/v (value `clone`, [3, L, B, E]) runs only when the kernel did not win
    kernel = any(k.name.startswith("attention_attention_") for k in rt.read_manifest(out).kernels)
    assert kernel == (prefer == "attention#0")
    assert ("// clone = fused_copy_" in graph) != kernel and ("__q_src" in graph) == kernel
    _fresh_process_matches(out, model, inputs, tmp_path)
    _fresh_process_matches(out, model, (torch.randn(2, 16, 32),), tmp_path)


@pytest.mark.parametrize("share", [False, True], ids=["private-copy", "copy-read-elsewhere"])
def test_only_a_copy_nothing_else_reads_is_read_through(share):
    torch.manual_seed(0)
    cap = capture(ManualPacked(share).eval(), (torch.randn(2, 16, 32),))
    folded = fold_constants(cap.model, cap.weights)
    found = find_tactics(folded.model, folded.weights)
    (attn,) = [s for s in found.model.program.steps if getattr(s, "tactic_kind", "") == "attention"]
    if share:
        assert "sources" not in attn.desc and not {"q_src", "k_src", "v_src"} & set(attn.bind)
    else:
        assert [r[0] for r in attn.desc["sources"]["k"]] == ["select", "view", "permute"]
        assert attn.desc["sources"]["k"][0] == ["select", [0, 1]] and {"q_src", "k_src", "v_src"} <= set(attn.bind)
