"""fp16: run the model in float16, keeping in float32 what needs it (``--fp16``).

DirectML's kernels take float16 nearly everywhere and half the bytes move; it is
DirectML's biggest win on most GPUs.  The numbers change (float16 rounding), so the
pipeline validates with float16 tolerances when this pass ran.

Rewrites (main graph):
  Op(x: f32, W: f32)           -> Op(Cast<f16>(x), W': f16)      W' converted once, in place
  Constant<value: f32>         -> Constant<value: f16>
  Cast(x, to=FLOAT)            -> Cast(x, to=FLOAT16)
  ConstantOfShape<value: f32>  -> ConstantOfShape<value: f16>
  Kept(h: f16)                 -> Kept(Cast<f32>(h))              at the edge of a float32 island
  output y: f16                -> Cast<f32>(y) named y             with keep_io_types (default)

Cases:
  1. Which tensors of a node turn float16 comes from the op's ONNX schema: each type
     variable bound to float32 that allows float16 *and reaches an output* is converted
     (Conv's T, MatMul's T, LayerNormalization's T).  Type variables that do not allow
     float16 stay float32 (LayerNormalization's Mean/InvStdDev ``U``; Range's ``T``: Range
     is then kept whole).  Inputs whose variable reaches no output (Resize's roi, Cast's
     and Shape's input) take either type; fixed-type inputs (Resize's scales) stay float32.
  2. Kept in float32, declined with the reason in the report:
     a. no float16 in the schema (Range);
     b. index math: float values computed only from Shape/Size and constants
        (``Cast(Shape) -> Div -> Floor -> Cast``); float16 holds integers exactly only to 2048;
     c. the output type is set by an attribute (RandomNormal's dtype, EyeLike, ...);
     d. control flow (If/Loop/Scan) with its bodies; outer values a body reads are cast
        back to float32 for it;
     e. ops outside the ONNX domain, except com.microsoft ops whose float tensors are all
        one type (MultiHeadAttention, Attention, FusedMatMul, the GELU family, BiasAdd) and
        the skip normalizations, whose mean/inv_std_var outputs stay float32 (their schema's U);
     f. op types named in ``--fp16-keep-ops``, nodes named in ``--fp16-keep-nodes`` (what
        dmlopt's fp16 repair sets when float16 fails validation: dmlopt/engine/fp16_repair.py).
  3. Initializers and Constants used only in float16 are converted in place (values beyond
     +-65504 are clipped to it, noted in the report); used in both, they get a float16 copy.
  4. Graph inputs and outputs stay float32 with ``keep_io_types`` (Cast at the boundary);
     without it they become float16 (inputs only where a float16 node reads them).
ORT's CPU EP runs float16 graphs (it inserts Casts around ops without a float16
kernel); validation rounds every float16 value where it is made (dmlopt.runtime.validate), since
those Casts would otherwise hide float16's rounding and overflow.  Every op of the bundled
models was checked.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnx_ir as ir

from dmlopt.graph.check import has_subgraphs
from dmlopt.passes._base import DmlPass, Option
from dmlopt.targets.webgpu import registry as webgpu_registry

HALF, FULL = ir.DataType.FLOAT16, ir.DataType.FLOAT
FP16_MAX = float(np.finfo(np.float16).max)
INDEX_SOURCES = frozenset({"Shape", "Size"})
# com.microsoft ops (no schema in onnx.defs) whose float tensors all share one type T.
CONTRIB_ALL_T = frozenset({"MultiHeadAttention", "Attention", "FusedMatMul", "Gelu", "FastGelu", "BiasGelu",
                           "QuickGelu", "BiasAdd"})
# com.microsoft ops with one float type T and float-only statistics (ORT's contrib schema: the
# outputs mean and inv_std_var are U = float): every float input and these outputs turn float16.
CONTRIB_T_OUTPUTS = {"SkipLayerNormalization": frozenset({0, 3}), "SkipSimplifiedLayerNormalization": frozenset({0, 3})}
TYPE_ATTRIBUTES = ("dtype", "output_dtype")
# Inputs whose *values* reach the output (the others only select, shape or index them);
# index math flows through these only.  Not listed: every input.
VALUE_INPUTS = {
    "Gather": (0,), "GatherElements": (0,), "GatherND": (0,), "Slice": (0,), "Reshape": (0,), "Expand": (0,),
    "Tile": (0,), "Pad": (0, 2), "Squeeze": (0,), "Unsqueeze": (0,), "Flatten": (0,), "Transpose": (0,),
    "Split": (0,), "Resize": (0,), "Where": (1, 2), "ScatterND": (0, 2), "ScatterElements": (0, 2),
    "OneHot": (2,), "ConstantOfShape": (), "ReduceMean": (0,), "ReduceSum": (0,), "ReduceMax": (0,),
    "ReduceMin": (0,), "ReduceProd": (0,),
}
UNKNOWN = "no float16 type information"
VARIADIC = onnx.defs.OpSchema.FormalParameterOption.Variadic


@dataclasses.dataclass
class NodePlan:
    """Which inputs must be float16, which take either, which outputs become float16."""

    half_inputs: set[int] = dataclasses.field(default_factory=set)
    flexible_inputs: list[list[int]] = dataclasses.field(default_factory=list)  # groups sharing a type variable
    half_outputs: set[int] = dataclasses.field(default_factory=set)

    @property
    def half(self) -> bool:
        return bool(self.half_inputs or self.half_outputs)


class Fp16Pass(DmlPass):
    """float32 -> float16 with float32 islands where float16 cannot hold the values."""

    name = "fp16"
    summary = "float32 -> float16 (float32 kept for index math and ops without float16); --fp16 turns it on"
    order = 90.0
    options = (
        Option("fp16", False, "convert the model to float16 (validated with float16 tolerances)", type=bool,
               tunable=True),
        Option("keep_io_types", True, "keep float32 graph inputs and outputs (Casts at the boundary)", type=bool),
        Option("fp16_keep_ops", "", "comma-separated op types to keep in float32, e.g. Pow,ReduceMean"),
        Option("fp16_keep_nodes", "", "comma-separated node names to keep in float32"),
        Option("fp16_target_keep", True, "keep in float32 the ops whose float16 kernels on the target lose "
                                         "accuracy (WebGPU: Gemm, MatMul, Conv, measured on an H100)", type=bool),
        # Read by the engine (dmlopt/engine/fp16_repair.py), not by the conversion: a pass cannot run ORT.
        Option("fp16_repair", True, "when float16 fails validation, keep in float32 the nodes that need it "
                                    "(overflow detection, then bisection) instead of refusing", type=bool),
        Option("fp16_repair_runs", 24, "at most this many validation runs for the fp16 repair", type=int),
    )

    def changes_interface_types(self) -> bool:
        return not self.option("keep_io_types")

    def enabled(self) -> bool:
        return bool(self.option("fp16"))

    needs_shapes = "onnx-strict"
    needs_fresh_names = True  # for its Casts and converted constants

    def skip(self, model: ir.Model, sites) -> bool:
        self.converted: list[str] = []  # names of the nodes that compute in float16 (the repair's candidates)
        return not self.enabled()

    def rewrite(self, model: ir.Model) -> bool:
        converter = _Converter(self, model)
        modified = converter.run()
        self.converted = [node.name for node, plan in converter.plans.items() if plan.half]
        unknown = sorted(converter.keep_nodes - {node.name for node in model.graph})
        if unknown:
            self.note(f"--fp16-keep-nodes: no node named {', '.join(unknown[:10])} in the main graph")
        if modified:
            self.rewrote("<graph>", f"{converter.half_nodes} nodes in float16, {converter.kept_nodes} kept in float32, "
                                    f"{converter.casts} Casts inserted, {converter.converted_constants} constants converted")
        return modified


class _Converter:
    """One conversion of a model's main graph (state shared by the steps of `run`)."""

    def __init__(self, owner: Fp16Pass, model: ir.Model):
        self.owner = owner
        self.model = model
        self.graph = model.graph
        self.keep_io = bool(owner.option("keep_io_types"))
        self.keep_ops = _names(owner.option("fp16_keep_ops"))
        ep = owner.context.target.ep
        self.target_keep = (frozenset(webgpu_registry.fp16_keep_float32(ep)) - self.keep_ops
                            if owner.option("fp16_target_keep") else frozenset())
        self.keep_nodes = _names(owner.option("fp16_keep_nodes"))
        self.plans: dict[ir.Node, NodePlan] = {}
        self.casts = 0
        self.converted_constants = 0
        self.half_nodes = 0
        self.kept_nodes = 0
        self._cache: dict[tuple[int, ir.DataType], ir.Value] = {}

    # -- planning ---------------------------------------------------------------------
    def run(self) -> bool:
        index = _index_values(self.graph)
        for node in self.graph:
            plan, reason = self._plan(node, index)
            if reason:
                self.kept_nodes += 1
                if reason.startswith(UNKNOWN):
                    self.owner.declined(node, reason)
                else:
                    self.owner.kept(node, reason)
            elif plan.half:
                self.half_nodes += 1
            self.plans[node] = plan
        if not self.half_nodes:
            return False
        new_type = self._output_types()
        self._retype_outputs(new_type)
        self._retype_sources()
        self._rewire_inputs()
        self._fix_outputs()
        return True

    def _plan(self, node: ir.Node, index: set[ir.Value]) -> tuple[NodePlan, str]:
        plan = NodePlan()
        if has_subgraphs(node):  # its float16 inputs stay float16: its bodies read them so (a float16 Scan)
            plan.half_inputs = {i for i, v in enumerate(node.inputs) if v is not None and v.dtype == HALF}
        floats = [v for v in (*node.inputs, *node.outputs) if v is not None and v.dtype == FULL]
        if not floats:
            return plan, ""  # nothing float32 here: nothing to convert or keep
        if node.op_type in self.keep_ops:
            return plan, f"{node.op_type} kept in float32 (--fp16-keep-ops)"
        if node.op_type in self.target_keep and node.domain in ("", "ai.onnx"):
            return plan, (f"{node.op_type} kept in float32: the {self.owner.context.target.ep} EP's float16 "
                          f"{node.op_type} loses accuracy (--no-fp16-target-keep converts it)")
        if node.name in self.keep_nodes:
            return plan, "kept in float32 (--fp16-keep-nodes)"
        if has_subgraphs(node):
            return plan, "control flow: the node and its bodies stay float32"
        if any(v is not None and not isinstance(v.type, ir.TensorType) for v in (*node.inputs, *node.outputs)):
            return plan, "sequence or optional values stay float32"
        float_outputs = [o for o in node.outputs if o.dtype == FULL]
        if float_outputs and all(o in index for o in float_outputs):
            return plan, "index math (computed from shapes): float16 holds integers exactly only up to 2048"
        if node.domain in ("", "ai.onnx"):
            if node.op_type == "Constant":
                return plan, ""  # a source: converted by its consumers (case 3)
            if node.op_type == "Cast":
                return self._plan_cast(node, plan)
            if node.op_type == "ConstantOfShape":
                if node.outputs[0].dtype == FULL:
                    plan.half_outputs.add(0)
                return plan, ""
            if any(name in node.attributes for name in TYPE_ATTRIBUTES):
                return plan, f"{node.op_type}'s output type is set by an attribute"
            return self._plan_by_schema(node, plan)
        if node.domain == "com.microsoft" and node.op_type in CONTRIB_ALL_T:
            plan.half_inputs = {i for i, v in enumerate(node.inputs) if v is not None and v.dtype == FULL}
            plan.half_outputs = {i for i, v in enumerate(node.outputs) if v.dtype == FULL}
            return plan, ""
        if node.domain == "com.microsoft" and node.op_type in CONTRIB_T_OUTPUTS:
            plan.half_inputs = {i for i, v in enumerate(node.inputs) if v is not None and v.dtype == FULL}
            plan.half_outputs = {i for i in CONTRIB_T_OUTPUTS[node.op_type]
                                 if i < len(node.outputs) and node.outputs[i].dtype == FULL}
            return plan, ""
        return plan, f"{UNKNOWN}: {node.domain}.{node.op_type} (kept in float32)"

    def _plan_cast(self, node: ir.Node, plan: NodePlan) -> tuple[NodePlan, str]:
        plan.flexible_inputs.append([0])
        to = node.attributes.get("to")
        if to is not None and to.value == FULL.value:
            plan.half_outputs.add(0)
        return plan, ""

    def _plan_by_schema(self, node: ir.Node, plan: NodePlan) -> tuple[NodePlan, str]:
        version = node.version or self.model.opset_imports.get(node.domain or "", None)
        try:
            schema = onnx.defs.get_schema(node.op_type, max_inclusive_version=version or 1_000,
                                          domain=node.domain if node.domain != "ai.onnx" else "")
        except onnx.defs.SchemaError:
            return plan, f"{UNKNOWN}: no ONNX schema of {node.op_type} for opset {version} (kept in float32)"
        allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
        ins = [(i, _formal(schema.inputs, i)) for i in range(len(node.inputs))]
        outs = [(i, _formal(schema.outputs, i)) for i in range(len(node.outputs))]
        bound_float = {f.type_str for (i, f), v in zip((*ins, *outs), (*node.inputs, *node.outputs))
                       if f is not None and v is not None and v.dtype == FULL}
        out_params = {f.type_str for _, f in outs if f is not None}
        no_half = []
        for param in sorted(bound_float):
            if param not in allowed:
                continue  # a fixed type such as tensor(float): stays float32
            if "tensor(float16)" not in allowed[param]:
                no_half.append(param)
                continue
            if param in out_params:
                plan.half_inputs |= {i for i, f in ins if f is not None and f.type_str == param
                                     and node.inputs[i] is not None}
                plan.half_outputs |= {i for i, f in outs if f is not None and f.type_str == param}
            else:
                plan.flexible_inputs.append([i for i, f in ins if f is not None and f.type_str == param
                                             and node.inputs[i] is not None])
        if not plan.half and no_half and any(p in out_params for p in no_half):
            return plan, f"{node.op_type} has no float16 form (type {', '.join(no_half)} of its schema)"
        return plan, ""

    def _output_types(self) -> dict[ir.Value, ir.DataType]:
        new_type = {}
        for node, plan in self.plans.items():
            for i in plan.half_outputs:
                if node.outputs[i].dtype == FULL:
                    new_type[node.outputs[i]] = HALF
        return new_type

    # -- rewriting ----------------------------------------------------------------------
    def _retype_outputs(self, new_type: dict[ir.Value, ir.DataType]) -> None:
        for node, plan in self.plans.items():
            if not plan.half:
                continue
            if node.op_type == "Cast" and 0 in plan.half_outputs and node.domain in ("", "ai.onnx"):
                node.attributes["to"] = ir.AttrInt64("to", HALF.value)
            if node.op_type == "ConstantOfShape" and 0 in plan.half_outputs:
                value = node.attributes.get("value")
                array = value.value.numpy() if value is not None else np.zeros((1,), np.float32)
                node.attributes["value"] = ir.AttrTensor("value", ir.tensor(self._to_half(array, node.name)))
        for value, dtype in new_type.items():
            _set_dtype(value, dtype)

    def _wants(self, node: ir.Node, index: int, value: ir.Value) -> ir.DataType | None:
        """The type input `index` of `node` needs, or None when either type is fine."""
        plan = self.plans.get(node)
        if plan is None:  # a node inside a subgraph body (case 2d)
            return FULL
        if index in plan.half_inputs:
            return HALF
        for group in plan.flexible_inputs:
            if index in group:
                members = [node.inputs[i] for i in group if node.inputs[i] is not None]
                if len({v.dtype for v in members}) == 1:
                    return None
                # Mixed (Equal(h, 1.0)): constants follow the float16 member, else all float32.
                return HALF if all(v.dtype == HALF or _is_constant(v) for v in members) else FULL
        return FULL

    def _retype_sources(self) -> None:
        """Initializers and Constants that only float16 nodes read become float16 (case 3)."""
        for value in list(self._sources()):
            if value.dtype != FULL or value.is_graph_output() or value.is_graph_input():
                continue
            uses = value.uses()
            wants = [self._wants(n, i, value) for n, i in uses]
            if uses and all(w in (HALF, None) for w in wants) and HALF in wants:
                self._convert_source(value)

    def _sources(self):
        yield from self.graph.initializers.values()
        for node in self.graph:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.outputs:
                yield node.outputs[0]

    def _convert_source(self, value: ir.Value) -> None:
        producer = value.producer()
        if producer is None:  # an initializer
            value.const_value = ir.tensor(self._to_half(value.const_value.numpy(), value.name), name=value.name)
        else:
            array = ir.convenience.get_const_tensor(value).numpy()
            for name in list(producer.attributes):
                del producer.attributes[name]
            producer.attributes["value"] = ir.AttrTensor("value", ir.tensor(self._to_half(array, value.name)))
        _set_dtype(value, HALF)
        self.converted_constants += 1

    def _rewire_inputs(self) -> None:
        for node in list(self.plans):
            for i, value in enumerate(node.inputs):
                if value is None or value.dtype not in (FULL, HALF):
                    continue
                want = self._wants(node, i, value)
                if want is not None and want != value.dtype:
                    node.replace_input_with(i, self._as(value, want))
        for value in _all_values(self.graph):  # reads from inside subgraph bodies (case 2d)
            producer = value.producer()
            if value.dtype != HALF or (producer is not None and producer.graph is not self.graph):
                continue  # a body's own value is the body's to convert: a Cast for it belongs in the body
            for node, i in value.uses():
                if node.graph is not self.graph:
                    node.replace_input_with(i, self._as(value, FULL))

    def _as(self, value: ir.Value, dtype: ir.DataType) -> ir.Value:
        """`value` in `dtype`: a converted constant copy, or a Cast right after its producer."""
        key = (id(value), dtype)
        if key in self._cache:
            return self._cache[key]
        name = self._fresh(f"{value.name}_{'fp16' if dtype == HALF else 'fp32'}")
        if _is_constant(value):
            array = (value.const_value or ir.convenience.get_const_tensor(value)).numpy()
            array = self._to_half(array, value.name) if dtype == HALF else array.astype(np.float32)
            out = ir.Value(name=name, shape=value.shape, type=ir.TensorType(dtype), const_value=ir.tensor(array, name=name))
            self.graph.register_initializer(out)
        else:
            cast = ir.Node("", "Cast", [value], [ir.AttrInt64("to", dtype.value)], name=self._fresh(f"{name}_cast"))
            out = cast.outputs[0]
            out.name = name
            out.shape = value.shape
            _set_dtype(out, dtype)
            producer = value.producer()
            if producer is not None and producer.graph is self.graph:
                self.graph.insert_after(producer, cast)
            elif len(self.graph):
                self.graph.insert_before(self.graph.node(0), cast)
            else:
                self.graph.append(cast)
            self.plans[cast] = NodePlan()
            self.casts += 1
        self._cache[key] = out
        return out

    def _fix_outputs(self) -> None:
        """Case 4: graph outputs back to float32 (keep_io_types), keeping their names."""
        for position, value in enumerate(list(self.graph.outputs)):
            if value.dtype != HALF or not self.keep_io:
                continue
            name = value.name
            value.name = self._fresh(f"{name}_fp16")
            cast = ir.Node("", "Cast", [value], [ir.AttrInt64("to", FULL.value)], name=self._fresh(f"{name}_cast"))
            out = cast.outputs[0]
            out.name = name
            out.shape = value.shape
            _set_dtype(out, FULL)
            self.graph.append(cast)
            self.graph.outputs[position] = out
            self.casts += 1
        if not self.keep_io:
            for value in self.graph.inputs:
                if value.dtype == FULL and (id(value), HALF) in self._cache:  # a float16 node reads it
                    self._retype_graph_input(value)

    def _retype_graph_input(self, value: ir.Value) -> None:
        """Without keep_io_types a float32 input becomes float16; its float32 readers get a Cast."""
        cast_of = self._cache.pop((id(value), HALF), None)
        _set_dtype(value, HALF)
        if cast_of is not None:  # the float16 Cast inserted for it is now redundant
            cast = cast_of.producer()
            cast_of.replace_all_uses_with(value)
            self.graph.remove(cast, safe=True)
            self.casts -= 1
        for node, i in value.uses():
            if self._wants(node, i, value) == FULL:
                node.replace_input_with(i, self._as(value, FULL))

    def _to_half(self, array: np.ndarray, name: str | None) -> np.ndarray:
        array = np.asarray(array)
        if array.size and np.isfinite(array).all() and np.abs(array).max() > FP16_MAX:
            self.owner.note(f"constant {name}: values beyond +-{FP16_MAX:g} clipped to the float16 range")
            array = np.clip(array, -FP16_MAX, FP16_MAX)
        return array.astype(np.float16)

    def _fresh(self, base: str) -> str:
        return self.owner.fresh(base)


