"""The encoder bench/serve_batching.py serves: two pre-norm transformer layers (BERT-base width:
768, 12 heads, FFN 3072, GELU) over 4 tokens (a short request: a query, a few features), one
float input [batch, 4, 768], a dynamic batch 1..16 whose buckets (1, 4, 8, 16) are the example and
calibration inputs; random weights, plain torch. Its 57 MB of weights make a batch-1 call
memory-bound: the case batching is for (rows of one call share each weight read).

    ascendc-pack build bench/models/serve_encoder.py --topn 2 -o serve_encoder.ascpack
    python bench/serve_batching.py --bundle serve_encoder.ascpack
"""
import torch
from torch import nn
from torch.export import Dim

WIDTH, HEADS, FFN, LAYERS, TOKENS = 768, 12, 3072, 2, 4


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.out = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.fc1, self.fc2 = nn.Linear(WIDTH, FFN), nn.Linear(FFN, WIDTH)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (t.view(b, s, HEADS, d // HEADS).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(d, -1))
        a = nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def get_model():
    torch.manual_seed(0)
    return Encoder()


def _rows(batch, seed):
    return (torch.randn(batch, TOKENS, WIDTH, generator=torch.Generator().manual_seed(seed)),)


def get_example_inputs():
    return _rows(1, 1)


def get_calibration_inputs():
    return [_rows(4, 2), _rows(8, 3), _rows(16, 4)]


def get_dynamic_shapes():
    return {"x": {0: Dim("batch", min=1, max=16)}}
