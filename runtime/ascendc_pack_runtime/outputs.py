"""The structure of a model's outputs, as plain JSON, and the names of its output tensors.

A model returns tensors arranged in tuples, lists, dicts and namedtuples (or other registered
pytree containers). The bundle stores that arrangement as an *output tree*, plain JSON that
needs neither the user's classes nor torch's pytree serializer::

    {"kind": "leaf"}
    {"kind": "tuple" | "list", "items": [tree, ...]}
    {"kind": "dict", "keys": ["logits", ...], "items": [tree, ...]}
    {"kind": "namedtuple", "type": "Out", "fields": ["logits", ...], "items": [tree, ...]}

Leaves are numbered in order (depth first), like ``torch.utils._pytree.tree_flatten``. The
runtime rebuilds a namedtuple as ``collections.namedtuple(type, fields)``: equal field by field
to the model's own class, though not the same class (the runtime never imports model code).

Output names come from the tree: dict keys and namedtuple fields, joined with ``.`` when nested
(``out.logits``), list/tuple positions as numbers (``aux.0``); a model returning one tensor or a
flat tuple gets ``output_0``, ``output_1``, ...
"""

from __future__ import annotations

import collections
import re
from typing import Any

LEAF = {"kind": "leaf"}
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def tree_from_treespec(spec) -> dict:
    """The output tree of a ``torch.utils._pytree.TreeSpec`` (e.g. ``ExportedProgram.call_spec.out_spec``).

    Containers torch registers with keys as context (dict, OrderedDict, transformers'
    ModelOutput, ...) become ``dict`` nodes; namedtuples keep their type name and fields;
    any other container becomes a ``tuple`` node.
    """
    if spec.is_leaf():
        return dict(LEAF)
    items = [tree_from_treespec(spec.child(i)) for i in range(spec.num_children)]
    typ, ctx = spec.type, spec.context
    if typ is list:
        return {"kind": "list", "items": items}
    if typ is tuple:
        return {"kind": "tuple", "items": items}
    if isinstance(ctx, type) and issubclass(ctx, tuple) and hasattr(ctx, "_fields"):
        return {"kind": "namedtuple", "type": ctx.__name__, "fields": [str(f) for f in ctx._fields],
                "items": items}
    if isinstance(ctx, (list, tuple)) and len(ctx) == len(items) and \
            all(isinstance(k, (str, int)) for k in ctx):
        return {"kind": "dict", "keys": [k for k in ctx], "items": items}
    return {"kind": "tuple", "items": items}


def tree_of(obj: Any) -> dict:
    """The output tree of a concrete output object (tensors are leaves)."""
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return {"kind": "namedtuple", "type": type(obj).__name__, "fields": list(obj._fields),
                "items": [tree_of(x) for x in obj]}
    if isinstance(obj, (tuple, list)):
        return {"kind": "tuple" if isinstance(obj, tuple) else "list", "items": [tree_of(x) for x in obj]}
    if isinstance(obj, dict):
        return {"kind": "dict", "keys": list(obj.keys()), "items": [tree_of(v) for v in obj.values()]}
    return dict(LEAF)


def leaves(obj: Any) -> list:
    """The leaves of an output object in tree order."""
    if isinstance(obj, (tuple, list)):
        return [x for item in obj for x in leaves(item)]
    if isinstance(obj, dict):
        return [x for item in obj.values() for x in leaves(item)]
    return [obj]


def count_leaves(tree: dict) -> int:
    """Number of tensors the tree holds."""
    return 1 if tree["kind"] == "leaf" else sum(count_leaves(t) for t in tree["items"])


def leaf_names(tree: dict) -> list[str]:
    """One stable name per leaf (see the module docstring)."""
    if tree["kind"] == "leaf":
        return ["output_0"]
    names: list[str] = []

    def walk(t: dict, path: list[str]) -> None:
        if t["kind"] == "leaf":
            names.append(".".join(path))
            return
        labels = t.get("keys") or t.get("fields") or \
            [f"output_{i}" if not path else str(i) for i in range(len(t["items"]))]
        for label, child in zip(labels, t["items"]):
            walk(child, [*path, str(label)])

    walk(tree, [])
    return names


