"""Graph passes over the captured Program: constant folding, copy elision, fusion into
kernel specs, lowering of fused ops."""
