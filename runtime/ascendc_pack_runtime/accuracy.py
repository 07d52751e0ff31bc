"""One accuracy rule for every "does this match eager?" check (capture, build, ``run --check``).

Two floating-point results of the same model differ by rounding: a fused kernel sums in another
order, a 16-bit cast lands on the neighbouring value. A fixed ``atol = rtol = 1e-5`` calls such
graphs wrong (timm resnet50d: 9.8e-4 on logits of magnitude 2.3e3, about 4 float32 ulp). The
rule here scales with the dtype and with the magnitude of the tensor:

    allowed_i = atol + rtol * (|expected_i| + 0.1 * max|expected|)

with ``(rtol, atol)`` per dtype (:data:`DEFAULT_TOLERANCES`; ``--rtol/--atol`` override them).
The ``0.1 * max|expected|`` term lets an element near zero carry the error that accumulating
values of the tensor's magnitude produces. When a float64 run of the model is available, an
element also passes when it is as accurate as eager: ``|actual - ref64| <= 2 * |expected - ref64|
+ atol`` (the comparison torch's own compiler tests make), up to 16 times ``allowed_i``. NaN must meet NaN, infinities must be
equal; integer and bool outputs must be equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 1e-5),     # about 2 ulp
    torch.bfloat16: (1.6e-2, 1e-5),  # about 2 ulp
}
"""(rtol, atol) per dtype; complex dtypes use their real parts' entry."""

SCALE_FRACTION = 0.1
SECOND_LOOK_CAP = 16.0
"""The float64 second look passes an element at most this many times its allowed error."""


@dataclass(frozen=True)
class OutputCheck:
    """How one output tensor compares: its worst element and the error allowed there."""

    name: str
    max_error: float          # largest |actual - expected| (inf for mismatched NaN/inf/ints)
    allowed: float            # the allowed error at that element
    index: tuple[int, ...] | None
    actual: float | None
    expected: float | None
    problem: str | None       # None when the output matches
    rule: str                 # the tolerance rule that applied, for messages

    @property
    def ok(self) -> bool:
        return self.problem is None

    def describe(self) -> str:
        """One line for a report: the error and the allowed error."""
        if self.problem is None and self.rule.startswith("relative error"):
            return f"{self.name}: relative error {self.max_error:.3g} (budget {self.allowed:.3g})"
        if self.problem is None:
            return f"{self.name}: max error {self.max_error:.3g} (allowed {self.allowed:.3g})"
        return f"{self.name}: {self.problem}"


def tolerance_for(dtype: torch.dtype, rtol: float | None = None, atol: float | None = None) -> tuple[float, float]:
    """The (rtol, atol) used for ``dtype``, with user overrides applied."""
    base = dtype.to_real() if dtype.is_complex else dtype
    d_rtol, d_atol = DEFAULT_TOLERANCES.get(base, (0.0, 0.0))
    return (d_rtol if rtol is None else float(rtol)), (d_atol if atol is None else float(atol))


def check_tensor(name: str, expected: torch.Tensor, actual: torch.Tensor, reference64: torch.Tensor | None = None,
                 rtol: float | None = None, atol: float | None = None) -> OutputCheck:
    """Compare one output tensor by the rule of this module."""
    def fail(problem, err=float("inf")):
        return OutputCheck(name, err, 0.0, None, None, None, problem, "")

    if not isinstance(actual, torch.Tensor):
        return fail(f"expected a tensor, got {type(actual).__name__}")
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return fail(f"expected {_typ(expected)}, got {_typ(actual)}")
    if not (expected.dtype.is_floating_point or expected.dtype.is_complex):
        diff = (actual != expected)
        if bool(diff.any()):
            idx = _unravel(int(diff.flatten().nonzero()[0]), expected.shape)
            return OutputCheck(name, float("inf"), 0.0, idx, _item(actual, idx), _item(expected, idx),
                               f"{_typ(expected)} differs at {list(idx)}: got {_item(actual, idx)}, "
                               f"expected {_item(expected, idx)} (integer and bool outputs must be equal)",
                               "exact")
        return OutputCheck(name, 0.0, 0.0, None, None, None, None, "exact")
    e, a = _real64(expected), _real64(actual)
    r = _real64(reference64) if reference64 is not None and reference64.shape == expected.shape else None
    t_rtol, t_atol = tolerance_for(expected.dtype, rtol, atol)
    finite_e = e[torch.isfinite(e)]
    scale = float(finite_e.abs().max()) if finite_e.numel() else 0.0
    rule = (f"atol {t_atol:g} + rtol {t_rtol:g} × (|expected| + {SCALE_FRACTION:g} × max|expected| "
            f"{scale:.3g})")
    nan_e, nan_a = torch.isnan(e), torch.isnan(a)
    if not torch.equal(nan_e, nan_a):
        idx = _unravel(int((nan_e != nan_a).flatten().nonzero()[0]), e.shape)
        return OutputCheck(name, float("inf"), 0.0, idx, _item(a, idx), _item(e, idx),
                           f"NaN mismatch at {list(idx)}: got {_item(a, idx)}, expected {_item(e, idx)}", rule)
    inf_e, inf_a = torch.isinf(e), torch.isinf(a)
    bad_inf = (inf_e | inf_a) & ~(inf_e & inf_a & (e == a))
    if bool(bad_inf.any()):
        idx = _unravel(int(bad_inf.flatten().nonzero()[0]), e.shape)
        return OutputCheck(name, float("inf"), 0.0, idx, _item(a, idx), _item(e, idx),
                           f"infinity mismatch at {list(idx)}: got {_item(a, idx)}, expected {_item(e, idx)}", rule)
    finite = torch.isfinite(e) & torch.isfinite(a)
    err = torch.where(finite, (a - e).abs(), torch.zeros_like(e))
    allowed = t_atol + t_rtol * (e.abs().nan_to_num(0, 0, 0) + SCALE_FRACTION * scale)
    ok = err <= allowed
    if r is not None:  # as accurate as eager, within a bounded multiple of the tolerance
        ok |= torch.where(finite, (a - r).abs() <= 2 * (e - r).abs() + t_atol, torch.ones_like(ok)) & \
            (err <= SECOND_LOOK_CAP * allowed)
    if e.numel() == 0:
        return OutputCheck(name, 0.0, 0.0, None, None, None, None, rule)
    ratio = torch.where(ok, torch.zeros_like(err), err / allowed.clamp_min(1e-300))
    worst = int(ratio.flatten().argmax()) if not bool(ok.all()) else int(err.flatten().argmax())
    idx = _unravel(worst, e.shape)
    max_err, allowed_at = float(err.flatten()[worst]), float(allowed.flatten()[worst])
    problem = None
    if not bool(ok.all()):
        n_bad = int((~ok).sum())
        problem = (f"max error {max_err:.3g} at {list(idx)} (got {_item(a, idx):.6g}, expected "
                   f"{_item(e, idx):.6g}) exceeds the allowed {allowed_at:.3g} = {rule}; "
                   f"{n_bad} of {e.numel()} elements differ")
    return OutputCheck(name, max_err, allowed_at, idx, _item(a, idx), _item(e, idx), problem, rule)


