#!/usr/bin/env python
"""PyTorch's own OpInfo samples of pointwise and reduction ops through ``ascendc_pack.compile``.

    .venv/bin/python bench/opinfo_conformance.py [--dtypes float32,bfloat16,float16] [--samples 4]
                                                 [--ops add,sum] [--json out.json]

For each OpInfo of PyTorch's ``op_db`` that is a unary or binary ufunc or a reduction and supports
the dtype on the CPU, the first ``--samples`` samples are each wrapped in one small module class
defined once (:class:`OpSample`: the op and the sample's non-tensor arguments in a closure, the
tensors as inputs) and compiled with ``ascendc_pack.compile(..., topn=1)`` in this one process on
the default cache (``TORCHINDUCTOR_CACHE_DIR``, as a user's run would be). The result is compared
with eager by the project's accuracy rule (``ascendc_pack.frontend.check.compare_outputs``).

Each sample ends as one of: ``match``; ``wrong`` (ran, differs from eager); ``crash`` (the
compiled callable raised); ``refused`` (compile refused with a typed ascendc-pack error, e.g. an
op torch.export cannot capture); ``eager-fails`` (the sample raises in eager too) and ``random``
(two eager runs with different seeds disagree, or - for ops that seed themselves, as OpInfo's
``rrelu`` does - the captured graph draws random numbers: an ATen op tagged
``nondeterministic_seeded``; no single right answer), neither counted. An output that misses the tolerances gets the accuracy rule's second
look against a float64 run of the sample, as ``build``'s own check does.
The conformance rate is match / (match + wrong + crash): a clear refusal is not a wrong answer,
and refusals are listed separately. Needs ``expecttest`` (PyTorch's OpInfo database imports it).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ascendc_pack  # noqa: E402
from ascendc_pack.frontend.check import compare_outputs  # noqa: E402
from ascendc_pack.errors import PackError  # noqa: E402


class OpSample(torch.nn.Module):
    """One OpInfo sample as a model: tensors are inputs, everything else is fixed in a closure."""

    def __init__(self, op, template: list, kwargs: dict):
        super().__init__()
        self.call = lambda *xs: op(*_fill(template, xs), **kwargs)

    def forward(self, *xs):
        return self.call(*xs)


def _fill(template: list, tensors) -> list:
    it = iter(tensors)
    return [next(it) if a is _TENSOR else a for a in template]


_TENSOR = object()


def _ops():
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.opinfo.core import BinaryUfuncInfo, ReductionOpInfo, UnaryUfuncInfo

    return [op for op in op_db if isinstance(op, (UnaryUfuncInfo, BinaryUfuncInfo, ReductionOpInfo))]


def _sample_case(op, sample):
    """(module, tensor inputs), or None when a sample's kwargs hold tensors (not a plain graph)."""
    args = [sample.input, *sample.args]
    if any(isinstance(v, torch.Tensor) for v in sample.kwargs.values()):
        return None
    if any(isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a) for a in args):
        return None
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    template = [_TENSOR if isinstance(a, torch.Tensor) else a for a in args]
    return OpSample(op.op, template, dict(sample.kwargs)), tuple(t.detach().clone() for t in tensors)


def _float64(module, inputs):
    """The sample run in float64 (the accuracy rule's reference), or None where it cannot."""
    wide = [t.double() if t.is_floating_point() else t.clone() for t in inputs]
    try:
        with torch.no_grad():
            return module(*wide)
    except Exception:  # noqa: BLE001 - some ops have no float64 kernel
        return None


def _draws_random_numbers(module, inputs) -> bool:
    """Whether the captured graph calls an ATen op tagged ``nondeterministic_seeded``."""
    from ascendc_pack.frontend.capture import capture, random_ops

    try:
        return bool(random_ops(capture(module, tuple(t.clone() for t in inputs)).model.program))
    except Exception:  # noqa: BLE001
        return False


def run(dtypes: list[str], samples: int, only: set[str] | None) -> dict:
    logging.getLogger("ascendc_pack").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    results = {}
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        counts, failures = collections.Counter(), []
        t0 = time.perf_counter()
        for op in _ops():
            if only and op.name not in only:
                continue
            if dtype not in op.supported_dtypes("cpu"):
                continue
            torch.manual_seed(0)
            try:
                gen = list(op.sample_inputs("cpu", dtype, requires_grad=False))[:samples]
            except Exception:  # noqa: BLE001 - a sample generator that fails on this host
                continue
            for k, sample in enumerate(gen):
                case = _sample_case(op, sample)
                if case is None:
                    counts["skipped"] += 1
                    continue
                module, inputs = case
                label = f"{op.name}#{k}{op.variant_test_name and '.' + op.variant_test_name}"
                try:
                    with torch.no_grad():
                        torch.manual_seed(1)
                        expected = module(*[t.clone() for t in inputs])
                        torch.manual_seed(2)
                        again = module(*[t.clone() for t in inputs])
                except Exception:  # noqa: BLE001
                    counts["eager-fails"] += 1
                    continue
                if compare_outputs(expected, again, atol=0.0, rtol=0.0) is not None:
                    counts["random"] += 1
                    continue
                if not isinstance(expected, torch.Tensor) and not (
                        isinstance(expected, tuple) and all(isinstance(e, torch.Tensor) for e in expected)):
                    counts["skipped"] += 1
                    continue
                try:
                    compiled = ascendc_pack.compile(module, inputs, topn=1)
                except PackError as exc:
                    counts["refused"] += 1
                    failures.append((label, "refused", str(exc).splitlines()[0][:160]))
                    continue
                except Exception as exc:  # noqa: BLE001 - an untyped failure is a crash
                    counts["crash"] += 1
                    failures.append((label, "crash", f"compile: {type(exc).__name__}: {exc}"[:200]))
                    continue
                try:
                    actual = compiled(*[t.clone() for t in inputs])
                except Exception as exc:  # noqa: BLE001
                    counts["crash"] += 1
                    failures.append((label, "crash", f"call: {type(exc).__name__}: {exc}"[:200]))
                    continue
                actual = tuple(actual) if isinstance(expected, tuple) else actual
                problem = compare_outputs(expected, actual)
                if problem is not None and dtype != torch.float64:
                    problem = compare_outputs(expected, actual, reference64=_float64(module, inputs))
                if problem is None:
                    counts["match"] += 1
                elif _draws_random_numbers(module, inputs):
                    counts["random"] += 1
                else:
                    counts["wrong"] += 1
                    failures.append((label, "wrong", problem[:200]))
        judged = counts["match"] + counts["wrong"] + counts["crash"]
        results[dtype_name] = {"counts": dict(counts), "judged": judged,
                               "rate": counts["match"] / judged if judged else None,
                               "seconds": round(time.perf_counter() - t0, 1), "failures": failures}
        r = results[dtype_name]
        print(f"{dtype_name:>9}: {counts['match']}/{judged} match ({100 * (r['rate'] or 0):.2f} %), "
              f"refused {counts['refused']}, skipped {counts['skipped']}, eager fails {counts['eager-fails']}, "
              f"random {counts['random']}, "
              f"{r['seconds']} s", flush=True)
        for label, kind, why in failures:
            print(f"    {kind:<8} {label}: {why}", flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--ops", default="", help="comma-separated OpInfo names (default: all)")
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args()
    results = run(a.dtypes.split(","), a.samples, set(a.ops.split(",")) if a.ops else None)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
