"""A 4-layer BERT encoder (transformers ``BertModel``: hidden 256, 4 heads, FFN 1024, SDPA
attention), random weights, batch 1, sequence 128 with an attention mask whose last 16 tokens
are padding. Returns the last hidden state. Needs the `bench` extra."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_deps as deps  # noqa: E402

VOCAB, SEQ, PAD = 8192, 128, 16


class Bert(torch.nn.Module):
    """BertModel without the pooler, returning a plain tensor (the model-file contract)."""

    def __init__(self):
        super().__init__()
        tf = deps.import_transformers()
        config = tf.BertConfig(vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4,
                               num_attention_heads=4, intermediate_size=1024,
                               max_position_embeddings=SEQ, attn_implementation="sdpa")
        self.bert = tf.BertModel(config, add_pooling_layer=False)

    def forward(self, input_ids, attention_mask):
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def get_model():
    torch.manual_seed(0)
    return Bert()


def get_example_inputs():
    mask = torch.ones(1, SEQ, dtype=torch.long)
    mask[:, SEQ - PAD:] = 0
    return deps.token_inputs(VOCAB, seq=SEQ), mask
