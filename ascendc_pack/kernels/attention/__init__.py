"""The generated fused-attention kernel family (docs/ATTENTION.md)."""
