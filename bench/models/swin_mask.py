"""Shifted-window attention whose mask is rebuilt by slice assignment on every call (swin)."""
import torch
from torch import nn

H = W = 16
WS, SHIFT, C, HEADS = 8, 4, 32, 2


class ShiftedWindowBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)

    def forward(self, x):  # (B, H, W, C)
        B = x.shape[0]
        x = torch.roll(x, shifts=(-SHIFT, -SHIFT), dims=(1, 2))
        xw = x.view(B, H // WS, WS, W // WS, WS, C).permute(0, 1, 3, 2, 4, 5).reshape(-1, WS * WS, C)
        qkv = self.qkv(xw).reshape(xw.shape[0], WS * WS, 3, HEADS, C // HEADS).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * (C // HEADS) ** -0.5) @ k.transpose(-2, -1)
        mask = x.new_zeros((H, W))
        slices = ((0, -WS), (-WS, -SHIFT), (-SHIFT, None))
        count = 0
        for h in slices:
            for w in slices:
                mask[h[0]:h[1], w[0]:w[1]] = count
                count += 1
        mask = mask.view(H // WS, WS, W // WS, WS).permute(0, 2, 1, 3).reshape(-1, WS * WS)
        mask = mask.unsqueeze(1) - mask.unsqueeze(2)
        mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
        nw = mask.shape[0]
        attn = attn.view(B, nw, HEADS, WS * WS, WS * WS) + mask.unsqueeze(1).unsqueeze(0)
        attn = torch.softmax(attn.view(-1, HEADS, WS * WS, WS * WS), dim=-1)
        out = self.proj((attn @ v).transpose(1, 2).reshape(-1, WS * WS, C))
        out = out.view(B, H // WS, W // WS, WS, WS, C).permute(0, 1, 3, 2, 4, 5).reshape(B, H, W, C)
        return torch.roll(out, shifts=(SHIFT, SHIFT), dims=(1, 2))


def get_model():
    torch.manual_seed(0)
    return ShiftedWindowBlock()


def get_example_inputs():
    return (torch.randn(2, H, W, C, generator=torch.Generator().manual_seed(0)),)
