"""Sizes for an input's dynamic dims that exercise the model, not 1.

Why: validating and timing at 1x1 proves nothing (a U-Net's skip connections broadcast, a
super-resolution CNN sees one pixel) or fails in ONNX Runtime with no hint (a 16x16 patch Conv).
Each free dim gets, in this order:

  1. the user's ``--shape`` / ``--dim``;
  2. the static size of the same input position in the other model of a comparison
     (validation, ``bench --compare``), so both run the same inputs;
  3. the export's example size: a metadata entry named like the dim (``height: 512``) or a
     number ending the dim's name (``height_512``);
  4. axis 0 of an input of rank >= 2 (the batch): 1, the usual deployment size;
  5. spatial dims (those reaching a Conv or pooling): the smallest multiple of the graph's total
     stride (the strides multiplied along each path, lcm over the paths) from 32 up that onnx's
     strict shape inference accepts, so patch embeddings meet their static position tables; at
     most MAX_AUTO_SPATIAL (1024) and within MEMORY_BUDGET of estimated activations (1 GiB: the
     peak of live values, each freed after its last reader), else refused, naming the size;
  6. any other dim: the one static size of the graph that strict shape inference accepts there
     (a Reshape's or a position table's), when a prime it refuses shows that the graph fixes it.

Whatever is left is refused (`FreeDims`) with the dims named and the ``--dim`` to give.
"""

from __future__ import annotations

import dataclasses
import fractions
import math
import re
import weakref
from typing import Mapping, Sequence

import onnx
import onnx_ir as ir

from dmlopt.errors import InputError
from dmlopt.graph.shape_inference import data_propagation_allowed, weightless_proto

# Spatial sizes start here (a multiple of the total stride at least this large).
SPATIAL_FLOOR = 32
# Sizes tried for spatial dims before giving up: the first multiples of the total stride, then
# multiples the graph's static sizes suggest, up to MAX_SPATIAL.
SMALL_MULTIPLES = 8
SPATIAL_TRIES = 40
MAX_SPATIAL = 4096
# dmlopt sizes image dims itself up to this (px) and this much estimated activation memory; a graph
# that needs more is refused with the size named, for --dim (a Segformer was validated at 2048x2048:
# 79 s and 8.6 GB, where 512x512 took 13 s and 284 MB).
MAX_AUTO_SPATIAL = 1024
MEMORY_BUDGET = 1 << 30
# Static sizes of the graph tried for another dim.
STATIC_TRIES = 24
# A size no graph fixes a dim to: accepted by strict inference, it shows the dim is free.
PROBE = 7919
STRIDED = {"Conv", "MaxPool", "AveragePool", "LpPool", "QLinearConv", "ConvInteger"}
UNSTRIDED = {"ConvTranspose"}
SPATIAL_OPS = STRIDED | UNSTRIDED | {"GlobalAveragePool", "GlobalMaxPool", "InstanceNormalization",
                                    "BatchNormalization", "Resize", "Upsample", "DepthToSpace", "SpaceToDepth"}
# Ops whose output keeps the layout of their first input (what an image passes through before a Conv).
LAYOUT_KEEPING = {"Add", "Sub", "Mul", "Div", "Cast", "Identity", "Pad", "Clip", "Relu", "LeakyRelu", "Sigmoid",
                  "Tanh", "Neg", "Abs", "Sqrt", "Pow", "Where", "Max", "Min", "Concat", "Dropout", "Erf", "Exp",
                  "Log", "HardSigmoid", "HardSwish", "Mish", "Softplus", "Elu", "Selu", "Gelu", "PRelu", "Floor",
                  "Round", "Ceil", "Reciprocal", "QuantizeLinear", "DequantizeLinear"}
EXAMPLE_IN_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*[_=-](\d+)$")


class FreeDims(InputError):
    """Dims that nothing sizes: the user must give them."""


