"""Static shapes from the user: parse ``--shape`` / ``--dim`` and check them against a model.

Why here and not in the CLI: the command (``--shape image:1,3,1024,1024``, ``--dim batch=1``)
and the API (``dmlopt.optimize(m, shapes={"image": [1, 3, 1024, 1024]}, dims={"batch": 1})``)
must accept and refuse the same things with the same one-line message, and the
freeze-shapes pass checks again so that a direct pass user gets it too.

Accepted spellings:
  ``NAME:D0,D1,...``    onnxsim / onnxslim (``image:1,3,1024,1024``); the name may itself
                        contain ``:`` (``input:0:1,3``), the last ``:`` separates.
  ``NAME:[D0,D1,...]``  Polygraphy; ``NAME:[]`` is a scalar.
  ``DIM_PARAM=VALUE``   a named dynamic axis (``batch=1``); it freezes every occurrence.  The
                        value holds no ``=``, so the last ``=`` separates: a dim named
                        ``seq=len`` is ``--dim seq=len=3``, as the refusals advise.

Refused (``UsageError``, exit 2, one line): malformed text, a value that is not a positive
integer (0 is accepted in a shape exactly where the model declares 0) or does not fit in int64, an input or dim name the model does not have, a shape of the
wrong rank, a value that contradicts a static dim, and two settings that give one named dim two values.
"""

from __future__ import annotations

import difflib
from typing import Mapping, Sequence

import onnx_ir as ir

from dmlopt.errors import UsageError

MAX_DIM = 2**63 - 1  # dims are int64 in ONNX


def parse_shape(text: str) -> dict[str, list[int]]:
    """``"image:1,3,64,64"`` or ``"image:[1,3,64,64]"`` -> ``{"image": [1, 3, 64, 64]}``."""
    where = f"--shape '{text}'"
    name, sep, dims_text = text.strip().rpartition(":")
    name, dims_text = name.strip(), dims_text.strip()
    if not sep or not name:
        raise UsageError(f"{where}: expected NAME:D0,D1,... (e.g. image:1,3,1024,1024)")
    if dims_text.startswith("[") != dims_text.endswith("]"):
        raise UsageError(f"{where}: unbalanced brackets; write NAME:[D0,D1,...] or NAME:D0,D1,...")
    bracketed = dims_text.startswith("[")
    if bracketed:
        dims_text = dims_text[1:-1].strip()
        if not dims_text:
            return {name: []}  # Polygraphy's spelling of a scalar
    if not dims_text:
        raise UsageError(f"{where}: no dimensions after ':' (a scalar is NAME:[])")
    return {name: [_positive(item, where, zero_ok=True) for item in dims_text.split(",")]}


def parse_dim(text: str) -> dict[str, int]:
    """``"batch=1"`` -> ``{"batch": 1}``; ``"seq=len=3"`` -> ``{"seq=len": 3}`` (a value holds no
    ``=``: the last one separates, so a dim name may hold one)."""
    where = f"--dim '{text}'"
    name, sep, value = text.strip().rpartition("=")
    name = name.strip()
    if not sep or not name:
        raise UsageError(f"{where}: expected DIM_PARAM=VALUE (e.g. batch=1)")
    return {name: _positive(value, where)}


def _positive(item: str, where: str, zero_ok: bool = False) -> int:
    """A dimension; `zero_ok`: 0 too (a shape may give 0 where the model declares 0: check_shapes)."""
    item = item.strip()
    if not item:
        raise UsageError(f"{where}: empty dimension (two commas in a row?)")
    try:
        value = int(item)
    except ValueError:
        raise UsageError(f"{where}: '{item}' is not an integer") from None
    if value < 0 or value == 0 and not zero_ok:
        raise UsageError(f"{where}: dimensions must be positive integers (got {value})")
    if value > MAX_DIM:
        raise UsageError(f"{where}: {value} is larger than an ONNX dimension can be (at most 2**63-1)")
    return value


def runtime_inputs(model: ir.Model) -> list[ir.Value]:
    """The graph inputs a caller feeds (not initializers listed as inputs, IR < 4)."""
    return [v for v in model.graph.inputs if v.name not in model.graph.initializers]


def free_dimensions(model: ir.Model) -> dict[str, list[str]]:
    """Dynamic axes of the inputs: dim name (``"?"`` if unnamed) -> ``["image[0]", ...]``."""
    found: dict[str, list[str]] = {}
    for value in runtime_inputs(model):
        if value.shape is None:
            found.setdefault("?", []).append(f"{value.name}[unknown rank]")
            continue
        for axis, dim in enumerate(value.shape.dims):
            if not isinstance(dim, int):
                found.setdefault(dim.value or "?", []).append(f"{value.name}[{axis}]")
    return found


