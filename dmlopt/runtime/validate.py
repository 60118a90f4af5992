"""Numerics check: the rewritten model against the original, on ORT's CPU EP.

Both models run with ORT's own graph rewrites off (so dmlopt's graph is what is
compared) on the same seeded random inputs, or the user's .npz.  Per output: max abs
error, max error relative to the output's magnitude, cosine similarity.  A float output
passes when ``max_abs <= atol + rtol * max|ref|``: scaled by the output's magnitude, so
deep ViTs' float noise is not flagged (onnxsim's fixed allclose is, peers.md) while a
wrong rewrite (relative error ~1) always is.

A float16 model is run as float16 hardware computes it (`with_float16_rounding`): ORT's
CPU EP has float16 kernels for few ops and runs the others in float32 between Casts it
inserts and then removes, so without this only the float16 constants would be checked,
never a rounded or overflowing intermediate value.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
from typing import Any, Mapping

import numpy as np
import onnx_ir as ir

from dmlopt.graph import input_sizes, input_values
from dmlopt.runtime import sessions as runtime
from dmlopt.errors import CELL_WIDTH, TEXT_WIDTH, InputError, UsageError, printable
from dmlopt.io.inputs_file import Archive, open_npz
from dmlopt.io.model import ModelLike, load
from dmlopt.graph.names import numbered_name
from dmlopt.graph.shape_inference import infer_shapes
from dmlopt.graph.shapes import check_shapes
from dmlopt.io.tables import format_table

# dtype name -> (atol, rtol): the error allowed, `rtol` relative to the reference's own scale
# (see `compare` for the rule; README "Validation rule" for the measurements behind the numbers).
# atol, an absolute error small enough to ignore, is 0: an absolute floor is what let an all-zeros
# output pass against a reference of magnitude 1e-5.
DEFAULT_TOLERANCES = {
    "float64": (0.0, 1e-6),
    "float32": (0.0, 1e-4),
    "float16": (0.0, 1e-2),
    "bfloat16": (0.0, 5e-2),
}
# The single worst element may be off this many times `rtol` of the reference's range (max - min):
# a float16 ViT's worst element is off ~30x its RMS error relative to the range's RMS, a wrong
# value (zeros, a sign, a permutation) ~100% of the range.
WORST_ELEMENT_FACTOR = 10.0
RULE = ("rel L2 = ||cand-ref|| / ||ref|| <= rtol (+ atol), and max abs <= atol + 10*rtol*range(ref), "
        "each + 1 ulp of the output's float type at its largest value; two values both below the smallest "
        "normal number of the more precise type are equal")


@dataclasses.dataclass
class OutputCheck:
    """One output's comparison.  `max_rel` is max abs over the reference's range (max - min;
    max |ref| when the reference is constant); `decided_by` names the rule that decided: for a
    failure the one broken, for a pass the one closest to its limit."""
    name: str
    dtype: str
    shape: list[int]
    max_abs: float
    max_rel: float
    cosine: float
    atol: float
    rtol: float
    passed: bool
    reason: str = ""
    rel_l2: float = 0.0
    range: float = 0.0
    decided_by: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Validation:
    outputs: list[OutputCheck]
    inputs: dict[str, list[int]]
    seed: int | None
    basis: list[str] = dataclasses.field(default_factory=list)
    # outputs the reference (the input model) computes without a single finite value on these
    # inputs: a failure there is the inputs', not a rewrite's
    reference_nonfinite: list[str] = dataclasses.field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "inputs": self.inputs, "input_basis": self.basis, "seed": self.seed,
                "reference_nonfinite": self.reference_nonfinite, "outputs": [o.to_dict() for o in self.outputs]}

    def to_table(self) -> str:
        verdict = "numerics: " + ("match" if self.passed else "DIFFER") + f" on {shapes_text(self.inputs, self.basis)}"
        return verdict + "\n" + output_rows([o.to_dict() for o in self.outputs])


def output_rows(outputs: list[Mapping[str, Any]]) -> str:
    """The per-output table (validation on the CPU EP, on the real DirectML EP, on WebGPU): its
    "result" is the row's own `passed`, the same value the verdict is made of."""
    rows = [("output", "dtype", "shape", "rel L2", "max abs", "max abs/range", "cosine", "rtol", "result")]
    for o in outputs:
        rows.append((o["name"], o["dtype"], "x".join(map(str, o["shape"])) or "scalar", _num(o.get("rel_l2")),
                     _num(o["max_abs"]), _num(o["max_rel"]), _num(o["cosine"], ".6f"), f"{o['rtol']:g}"
                     + (f" atol {o['atol']:g}" if o["atol"] else ""), result_text(o)))
    return format_table(rows)


