"""Sizes of a dynamic-shape plan: integer expressions over the model's declared dynamic dims.

A model that declares dynamic dims (``get_dynamic_shapes()``, docs/DESIGN.md §2.10) is also
built once as a *generic plan*: captured with ``torch.export`` dynamic shapes, its values'
shapes and strides and the size arguments of its steps are sympy expressions over one symbol
per dynamic dim (``batch``, ``seq``; :func:`dim_symbol`), plain ``int`` everywhere else. The
stages that build the generic plan (fuse, lower, the jit kernels, the graph planner and
emitter) keep such expressions as they are: they are never converted to an ``int`` (sympy
raises), equalities are structural (``batch*seq*64 == 64*seq*batch``), and an ordering of two
expressions that only a heuristic needs (which axis is outermost) uses :func:`order_key`: the
values where every dim is large.

What crosses into C++ (jit kernels, graph.cpp) is rendered by :func:`c_expr` (a C expression
over an array of dim values) or compiled to the graph's postfix code (:func:`postfix`); both
accept only the operations shapes are made of (+, *, floor division, modulo, max, min) and
refuse anything else with an error naming the expression.
"""

from __future__ import annotations

import json
import math

from ascendc_pack.errors import PackError

# sympy is imported only by the functions that build or print expressions: a static build never
# loads it (about 0.3 s)

_LARGE = 1 << 20   # the value of every dim in order_key: large enough that sizes dominate constants


class SymbolicError(PackError):
    """A dynamic size the generic plan cannot express (an operation outside + * // % max min)."""


def dim_symbol(name: str):
    """The symbol of dynamic dim ``name`` (a positive integer)."""
    import sympy

    return sympy.Symbol(name, integer=True, positive=True)


def _is_expr(x) -> bool:
    return hasattr(x, "free_symbols") and hasattr(x, "is_number")


def is_symbolic(x) -> bool:
    """``x`` is an expression over dynamic dims (not a plain number)."""
    return _is_expr(x) and not x.is_number


def simplify(x):
    """``x`` with sympy integers made ``int`` (an expression stays an expression, expanded)."""
    if _is_expr(x):
        import sympy

        x = sympy.expand(x)
        return int(x) if x.is_number else x
    return x


def symbols_of(*xs) -> set[str]:
    """Names of the dynamic dims the values ``xs`` (ints, expressions, nested lists) depend on."""
    out: set[str] = set()
    for x in xs:
        if isinstance(x, (list, tuple)):
            out |= symbols_of(*x)
        elif is_symbolic(x):
            out |= {s.name for s in x.free_symbols}
    return out


def any_symbolic(*xs) -> bool:
    """Whether any value in ``xs`` (nested lists included) is an expression."""
    return bool(symbols_of(*xs))


def order_key(x) -> int:
    """A sort key for a size or stride: itself, or an expression's value where every dim is
    large. Only for heuristics (axis order, memory order); never a size."""
    if is_symbolic(x):
        return int(x.subs({s: _LARGE for s in x.free_symbols}))
    return int(x)


def evaluate(x, sizes: dict[str, int]) -> int:
    """The value of a size at ``sizes`` (dim name -> value)."""
    if not is_symbolic(x):
        return int(x)
    missing = symbols_of(x) - set(sizes)
    if missing:
        raise SymbolicError(f"size {x} depends on dynamic dim(s) {sorted(missing)} that have no value")
    return int(x.subs({s: sizes[s.name] for s in x.free_symbols}))


