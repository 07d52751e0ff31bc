"""Stage 2.5, tune (docs/DESIGN.md §2.5): the Python-mode module that runs the program on the real
inputs and tunes every fused kernel on its first call (:mod:`.python_mode`), and the whole-call
thread cap (:mod:`.call_threads`). The measurement machinery they share with the tactic tuner -
the protocol, candidate verification, the timing pool - is :mod:`ascendc_pack.autotune`."""
