"""Step 1: ORT's level-1 constant folding, which runs before the EP sees the graph.

Why: a node whose inputs are all constants, and a Shape/Size of a static shape, become
initializers and never reach the EP; `prepare` makes the copy the later steps analyse.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from dmlopt.targets.dml.placement_data import canonical_domain
from dmlopt.targets.dml.placement_nodes import attribute_value, graph_attributes, static_shape
from dmlopt.targets.dml.placement_ort import GIVEN_AS_INPUT, contrib_shapes, ort_level1
from dmlopt.graph.shape_inference import check_function_expansion, fold_refusal, infer_shapes


# Ops ORT never folds (non-deterministic) even when their inputs are constant.
NOT_FOLDABLE = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                "Bernoulli"}


# The prediction evaluates ORT's folds itself; a result over this many elements (that frees
# less than it adds) is not evaluated and is predicted as a node (a warning says so).
FOLD_LIMIT_ELEMENTS = 1 << 22


def prepare(model: ir.Model, fold: bool = True) -> tuple[ir.Model, int]:
    """The copy of `model` that `predict` analyses and how many nodes ORT's level-1 optimizer removed.

    ORT's own level-1 optimizer (placement_ort.ort_level1) makes the copy; when the installed
    onnxruntime cannot load the model (an op or type its CPU EP lacks), dmlopt replays ORT's
    constant folding itself and the copy says why (``graph.meta[LEVEL1_KEY]``)."""
    if model.functions:  # ORT inlines model-local functions when it loads the model
        check_function_expansion(model)
        model = model.clone()
        common_passes.InlinePass()(model)
    if not fold:
        work = _with_shapes(model.clone())
        contrib_shapes(work)
        return work, 0
    # ORT folds without a size limit and a 400-byte model can expand to GBs: where a fold may be large,
    # dmlopt's bounded replay evaluates first, and ORT gets the model only if every fold stayed small.
    replayed = ort_constant_folding(model) if may_fold_large(model) else None
    if replayed is not None and replayed[0].graph.meta[UNFOLDED_KEY]:
        work, why = None, f"a constant over {FOLD_LIMIT_ELEMENTS} elements would be folded"
    else:
        work, why = ort_level1(model)
    if work is None:
        work, folded = replayed if replayed is not None else ort_constant_folding(model)
        work.graph.meta[LEVEL1_KEY] = f"replayed by dmlopt (ORT's level-1 optimizer not used: {why})"
    else:
        folded = _node_count(model.graph) - _node_count(work.graph)
        _with_shapes(work)
        unfolded: list[str] = []
        folded += _fold_what_reads_large_weights(work, unfolded)
        work.graph.meta[UNFOLDED_KEY] = unfolded
        work.graph.meta[LEVEL1_KEY] = "ORT's level-1 optimizer (onnxruntime, CPU EP, ORT_ENABLE_BASIC)"
    contrib_shapes(work)
    return work, folded


LEVEL1_KEY = "dmlopt.placement.level1"

# Ops whose result can be far larger than their inputs (or than a declared shape says).
EXPANDING = {"Expand", "ConstantOfShape", "Tile", "Range", "Resize", "Upsample", "Pad", "OneHot", "EyeLike",
             "MatMul", "Gemm", "Einsum", "Gather", "GatherND"}


def may_fold_large(model: ir.Model) -> bool:
    """Whether ORT's folding could build a large constant: a node of EXPANDING on constants only (declared
    shapes can lie), or any constant result over FOLD_LIMIT_ELEMENTS by its inferred shape."""
    work = _with_shapes(model.clone())
    inputs = set(work.graph.inputs)
    constant = {id(v) for v in work.graph.initializers.values() if v not in inputs}
    for node in work.graph:
        if node.op_type == "Constant" and canonical_domain(node.domain) == "":
            constant.update(id(o) for o in node.outputs)
            continue
        if canonical_domain(node.domain) != "" or node.op_type in NOT_FOLDABLE or graph_attributes(node):
            continue
        present = [v for v in node.inputs if v is not None]
        if node.op_type in ("Shape", "Size") and present and static_shape(present[0]) is not None:
            pass
        elif not present or not all(id(v) in constant for v in present):
            continue
        if node.op_type in EXPANDING:
            return True
        for out in node.outputs:
            shape = static_shape(out)
            if shape is not None and int(np.prod(shape, dtype=np.int64)) > FOLD_LIMIT_ELEMENTS:
                return True
            constant.add(id(out))
    return False


def _node_count(graph: ir.Graph) -> int:
    return sum(1 for n in graph if not (n.op_type == "Constant" and canonical_domain(n.domain) == ""))


def prepared_graph(model: ir.Model, *, fold: bool = True) -> ir.Model:
    """The copy of `model` that `predict` analyses (ORT's folding applied, shapes inferred);
    its nodes, Constant nodes left out, carry the names `node_label` gives."""
    return prepare(model, fold)[0]


def _with_shapes(model: ir.Model) -> ir.Model:
    """`model` (changed in place and returned) with ONNX shape inference, data propagation on.

    Best effort (contrib ops, odd models); the weights are not serialized (dmlopt.graph.shape_inference)."""
    infer_shapes(model)
    return model


def ort_constant_folding(model: ir.Model, max_rounds: int = 12) -> tuple[ir.Model, int]:
    """A copy of `model` after what ORT's level-1 ConstantFolding does before partitioning.

    ORT folds a node when all its inputs are constant, and a Shape/Size whose input shape is
    fully static; it does not fold through partially known shapes.
    """
    work = _with_shapes(model.clone())
    unfolded: list[str] = []
    folded = _fold_rounds(work, unfolded, max_rounds)
    work.graph.meta[UNFOLDED_KEY] = unfolded
    return work, folded


UNFOLDED_KEY = "dmlopt.placement.unfolded"


def _fold_what_reads_large_weights(work: ir.Model, unfolded: list[str]) -> int:
    """Fold, in place, the nodes ORT could not fold only because their weight was given to it as an
    input (placement_ort: weights over LARGE_BYTES), and what they make constant; how many.

    Why: ORT folds them when it has the weights (SAM ViT-B's Transpose of its 3 MB position
    embedding): left in, such a node was predicted as a DML partition of its own that the real EP
    never had (1.17.3, 512-px ViT-B export: 1 predicted, 0 real)."""
    return _fold_rounds(work, unfolded, large_weights_only=True)


def _fold_rounds(work: ir.Model, unfolded: list[str], max_rounds: int = 12, large_weights_only: bool = False) -> int:
    """Fold, in place, every node ORT would fold (`_fold_node`), round after round: each round infers
    shapes again, because a folded Reshape shape makes the next Shape static; how many were folded.
    `large_weights_only`: only nodes that read a value marked GIVEN_AS_INPUT, whose results are
    marked so in turn (what reads them was not foldable by ORT either)."""
    folded = 0
    for _ in range(max_rounds):
        changed = 0
        for node in list(work.graph):
            if large_weights_only and not any(v is not None and v.meta.get(GIVEN_AS_INPUT) for v in node.inputs):
                continue
            values = _fold_node(node, unfolded)
            if values is None:
                continue
            for out, array in zip(node.outputs, values):
                const = ir.Value(name=out.name, shape=ir.Shape(array.shape), type=ir.TensorType(out.dtype or
                                 ir.DataType.from_numpy(array.dtype)), const_value=ir.tensor(array))
                if large_weights_only:
                    const.meta[GIVEN_AS_INPUT] = True
                ir.convenience.replace_all_uses_with(out, const, replace_graph_outputs=True)
                work.graph.register_initializer(const)
            work.graph.remove(node, safe=True)
            changed += 1
        folded += changed
        if not changed:
            break
        _with_shapes(work)
    return folded


def _fold_node(node: ir.Node, unfolded: list[str]) -> list[np.ndarray] | None:
    """The values of `node`'s outputs when ORT would fold it, else None."""
    if canonical_domain(node.domain) != "" or node.op_type in NOT_FOLDABLE or node.op_type == "Constant" \
            or graph_attributes(node) or not node.outputs:
        return None
    inputs = list(node.inputs)
    if node.op_type in ("Shape", "Size") and inputs and static_shape(inputs[0]) is not None:
        shape = np.array(static_shape(inputs[0]), dtype=np.int64)
        if node.op_type == "Size":
            return [np.array(int(np.prod(shape)), dtype=np.int64)]
        start, end = attribute_value(node, "start", 0), attribute_value(node, "end", None)
        return [shape[start:end] if end is not None else shape[start:]]
    if not inputs or any(v is not None and v.is_graph_input() for v in inputs):
        return None
    tensors = {v.name: _const_tensor(v) for v in inputs if v is not None}
    if any(t is None for t in tensors.values()):
        return None
    if fold_refusal(node, FOLD_LIMIT_ELEMENTS, const=_const_tensor) is not None:  # sized before evaluating
        if node.name not in unfolded:
            unfolded.append(node.name or node.op_type)
        return None
    feeds = {name: t.numpy() for name, t in tensors.items()}
    try:
        from onnx.reference import ReferenceEvaluator  # lazily: only folds that get this far need it

        proto = ir.serde.serialize_node(node)
        outputs = ReferenceEvaluator(proto).run(None, feeds)
    except Exception:  # noqa: BLE001 - an op the reference runtime cannot evaluate stays in the graph
        return None
    return [np.asarray(o) for o in outputs]


def _const_tensor(value: ir.Value) -> ir.TensorProtocol | None:
    """ir.convenience.get_const_tensor without naming a Constant's tensor: the work copy shares it with the
    caller's model (clone does not copy tensors), which predict leaves unchanged."""
    producer = value.producer()
    if value.const_value is None and producer is not None and producer.op_type == "Constant" \
            and canonical_domain(producer.domain) == "" and "value" in producer.attributes:
        return producer.attributes["value"].as_tensor()
    return ir.convenience.get_const_tensor(value)