def result_text(o: Mapping[str, Any]) -> str:
    """``ok (rel L2)``: the verdict and the rule that decided it."""
    why = o.get("decided_by") or ""
    if o["passed"]:
        return f"ok ({why})" if why else "ok"
    return f"FAIL {o.get('reason') or why}".strip()


def _num(value, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def shapes_text(inputs: Mapping[str, list[int]], basis: list[str] | None = None) -> str:
    """``image 1x3x64x64 (height,width=64 (spatial ...))``: the shapes a run used and why."""
    shown = ", ".join(f"{printable(name, CELL_WIDTH)} {'x'.join(map(str, s)) or 'scalar'}"
                      for name, s in inputs.items()) or "no inputs"
    # names come from the model: escaped and cut, like every printed name (errors.printable)
    return printable(shown + (f" ({'; '.join(basis)})" if basis else ""), TEXT_WIDTH)


def load_inputs(path: str | os.PathLike) -> Archive:
    """An --inputs .npz, sized and compared with the model by header before it is read
    (dmlopt.io.inputs_file)."""
    return open_npz(path)


def make_inputs(ref, cand, shapes=None, dims=None, inputs=None, seed: int = 0, *,
                basis: list[str] | None = None, unread: list[str] | None = None) -> dict[str, np.ndarray]:
    """Inputs both models accept: given ones, else seeded random ones of sizes that exercise the
    model (dmlopt.graph.input_sizes: the candidate's static dims first, so a shape-fixed output and its
    dynamic original run the same inputs).  `basis` gets where each chosen size came from.
    Inputs the graph uses as sizes, axes, indices or divisors get values valid there
    (dmlopt.graph.input_values; noted in `basis`); `unread` gets the integer inputs left random.

    Arrays of the file that are not inputs (an .npz that also holds reference outputs) are left out."""
    if isinstance(inputs, (str, os.PathLike)):
        inputs = load_inputs(inputs)
    names = [v.name for v in input_sizes.runtime_inputs(ref)]
    in_file = inputs.names if isinstance(inputs, Archive) else list(inputs or {})
    if isinstance(inputs, Archive):
        given = inputs.arrays(ref)  # headers compared with the inputs first; other members unread
    else:
        given = {k: np.asarray(v) for k, v in (inputs or {}).items() if k in names}
    if in_file and not given:
        outputs = {o.name for o in ref.graph.outputs}
        raise UsageError(f"inputs file holds none of the model's inputs ({', '.join(names)}): it names "
                         + ", ".join(f"{k}{' (an output)' if k in outputs else _close(k, names)}" for k in in_file))
    shapes = {**_fully_static(cand, names), **(shapes or {}), **{k: list(v.shape) for k, v in given.items()}}
    specs = runtime.input_specs(ref, shapes, dims, fixed=input_sizes.static_dims(cand), basis=basis)
    feeds = runtime.random_inputs({k: v for k, v in specs.items() if k not in given}, seed)
    chosen, notes, random = input_values.meaningful(ref, feeds, seed)
    feeds.update(chosen)
    if basis is not None:
        basis.extend(notes)
    if unread is not None:
        unread.extend(random)
    feeds.update(given)
    return feeds


def _fully_static(model, names) -> dict[str, list[int]]:
    """The inputs of `model` among `names` whose every dim is static, with their shapes."""
    return {v.name: [int(d) for d in v.shape.dims] for v in input_sizes.runtime_inputs(model)
            if v.name in names and _static(model, v.name) and all(d >= 0 for d in v.shape.dims)}


def _static(model, name: str) -> bool:
    for v in model.graph.inputs:
        if v.name == name:
            return v.shape is not None and all(isinstance(d, int) for d in v.shape.dims)
    return False


def _close(name: str, candidates) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def validate(ref: ModelLike, cand: ModelLike, *, shapes: Mapping[str, list[int]] | None = None,
             dims: Mapping[str, int] | None = None, inputs=None, atol: float | None = None,
             rtol: float | None = None, seed: int = 0, ep: str = "cpu",
             allow_nonfinite: bool = False, progress=None) -> Validation:
    """Run both models on the same inputs (CPU EP, ORT rewrites off) and compare every output
    (`compare`; `allow_nonfinite`: outputs with no finite value may pass, see there).  A model that
    computes in float16 is judged with float16's `rtol` (unless given), also where its outputs are
    float32 (--keep-io-types): float32 tolerances failed an fp16 model on the real DirectML EP.
    `ep`: the provider CAND runs on (REF stays on the CPU EP, the reference): a kernel of that EP
    that computes differently shows as a mismatch (WebGPU's MultiHeadAttention on lavapipe).
    `progress` (a step callback) gets the shapes, and why, before the models run."""
    tolerances(np.dtype(np.float32), atol, rtol)  # bad tolerances refused before any work
    ref_model, cand_model = load(ref), load(cand)
    _check_same_inputs(ref_model, cand_model)
    if rtol is None and (_has_float16(ref_model.graph) or _has_float16(cand_model.graph)):
        rtol = DEFAULT_TOLERANCES["float16"][1]  # computed in float16, whatever its outputs' type
    if shapes or dims:
        check_shapes(ref_model, shapes, dims)
    basis: list[str] = []
    unread: list[str] = []
    feeds = make_inputs(ref_model, cand_model, shapes, dims, inputs, seed, basis=basis, unread=unread)
    if progress:
        progress(f"validate on {shapes_text({k: list(v.shape) for k, v in feeds.items()}, basis)}")
    try:
        ref_out = run(ref_model, feeds)
        cand_out = run(cand_model, feeds, ep)
    except InputError as e:
        if unread and str(e).startswith("ONNX Runtime failed to run"):  # likely: values nothing in the graph explains
            names = ", ".join(f"'{printable(n, CELL_WIDTH)}'" for n in unread)
            raise InputError(f"{e} (the integer input(s) {names} got dmlopt's own random values 0/1: the graph does "
                             "not show what they hold; give real values with --inputs FILE.npz, or inputs= in "
                             "the API)") from e
        if not basis:
            raise
        used = shapes_text({k: list(v.shape) for k, v in feeds.items()}, basis)
        raise InputError(f"{e} (on the shapes dmlopt chose: {used}; give the model's real sizes with --shape or "
                         "--dim)") from e
    checks = [compare(name, ref_out[name], cand_out.get(name), atol, rtol, allow_nonfinite=allow_nonfinite)
              for name in ref_out]
    nonfinite = [name for name, value in ref_out.items() if _no_finite_value(value)]
    return Validation(checks, {k: list(v.shape) for k, v in feeds.items()}, None if inputs else seed, basis,
                      nonfinite)


def _no_finite_value(value) -> bool:
    """A float output with elements, none of them finite (all NaN or infinite)."""
    if isinstance(value, (list, tuple, dict)):
        return False
    value = np.asarray(value)
    return value.dtype.kind == "f" and value.size > 0 and not np.isfinite(value).any()


def _check_same_inputs(ref: ir.Model, cand: ir.Model) -> None:
    """CAND's inputs must be REF's (by name; REF may take more): else the names that differ, before
    ORT says only "missing from input feed"."""
    ref_names = [v.name for v in input_sizes.runtime_inputs(ref)]
    extra = [v.name for v in input_sizes.runtime_inputs(cand) if v.name not in ref_names]
    if extra:
        shown = ", ".join(f"'{printable(n, CELL_WIDTH)}'{_close(n, ref_names)}" for n in extra)
        raise UsageError(f"CAND takes inputs REF does not: {shown} (REF takes "
                         f"{', '.join(repr(printable(n, CELL_WIDTH)) for n in ref_names) or 'none'}); both "
                         "models must take the same inputs")


def run(model, feeds: Mapping[str, np.ndarray], target: str = "cpu") -> dict[str, np.ndarray]:
    if target == "cpu" and isinstance(model, ir.Model) and _has_float16(model.graph):
        model = with_float16_rounding(model)
    sess = runtime.session(model, target, optimize=False, share_weights=target == "cpu")
    names = [o.name for o in sess.get_outputs()]
    wanted = {i.name: i.type for i in sess.get_inputs()}
    try:
        values = sess.run(names, {k: as_input_type(v, wanted[k]) for k, v in feeds.items() if k in wanted})
    except Exception as e:  # noqa: BLE001
        raise InputError(f"ONNX Runtime failed to run the model: {runtime._first_line(e)}") from e
    # Copies: an output array may keep the session's memory arena (all its activations) alive,
    # and validation holds the reference outputs while the candidate runs.  (The session is freed
    # on return, before the next model's starts; ORT's arena without it, or growing by exactly what
    # is asked through env allocators, raises validation's peak instead of lowering it.)
    return {name: _copied(value) for name, value in zip(names, values)}


def _copied(value):
    """A copy of an output: a tensor, or a sequence's elements one by one (their shapes may differ)."""
    if isinstance(value, (list, tuple)):
        return [_copied(v) for v in value]
    if isinstance(value, dict):  # a map (ZipMap): compared as one object
        return dict(value)
    return np.array(value, copy=True)


HALF, FULL = ir.DataType.FLOAT16, ir.DataType.FLOAT


def _has_float16(graph: ir.Graph) -> bool:
    """Whether a float16 value is declared or made (a saved model may carry no intermediate types)."""
    if any(v.dtype == HALF for v in (*graph.inputs, *graph.initializers.values(),
                                     *(o for node in graph for o in node.outputs))):
        return True
    if any(v.const_value is not None and v.const_value.dtype == HALF for v in graph.initializers.values()):
        return True
    return any(_makes_float16(attr) for node in graph for attr in node.attributes.values())


def _makes_float16(attr) -> bool:
    if attr.type == ir.AttributeType.INT:
        return attr.name in ("to", "dtype", "output_dtype") and attr.value == HALF.value
    return attr.type == ir.AttributeType.TENSOR and attr.value is not None and attr.value.dtype == HALF


def with_float16_rounding(model: ir.Model) -> ir.Model:
    """A float32 copy of `model` that rounds every float16 value of its main graph where it is made.

    Each float16 node output becomes float32 followed by an explicit ``Cast(to=FLOAT16) ->
    Cast(to=FLOAT)``, which ORT keeps (it drops only the lossy Cast pairs it inserted itself);
    float16 constants become float32 holding the same values.  So each node computes in float32
    from float16-rounded inputs and its result is rounded, overflowing to inf, as in float16;
    inputs and outputs keep their float16 type and names."""
    model = model.clone()
    infer_shapes(model)  # every float16 value typed (a saved model keeps no value_info); best effort
    _type_contrib_outputs(model)
    taken = set()
    for graph in model.graphs():
        taken |= {v.name for v in (*graph.inputs, *graph.initializers.values(), *(o for n in graph for o in n.outputs))}
        taken |= {n.name for n in graph}
    fresh = functools.partial(numbered_name, taken)
    for graph in model.graphs():
        for value in graph.initializers.values():  # a loaded initializer may carry its type on the tensor only
            if value.const_value is not None and (value.dtype or value.const_value.dtype) == HALF:
                value.const_value = ir.tensor(value.const_value.numpy().astype(np.float32), name=value.name)
                value.type = ir.TensorType(FULL)
    _round_graph(model.graph, fresh)
    return model


def _round_graph(graph: ir.Graph, fresh) -> None:
    """`with_float16_rounding` for one graph, its subgraphs (If/Loop/Scan bodies) first: each keeps
    its float16 inputs and outputs, so a node with a body reads and makes float16 values as before,
    cast from and to the float32 around it (ORT's type inference refused a body left in float16)."""
    half_inputs = {node: [i for i, v in enumerate(node.inputs) if v is not None and v.dtype == HALF]
                   for node in graph if _bodies(node)}  # before the rounding makes them float32
    for value in list(graph.inputs):
        if value.dtype == HALF and value.name not in graph.initializers and len(graph):
            _insert_after(graph, value, None, [FULL], fresh)
    for node in list(graph):
        _to_float32_attributes(node)
        bodies = _bodies(node)
        if bodies:
            for sub in bodies:
                _round_graph(sub, fresh)
            for value in node.outputs:
                if value.dtype == HALF:
                    _keep_output_float16(graph, value, _insert_after(graph, value, node, [FULL], fresh), fresh)
            _half_inputs_after(graph, node, half_inputs[node], fresh)
            continue
        for value in node.outputs:
            if value.dtype == HALF:
                value.type = ir.TensorType(FULL)
                rounded = _insert_after(graph, value, node, [HALF, FULL], fresh)
                _keep_output_float16(graph, value, rounded, fresh)


def _bodies(node: ir.Node) -> list[ir.Graph]:
    return [g for a in node.attributes.values() if a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
            for g in (a.as_graphs() if a.type == ir.AttributeType.GRAPHS else [a.as_graph()])]


def _half_inputs_after(graph: ir.Graph, node: ir.Node, indices: list[int], fresh) -> None:
    """Give `node` its float16 inputs (at `indices`) again when the rounding made them float32."""
    for index in indices:
        value = node.inputs[index]
        if value is None or value.dtype != FULL:
            continue
        cast = ir.Node("", "Cast", [value], [ir.AttrInt64("to", HALF.value)], name=fresh(f"{value.name}__half"))
        out = cast.outputs[0]
        out.name, out.type, out.shape = fresh(f"{value.name}__h"), ir.TensorType(HALF), value.shape
        graph.insert_before(node, cast)
        node.replace_input_with(index, out)


# com.microsoft ops whose every output has input 0's element type (ORT's contrib schemas).
SAME_TYPE_CONTRIB = {"SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "MultiHeadAttention",
                     "FusedMatMul", "BiasGelu", "FastGelu", "Gelu", "QuickGelu", "BiasAdd", "GroupNorm",
                     "SimplifiedLayerNormalization", "RotaryEmbedding", "BiasSplitGelu"}


def _type_contrib_outputs(model: ir.Model, rounds: int = 8) -> None:
    """Type the outputs of com.microsoft nodes ONNX inference cannot (no schema there), and infer
    again from them: a saved float16 model with contrib ops (dmlopt's --fp16 SAM) otherwise kept
    float16 values after them untyped, so unrounded, and its rounding copy did not load
    ("MatMul bound to different types")."""
    for _ in range(rounds):
        typed = False
        for node in model.graph:
            if node.domain != "com.microsoft" or node.op_type not in SAME_TYPE_CONTRIB or not node.inputs:
                continue
            source = node.inputs[0].dtype if node.inputs[0] is not None else None
            for out in node.outputs:
                if out.name and out.dtype is None and source is not None:
                    out.type = ir.TensorType(source)
                    typed = True
        if not typed:
            return
        infer_shapes(model)


def _keep_output_float16(graph: ir.Graph, value: ir.Value, rounded: ir.Value, fresh) -> None:
    """A float16 graph output stays float16 under its name: the rounded value cast back."""
    for i, output in enumerate(list(graph.outputs)):
        if output is value:
            name = value.name
            value.name = fresh(f"{name}__float32")
            cast = ir.Node("", "Cast", [rounded], [ir.AttrInt64("to", HALF.value)], name=fresh(f"{name}__output"))
            cast.outputs[0].name, cast.outputs[0].type = name, ir.TensorType(HALF)
            cast.outputs[0].shape = value.shape
            graph.insert_after(rounded.producer(), cast)
            graph.outputs[i] = cast.outputs[0]


def _insert_after(graph: ir.Graph, value: ir.Value, producer: ir.Node | None,
                  chain: list[ir.DataType], fresh) -> ir.Value:
    """Route every node reading `value` through Casts to the types in `chain`; the last Cast's output."""
    uses = list(value.uses())
    current, anchor = value, producer
    base = value.name or "v"
    for n, dtype in enumerate(chain):
        cast = ir.Node("", "Cast", [current], [ir.AttrInt64("to", dtype.value)], name=fresh(f"{base}__rounded_{n}"))
        out = cast.outputs[0]
        out.name, out.type, out.shape = fresh(f"{base}__r{n}"), ir.TensorType(dtype), value.shape
        if anchor is not None:
            graph.insert_after(anchor, cast)
        else:
            graph.insert_before(graph.node(0), cast)
        current, anchor = cast.outputs[0], cast
    for node, index in uses:
        node.replace_input_with(index, current)
    return current


def _to_float32_attributes(node: ir.Node) -> None:
    """Cast(to=FLOAT16), ConstantOfShape/Constant with a float16 value, dtype=FLOAT16: float32."""
    for name, attr in list(node.attributes.items()):
        if not _makes_float16(attr):
            continue
        if attr.type == ir.AttributeType.INT:
            node.attributes[name] = ir.AttrInt64(name, FULL.value)
        else:
            node.attributes[name] = ir.AttrTensor(name, ir.tensor(attr.value.numpy().astype(np.float32)))


def as_input_type(value, ort_type: str) -> np.ndarray:
    """A float feed in the float type the session takes (a float16-interface model gets the
    float32 inputs rounded), anything else unchanged."""
    value = np.asarray(value)
    want = runtime.NUMPY_TYPES.get(ort_type)
    if want is not None and value.dtype != want and value.dtype.kind == "f" and np.dtype(want).kind == "f":
        return value.astype(want)
    return value


def tolerances(dtype: np.dtype, atol: float | None, rtol: float | None) -> tuple[float, float]:
    for name, value in (("atol", atol), ("rtol", rtol)):  # the API's values too (the CLI parses them)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise UsageError(f"{name}={value}: a tolerance must be a finite number >= 0")
    default = DEFAULT_TOLERANCES.get(np.dtype(dtype).name, (0.0, 0.0))
    return (default[0] if atol is None else atol, default[1] if rtol is None else rtol)


# Outputs are compared this many elements at a time: float64 copies of a whole output would
# take 8 bytes an element (a uint8 output 8 times its own size).
COMPARE_CHUNK = 1 << 20


def compare(name: str, ref, cand, atol=None, rtol=None, *, allow_nonfinite: bool = False) -> OutputCheck:
    """One output of the candidate against the reference's.

    Types and shapes first: a float output never passes against a bool or int one (float widths
    may differ: a float16 interface asked for with --fp16).  A comparison with nothing finite to
    compare (every value NaN or infinite in both) is not a pass: two different models agree
    there.  It passes only with `allow_nonfinite`, and only where both hold the same non-finite
    values in the same places.  Sequence outputs (lists) are compared element by element.

    Values are compared against the reference's own scale, so the rule holds for outputs of any
    magnitude (softmax probabilities, depth in 1e-3, logits in 1e3) and no wrong output passes:
    relative L2 error ``||cand - ref|| / ||ref|| <= rtol`` catches an output wrong on the whole
    (all zeros, a flipped sign, a permutation: ~1 and more), max abs ``<= 10 * rtol * range(ref)``
    one wrong region or element; each may add `atol` (an absolute error to ignore, default 0)
    and the max abs one unit in the last place of the output's float type at max |ref| (a float16
    output cannot be closer).  Defaults by the less precise of the two float types."""
    if isinstance(ref, (list, tuple)) or isinstance(cand, (list, tuple)):
        return _compare_sequence(name, ref, cand, atol, rtol, allow_nonfinite)
    ref = np.asarray(ref)
    cand_dtype = np.asarray(cand).dtype if cand is not None else ref.dtype
    a, r = tolerances(_less_precise(ref.dtype, cand_dtype), atol, rtol)

    def failed(reason: str, error: float = float("inf"), rule: str = "") -> OutputCheck:
        return OutputCheck(name, str(ref.dtype), list(ref.shape), error, error, 0.0, a, r, False, reason,
                           rel_l2=error, decided_by=rule or reason)

    if cand is None:
        return failed("output missing")
    cand = np.asarray(cand)
    if cand.dtype != ref.dtype and not (ref.dtype.kind == "f" and cand.dtype.kind == "f"):
        return failed(f"dtype {cand.dtype} != {ref.dtype}")
    if cand.shape != ref.shape:
        return failed(f"shape {list(cand.shape)} != {list(ref.shape)}")
    if ref.dtype.kind not in "biufc" or cand.dtype.kind not in "biufc":  # strings: equal or not
        if np.array_equal(ref, cand):
            return OutputCheck(name, str(ref.dtype), list(ref.shape), 0.0, 0.0, 1.0, a, r, True,
                               decided_by="equal")
        return failed("values differ")
    stats = _Stats()
    x_all, y_all = np.ravel(ref), np.ravel(cand)
    # Two values both below the smallest normal number of the more precise type are equal: hardware and
    # ORT's threads may flush such subnormals to zero (FTZ/DAZ), run to run (a Gemm with alpha 1e-45 gave 1
    # or 2 ulps there).  The more precise type's: a float16 output must still hold a float32 reference's 1e-5.
    flush = (float(np.finfo(np.result_type(ref.dtype, cand.dtype)).tiny)
             if ref.dtype.kind == "f" and cand.dtype.kind == "f" else 0.0)
    for start in range(0, x_all.size, COMPARE_CHUNK):
        x = x_all[start:start + COMPARE_CHUNK].astype(np.float64)
        y = y_all[start:start + COMPARE_CHUNK].astype(np.float64)
        nan_x = np.isnan(x)
        if not np.array_equal(nan_x, np.isnan(y)):
            return failed("NaNs differ", float("nan"))
        if flush:
            y = np.where((np.abs(x) < flush) & (np.abs(y) < flush), x, y)
        stats.add(x[~nan_x], y[~nan_x])
    if x_all.size and not stats.finite_pairs:  # every value NaN or infinite: nothing was compared
        if not allow_nonfinite:
            return failed("no finite values to compare (all NaN/inf; see --allow-nonfinite)", float("nan"))
        if stats.max_abs != 0.0:
            return failed("non-finite values differ", float("nan"))
    return _judge(name, ref, cand, stats, a, r)


class _Stats:
    """Sums over the compared elements, chunk by chunk: an infinity equal in both counts as no
    error and takes no part in the norms (nor in the range)."""

    def __init__(self) -> None:
        self.max_abs = self.peak = self.err2 = self.dot = self.xx = self.yy = 0.0
        self.low, self.high = math.inf, -math.inf
        self.finite_pairs = 0

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        self.finite_pairs += int(np.count_nonzero(np.isfinite(x) & np.isfinite(y)))
        same_inf = np.isinf(x) & (x == y)
        with np.errstate(invalid="ignore"):  # inf - inf where both are the same inf: masked to 0 here
            diff = np.where(same_inf, 0.0, np.abs(x - y))
        if diff.size:
            self.max_abs = max(self.max_abs, float(diff.max()))
        xv, yv = np.where(np.isinf(x), 0.0, x), np.where(np.isinf(y), 0.0, y)
        finite_x = x[np.isfinite(x)]
        if finite_x.size:
            self.low, self.high = min(self.low, float(finite_x.min())), max(self.high, float(finite_x.max()))
            self.peak = max(self.peak, float(np.abs(finite_x).max()))
        with np.errstate(invalid="ignore", over="ignore"):
            err = np.where(same_inf, 0.0, x - y)
        self.err2 += float(np.dot(err, err))
        self.dot += float(np.dot(xv, yv))
        self.xx += float(np.dot(xv, xv))
        self.yy += float(np.dot(yv, yv))


def _judge(name: str, ref: np.ndarray, cand: np.ndarray, s: _Stats, a: float, r: float) -> OutputCheck:
    """The rule of `compare`, on the sums; `decided_by`: the broken rule, else the nearest its limit."""
    n = max(ref.size, 1)
    scale = s.high - s.low if s.high > s.low else s.peak
    nx, ny, ne = math.sqrt(s.xx), math.sqrt(s.yy), math.sqrt(s.err2)
    rel_l2 = ne / nx if nx > 0 else (0.0 if ne == 0 else math.inf)
    max_rel = s.max_abs / scale if scale > 0 else (0.0 if s.max_abs == 0 else math.inf)
    cosine = max(-1.0, min(1.0, s.dot / (nx * ny))) if nx > 0 and ny > 0 else (1.0 if nx == ny else 0.0)
    ulp = float(np.spacing(np.array(s.peak, _less_precise(ref.dtype, cand.dtype)))) \
        if ref.dtype.kind == "f" and math.isfinite(s.peak) else 0.0
    # rms(error) <= atol + rtol * rms(ref) + 1 ulp: outputs in the subnormal range (a Gemm alpha of 1e-45)
    # have no relative precision left, every element off by one ulp is as close as the type can be
    l2_limit = (a + ulp) * math.sqrt(n) + r * nx
    max_limit = a + WORST_ELEMENT_FACTOR * r * scale + ulp
    used = {"rel L2": ne / l2_limit if l2_limit > 0 else (0.0 if ne == 0 else math.inf),
            "max abs/range": s.max_abs / max_limit if max_limit > 0 else (0.0 if s.max_abs == 0 else math.inf)}
    if not math.isfinite(s.max_abs) or not math.isfinite(ne):
        used["max abs/range"] = math.inf
    rule = max(used, key=lambda k: used[k])
    passed = used[rule] <= 1.0
    if ref.dtype.kind != "f" and a == 0 and r == 0:  # integers, booleans: equal or not
        rule = "exact"
    if passed:
        reason = ""
    elif rule == "rel L2":
        reason = f"rel L2 {rel_l2:.3g} > {r:g}" + (" (+atol)" if a else "")
    elif rule == "exact":
        reason = f"values differ (max abs {s.max_abs:.3g}; {ref.dtype} is compared exactly)"
    else:
        reason = f"max abs {s.max_abs:.3g} > {max_limit:.3g} ({WORST_ELEMENT_FACTOR:g}*rtol*range{'+atol' if a else ''})"
    return OutputCheck(name, str(ref.dtype), list(ref.shape), s.max_abs, max_rel, float(cosine), a, r, passed,
                       reason, rel_l2=rel_l2, range=scale, decided_by=rule)


def _less_precise(a: np.dtype, b: np.dtype) -> np.dtype:
    """The float type whose tolerances apply: a float16 output against a float32 reference is
    judged as float16 (it cannot be closer)."""
    if a.kind == "f" and b.kind == "f" and b.itemsize < a.itemsize:
        return b
    return a


def _compare_sequence(name: str, ref, cand, atol, rtol, allow_nonfinite: bool) -> OutputCheck:
    """A sequence output: same length, then each element as an output of its own (their shapes
    may differ from one element to the next); the worst element decides."""
    length = len(ref) if isinstance(ref, (list, tuple)) else 0
    a, r = atol if atol is not None else 0.0, rtol if rtol is not None else 0.0

    def failed(reason: str) -> OutputCheck:
        return OutputCheck(name, "sequence", [length], float("inf"), float("inf"), 0.0, a, r, False, reason,
                           rel_l2=float("inf"), decided_by=reason)

    if cand is None:
        return failed("output missing")
    if not isinstance(ref, (list, tuple)) or not isinstance(cand, (list, tuple)):
        return failed("a sequence against a tensor")
    if len(cand) != len(ref):
        return failed(f"sequence length {len(cand)} != {len(ref)}")
    checks = [compare(f"{name}[{i}]", x, y, atol, rtol, allow_nonfinite=allow_nonfinite)
              for i, (x, y) in enumerate(zip(ref, cand))]
    if not checks:
        return OutputCheck(name, "sequence", [0], 0.0, 0.0, 1.0, a, r, True, decided_by="equal")
    worst = next((c for c in checks if not c.passed), max(checks, key=lambda c: c.rel_l2))
    dtype = f"sequence({checks[0].dtype})"
    return OutputCheck(name, dtype, [length], max(c.max_abs for c in checks), max(c.max_rel for c in checks),
                       min(c.cosine for c in checks), worst.atol, worst.rtol, all(c.passed for c in checks),
                       "" if worst.passed else f"element {worst.name[len(name):]}: {worst.reason}",
                       rel_l2=max(c.rel_l2 for c in checks), range=max(c.range for c in checks),
                       decided_by=f"element {worst.name[len(name):]}: {worst.decided_by}")