def check_outputs(names: list[str], expected: list, actual: list, reference64: list | None = None,
                  rtol: float | None = None, atol: float | None = None) -> list[OutputCheck]:
    """Compare flat lists of output tensors, one :class:`OutputCheck` per output."""
    if len(expected) != len(actual):
        return [OutputCheck("outputs", float("inf"), 0.0, None, None, None,
                            f"expected {len(expected)} output tensors, got {len(actual)}", "")]
    refs = reference64 if reference64 is not None and len(reference64) == len(expected) else [None] * len(expected)
    return [check_tensor(n, e, a, r, rtol, atol) for n, e, a, r in zip(names, expected, actual, refs)]


def relative_error(expected: torch.Tensor, actual: torch.Tensor) -> float:
    """The relative error of one output: ``||actual - expected||_2 / ||expected||_2`` in float64
    over the finite elements (a precision budget's metric, docs/PRECISION.md). 0.0 for equal
    tensors (an all-zero ``expected`` included); ``inf`` where shapes differ, NaN/infinities do not
    meet or integer/bool outputs differ."""
    if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape:
        return float("inf")
    if not (expected.dtype.is_floating_point or expected.dtype.is_complex):
        return 0.0 if torch.equal(actual.to(expected.dtype), expected) else float("inf")
    e, a = _real64(expected), _real64(actual)
    fe, fa = torch.isfinite(e), torch.isfinite(a)
    if not torch.equal(fe, fa) or not torch.equal(e[~fe].nan_to_num(0.0), a[~fa].nan_to_num(0.0)) \
            or not torch.equal(torch.isnan(e), torch.isnan(a)):
        return float("inf")
    diff = float(torch.linalg.vector_norm(a[fa] - e[fe]))
    norm = float(torch.linalg.vector_norm(e[fe]))
    if diff == 0.0:
        return 0.0
    return diff / norm if norm > 0 else float("inf")


def check_budget(names: list[str], expected: list, actual: list, budget: float) -> list[OutputCheck]:
    """Compare flat lists of outputs by a precision budget (a bundle with low-precision steps,
    manifest ``precision``): every floating output's :func:`relative_error` at most ``budget``;
    integer and bool outputs must be equal (:func:`check_tensor`)."""
    if len(expected) != len(actual):
        return [OutputCheck("outputs", float("inf"), 0.0, None, None, None,
                            f"expected {len(expected)} output tensors, got {len(actual)}", "")]
    out = []
    rule = f"relative error ||y - eager|| / ||eager|| <= the accuracy budget {budget:g}"
    for n, e, a in zip(names, expected, actual):
        if not (isinstance(e, torch.Tensor) and (e.dtype.is_floating_point or e.dtype.is_complex)):
            out.append(check_tensor(n, e, a))
            continue
        rel = relative_error(e, a)
        problem = None if rel <= budget else (f"relative error {rel:.3g} exceeds the accuracy budget {budget:g} the "
                                              "bundle was built with")
        out.append(OutputCheck(n, rel, budget, None, None, None, problem, rule))
    return out


def first_problem(checks: list[OutputCheck]) -> str | None:
    """The first failing check's description, or None when every output matches."""
    return next((c.describe() for c in checks if not c.ok), None)


def _real64(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t.resolve_conj())
    return t.to(torch.float64)


def _typ(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


def _unravel(flat: int, shape) -> tuple[int, ...]:
    idx = []
    for s in reversed(tuple(shape)):
        idx.append(flat % s if s else 0)
        flat //= max(s, 1)
    return tuple(reversed(idx))


def _item(t: torch.Tensor, idx: tuple[int, ...]):
    v = t[idx] if idx else t
    return v.item() if v.numel() == 1 else v.flatten()[0].item()