def _names(option) -> set[str]:
    """A comma-separated string (the CLI) or a collection of names (the API: a name may hold a comma)."""
    if isinstance(option, str) or option is None:
        return {s.strip() for s in (option or "").split(",") if s.strip()}
    return {str(s) for s in option}


def _formal(params, i: int):
    if i < len(params):
        return params[i]
    if params and params[-1].option == VARIADIC:
        return params[-1]
    return None


def _set_dtype(value: ir.Value, dtype: ir.DataType) -> None:
    value.type = ir.TensorType(dtype)


def _all_values(graph: ir.Graph):
    yield from graph.inputs
    yield from graph.initializers.values()
    for node in ir.traversal.RecursiveGraphIterator(graph):
        yield from node.outputs


def _is_constant(value: ir.Value) -> bool:
    producer = value.producer()
    return (value.const_value is not None and not value.is_graph_input()) or (
        producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx"))


def _index_values(graph: ir.Graph) -> set[ir.Value]:
    """Values computed from Shape/Size and constants only (case 2b), in topological order.

    ``Gather(table, Range(Shape(x)))`` is not index math: its values come from the table."""
    index: set[ir.Value] = set()
    for node in graph:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type in INDEX_SOURCES:
            index.update(node.outputs)
            continue
        positions = VALUE_INPUTS.get(node.op_type, range(len(node.inputs)))
        values = [node.inputs[i] for i in positions if i < len(node.inputs) and node.inputs[i] is not None]
        live = [v for v in values if not _is_constant(v)]
        if live and all(v in index for v in live):
            index.update(node.outputs)
    return index
