"""Stage 2.7 (docs/DESIGN.md §2.7): the ``.ascpack`` bundle, its signature, and the Triton
model-repository exporter."""