def check_names(names: list, n_outputs: int, where: str) -> list[str]:
    """Validate user-given output names; ValueError naming the problem otherwise."""
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{where} must return a list of strings, got {type(names).__name__}")
    if len(names) != n_outputs:
        raise ValueError(f"{where} returned {len(names)} names but the model has {n_outputs} output "
                         f"tensors; return one name per output tensor")
    for n in names:
        if not n or len(n) > 128 or not all(_NAME_RE.fullmatch(p) for p in n.split(".")):
            raise ValueError(f"{where}: output name {n!r} is not a valid name; use letters, digits and "
                             "'_' (dots may separate parts), at most 128 characters")
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"{where}: output names must be unique, {dups} repeat")
    return list(names)


def plain(tree: dict) -> dict:
    """The tree with namedtuples as tuples (the structure torch's treespec JSON can carry)."""
    if tree["kind"] == "leaf":
        return tree
    out = {**tree, "items": [plain(t) for t in tree["items"]]}
    if tree["kind"] == "namedtuple":
        return {"kind": "tuple", "items": out["items"]}
    return out


def plain_treespec(tree: dict) -> str:
    """``torch.utils._pytree.treespec_dumps`` of the tree with namedtuples as tuples (the
    manifest's ``out_spec``, which readers of bundles from before ``out_tree`` use)."""
    from torch.utils import _pytree as pytree

    obj = OutputBuilder(plain(tree))([0] * count_leaves(tree))
    return pytree.treespec_dumps(pytree.tree_flatten(obj)[1])


class OutputBuilder:
    """Rebuilds output objects from flat tensors; namedtuple classes are made once."""

    def __init__(self, tree: dict):
        validate(tree)
        self.tree = tree
        self.n_leaves = count_leaves(tree)
        self._classes: dict[tuple, type] = {}

    def __call__(self, flat: list) -> Any:
        if len(flat) != self.n_leaves:
            raise ValueError(f"expected {self.n_leaves} output tensors, got {len(flat)}")
        it = iter(flat)
        return self._build(self.tree, it)

    def _build(self, t: dict, it) -> Any:
        kind = t["kind"]
        if kind == "leaf":
            return next(it)
        items = [self._build(c, it) for c in t["items"]]
        if kind == "tuple":
            return tuple(items)
        if kind == "list":
            return items
        if kind == "dict":
            return dict(zip(t["keys"], items))
        key = (t["type"], tuple(t["fields"]))
        cls = self._classes.get(key)
        if cls is None:
            cls = self._classes[key] = collections.namedtuple(t["type"], t["fields"], rename=True)
        return cls(*items)


def validate(tree: Any, depth: int = 0) -> None:
    """ValueError unless ``tree`` is a well-formed output tree (bounded depth)."""
    if depth > 64 or not isinstance(tree, dict):
        raise ValueError("output tree is malformed or nested more than 64 levels")
    kind = tree.get("kind")
    if kind == "leaf":
        return
    items = tree.get("items")
    if kind not in ("tuple", "list", "dict", "namedtuple") or not isinstance(items, list):
        raise ValueError(f"output tree node has unknown kind {kind!r} or no items")
    if kind == "dict":
        keys = tree.get("keys")
        if not isinstance(keys, list) or len(keys) != len(items) or \
                not all(isinstance(k, (str, int)) for k in keys):
            raise ValueError("output tree dict node needs one string or integer key per item")
    if kind == "namedtuple":
        fields = tree.get("fields")
        if not isinstance(tree.get("type"), str) or not isinstance(fields, list) or \
                len(fields) != len(items) or not all(isinstance(f, str) for f in fields):
            raise ValueError("output tree namedtuple node needs a type name and one field per item")
    for child in items:
        validate(child, depth + 1)
