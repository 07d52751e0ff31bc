"""Generated CPU kernel families (docs/DESIGN.md §2.4): each subpackage renders, tiles and
compiles one family from templates/kernel/ - ``fused`` (pointwise + reductions), ``gemm``,
``conv`` (direct, depthwise, Winograd), ``attention``."""