def bounds(x, ranges: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """The smallest and largest value of ``x`` over the declared ``ranges`` (dim -> (min, max)).

    Exact for expressions that never decrease when a dim grows (the sizes and strides of a
    plan: once expanded, sums of products of dims with positive coefficients, floor divisions
    and maxima of those); anything else raises SymbolicError (its extremes need not be at the
    corners). The graph interpreter also checks every arena buffer against the arena per call."""
    if not is_symbolic(x):
        return int(x), int(x)
    import sympy

    x = sympy.expand(x)
    if not _monotone(x):
        raise SymbolicError(f"size {x} can shrink when a dynamic dim grows; the generic plan cannot bound it")
    lo = evaluate(x, {n: r[0] for n, r in ranges.items()})
    hi = evaluate(x, {n: r[1] for n, r in ranges.items()})
    return lo, hi


def _monotone(x) -> bool:
    """Non-decreasing in every dim (dims are positive): a constant term may be negative, a
    product needs a positive coefficient and non-negative, non-decreasing factors."""
    if x.is_number or x.is_Symbol:
        return True
    if x.is_Add:
        return all(_monotone(a) for a in x.args)
    if x.is_Mul:
        coeff, rest = x.as_coeff_Mul()
        return coeff > 0 and all(_growing_factor(f) for f in rest.as_ordered_factors())
    return _growing_factor(x)


def _growing_factor(f) -> bool:
    """A non-negative, non-decreasing factor of a product."""
    import sympy

    if f.is_Symbol:
        return True
    if f.is_number:
        return f >= 0
    if f.is_Pow:
        return f.exp.is_Integer and f.exp > 0 and _growing_factor(f.base)
    if isinstance(f, (sympy.Max, sympy.Min)):
        return all(_growing_factor(a) or (a.is_number and a >= 0) for a in f.args)
    if type(f).__name__ in ("FloorDiv", "CeilDiv", "CleanDiv"):
        return f.args[1].is_number and f.args[1] > 0 and _growing_factor(f.args[0])
    if f.is_Add:  # a sum inside a product: every term must grow and the sum stay >= 0 (positive terms)
        return all(a.is_number and a >= 0 or _growing_factor(a) for a in f.args)
    if f.is_Mul:
        coeff, rest = f.as_coeff_Mul()
        return coeff > 0 and all(_growing_factor(g) for g in rest.as_ordered_factors())
    return False


# --- JSON --------------------------------------------------------------------------------------

def to_json(x):
    """An int, or ``{"sym": text}`` for an expression (specs and programs that hold dynamic sizes)."""
    if is_symbolic(x):
        import sympy

        return {"sym": sympy.srepr(x)}
    if _is_expr(x):
        return int(x)
    return x


def canonical(x) -> str:
    """Stable text of an int or expression (cache keys)."""
    return json.dumps(to_json(x), sort_keys=True)


# --- C --------------------------------------------------------------------------------------

def _binary(name: str):
    return lambda a, b: f"{name}({a}, {b})"


def c_expr(x, dim_var) -> str:
    """``x`` as a C expression of type int64_t; ``dim_var(name)`` is the C text of a dim's value."""
    if not is_symbolic(x):
        return f"INT64_C({int(x)})"
    import sympy

    return _c(sympy.expand(x), dim_var)


def _c(x, dim_var) -> str:
    import sympy

    if x.is_Integer:
        return f"INT64_C({int(x)})"
    if x.is_Symbol:
        return dim_var(x.name)
    if x.is_Add:
        return "(" + " + ".join(_c(a, dim_var) for a in x.args) + ")"
    if x.is_Mul:
        return "(" + " * ".join(_c(a, dim_var) for a in x.args) + ")"
    if x.is_Pow and x.exp.is_Integer and 0 < int(x.exp) <= 8:
        return "(" + " * ".join([_c(x.base, dim_var)] * int(x.exp)) + ")"
    name = type(x).__name__
    if name == "FloorDiv":
        return f"ap_floordiv({_c(x.args[0], dim_var)}, {_c(x.args[1], dim_var)})"
    if name in ("Mod", "PythonMod"):
        return f"ap_floormod({_c(x.args[0], dim_var)}, {_c(x.args[1], dim_var)})"
    if isinstance(x, (sympy.Max, sympy.Min)):
        fn = "ap_max64" if isinstance(x, sympy.Max) else "ap_min64"
        out = _c(x.args[0], dim_var)
        for a in x.args[1:]:
            out = f"{fn}({out}, {_c(a, dim_var)})"
        return out
    raise SymbolicError(f"dynamic size {x} uses {name}, which the generic plan does not support "
                        "(only +, *, //, %, max and min of dynamic dims)")


# --- the graph's postfix code -------------------------------------------------------------------

# opcodes of graph_program.h (ap_sym_op)
OP_CONST, OP_DIM, OP_ADD, OP_MUL, OP_FLOORDIV, OP_MOD, OP_MAX, OP_MIN = range(8)


def postfix(x, dim_index) -> list[int]:
    """``x`` as postfix code for the graph interpreter: pairs ``(opcode, operand)`` flattened
    (``OP_CONST c``, ``OP_DIM k`` push; the others pop two and push one). ``dim_index(name)``
    is the position of a dim in the graph's dim table."""
    import sympy

    code: list[int] = []

    def emit(e):
        if e.is_Integer:
            code.extend((OP_CONST, int(e)))
        elif e.is_Symbol:
            code.extend((OP_DIM, dim_index(e.name)))
        elif e.is_Add or e.is_Mul or isinstance(e, (sympy.Max, sympy.Min)):
            op = OP_ADD if e.is_Add else OP_MUL if e.is_Mul else OP_MAX if isinstance(e, sympy.Max) else OP_MIN
            emit(e.args[0])
            for a in e.args[1:]:
                emit(a)
                code.extend((op, 0))
        elif e.is_Pow and e.exp.is_Integer and 0 < int(e.exp) <= 8:
            emit(e.base)
            for _ in range(int(e.exp) - 1):
                emit(e.base)
                code.extend((OP_MUL, 0))
        elif type(e).__name__ in ("FloorDiv", "Mod", "PythonMod"):
            emit(e.args[0])
            emit(e.args[1])
            code.extend((OP_FLOORDIV if type(e).__name__ == "FloorDiv" else OP_MOD, 0))
        else:
            raise SymbolicError(f"dynamic size {e} uses {type(e).__name__}, which the generic plan does not "
                                "support (only +, *, //, %, max and min of dynamic dims)")

    emit(sympy.expand(x) if is_symbolic(x) else sympy.Integer(int(x)))
    return code


def eval_postfix(code: list[int], dims: list[int]) -> int:
    """Run :func:`postfix` code (the interpreter's algorithm; tests compare the two)."""
    stack: list[int] = []
    for op, v in zip(code[::2], code[1::2]):
        if op == OP_CONST:
            stack.append(v)
        elif op == OP_DIM:
            stack.append(dims[v])
        else:
            b, a = stack.pop(), stack.pop()
            stack.append({OP_ADD: a + b, OP_MUL: a * b, OP_FLOORDIV: a // b if b else 0,
                          OP_MOD: a % b if b else 0, OP_MAX: max(a, b), OP_MIN: min(a, b)}[op])
    return stack[-1]


def prod(xs):
    """Product of sizes (ints or expressions)."""
    return simplify(math.prod(xs))
