"""Load a user's model.py (docs/DESIGN.md §2.1) into a module and its example/calibration inputs.

A model file defines ``get_model()`` (or a module attribute ``model``) returning an
``nn.Module`` and ``get_example_inputs()`` (or ``example_inputs``) returning a tuple of
tensors. It may define ``get_calibration_inputs()`` returning a list of input tuples with the
same shapes and dtypes; PGO runs every one of them. With ``get_dynamic_shapes()`` (torch.export's
``dynamic_shapes``, :mod:`ascendc_pack.frontend.dynamic`) the input sets may come at several
shapes inside the declared ranges, each a bucket (docs/DESIGN.md §2.10).
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ascendc_pack.errors import ModelFileError
from ascendc_pack.frontend.dynamic import DynamicShapeError, DynamicShapes, forward_input_names, parse_declaration

CONTRACT_HINT = (
    "a model file defines get_model() (or `model`) returning an nn.Module and "
    "get_example_inputs() (or `example_inputs`) returning a tuple of tensors"
)


@dataclass
class LoadedModel:
    """What a model file provides, checked against the contract."""

    name: str
    path: Path
    module: torch.nn.Module
    example_inputs: tuple[torch.Tensor, ...]
    calibration_inputs: list[tuple[torch.Tensor, ...]] = field(default_factory=list)
    output_names: list[str] | None = None
    dynamic: DynamicShapes | None = None   # get_dynamic_shapes(), checked (None: static shapes)

    @property
    def all_input_sets(self) -> list[tuple[torch.Tensor, ...]]:
        """The example inputs followed by every calibration input set."""
        return [self.example_inputs, *self.calibration_inputs]


def load_model_file(path: str | Path) -> LoadedModel:
    """Import ``path`` and return its model (in eval mode) and inputs.

    Raises:
        ModelFileError: with a message naming the file, the problem and the fix.
    """
    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"{path}: no such file. Pass the path of a model.py file; {CONTRACT_HINT}.")
    if path.is_dir():
        raise ModelFileError(f"{path}: is a directory. Pass the path of a model.py file inside it.")
    if path.suffix != ".py":
        raise ModelFileError(
            f"{path}: not a Python file (expected a .py suffix). Pass a model.py file; {CONTRACT_HINT}."
        )
    module = _import_file(path)
    name = path.stem
    model = _get(module, path, "get_model", "model", "model")
    if not isinstance(model, torch.nn.Module):
        raise ModelFileError(
            f"{path}: get_model()/model returned {type(model).__name__}, not a torch.nn.Module. "
            "Return the nn.Module instance itself (e.g. `return MyModel()`)."
        )
    model.eval()
    example = _check_inputs(path, _get(module, path, "get_example_inputs", "example_inputs", "example inputs"),
                            "get_example_inputs()/example_inputs")
    dynamic = None
    if hasattr(module, "get_dynamic_shapes"):
        spec = _call(path, module.get_dynamic_shapes, "get_dynamic_shapes")
        if spec is not None:
            try:
                dynamic = parse_declaration(spec, example, forward_input_names(model, len(example)),
                                            f"{path}: get_dynamic_shapes()")
            except DynamicShapeError as exc:
                raise ModelFileError(str(exc)) from None
    calibration: list[tuple[torch.Tensor, ...]] = []
    if hasattr(module, "get_calibration_inputs"):
        sets = _call(path, module.get_calibration_inputs, "get_calibration_inputs")
        if not isinstance(sets, (list, tuple)):
            raise ModelFileError(
                f"{path}: get_calibration_inputs() returned {type(sets).__name__}; return a list of "
                "input tuples, each like get_example_inputs()."
            )
        for i, inputs in enumerate(sets):
            what = f"get_calibration_inputs()[{i}]"
            checked = _check_inputs(path, inputs, what)
            if dynamic is None:
                _check_same_signature(path, example, checked, what)
            else:  # another bucket: same dtypes and static dims, dynamic dims inside their ranges
                try:
                    dynamic.sizes_of(checked, f"{path}: {what}")
                    dynamic.check_static_dims(example, checked, f"{path}: {what}")
                except DynamicShapeError as exc:
                    raise ModelFileError(str(exc)) from None
            calibration.append(checked)
    output_names = None
    if hasattr(module, "get_output_names"):
        output_names = _call(path, module.get_output_names, "get_output_names")
        if not isinstance(output_names, (list, tuple)) or not all(isinstance(n, str) for n in output_names):
            raise ModelFileError(f"{path}: get_output_names() returned {type(output_names).__name__}; return a "
                                 "list of strings, one name per output tensor, e.g. `return [\"logits\"]`.")
        output_names = list(output_names)
    return LoadedModel(name=name, path=path, module=model, example_inputs=example,
                       calibration_inputs=calibration, output_names=output_names, dynamic=dynamic)


def _import_file(path: Path):
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    mod_name = f"_ascendc_pack_model_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ModelFileError(f"{path}: cannot be imported as a Python module. Pass a model.py file.")
    module = importlib.util.module_from_spec(spec)
    # torch.export of torch.cond models needs the module registered (docs/DESIGN.md §8).
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(mod_name, None)
        raise ModelFileError(
            f"{path}: is not valid Python (line {exc.lineno}: {exc.msg}). Fix the syntax error; "
            f"{CONTRACT_HINT}."
        ) from exc
    except BaseException as exc:  # the user's code may raise anything, SystemExit included
        sys.modules.pop(mod_name, None)
        tb = _user_traceback(exc)
        raise ModelFileError(
            f"{path}: raised {type(exc).__name__} while importing. Fix the error in the model file; "
            f"its traceback:\n{tb}"
        ) from exc
    return module


def _call(path: Path, fn, what: str):
    try:
        return fn()
    except BaseException as exc:
        tb = _user_traceback(exc)
        raise ModelFileError(
            f"{path}: {what}() raised {type(exc).__name__}. Fix the error in the model file; "
            f"its traceback:\n{tb}"
        ) from exc


def _user_traceback(exc: BaseException) -> str:
    """The traceback without our loader's and importlib's frames: only the user's code."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if f.filename != __file__ and "importlib._bootstrap" not in f.filename and "<frozen" not in f.filename]
    return ("Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
            + "".join(traceback.format_exception_only(type(exc), exc)))


