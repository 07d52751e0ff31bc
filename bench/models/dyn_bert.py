"""A BERT-like encoder with a dynamic batch (1..32) and sequence length (8..256): token and
position embeddings, LayerNorm, 2 encoder layers (hidden 256, 4 heads, FFN 1024, GELU, post-norm)
and a padding mask; random weights. The example and calibration inputs are the buckets the
dynamic bundle tunes (batch x seq: 1x128, 8x128, 32x256); bench/dynamic_bench.py times it there
and off the buckets. Plain torch (no transformers)."""
import torch
from torch import nn
from torch.export import Dim

VOCAB, HIDDEN, HEADS, FFN, LAYERS, MAX_SEQ = 8192, 256, 4, 1024, 2, 256


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear(HIDDEN, 3 * HIDDEN), nn.Linear(HIDDEN, HIDDEN)
        self.ln1, self.ln2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.fc1, self.fc2 = nn.Linear(HIDDEN, FFN), nn.Linear(FFN, HIDDEN)

    def forward(self, x, bias):
        b, s, d = x.shape
        q, k, v = (t.view(b, s, HEADS, d // HEADS).transpose(1, 2) for t in self.qkv(x).split(d, -1))
        a = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        x = self.ln1(x + self.out(a.transpose(1, 2).reshape(b, s, d)))
        return self.ln2(x + self.fc2(nn.functional.gelu(self.fc1(x))))


class Bert(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(MAX_SEQ, HIDDEN)
        self.ln = nn.LayerNorm(HIDDEN)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))

    def forward(self, input_ids, attention_mask):
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.ln(self.tok(input_ids) + self.pos(pos))
        bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -1e4
        for layer in self.layers:
            x = layer(x, bias)
        return x


def get_model():
    torch.manual_seed(0)
    return Bert()


def make_inputs(batch, seq, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[:, seq - seq // 8:] = 0
    return ids, mask


def get_example_inputs():
    return make_inputs(1, 128, 1)


def get_calibration_inputs():
    return [make_inputs(8, 128, 2), make_inputs(32, 256, 3)]


def get_dynamic_shapes():
    batch, seq = Dim("batch", min=1, max=32), Dim("seq", min=8, max=256)
    return {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
