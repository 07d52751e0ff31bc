"""Stages 2.1-2.2 (docs/DESIGN.md §2.1, §2.2): load a model.py, capture it with torch.export
(through the capture cache), and the reference executor that runs a captured Program and checks it
against eager."""
