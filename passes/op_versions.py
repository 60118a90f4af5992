"""op-versions: ops at an ONNX version DirectML does not register -> a registered version or an exact equivalent.

ORT looks kernels up by the node's ONNX since-version; DirectML's table stops at older versions of
some ops (it is in maintenance mode, the gaps stay), so such a node runs on the CPU with a copy each
way.  The placement data (``dmlopt/data/dml_ort_<version>.json``) says which versions are registered.
  1. GroupNormalization(x, s, b) -> Add(Mul(Reshape(InstanceNormalization(Reshape(x, [0, G, -1]),
     1, 0), [0, C, ...]), s'), b')    DirectML registers no ONNX GroupNormalization (18 or 21), nor
     does the CPU EP: ORT expands its function body, whose Reshapes take shapes computed by
     Shape/Concat at run time (CPU shape math, no compiled graph).  DirectML registers
     InstanceNormalization-6; a group's statistics are those of one row of the [N, G, C/G*H*W] view,
     and the Reshapes here take constant shapes.
     s', b' are the per-channel scale and bias as [C, 1, ...] (GroupNormalization-18 has per-group
     ones, repeated C/G times).
  2. GridSample-20/22(x, grid) -> GridSample-16 with mode linear/cubic spelled bilinear/bicubic, by
     lowering the model's ai.onnx opset to 19.  A model has one opset per domain, so a single node
     cannot be written at version 16: the whole model moves to 19, which is exact only when every
     other node keeps its meaning there (the same since-version, or a newer one that only added
     types the node does not use: same inputs, outputs and attributes with their defaults).

For WebGPU (``dmlopt.targets.webgpu.registry``): it has no GroupNormalization kernel either (ORT inlines
it, two of its shape nodes on the CPU; the form of 1 runs wholly on WebGPU, measured) and registers
GridSample for opsets 16-19 only, so both rewrites apply there too.

Declined, with the reason: a GroupNormalization whose channel or spatial sizes are not static, whose
C is not a multiple of G, of float16 (stash_type computes in float32, InstanceNormalization in the
kernel's precision), or -18 with a computed scale/bias; a GridSample that is not 4-D (16 is 4-D
only), an ORT whose DirectML has no GridSample (1.14), or a model where another op would change at
opset 19 (e.g. DequantizeLinear-21's block_size, Gelu-20, which does not exist at 19) or that has
model-local functions importing ai.onnx.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

from dmlopt.targets.dml import placement
from dmlopt.targets.webgpu import registry as webgpu_registry
from dmlopt.passes._base import DmlPass, SiteRule, apply_rules
from dmlopt.passes._shared import all_nodes, show_shape

GRID_SAMPLE_MODES_16 = {"linear": "bilinear", "nearest": "nearest", "cubic": "bicubic"}


def _onnx_opset(model: ir.Model) -> int | None:
    return model.opset_imports.get("", model.opset_imports.get("ai.onnx"))


def _since(op_type: str, opset: int) -> int | None:
    """The since-version of the ONNX `op_type` at `opset`, None when it does not exist there."""
    try:
        return onnx.defs.get_schema(op_type, opset, "").since_version
    except onnx.defs.SchemaError:
        return None


# ** 1. GroupNormalization -> InstanceNormalization **

class GroupNormToInstanceNorm(SiteRule):
    """``GroupNormalization(x, s, b)`` -> Reshape, InstanceNormalization, Reshape, Mul, Add."""

    def __init__(self, owner: DmlPass, opset: int, data: placement.DmlData | None):
        """`data` None: for WebGPU, which has no GroupNormalization kernel (registry.NO_KERNEL)."""
        super().__init__(owner, "GroupNormToInstanceNorm")
        self.version = _since("GroupNormalization", opset)
        self.data = data

    def pattern(self, op, x, scale, bias):
        return op.GroupNormalization(x, scale, bias, _allow_other_attributes=True, _outputs=["y"])

    def check(self, context, x, scale, bias, y, **_):
        node = y.producer()
        reason = self._reason(node, x, scale, bias)
        return self.decline(node, reason) if reason else True

    def _reason(self, node: ir.Node, x: ir.Value, scale: ir.Value, bias: ir.Value) -> str | None:
        if self.data is not None and self.data.has_op("", "GroupNormalization", self.version):
            return f"DirectML registers GroupNormalization-{self.version} in ORT {self.data.version}"
        if x.dtype != ir.DataType.FLOAT:
            return (f"GroupNormalization on {x.dtype}: only float32 is rewritten (float16 statistics are computed "
                    "in float32 by GroupNormalization, in the kernel's precision by InstanceNormalization)")
        if x.shape is None or len(x.shape) < 3 or not all(isinstance(d, int) for d in x.shape.dims[1:]):
            return f"input shape {show_shape(x.shape)}: needs rank >= 3 and static channel and spatial sizes"
        channels, groups = x.shape.dims[1], node.attributes.get_int("num_groups", 0)
        if groups <= 0 or channels % groups:
            return f"{channels} channels are not a multiple of num_groups={groups}"
        if self.version is not None and self.version < 21:
            for name, value in (("scale", scale), ("bias", bias)):
                if value.const_value is None:
                    return f"GroupNormalization-{self.version} with a computed {name} (per-group values)"
                if value.const_value.numpy().size != groups:
                    return f"{name} has {value.const_value.numpy().size} values for {groups} groups"
        return None

    def rewrite(self, op, x, scale, bias, y, **_):
        node = y.producer()
        dims = list(x.shape.dims)
        channels, groups = dims[1], node.attributes.get_int("num_groups")
        epsilon = node.attributes.get_float("epsilon", 1e-5)
        per_channel = [channels] + [1] * (len(dims) - 2)
        grouped = op.Reshape(x, op.Constant(value=ir.tensor(np.array([0, groups, -1], dtype=np.int64))))
        normalized = op.InstanceNormalization(
            grouped, op.Constant(value=ir.tensor(np.ones(groups, dtype=np.float32))),
            op.Constant(value=ir.tensor(np.zeros(groups, dtype=np.float32))), epsilon=epsilon)
        restored = op.Reshape(normalized, op.Constant(value=ir.tensor(np.array([0, *dims[1:]], dtype=np.int64))))
        if self.version is not None and self.version < 21:  # per-group scale/bias: repeat over the group's channels
            s = op.Constant(value=ir.tensor(_per_channel(scale, channels, groups).reshape(per_channel)))
            b = op.Constant(value=ir.tensor(_per_channel(bias, channels, groups).reshape(per_channel)))
        else:
            shape = op.Constant(value=ir.tensor(np.array(per_channel, dtype=np.int64)))
            s, b = op.Reshape(scale, shape), op.Reshape(bias, shape)
        self.accepted(node, f"InstanceNormalization over {groups} groups of {channels} channels",
                      num_groups=groups)
        return op.Add(op.Mul(restored, s), b)


def _per_channel(value: ir.Value, channels: int, groups: int) -> np.ndarray:
    return np.repeat(value.const_value.numpy().astype(np.float32).reshape(groups), channels // groups)


# ** 2. GridSample-20/22 -> GridSample-16 by lowering the opset **

def _formals(schema, is_input: bool):
    return schema.inputs if is_input else schema.outputs


def _same_signature(new, old) -> str | None:
    """Why `old` (an older schema of the op) differs from `new` beyond added types; None if it does not."""
    for is_input in (True, False):
        a, b = _formals(new, is_input), _formals(old, is_input)
        if [(f.name, f.option) for f in a] != [(f.name, f.option) for f in b]:
            return "inputs" if is_input else "outputs"
    if set(new.attributes) != set(old.attributes):
        return "attributes " + ", ".join(sorted(set(new.attributes) ^ set(old.attributes)))
    for name, attr in new.attributes.items():
        other = old.attributes[name]
        if attr.required != other.required or attr.default_value != other.default_value:
            return f"attribute {name}"
    return None


def _types_fit(node: ir.Node, schema) -> bool:
    """Whether every typed input/output of `node` is allowed by `schema`'s type constraints."""
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    for is_input, values in ((True, node.inputs), (False, node.outputs)):
        formals = _formals(schema, is_input)
        for i, value in enumerate(values):
            if value is None or value.type is None or not formals:
                continue
            formal = formals[min(i, len(formals) - 1)]
            type_str = _type_string(value.type)
            permitted = allowed.get(formal.type_str, {formal.type_str})
            if type_str is None or type_str not in permitted:
                return False
    return True