def check_shapes(model: ir.Model, shapes: Mapping[str, Sequence[int]] | None,
                 dims: Mapping[str, int] | None) -> dict[str, int]:
    """Refuse settings that do not fit `model`; return every named dim's value.

    The result holds `dims` plus the names the frozen input positions carry: giving
    ``image`` the shape ``[1, 3, 64, 64]`` where its dim 0 is ``batch`` sets
    ``batch = 1`` wherever else it appears.
    """
    shapes, dims = dict(shapes or {}), dict(dims or {})
    inputs = {v.name: v for v in runtime_inputs(model)}
    values: dict[str, int] = {}
    origin: dict[str, str] = {}
    for name, value in dims.items():
        values[name] = _checked_value(value, f"dim '{name}'")
        origin[name] = f"--dim {name}={values[name]}"
    for name, given in shapes.items():
        if name not in inputs:
            hint = "an initializer, not an input" if name in model.graph.initializers else "not an input"
            raise UsageError(f"shape for '{name}': {hint} of the model{_suggest(name, inputs)} "
                             f"(inputs: {', '.join(inputs) or 'none'})")
        if isinstance(given, (str, bytes, Mapping)) or not hasattr(given, "__iter__"):
            raise UsageError(f"shape for input '{name}': expected a list of dimensions, got {given!r}")
        given = [_checked_value(d, f"shape for input '{name}'", zero_ok=True) for d in given]
        shape = inputs[name].shape
        for axis, value in enumerate(given):  # 0 is legal ONNX, given exactly where the model declares it
            dim = shape.dims[axis] if shape is not None and axis < len(shape) else None
            if value == 0 and dim != 0:
                raise UsageError(f"shape for input '{name}': dimensions must be positive integers (got 0) for dim "
                                 f"{axis}: 0 only where the model declares 0")
        if shape is None:
            continue
        if len(given) != len(shape):
            raise UsageError(f"shape for input '{name}': {len(given)} dimensions given, the input has rank "
                             f"{len(shape)} ({_show(shape)})")
        for axis, (dim, value) in enumerate(zip(shape.dims, given)):
            if isinstance(dim, int):
                if dim != value:
                    raise UsageError(f"shape for input '{name}': dim {axis} is fixed at {dim} in the model, "
                                     f"{value} given ({_show(shape)})")
            elif dim.value is not None:
                here = f"shape for input '{name}'"
                if dim.value in values and values[dim.value] != value:
                    raise UsageError(f"{here} sets dim '{dim.value}' to {value}, but {origin[dim.value]} "
                                     f"sets it to {values[dim.value]}")
                values[dim.value] = value
                origin.setdefault(dim.value, here)
    known = _dim_names(model)
    for name in dims:
        if name not in known:
            free = sorted(n for n in free_dimensions(model) if n != "?")
            raise UsageError(f"dim '{name}': no input has a dimension of that name{_suggest(name, free)} "
                             f"(named dimensions: {', '.join(free) or 'none'})")
    return values


def _checked_value(value, where: str, zero_ok: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) and not _is_integral(value):
        raise UsageError(f"{where}: {value!r} is not an integer")
    if int(value) < 0 or int(value) == 0 and not zero_ok:
        raise UsageError(f"{where}: dimensions must be positive integers (got {int(value)})")
    if int(value) > MAX_DIM:
        raise UsageError(f"{where}: {int(value)} is larger than an ONNX dimension can be (at most 2**63-1)")
    return int(value)


def _is_integral(value) -> bool:
    try:
        return int(value) == value and not isinstance(value, (str, bytes, float))
    except (TypeError, ValueError):
        return False


def _dim_names(model: ir.Model) -> set[str]:
    """Named dims of the main graph's inputs and outputs (what a user can see and name)."""
    names = set()
    for value in [*runtime_inputs(model), *model.graph.outputs]:
        if value.shape is not None:
            names.update(d.value for d in value.shape.dims if not isinstance(d, int) and d.value)
    return names


def _show(shape: ir.Shape) -> str:
    return "[" + ",".join(str(d) if isinstance(d, int) else (d.value or "?") for d in shape.dims) + "]"


def _suggest(name: str, candidates) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""
