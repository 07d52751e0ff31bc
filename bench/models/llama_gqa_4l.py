"""A 4-layer Llama-style decoder (transformers ``LlamaModel``: hidden 256, 8 query heads sharing
2 key/value heads (grouped-query attention), SwiGLU FFN 688, RMSNorm, RoPE, causal SDPA
attention), random weights, batch 1, sequence 128, no KV cache. Returns the last hidden state.
Needs the `bench` extra."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_deps as deps  # noqa: E402

VOCAB, SEQ = 8192, 128


class Llama(torch.nn.Module):
    """LlamaModel returning a plain tensor (the model-file contract), cache off."""

    def __init__(self):
        super().__init__()
        tf = deps.import_transformers()
        config = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=688,
                                num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                                max_position_embeddings=2 * SEQ, use_cache=False,
                                attn_implementation="sdpa")
        self.llama = tf.LlamaModel(config)

    def forward(self, input_ids):
        return self.llama(input_ids=input_ids, use_cache=False).last_hidden_state


def get_model():
    torch.manual_seed(0)
    return Llama()


def get_example_inputs():
    return (deps.token_inputs(VOCAB, seq=SEQ),)
