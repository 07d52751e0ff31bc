"""Stage 2.5, PGO (docs/DESIGN.md §2.5): the measurement protocol and selection
(:mod:`.protocol`), candidate verification in an isolated worker (:mod:`.verify`), the Python-mode
module that tunes kernels on their first call (:mod:`.python_mode`), the whole-call thread cap
(:mod:`.call_threads`)."""
