"""Fused pointwise/reduction kernels: C source (:mod:`.codegen`), candidate tilings and the
cost model (:mod:`.tiling`), and the stage entry point :func:`.build.prepare_kernels`."""