@dataclasses.dataclass(frozen=True)
class Slot:
    """One dynamic position: input name, axis, and the dim's name (None when unnamed)."""

    input: str
    axis: int
    name: str | None

    def label(self) -> str:
        return f"{self.input}[{self.axis}]"


@dataclasses.dataclass
class Sizes:
    """Concrete shapes per input and, per sized dim, where its size came from."""

    shapes: dict[str, list[int]]
    basis: list[str]
    dims: dict[str, int] = dataclasses.field(default_factory=dict)  # the named dims' values

    def describe(self) -> str:
        shown = ", ".join(f"{name} {'x'.join(map(str, s)) or 'scalar'}" for name, s in self.shapes.items())
        return shown + (f" ({'; '.join(self.basis)})" if self.basis else "")


def runtime_inputs(model: ir.Model) -> list[ir.Value]:
    return [v for v in model.graph.inputs if v.name not in model.graph.initializers]


def static_dims(model: ir.Model) -> dict[tuple[str, int], int]:
    """(input, axis) -> size for every static dim of the inputs."""
    found = {}
    for v in runtime_inputs(model):
        for axis, d in enumerate(v.shape.dims if v.shape is not None else ()):
            if isinstance(d, int) and d >= 0:
                found[(v.name, axis)] = d
    return found


# Choices per model: validation, re-timing, bisection and tuning ask again for the same model.
_CHOSEN: "weakref.WeakKeyDictionary[ir.Model, dict[tuple, Sizes]]" = weakref.WeakKeyDictionary()


def choose(model: ir.Model, shapes: Mapping[str, Sequence[int]] | None = None,
           dims: Mapping[str, int] | None = None, *, fixed: Mapping[tuple[str, int], int] | None = None) -> Sizes:
    """Concrete shapes for `model`'s inputs (see the module's docstring); FreeDims when some dim is left.

    `fixed`: (input, axis) -> size from another model (a static dim there)."""
    key = (_frozen(shapes), _frozen(dims), _frozen(fixed), len(model.graph),
           tuple((v.name, str(v.shape)) for v in runtime_inputs(model)))
    cached = _CHOSEN.setdefault(model, {})
    if key not in cached:
        cached[key] = _choose(model, shapes, dims, fixed)
    sizes = cached[key]
    return Sizes({k: list(v) for k, v in sizes.shapes.items()}, list(sizes.basis), dict(sizes.dims))


def _frozen(mapping) -> tuple:
    return tuple(sorted((str(k), str(v)) for k, v in (mapping or {}).items()))


