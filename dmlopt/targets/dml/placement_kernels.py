"""Step 2: kernel lookup and the EP's support query (``kernel_match``, IsNodeSupportedByDml).

Why: a node runs on DirectML only if the EP registers its ONNX since-version with its element
types, the device supports its types and rank, and the op's support query accepts it (Einsum
equations, LayerNormalization outputs, Resize modes...); ops registered at other versions
only are listed as version gaps.
"""

from __future__ import annotations

from typing import Any

import onnx
import onnx_ir as ir

from dmlopt.targets.dml.einsum_support import einsum_supported
from dmlopt.targets.dml.placement_data import DmlData, Registration, canonical_domain
from dmlopt.targets.dml.placement_nodes import attribute_value, dtype_name, op_name, present_values


MS_DOMAIN = "com.microsoft"


def registered_versions(data: DmlData, domain: str, op: str) -> list[int]:
    """The ONNX since-versions of `op` that DirectML registers in `data`, oldest first."""
    return sorted({s for r in data.registrations(domain, op) for s in r.since})


def version_gap(node: ir.Node, data: DmlData, opsets: dict[str, int]) -> tuple[int, list[int]] | None:
    """(node's since-version, registered since-versions) when DirectML has `node`'s op at other versions
    only, or at none while ONNX defines it; None when its version is registered (or it is no ONNX op)."""
    since = since_version(node, opsets)
    if since is None or canonical_domain(node.domain) != "":
        return None
    known = registered_versions(data, node.domain, node.op_type)
    if since in known:
        return None
    if not known and _schema(node, opsets) is None:
        return None  # not an ONNX op (an ORT contrib op in the ONNX domain, or unknown)
    return since, known


def version_gaps(model: ir.Model, data: DmlData) -> list[dict[str, Any]]:
    """One entry per (op, since-version) of the model that DirectML does not register:
    {"op", "version", "registered", "nodes"}; every graph, subgraphs included."""
    opsets = dict(model.opset_imports)
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.op_type == "Constant":
            continue
        gap = version_gap(node, data, opsets)
        if gap is None:
            continue
        since, known = gap
        schema = _schema(node, opsets)
        # An op no EP has a kernel for is expanded by ORT into its ONNX function body, if it has one
        # (GroupNormalization: measured on the CPU EP); whether the CPU EP has one is not in the table.
        body = bool(schema is not None and (schema.has_function or schema.has_context_dependent_function))
        entry = found.setdefault((node.op_type, since), {"op": node.op_type, "version": since,
                                                         "registered": known, "nodes": 0, "function_body": body})
        entry["nodes"] += 1
    return sorted(found.values(), key=lambda e: (e["op"], e["version"]))


def version_gap_text(gap: dict[str, Any], ort_version: str) -> str:
    """``GridSample-20: DirectML registers 16 only`` (one line of ``inspect --ep dml``)."""
    known = gap["registered"]
    if not known:
        has = "no version of it"
    elif len(known) == 1:
        has = f"{known[0]} only"
    else:
        has = ", ".join(map(str, known))
    count = gap["nodes"]
    where = (f"{count} node{'s' if count != 1 else ''} on the CPU" if not gap.get("function_body") else
             f"{count} node{'s' if count != 1 else ''}: CPU kernel or ORT's expansion of the ONNX function body")
    return f"{gap['op']}-{gap['version']}: DirectML registers {has} (ORT {ort_version}; {where})"


def memory_slots(node: ir.Node, data: DmlData, opsets: dict[str, int]) -> tuple[frozenset[int], frozenset[int]]:
    """(input slots, output slots) the DML kernel of `node` keeps in CPU memory; empty when none."""
    reg, _ = find_kernel(node, data, opsets)
    return (reg.cpu_inputs, reg.cpu_outputs) if reg is not None else (frozenset(), frozenset())


def since_version(node: ir.Node, opsets: dict[str, int]) -> int | None:
    domain = canonical_domain(node.domain)
    if domain == MS_DOMAIN:
        return 1
    opset = opsets.get(domain if domain else "", opsets.get("ai.onnx"))
    if opset is None:
        return None
    try:
        return onnx.defs.get_schema(node.op_type, opset, domain).since_version
    except Exception:  # noqa: BLE001 - ORT contrib ops registered in the ONNX domain (since 1)
        return 1 if domain == "" else None


def _schema(node: ir.Node, opsets: dict[str, int]):
    domain = canonical_domain(node.domain)
    try:
        return onnx.defs.get_schema(node.op_type, opsets.get(domain, opsets.get("", 1)), domain)
    except Exception:  # noqa: BLE001
        return None


def _type_bindings(node: ir.Node, opsets: dict[str, int]) -> list[tuple[str, str, bool, int]]:
    """(type parameter, element type, is_input, index) for each present input and output."""
    schema = _schema(node, opsets)
    bound = []
    for is_input, values, formals in ((True, node.inputs, schema.inputs if schema else None),
                                      (False, node.outputs, schema.outputs if schema else None)):
        for i, value in enumerate(values):
            dtype = dtype_name(value)
            if dtype is None:
                continue
            if formals:
                formal = formals[min(i, len(formals) - 1)]
                param = formal.type_str
            else:
                param = "T" if dtype in ("float", "float16", "double", "bfloat16") else ""
            bound.append((param, dtype, is_input, i))
    return bound