def _type_string(type_: ir.TypeProtocol) -> str | None:
    """``tensor(float)``-style name of an IR type (the spelling of ONNX type constraints)."""
    if isinstance(type_, ir.TensorType):
        return f"tensor({_elem_name(type_.dtype)})"
    if isinstance(type_, ir.SequenceType) and isinstance(type_.elem_type, ir.TensorType):
        return f"seq(tensor({_elem_name(type_.elem_type.dtype)}))"
    if isinstance(type_, ir.OptionalType):
        inner = _type_string(type_.elem_type)
        return f"optional({inner})" if inner else None
    return None


def _elem_name(dtype: ir.DataType) -> str:
    return onnx.helper.tensor_dtype_to_string(int(dtype)).replace("TensorProto.", "").lower()


def opset_change_reason(model: ir.Model, current: int, target: int, skip: set[int]) -> str | None:
    """Why moving `model` from ai.onnx `current` to `target` would change a node other than those in
    `skip` (ids); None when every node means the same at `target`."""
    if any(_onnx_domain_import(f.opset_imports) is not None for f in model.functions.values()):
        return "the model has local functions importing ai.onnx, which would need the same opset change"
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if id(node) in skip or node.domain not in ("", "ai.onnx"):
            continue
        now = _since(node.op_type, current)
        if now is None:
            continue  # an ORT contrib op in the ONNX domain: no ONNX schema, not versioned by the opset
        then = _since(node.op_type, target)
        label = f"{node.op_type}-{now} ({node.name or 'unnamed'})"
        if then is None:
            return f"{label} does not exist at opset {target}"
        if then == now:
            continue
        new, old = onnx.defs.get_schema(node.op_type, current, ""), onnx.defs.get_schema(node.op_type, target, "")
        differs = _same_signature(new, old)
        if differs:
            return f"{label} would become {node.op_type}-{then}, whose {differs} differ"
        if not _types_fit(node, old):
            return f"{label} uses a type {node.op_type}-{then} does not have"
    return None


