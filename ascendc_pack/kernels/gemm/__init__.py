"""The generated GEMM kernel family (docs/GEMM.md): generator and in-process launcher."""