def _choose(model: ir.Model, shapes, dims, fixed) -> Sizes:
    shapes, dims, fixed = dict(shapes or {}), dict(dims or {}), dict(fixed or {})
    values: dict[str, int] = dict(dims)
    by_slot: dict[tuple[str, int], int] = {}
    basis: list[str] = []
    slots: list[Slot] = []
    ranks: dict[str, int] = {}
    for v in runtime_inputs(model):
        if v.name in shapes:
            given = [int(d) for d in shapes[v.name]]
            for axis, d in enumerate(v.shape.dims if v.shape is not None else ()):
                if not isinstance(d, int) and d.value and axis < len(given):
                    values.setdefault(d.value, given[axis])
            continue
        if v.shape is None:
            raise FreeDims(f"input '{v.name}' has no declared rank: give its shape with --shape {v.name}:D0,D1,...")
        ranks[v.name] = len(v.shape)
        for axis, d in enumerate(v.shape.dims):
            if not (isinstance(d, int) and d >= 0):
                slots.append(Slot(v.name, axis, None if isinstance(d, int) else d.value))
    pending = []
    for slot in slots:
        key = (slot.input, slot.axis)
        if slot.name is not None and slot.name in values:
            continue
        if key in fixed:
            by_slot[key] = fixed[key]
            if slot.name is not None:
                values[slot.name] = fixed[key]
            continue
        pending.append(slot)
    hints = _example_sizes(model)
    rest = []
    for slot in pending:
        if slot.name is not None and slot.name in values:
            continue
        if slot.name is not None and slot.name in hints:
            values[slot.name], why = hints[slot.name]
            basis.append(f"{slot.name}={values[slot.name]} from {why}")
        else:
            rest.append(slot)
    spatial = _spatial_slots(model)
    batch = [s for s in rest if s.axis == 0 and ranks.get(s.input, 0) >= 2 and (s.input, 0) not in spatial]
    for slot in batch:
        _assign(slot, 1, values, by_slot)
    if batch:
        basis.append(f"{_names(batch)}=1 (axis 0, the batch)")
    rest = [s for s in rest if s not in batch and not _known(s, values, by_slot)]
    oracle = _Oracle(model, shapes, values, by_slot)
    strided = [s for s in rest if (s.input, s.axis) in spatial]
    if strided:
        stride = total_stride(model)
        candidates = _spatial_candidates(model, stride)
        size = oracle.first_accepted(strided, candidates, budget=MEMORY_BUDGET)
        if size is None:
            size = candidates[0] if not oracle.informative and candidates else None
        if size is None:
            raise FreeDims(_refusal(model, strided, _why_none(candidates, stride, oracle.over_budget)))
        for slot in strided:
            _assign(slot, size, values, by_slot)
        basis.append(f"{_names(strided)}={size} (image dims: " + (
            f"the smallest multiple of the total stride {stride} from {SPATIAL_FLOOR} that fits the graph's static "
            "shapes" if oracle.informative else
            f"a multiple of the total stride {stride}, unchecked: onnx cannot infer this graph's shapes") + ")")
    rest = [s for s in rest if s not in strided and not _known(s, values, by_slot)]
    free = []
    for slot in rest:
        if _known(slot, values, by_slot):
            continue
        size = None
        if oracle.informative and oracle.first_accepted([slot], [PROBE]) is None:
            size = oracle.first_accepted([slot], _static_sizes(model, STATIC_TRIES))
        if size is None:
            free.append(slot)
            continue
        _assign(slot, size, values, by_slot)
        basis.append(f"{_names([slot])}={size} (fixed by the graph's static shapes)")
    if free:
        raise FreeDims(_refusal(model, free, "nothing in the model sizes them"))
    return Sizes(_shapes(model, shapes, values, by_slot), basis, values)


def _why_none(candidates: Sequence[int], stride: int, over_budget: Sequence[tuple[int, int]]) -> str:
    """Why no image size was chosen: none fits the graph, or those that fit are over the budget."""
    if over_budget:
        size, peak = over_budget[0]
        return (f"the smallest size that fits the graph, {size}, needs ~{_mib(peak)} of activations (estimated), "
                f"over the {_mib(MEMORY_BUDGET)} dmlopt allows a size it chooses itself")
    if not candidates:
        return (f"a multiple of the total stride {stride} up to {MAX_AUTO_SPATIAL} px, the largest image size "
                "dmlopt chooses itself, does not exist")
    return (f"none of the sizes tried ({', '.join(map(str, candidates))}: multiples of the total stride {stride} "
            f"up to {MAX_AUTO_SPATIAL} px) fits the graph's static shapes")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def _assign(slot: Slot, size: int, values: dict[str, int], by_slot: dict[tuple[str, int], int]) -> None:
    if slot.name is not None:
        values[slot.name] = size
    else:
        by_slot[(slot.input, slot.axis)] = size


def _known(slot: Slot, values, by_slot) -> bool:
    return (slot.name is not None and slot.name in values) or (slot.input, slot.axis) in by_slot


def _names(slots: Sequence[Slot]) -> str:
    return ",".join(dict.fromkeys(s.name or s.label() for s in slots))


