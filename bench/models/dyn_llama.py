"""A Llama-like decoder with a dynamic batch (1..32) and sequence length (8..256): token
embedding, 2 decoder blocks (hidden 256, 8 query heads sharing 2 key/value heads, RoPE, causal
attention, RMSNorm, SwiGLU FFN 688) and a final RMSNorm; random weights, no KV cache. The example
and calibration inputs are the buckets the dynamic bundle tunes (batch x seq: 1x128, 8x128,
32x256); bench/dynamic_bench.py times it there and off the buckets. Plain torch (no transformers)."""
import torch
from torch import nn
from torch.export import Dim

VOCAB, HIDDEN, HEADS, KV_HEADS, FFN, LAYERS = 8192, 256, 8, 2, 688, 2
HEAD = HIDDEN // HEADS


class RMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(HIDDEN))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def rotate(x, cos, sin):
    x1, x2 = x[..., : HEAD // 2], x[..., HEAD // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.n1, self.n2 = RMSNorm(), RMSNorm()
        self.q = nn.Linear(HIDDEN, HEADS * HEAD, bias=False)
        self.kv = nn.Linear(HIDDEN, 2 * KV_HEADS * HEAD, bias=False)
        self.o = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.gate_up = nn.Linear(HIDDEN, 2 * FFN, bias=False)
        self.down = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        h = self.n1(x)
        q = self.q(h).view(b, s, HEADS, HEAD).transpose(1, 2)
        k, v = (t.view(b, s, KV_HEADS, HEAD).transpose(1, 2) for t in self.kv(h).split(KV_HEADS * HEAD, -1))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k, v = (t.repeat_interleave(HEADS // KV_HEADS, dim=1) for t in (k, v))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, HIDDEN))
        g, u = self.gate_up(self.n2(x)).split(FFN, -1)
        return x + self.down(nn.functional.silu(g) * u)


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = RMSNorm()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, HEAD, 2).float() / HEAD), persistent=False)

    def forward(self, input_ids):
        pos = torch.arange(input_ids.shape[1], device=input_ids.device).float()
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.tok(input_ids)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.norm(x)


def get_model():
    torch.manual_seed(0)
    return Llama()


def make_inputs(batch, seq, seed=0):
    return (torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed)),)


def get_example_inputs():
    return make_inputs(1, 128, 1)


def get_calibration_inputs():
    return [make_inputs(8, 128, 2), make_inputs(32, 256, 3)]


def get_dynamic_shapes():
    return ({0: Dim("batch", min=1, max=32), 1: Dim("seq", min=8, max=256)},)
