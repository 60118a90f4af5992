"""Values for inputs the graph uses as sizes, axes, indices or divisors, read from how it uses them.

Why: random integers (0 and 1) fed to a Reshape's shape, a Slice's starts or an integer Div's
divisor make ONNX Runtime fail, and dmlopt then said only "ONNX Runtime failed to run the
model".  Where an input reaches such a place directly (or through Cast/Identity), it gets a value
that is valid there whatever the other sizes are:

  Reshape shape      0 per kept dim (copy the input's), -1 for the rest (rank from the graph)
  Expand shape, Tile repeats, ConstantOfShape shape, Resize sizes: 1s
  Resize/Upsample scales: 1.0    Slice starts 0, ends the dtype's max, steps 1, axes 0, 1, ...
  integer Div/Mod divisor: 1..3  Gather*/Scatter* indices: 0    TopK k, OneHot depth: 1

An integer input used elsewhere keeps dmlopt's random values, and its name is returned so that a
failure can say so (and name ``--inputs FILE.npz`` / ``inputs=``).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx_ir as ir

# (op, input index) -> role
ROLES = {("Reshape", 1): "reshape", ("Expand", 1): "ones", ("Tile", 1): "ones", ("ConstantOfShape", 0): "ones",
         ("Resize", 3): "ones", ("Resize", 2): "scales", ("Upsample", 1): "scales",
         ("Slice", 1): "zeros", ("Slice", 2): "max", ("Slice", 3): "range", ("Slice", 4): "ones",
         ("Div", 1): "divisor", ("Mod", 1): "divisor", ("Gather", 1): "zeros", ("GatherElements", 1): "zeros",
         ("GatherND", 1): "zeros", ("ScatterElements", 1): "zeros", ("ScatterND", 1): "zeros",
         ("TopK", 1): "ones", ("OneHot", 1): "ones"}
PASS_THROUGH = {"Cast", "Identity"}
WHAT = {"reshape": "a Reshape's shape", "ones": "a size or repeat count", "scales": "a Resize's scales",
        "zeros": "a start or index", "max": "a Slice's ends", "range": "a Slice's axes",
        "divisor": "an integer divisor"}


def role(value: ir.Value) -> tuple[str, ir.Node] | None:
    """What the graph uses `value` as (ROLES), and the node, following Cast/Identity; None if
    nothing (or more than one role) says."""
    found = set()
    todo, seen = [value], set()
    while todo:
        v = todo.pop()
        for node, index in v.uses():
            if id(node) in seen:
                continue
            seen.add(id(node))
            if node.op_type in PASS_THROUGH and node.domain in ("", "ai.onnx"):
                todo.extend(node.outputs)
            elif node.domain in ("", "ai.onnx") and (node.op_type, index) in ROLES:
                found.add((ROLES[(node.op_type, index)], node))
    roles = {r for r, _ in found}
    return next(iter(found)) if len(roles) == 1 else None


def meaningful(model: ir.Model, feeds: Mapping[str, np.ndarray], seed: int = 0
               ) -> tuple[dict[str, np.ndarray], list[str], list[str]]:
    """(values for the feeds whose role the graph shows, a note per input on where its values came
    from, the integer feeds left random)."""
    rng = np.random.default_rng(seed + 1)
    inputs = {v.name: v for v in model.graph.inputs}
    values, notes, random = {}, [], []
    for name, array in feeds.items():
        value = inputs.get(name)
        if value is None or array.dtype.kind not in "iuf":
            continue
        found = role(value)
        if found is None:
            if array.dtype.kind in "iu" and array.size:
                random.append(name)
            continue
        kind, node = found
        made = _values(kind, node, array, rng)
        if made is not None:
            values[name] = made
            notes.append(f"{name}: {_show(made)} ({WHAT[kind]}, from the graph)")
    return values, notes, random


def _values(kind: str, node: ir.Node, array: np.ndarray, rng: np.random.Generator) -> np.ndarray | None:
    dtype, shape, n = array.dtype, array.shape, array.size
    if kind == "scales":
        return np.ones(shape, dtype) if dtype.kind == "f" else None
    if dtype.kind not in "iu":
        return None
    if kind == "ones":
        return np.ones(shape, dtype)
    if kind == "zeros":
        return np.zeros(shape, dtype)
    if kind == "max":
        return np.full(shape, np.iinfo(dtype).max, dtype)
    if kind == "range":
        return np.arange(n, dtype=dtype).reshape(shape)
    if kind == "divisor":
        return rng.integers(1, 4, size=shape, dtype=dtype)
    return _reshape_target(node, array)


def _reshape_target(node: ir.Node, array: np.ndarray) -> np.ndarray | None:
    """A Reshape target valid for any sizes: 0 (copy) per dim kept, -1 for the rest."""
    if array.ndim != 1:
        return None
    data = node.inputs[0]
    rank = len(data.shape) if data is not None and data.shape is not None else None
    allowzero = node.attributes.get("allowzero")
    k = array.size
    if rank is None or (allowzero is not None and allowzero.as_int() == 1):
        target = [-1] + [1] * (k - 1)
    elif k <= rank:
        target = [0] * (k - 1) + [-1]
    else:
        target = [0] * rank + [1] * (k - rank)
    return np.array(target, array.dtype) if k else None


def _show(array: np.ndarray) -> str:
    flat = array.ravel()
    text = ",".join(str(x) for x in flat[:6]) + (",..." if flat.size > 6 else "")
    return f"[{text}]"