def _onnx_domain_import(imports: dict[str, int]) -> int | None:
    return imports.get("", imports.get("ai.onnx"))


def grid_sample_reason(node: ir.Node) -> str | None:
    """Why GridSample-20/22 `node` has no exact GridSample-16 spelling; None when it has."""
    x = node.inputs[0]
    if x is None or x.shape is None or len(x.shape) != 4:
        rank = len(x.shape) if x is not None and x.shape is not None else "?"
        return f"input of rank {rank}: GridSample-16 is 4-D only"
    mode = node.attributes.get_string("mode", "linear")
    if mode not in GRID_SAMPLE_MODES_16:
        return f"mode={mode!r} has no GridSample-16 spelling"
    return None


class OpVersionsPass(DmlPass):
    """Ops at ONNX versions DirectML does not register -> registered versions or exact equivalents."""

    name = "op-versions"
    summary = ("ops at ONNX versions DirectML (or WebGPU) does not register (GroupNormalization, GridSample-20/22) "
               "-> InstanceNormalization form / GridSample-16")
    order = 12.0

    def enabled(self) -> bool:
        return self.context.target.ep in ("dml", "webgpu")

    needs_names = "sites"
    needs_shapes = "onnx"

    def find_sites(self, model: ir.Model) -> list[ir.Node]:
        if _onnx_opset(model) is None:
            return []
        return [n for n in all_nodes(model) if n.domain in ("", "ai.onnx")
                and n.op_type in ("GroupNormalization", "GridSample")]

    def shapes_missing(self, sites) -> bool:
        return any(n.inputs[0] is not None and n.inputs[0].shape is None for n in sites)

    def rewrite(self, model: ir.Model) -> bool:
        opset = _onnx_opset(model)
        webgpu = self.context.target.ep == "webgpu"
        data = None if webgpu else placement.load_data(self.context.target.table_version)
        count = 0
        if any(n.op_type == "GroupNormalization" and n.domain in ("", "ai.onnx") for n in all_nodes(model)):
            count += apply_rules(model, [GroupNormToInstanceNorm.rule(self, opset, data)])
        count += self._lower_grid_sample(model, opset, data)
        return count > 0

    def _lower_grid_sample(self, model: ir.Model, opset: int, data: placement.DmlData | None) -> int:
        """`data` None: the WebGPU EP's registrations (dmlopt.targets.webgpu.registry)."""
        registered = (placement.registered_versions(data, "", "GridSample") if data is not None
                      else webgpu_registry.REGISTERED_VERSIONS[("", "GridSample")])
        who = f"ORT {data.version}'s DirectML" if data is not None else "the WebGPU EP"
        since = _since("GridSample", opset)
        nodes = [n for n in all_nodes(model) if n.op_type == "GridSample" and n.domain in ("", "ai.onnx")]
        if not nodes or since in registered:
            return 0
        if 16 not in registered:
            for node in nodes:
                self.declined(node, f"{who} registers no GridSample at any version")
            return 0
        target = max(o for o in range(16, opset) if _since("GridSample", o) == 16)
        reasons = {id(n): grid_sample_reason(n) for n in nodes}
        bad = next((n for n in nodes if reasons[id(n)]), None)
        blocker = (f"GridSample {bad.name}: {reasons[id(bad)]}" if bad is not None
                   else opset_change_reason(model, opset, target, {id(n) for n in nodes}))
        if blocker:
            for node in nodes:
                own = reasons[id(node)]
                self.declined(node, own or f"GridSample-{since} -> 16 needs the model at opset {target}: {blocker}")
            return 0
        model.opset_imports[""] = target
        model.opset_imports.pop("ai.onnx", None)
        for node in nodes:
            mode = node.attributes.get_string("mode", "linear")
            node.attributes["mode"] = ir.AttrString("mode", GRID_SAMPLE_MODES_16[mode])
            self.rewrote(node, f"GridSample-{since} -> GridSample-16 (mode {GRID_SAMPLE_MODES_16[mode]}); "
                               f"model opset {opset} -> {target}", opset=target)
        return len(nodes)
