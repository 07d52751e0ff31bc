"""Device backends behind one seam (docs/DESIGN.md §6.3): the registry and protocol
(:mod:`.registry`), ``cpu`` (:mod:`.cpu`), ``npu`` (:mod:`.npu`)."""