def _get(module, path: Path, fn_name: str, attr_name: str, what: str):
    fn = getattr(module, fn_name, None)
    if fn is not None:
        if not callable(fn):
            raise ModelFileError(f"{path}: {fn_name} is not callable. Define it as a function: def {fn_name}(): ...")
        return _call(path, fn, fn_name)
    if hasattr(module, attr_name):
        return getattr(module, attr_name)
    raise ModelFileError(
        f"{path}: defines neither {fn_name}() nor `{attr_name}`, so it has no {what}. "
        f"Add `def {fn_name}(): ...`; {CONTRACT_HINT}."
    )


def _check_inputs(path: Path, inputs, what: str) -> tuple[torch.Tensor, ...]:
    if isinstance(inputs, torch.Tensor):
        raise ModelFileError(
            f"{path}: {what} returned a single tensor; return a tuple of tensors, e.g. `return (x,)`."
        )
    if not isinstance(inputs, (tuple, list)):
        raise ModelFileError(
            f"{path}: {what} returned {type(inputs).__name__}; return a tuple of tensors, e.g. `return (x, y)`."
        )
    for i, t in enumerate(inputs):
        if not isinstance(t, torch.Tensor):
            raise ModelFileError(
                f"{path}: {what} element {i} is {type(t).__name__}, not a torch.Tensor. "
                "Every model input must be a tensor (wrap scalars with torch.tensor(...))."
            )
        if t.device.type != "cpu":
            raise ModelFileError(
                f"{path}: {what} element {i} is on device {t.device}; the cpu backend needs CPU tensors. "
                "Create the inputs without a device argument or call .cpu()."
            )
    return tuple(inputs)


def _check_same_signature(path: Path, example, other, what: str) -> None:
    if len(other) != len(example):
        raise ModelFileError(
            f"{path}: {what} has {len(other)} inputs but the example inputs have {len(example)}. "
            "Every calibration set must have the same inputs as get_example_inputs()."
        )
    for i, (a, b) in enumerate(zip(example, other)):
        if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
            raise ModelFileError(
                f"{path}: {what} input {i} is {_describe(b)} but example input {i} is {_describe(a)}. "
                "Shapes are static: calibration inputs must have the example inputs' shapes and dtypes (or "
                "declare the dims that vary with get_dynamic_shapes())."
            )


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"
