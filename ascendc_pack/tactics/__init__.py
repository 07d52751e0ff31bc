"""Tactics: candidate implementations of the heavy steps (GEMM, convolution, attention, max
pooling), docs/TACTICS.md.

Where to look:

* :mod:`.match`, :mod:`.match_attention` - find a heavy step and the pointwise ops around it;
* :mod:`.rewrite`  - the tactic pass: matched steps become ``TacticStep``s of the program;
* :mod:`.tune`     - verify and time every step's candidates on the real inputs (PGO);
* :mod:`.lower`    - the chosen candidates become ATen / dispatcher / kernel steps;
* :mod:`.pool_widen` - a bfloat16 convolution's widening moves after the max pooling reading it;
* :mod:`.report`   - the build summary and the manifest records of the choices;
* :mod:`.families` - generated-kernel tactics (one module per family + the registry);
* :mod:`.dispatch` - dispatcher tactics: ATen as captured, oneDNN / MKL prepacked calls.
"""
