"""Generated-kernel tactic families: each module implements one family of
:class:`~ascendc_pack.tactics.families.base.KernelTactic`; the registry lists them."""
