"""The intermediate representations that cross stage boundaries: the captured Program
(:mod:`.program`), the fused-kernel spec (:mod:`.fusion`), the op table (:mod:`.ops`), candidates
and choices (:mod:`.candidate`, :mod:`.choice`). Plain, JSON-serializable dataclasses."""
