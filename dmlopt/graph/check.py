"""IR helpers of the optimize run: the check after each pass, the op counts and the input/output
descriptions the report records.  They sit below the engine so that the pipeline, the report and
the inspection share them without importing each other.

The check is onnx's checker plus strict shape inference: a pass that breaks the model must be
caught where it happens (see dmlopt.engine.pipeline).
"""

from __future__ import annotations

import collections
from typing import Any

import onnx
import onnx_ir as ir

from dmlopt.errors import DmlOptError
from dmlopt.graph.shape_inference import weightless_proto, without_external_data


class PassBroke(DmlOptError):
    """A pass produced a model the checker rejects: a dmlopt bug, reported as such."""

    exit_code = 1


def op_counts(model: ir.Model) -> dict[str, int]:
    """Op type -> count, all graphs included (subgraphs, not functions)."""
    counts = collections.Counter()
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        counts[node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"] += 1
    return dict(sorted(counts.items()))


def has_subgraphs(node: ir.Node) -> bool:
    """Control flow (If, Loop, Scan, SequenceMap, any op of another domain with a body): a node
    whose graphs the passes and the inspection must treat as one unit."""
    return any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values())


def describe_values(values) -> list[dict[str, Any]]:
    """Name, dtype and shape (a free dimension by its name, or "?") of graph inputs or outputs."""
    out = []
    for v in values:
        dims = [d if isinstance(d, int) else (getattr(d, "value", None) or "?")
                for d in (v.shape.dims if v.shape is not None else ())]
        out.append({"name": v.name, "dtype": v.dtype.name.lower() if v.dtype is not None else None,
                    "shape": dims if v.shape is not None else None})
    return out


def check_model(model: ir.Model, where: str, *, strict: bool = True) -> None:
    """onnx checker + shape inference; raise if a pass produced an invalid model.

    `strict` makes shape-inference errors fatal (a wrong attribute, a rank mismatch); it is
    turned off only for inputs whose export already fails strict inference.  The large weights
    are checked as typed graph inputs: the checker needs their types and shapes, and copying
    them into a proto after every pass cost seconds a pass on SAM ViT-B."""
    proto = without_external_data(weightless_proto(model))
    _mark_ort_onnx_domain_ops(proto)
    try:
        onnx.checker.check_model(proto)
        onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=strict)
    except Exception as e:  # noqa: BLE001
        raise PassBroke(f"{where} produced an invalid model: {str(e).strip().splitlines()[0][:300]}") from e


# ONNX Runtime contrib ops that ORT registers in the ONNX domain (no ONNX schema: the checker would
# reject them); dmlopt's norm-fusion writes SimplifiedLayerNormalization, which ORT and DirectML run.
ORT_OPS_IN_ONNX_DOMAIN = frozenset({"SimplifiedLayerNormalization"})


def _mark_ort_onnx_domain_ops(proto: onnx.ModelProto) -> None:
    """Check ORT's ONNX-domain contrib ops as ops of an extra domain (the checker and shape inference
    skip what they have no schema for there); `proto` is the check's own copy."""
    marked = False
    graphs = [proto.graph]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            if node.domain in ("", "ai.onnx") and node.op_type in ORT_OPS_IN_ONNX_DOMAIN:
                node.domain = "dmlopt.ort_onnx_domain"
                marked = True
            graphs.extend(a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH)
            graphs.extend(g for a in node.attribute if a.type == onnx.AttributeProto.GRAPHS for g in a.graphs)
    if marked:
        proto.opset_import.append(onnx.helper.make_opsetid("dmlopt.ort_onnx_domain", 1))