def find_kernel(node: ir.Node, data: DmlData, opsets: dict[str, int]) -> tuple[Registration | None, str | None]:
    """The registration ORT's kernel lookup finds for `node`, or why none matches."""
    rows = data.registrations(node.domain, node.op_type)
    label = op_name(node)
    if not rows:
        if node.op_type == "Gelu" and canonical_domain(node.domain) == "":
            return None, (f"no DirectML kernel for ai.onnx Gelu in ORT {data.version} (only com.microsoft Gelu "
                          "is registered)")
        return None, f"no DirectML kernel for {label} in ORT {data.version}"
    since = since_version(node, opsets)
    reg = next((r for r in rows if since in r.since), None)
    if reg is None:
        known = sorted({s for r in rows for s in r.since})
        return None, (f"no DirectML kernel for {label}-{since} in ORT {data.version} (registered since-versions: "
                      f"{', '.join(map(str, known))})")
    for param, dtype, is_input, index in _type_bindings(node, opsets):
        allowed = reg.types.get(param)
        if allowed is not None and dtype not in allowed:
            where = f"input {index}" if is_input else f"output {index}"
            return None, f"{label} has no DirectML kernel for {dtype} ({where}, type {param})"
    return reg, None


def support_query(node: ir.Node, reg: Registration, data: DmlData) -> str | None:
    """The EP's IsNodeSupportedByDml beyond the kernel lookup: device types, rank, support query."""
    label = op_name(node)
    for i, value in enumerate(node.inputs):
        if value is None or i in reg.cpu_inputs:
            continue
        dtype = dtype_name(value)
        if dtype in data.device_unsupported:
            return f"{dtype} tensors are not supported by DirectML devices (input {i} of {label})"
    for value in node.outputs:
        dtype = dtype_name(value)
        if dtype in data.device_unsupported:
            return f"{dtype} tensors are not supported by DirectML devices (output of {label})"
    max_rank = data.rules["max_rank"]["value"]
    for value in [*node.inputs, *node.outputs]:
        if value is not None and value.shape is not None and len(value.shape) > max_rank:
            return f"rank {len(value.shape)} exceeds DirectML's {max_rank} dimensions"
    query = QUERIES.get(reg.query) if reg.query else None
    return query(node, data) if query else None


def _query_einsum(node: ir.Node, data: DmlData) -> str | None:
    equation = attribute_value(node, "equation", "")
    n_inputs = len(present_values(node.inputs))
    if einsum_supported(equation, n_inputs, data.version):
        return None
    mode = data.rules["einsum"]["mode"]
    if mode == "pattern_table":
        return f"Einsum '{equation}' is not in the DirectML EP's recognized-equation table (ORT <= 1.18)"
    return f"Einsum '{equation}' needs ellipsis, more than 2 inputs or more than 8 labels"


def _query_layer_norm(node: ir.Node, data: DmlData) -> str | None:
    rule = data.rules["layer_norm"]
    if len(present_values(node.outputs)) > 1:
        return "LayerNormalization with Mean/InvStdDev outputs runs on the CPU"
    inputs = node.inputs
    if rule["requires_bias"] and (len(inputs) < 3 or inputs[2] is None or inputs[2].name == ""):
        return f"LayerNormalization without a bias input runs on the CPU in ORT {data.version}"
    return None


def _query_skip_layer_norm(node: ir.Node, data: DmlData) -> str | None:
    outputs = list(node.outputs)
    if any(k < len(outputs) and outputs[k] is not None and outputs[k].name for k in (1, 2)):
        return f"{node.op_type} with mean/inv_std_var outputs runs on the CPU"
    return None


def _query_resize(node: ir.Node, data: DmlData) -> str | None:
    mode = attribute_value(node, "mode", "nearest")
    if mode == "cubic":
        return "Resize mode=cubic runs on the CPU"
    if attribute_value(node, "exclude_outside", 0):
        return "Resize exclude_outside=1 runs on the CPU"
    if attribute_value(node, "extrapolation_value", 0.0):
        return "Resize with extrapolation_value != 0 runs on the CPU"
    return None


def _query_slice(node: ir.Node, data: DmlData) -> str | None:
    limit = data.rules["slice"]["max_inputs"]
    return f"Slice with more than {limit} inputs" if len(node.inputs) > limit else None


def _query_attention(node: ir.Node, data: DmlData) -> str | None:
    inputs, outputs = node.inputs, node.outputs
    if len(inputs) > 4 and inputs[4] is not None and inputs[4].name:
        return "Attention with a past input runs on the CPU"
    if len(inputs) > 6 and inputs[6] is not None and inputs[6].name:
        return "Attention with past_sequence_length runs on the CPU"
    if len(present_values(outputs)) > 1:
        return "Attention with a present output runs on the CPU"
    if attribute_value(node, "unidirectional", 0) or attribute_value(node, "do_rotary", 0):
        return "Attention with unidirectional=1 or do_rotary=1 runs on the CPU"
    return None


def _query_batchnorm(node: ir.Node, data: DmlData) -> str | None:
    return "BatchNormalization training_mode=1 runs on the CPU" if attribute_value(node, "training_mode", 0) else None


def _query_scatter(node: ir.Node, data: DmlData) -> str | None:
    reduction = attribute_value(node, "reduction", "none")
    return None if reduction == "none" else f"{node.op_type} reduction={reduction} runs on the CPU"


QUERIES = {
    "einsum": _query_einsum,
    "layer_norm": _query_layer_norm,
    "skip_layer_norm": _query_skip_layer_norm,
    "resize": _query_resize,
    "slice": _query_slice,
    "attention": _query_attention,
    "batchnorm_training": _query_batchnorm,
    "scatter_reduction": _query_scatter,
}