def _shapes(model: ir.Model, shapes, values, by_slot) -> dict[str, list[int]]:
    out = {}
    for v in runtime_inputs(model):
        if v.name in shapes:
            out[v.name] = [int(d) for d in shapes[v.name]]
            continue
        shape = []
        for axis, d in enumerate(v.shape.dims if v.shape is not None else ()):
            if isinstance(d, int) and d >= 0:
                shape.append(d)
            elif (v.name, axis) in by_slot:
                shape.append(by_slot[(v.name, axis)])
            elif not isinstance(d, int) and d.value in values:
                shape.append(values[d.value])
            else:
                raise FreeDims(f"input '{v.name}' dim {axis} has no size")
        out[v.name] = shape
    return out


def _refusal(model: ir.Model, slots: Sequence[Slot], why: str) -> str:
    named = sorted({s.name for s in slots if s.name})
    unnamed = [s for s in slots if not s.name]
    parts = []
    if named:
        parts.append(", ".join(f"'{n}' ({', '.join(s.label() for s in slots if s.name == n)})" for n in named))
    if unnamed:
        parts.append(", ".join(f"unnamed {s.label()}" for s in unnamed))
    example = " ".join(f"--dim {n}=N" for n in named)
    for name in dict.fromkeys(s.input for s in unnamed):
        v = next(v for v in runtime_inputs(model) if v.name == name)
        dims_text = ",".join(str(d) if isinstance(d, int) and d >= 0 else "N" for d in v.shape.dims)
        example += f" --shape {name}:{dims_text}"
    return (f"cannot choose sizes for the dynamic dims {'; '.join(parts)}: {why}; give the sizes to validate "
            f"and time with {example.strip()}")


def _example_sizes(model: ir.Model) -> dict[str, tuple[int, str]]:
    """dim name -> (size, where it was found): metadata entries, then a number ending the name."""
    found: dict[str, tuple[int, str]] = {}
    names = {d.value for v in runtime_inputs(model) if v.shape is not None for d in v.shape.dims
             if not isinstance(d, int) and d.value}
    for key, text in (model.metadata_props or {}).items():
        if key in names and str(text).strip().isdigit() and int(text) >= 1:
            found[key] = (int(text), f"the model's metadata '{key}'")
    for name in names - set(found):
        m = EXAMPLE_IN_NAME.search(name)
        if m and 2 <= int(m.group(1)) <= 1 << 16:
            found[name] = (int(m.group(1)), "the dim's name")
    return found


def _spatial_slots(model: ir.Model) -> set[tuple[str, int]]:
    """(input, axis) of the input dims that reach a Conv/pooling's spatial axes (2 and up) through
    layout-keeping ops and Transposes (an NHWC image transposed to NCHW: its H and W)."""
    found = set()
    for v in runtime_inputs(model):
        if v.shape is None or len(v.shape) < 3:
            continue
        seen: set[int] = set()
        todo = [(v, list(range(len(v.shape))))]  # a value and where each input axis is in it
        while todo:
            value, where = todo.pop()
            for node, _ in value.uses():
                if id(node) in seen or node.domain not in ("", "ai.onnx"):
                    continue
                seen.add(id(node))
                if node.op_type in SPATIAL_OPS:
                    found.update((v.name, axis) for axis, at in enumerate(where) if at >= 2)
                elif node.op_type == "Transpose":
                    perm = node.attributes.get("perm")
                    order = perm.as_ints() if perm is not None else list(range(len(where)))[::-1]
                    if sorted(order) == list(range(len(where))):
                        todo.append((node.outputs[0], [order.index(at) for at in where]))
                elif node.op_type in LAYOUT_KEEPING:
                    todo.extend((o, where) for o in node.outputs)
    return found


