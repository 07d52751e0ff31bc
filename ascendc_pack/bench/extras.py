"""The optional ``bench`` extra: which contender needs which package, and the message when one
is missing (the package and the install command, not a bare ``No module named ...``)."""

from __future__ import annotations

import importlib.util

from ascendc_pack.errors import PackError

INSTALL = "pip install 'ascendc-pack[bench]'"

#: packages a contender needs beyond torch (ONNX export goes through onnxscript)
NEEDS = {"ort": ("onnxruntime", "onnx", "onnxscript"), "ort_int8": ("onnxruntime", "onnx", "onnxscript"),
         "ov": ("openvino",), "ov_f32": ("openvino",)}
#: packages the chart of bench/run_all.py needs
CHART_NEEDS = ("matplotlib",)


class MissingExtraError(PackError):
    """A package of the ``bench`` extra is not installed."""


def missing(modules) -> list[str]:
    """The names in ``modules`` that cannot be imported here."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def require(contenders, labels: dict[str, str], all_ids) -> None:
    """Raise :class:`MissingExtraError` naming the missing packages of the chosen contenders,
    the install command and the ``--contenders`` subset that runs without them."""
    gaps = {cid: missing(NEEDS.get(cid, ())) for cid in contenders}
    gaps = {cid: m for cid, m in gaps.items() if m}
    if not gaps:
        return
    parts = [f"the {labels[cid]} contender needs {', '.join(f'`{m}`' for m in mods)}"
             for cid, mods in gaps.items()]
    rest = [c for c in all_ids if c not in gaps]
    raise MissingExtraError(f"{'; '.join(parts)}, not installed. Install the bench extra: {INSTALL} "
                            f"(or leave it out: --contenders {','.join(rest)})")


def require_chart() -> None:
    """Raise :class:`MissingExtraError` when the chart's packages are missing."""
    gaps = missing(CHART_NEEDS)
    if gaps:
        raise MissingExtraError(f"the chart needs {', '.join(f'`{m}`' for m in gaps)}, not installed. "
                                f"Install the bench extra: {INSTALL} (or pass --no-chart)")
