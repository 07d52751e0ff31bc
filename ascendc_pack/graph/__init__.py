"""Stage 2.6 (docs/DESIGN.md §2.6): the C++ graph - plan the steps and memory, emit the
translation unit from templates/graph/, compile it, render (cached)."""