def total_stride(model: ir.Model) -> int:
    """The divisibility the graph's downsampling asks of a spatial dim: the stride a value has
    accumulated along its path (Conv/pool strides, SpaceToDepth multiply it; ConvTranspose,
    DepthToSpace, Resize divide it back) where a strided op reads it, lcm over those ops.

    A node's value follows its first input that carries one (a data input, not a weight): an
    attention output is at its queries' stride, not at the reduced keys' (a Segformer's
    spatial-reduction Convs made every later stage look 8x coarser: total stride 2048, not 32)."""
    scale: dict[int, fractions.Fraction] = {}
    need = 1
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        into = next((scale[id(i)] for i in node.inputs if i is not None and id(i) in scale), fractions.Fraction(1))
        out = into
        if node.op_type in STRIDED:
            strides = node.attributes.get("strides")
            step = max(strides.as_ints()) if strides is not None and strides.as_ints() else 1
            if node.op_type in ("MaxPool", "AveragePool", "LpPool") and strides is None:
                step = 1
            out = into * step
            need = _lcm_with(need, out)
        elif node.op_type == "SpaceToDepth":
            block = node.attributes.get("blocksize")
            out = into * (block.as_int() if block is not None else 1)
            need = _lcm_with(need, out)
        elif node.op_type == "ConvTranspose":
            strides = node.attributes.get("strides")
            out = into / (max(strides.as_ints()) if strides is not None and strides.as_ints() else 1)
        elif node.op_type == "DepthToSpace":
            block = node.attributes.get("blocksize")
            out = into / (block.as_int() if block is not None else 1)
        elif node.op_type in ("Resize", "Upsample"):
            out = into / 2
        for o in node.outputs:
            scale[id(o)] = out
    return need


def _lcm_with(need: int, stride: fractions.Fraction) -> int:
    """`need` and a path's stride (a fraction after an upsampling: 14/4 needs 7 of the input)."""
    return math.lcm(need, max(1, stride.numerator)) if stride >= 1 else need


def _spatial_candidates(model: ir.Model, stride: int) -> list[int]:
    """Multiples of `stride`, smallest first: the first few from SPATIAL_FLOOR up, then those the
    graph's static sizes suggest (a position table of 64x64 or of 196 = 14*14 rows behind a stride
    of 16: 1024, 224), SPATIAL_TRIES in all."""
    start = stride * max(1, -(-SPATIAL_FLOOR // stride))
    found = [start + k * stride for k in range(SMALL_MULTIPLES)]
    for s in _static_sizes(model, limit=None):
        root = math.isqrt(s)
        for size in (s, s * stride, root * stride if root * root == s else 0):
            if size >= SPATIAL_FLOOR and size % stride == 0 and size <= MAX_SPATIAL:
                found.append(size)
    return [size for size in sorted(set(found)) if size <= MAX_AUTO_SPATIAL][:SPATIAL_TRIES]


def _static_sizes(model: ir.Model, limit: int | None = None) -> list[int]:
    """Sizes > 1 that the graph holds statically (initializer dims, small int constants), largest first."""
    sizes: set[int] = set()
    for v in model.graph.initializers.values():
        t = v.const_value
        if t is None:
            continue
        sizes.update(d for d in t.shape.numpy() if d > 1)
        if t.dtype in (ir.DataType.INT64, ir.DataType.INT32) and t.size <= 8:
            sizes.update(int(x) for x in t.numpy().ravel() if 1 < int(x) <= 1 << 20)
    return sorted(sizes, reverse=True)[:limit]


class _Oracle:
    """onnx's strict shape inference on the graph with concrete input shapes: does a size fit?"""

    def __init__(self, model: ir.Model, shapes, values, by_slot):
        self.model, self.shapes, self.values, self.by_slot = model, shapes, values, by_slot
        self._proto = None
        self._informative = None
        self._data_prop: bool | None = None
        self.over_budget: list[tuple[int, int]] = []  # (size, estimated peak bytes) refused for memory

    @property
    def informative(self) -> bool:
        """Whether strict inference accepts the graph with its dims symbolic (else it tells nothing)."""
        if self._informative is None:
            self._informative = self._check(self._base()) is None
        return self._informative

    def _base(self) -> onnx.ModelProto:
        if self._proto is None:
            self._proto = weightless_proto(self.model)
            del self._proto.graph.value_info[:]
        return self._proto

    def _check(self, proto: onnx.ModelProto) -> str | None:
        self.inferred = None
        try:
            # data propagation only within its budget: a tiny model must not take gigabytes here either
            if self._data_prop is None:
                self._data_prop = data_propagation_allowed(self.model)
            self.inferred = onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True,
                                                              data_prop=self._data_prop)
        except Exception as e:  # noqa: BLE001 - onnx raises several types
            return str(e) or type(e).__name__
        return None

    def first_accepted(self, slots: Sequence[Slot], sizes: Sequence[int], budget: int | None = None) -> int | None:
        """The first of `sizes` that, given to every slot in `slots` (other unsized dims left as
        they are), strict inference accepts (and, with `budget`, whose estimated activation peak
        fits it: `activation_peak`; those that do not are kept in `over_budget`)."""
        if not self.informative:
            return None
        proto = self._base()
        inputs = {i.name: i for i in proto.graph.input}
        saved = {name: onnx.TensorShapeProto() for name in inputs}
        for name, i in inputs.items():
            saved[name].CopyFrom(i.type.tensor_type.shape)
        try:
            for size in sizes:
                self._apply(inputs, slots, size)
                if self._check(proto) is None:
                    peak = activation_peak(self.inferred, [v.name for v in runtime_inputs(self.model)]) \
                        if budget is not None else 0
                    if peak <= (budget or 0):
                        return size
                    self.over_budget.append((size, peak))
            return None
        finally:
            for name, i in inputs.items():
                i.type.tensor_type.shape.CopyFrom(saved[name])

    def _apply(self, inputs, slots, size) -> None:
        chosen = {(s.input, s.axis) for s in slots}
        names = {s.name for s in slots if s.name}
        for v in runtime_inputs(self.model):
            if v.name not in inputs or not inputs[v.name].type.HasField("tensor_type"):
                continue
            shape = inputs[v.name].type.tensor_type.shape
            given = self.shapes.get(v.name)
            for axis, dim in enumerate(shape.dim):
                value = None
                if given is not None and axis < len(given):
                    value = int(given[axis])
                elif (v.name, axis) in chosen or (dim.dim_param and dim.dim_param in names):
                    value = size
                elif (v.name, axis) in self.by_slot:
                    value = self.by_slot[(v.name, axis)]
                elif dim.dim_param and dim.dim_param in self.values:
                    value = self.values[dim.dim_param]
                if value is not None:
                    dim.Clear()
                    dim.dim_value = value


def activation_peak(proto: onnx.ModelProto, inputs: Sequence[str]) -> int:
    """Bytes of the values live at once, at most, running the main graph's nodes in order (the
    runtime `inputs` and each node's outputs added, a value freed after its last reader; weights
    not counted): an estimate of ORT's activation peak, from the shapes onnx inferred (a value of
    unknown size counts 0)."""
    graph = proto.graph
    sizes = {}
    for info in (*graph.input, *graph.value_info, *graph.output):
        t = info.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        if t.elem_type and None not in dims:
            sizes[info.name] = math.prod(dims) * onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).itemsize
    last = {name: index for index, node in enumerate(graph.node) for name in node.input}
    kept = {o.name for o in graph.output}
    counted = set(inputs)
    live = peak = sum(sizes.get(name, 0) for name in counted)
    for index, node in enumerate(graph.node):
        made = [o for o in node.output if o]
        counted.update(made)
        live += sum(sizes.get(o, 0) for o in made)
        peak = max(peak, live)
        for name in set(node.input):
            if name in counted and last.get(name) == index and name not in kept:
                live -= sizes.get(name, 0)
    return peak
