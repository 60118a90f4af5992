"""Step 1 by ONNX Runtime itself: its level-1 optimizer, and the shapes its schemas infer.

Why: before the DirectML EP sees a graph, ORT's level-1 transformers rewrite it (constant
folding of static shape chains, common-subexpression elimination, Identity/Cast/Unsqueeze
elimination...).  Replaying them by hand missed CSE and undercounted by ~130 nodes on the dynamic
SAM export (real 1.17.3-1.31.1 runs: 173 CPU nodes; hand replay: 268).  The installed onnxruntime
(CPU) runs the very same transformers: the graph it saves at ORT_ENABLE_BASIC is the graph the
partitioner receives.  Contrib ops (com.microsoft MultiHeadAttention, SkipLayerNormalization...)
have no ONNX schema, so ONNX shape inference stops at them; ORT's symbolic shape inference types
their outputs as ORT does.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir

from dmlopt.io.scratch import folder
from dmlopt.graph.shape_inference import check_function_expansion, infer_shapes, proto_with, tensor_bytes, weightless_proto

logger = logging.getLogger(__name__)

# ORT refuses a serialized model over protobuf's limit; such a model keeps dmlopt's own replay.
PROTO_LIMIT_BYTES = 2_000_000_000
LARGE_BYTES = 1 << 20
# Value meta of a weight that ORT got as a graph input (over LARGE_BYTES): it could not fold what reads it.
GIVEN_AS_INPUT = "dmlopt.placement.given_as_input"


def ort_level1(model: ir.Model) -> tuple[ir.Model | None, str | None]:
    """(the graph after ORT's level-1 optimizations, None) or (None, why ORT could not make it).

    The CPU EP session only optimizes and saves; nothing is run.  Level 1 runs before partitioning
    and is the same for every EP (its rules apply to nodes not yet assigned to one)."""
    try:
        import onnxruntime as ort  # lazily: predictions without folding never need it
    except ImportError:
        return None, "onnxruntime is not installed"
    # Weights over LARGE_BYTES go to ORT as typed graph inputs, not data (no copies of them: optimize
    # predicts twice); ORT then cannot fold a node that reads one, which moves no node between CPU and GPU.
    inputs = set(model.graph.inputs)
    large = [v for v in model.graph.initializers.values() if v.const_value is not None and v not in inputs
             and tensor_bytes(v.const_value) > LARGE_BYTES]
    stripped = set(large)
    kept = [v for v in model.graph.initializers.values() if v not in stripped]
    try:
        check_function_expansion(model)
        data = proto_with(model, initializers=kept, extra_inputs=[_declared(v) for v in large]).SerializeToString()
    except Exception as e:  # noqa: BLE001 - over 2 GB, or a tensor that cannot be serialized
        return None, f"the model cannot be serialized in memory ({str(e).splitlines()[0][:120]})"
    if len(data) > PROTO_LIMIT_BYTES:
        return None, "the model is over 2 GB"
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 3
    with folder("dmlopt-ortl1-") as tmp:
        options.optimized_model_filepath = str(tmp / "level1.onnx")
        try:
            ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - an op or type the CPU EP lacks, an opset it does not know
            return None, str(e).strip().splitlines()[0][:200]
        del data
        work = ir.load(tmp / "level1.onnx")
        # Inline tensors are in memory once loaded; external ones (none are written) would not be.
        for value in work.graph.initializers.values():
            if value.const_value is not None:
                value.const_value = ir.tensor(value.const_value.numpy(), name=value.name)
    _undo_cpu_precision_casts(work)
    originals = {v.name: v.const_value for v in large}
    for value in list(work.graph.inputs):  # the weights become initializers again (the caller's tensors)
        if value.name in originals:
            work.graph.inputs.remove(value)
            value.const_value = originals[value.name]
            value.meta[GIVEN_AS_INPUT] = True
            work.graph.register_initializer(value)
    return work, None


# ORT's InsertCastTransformer names the Casts and the values it converts so: it runs on the CPU EP's
# nodes only, around float16 ops the CPU EP has no float16 kernel for.
CPU_CAST_PREFIX = "InsertedPrecisionFreeCast_"


def _undo_cpu_precision_casts(work: ir.Model) -> int:
    """Take out what only the CPU EP does to a float16 graph: ORT's InsertCastTransformer computes
    float16 ops without a CPU float16 kernel in float32, between Casts.  The DirectML EP runs them
    in float16 and gets no such Casts: left in, a Pad's float16 constant behind one was predicted a
    CPU input (EfficientViT --fp16: 1 copy and 3 partitions predicted, 0 and 1 measured).  The
    Casts are bypassed and the values ORT converted are float16 again, under their own names."""
    graph = work.graph
    removed = 0
    for node in list(graph):
        if node.op_type != "Cast" or not (node.name or "").startswith(CPU_CAST_PREFIX) or len(node.inputs) != 1:
            continue
        source, made = node.inputs[0], node.outputs[0]
        name = made.name
        made.replace_all_uses_with(source, replace_graph_outputs=True)
        graph.remove(node, safe=True)
        if source.name and source.name.startswith(CPU_CAST_PREFIX) and name and not name.startswith(CPU_CAST_PREFIX):
            source.name = name  # the value under the model's own name again
        removed += 1
    taken = {v.name for v in (*graph.inputs, *graph.initializers.values(), *(o for n in graph for o in n.outputs))}
    for node in graph:
        for value in node.outputs:
            if value.name and value.name.startswith(CPU_CAST_PREFIX):
                if value.dtype == ir.DataType.FLOAT:
                    value.type = ir.TensorType(ir.DataType.FLOAT16)
                own = value.name[len(CPU_CAST_PREFIX):]
                if own and own not in taken:
                    value.name = own
                    taken.add(own)
    return removed


def _declared(initializer: ir.Value) -> ir.Value:
    tensor = initializer.const_value
    return ir.Value(name=initializer.name, type=initializer.type or ir.TensorType(tensor.dtype),
                    shape=initializer.shape or ir.Shape(tensor.shape))


def contrib_shapes(model: ir.Model) -> int:
    """Type the outputs of com.microsoft nodes as ORT's symbolic shape inference does, then run
    ONNX shape inference again so their consumers get shapes; in place; how many outputs it typed."""
    missing = [out for node in model.graph if node.domain == "com.microsoft"
               for out in node.outputs if out.name and out.shape is None]
    if not missing:
        return 0
    try:
        inferred = _symbolic_shapes(weightless_proto(model))
    except Exception as e:  # noqa: BLE001 - best effort, as ONNX shape inference
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]  # a bare assert has no message
        logger.debug("ORT symbolic shape inference failed: %s", first[:200])
        inferred = None
    if inferred is None:
        return _contrib_rules(model)
    infos = {info.name: info for info in inferred.graph.value_info}
    typed = 0
    for out in missing:
        info = infos.get(out.name)
        if info is None or not info.type.HasField("tensor_type"):
            continue
        value = ir.serde.deserialize_value_info_proto(info, None)
        if value.shape is None or any(not isinstance(d, int) and d.value is None for d in value.shape.dims):
            continue
        out.shape = value.shape
        if value.type is not None:
            out.type = value.type
        typed += 1
    if typed:
        infer_shapes(model)
    return typed + _contrib_rules(model)  # what the symbolic inference left untyped


def _symbolic_shapes(proto):
    """ORT's SymbolicShapeInference, keeping what it inferred when it is incomplete.  Its infer_shapes
    entry point then writes sym_shape_infer_temp.onnx (+ external data) into the working directory and
    raises; the steps it runs are called here instead, so nothing is written."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference, get_opset
    except ImportError:
        return None
    opset = get_opset(proto)
    if not opset or opset < 7:
        return None
    inference = SymbolicShapeInference(2**31 - 1, True, False, 0)
    inference._preprocess(proto)  # noqa: SLF001 - the public entry point writes files (above)
    while inference.run_:
        inference._infer_impl()  # noqa: SLF001
    inference._update_output_from_vi()  # noqa: SLF001
    return inference.out_mp_


# Output 0's shape from the inputs' static shapes, as ORT's contrib schemas infer it.
SAME_AS_INPUT0 = {"SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "Gelu", "FastGelu", "QuickGelu",
                  "BiasGelu", "BiasAdd", "GroupNorm"}


def _contrib_output(node: ir.Node, shapes: list[tuple[int, ...] | None]) -> tuple[int, ...] | None:
    if not shapes or shapes[0] is None:
        return None
    if node.op_type in SAME_AS_INPUT0:
        return shapes[0]
    if node.op_type == "FusedMatMul" and len(shapes) > 1 and shapes[1] is not None:
        a, b = list(shapes[0]), list(shapes[1])
        trans = {k: int(node.attributes[k].value) if k in node.attributes else 0
                 for k in ("transA", "transB", "transBatchA", "transBatchB")}
        if trans["transBatchA"] or trans["transBatchB"] or len(a) < 2 or len(b) < 2:
            return None
        if trans["transA"]:
            a[-2], a[-1] = a[-1], a[-2]
        if trans["transB"]:
            b[-2], b[-1] = b[-1], b[-2]
        try:
            batch = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
        except ValueError:
            return None
        return (*batch, a[-2], b[-1])
    if node.op_type == "MultiHeadAttention" and len(shapes[0]) == 3:
        value = shapes[2] if len(shapes) > 2 else None
        return (*shapes[0][:2], value[-1]) if value is not None and len(value) == 3 else shapes[0]
    return None


def _contrib_rules(model: ir.Model, rounds: int = 32) -> int:
    """Type output 0 of the common com.microsoft ops from their inputs' static shapes, then let ONNX
    inference carry them on; in place; how many outputs it typed.  For when ORT's symbolic inference gives up."""
    typed = 0
    for _ in range(rounds):
        changed = 0
        for node in model.graph:
            if node.domain != "com.microsoft" or not node.outputs:
                continue
            # SkipLayerNormalization's output 3 (input + skip + bias) has the input's shape too
            slots = [k for k in ((0, 3) if node.op_type.startswith("Skip") else (0,))
                     if k < len(node.outputs) and node.outputs[k] is not None and node.outputs[k].name
                     and node.outputs[k].shape is None]
            if not slots:
                continue
            shape = _contrib_output(node, [None if v is None else _static(v) for v in node.inputs])
            if shape is None:
                continue
            for k in slots:
                node.outputs[k].shape = ir.Shape(shape)
                if node.outputs[k].type is None and node.inputs[0].type is not None:
                    node.outputs[k].type = node.inputs[0].type
                changed += 1
        if not changed:
            break
        typed += changed
        infer_shapes(model)
    return typed


def _static(value: ir.Value) -> tuple[int, ...] | None:
    if value.shape is None or not all(isinstance(d, int) for d in value.shape.dims):
        return None
    return tuple(value.shape.dims)


def rank_only_einsum_shapes(model: ir.Model) -> ir.Model:
    """A copy of `model` shaped as ONNX < 1.17 does (ORT <= 1.19): Einsum outputs get a rank and no
    dims, and the dims of everything downstream are inferred again from there.

    Measured: in 1.17.3 and 1.19.2 the nodes fed by SAM's Einsums run as standalone DML kernels
    (their shapes are unknown to ORT), in 1.24.3 the same graph compiles as one partition."""
    work = model.clone()
    einsums = [n for n in work.graph if n.op_type == "Einsum" and n.domain in ("", "ai.onnx")]
    if not einsums:
        return work
    inputs = set(work.graph.inputs)
    for node in work.graph:
        for out in node.outputs:
            if out not in inputs and not out.is_graph_output():
                out.shape = None
    for node in einsums:
        node.domain = "dmlopt.rank_only"  # unknown to ONNX: its declared (rank-only) shapes are kept
        for out in node.outputs:
            rank = _einsum_rank(node)
            out.shape = ir.Shape([None] * rank) if rank is not None else None
    work.opset_imports["dmlopt.rank_only"] = 1
    infer_shapes(work)
    for node in einsums:
        node.domain = ""
    del work.opset_imports["dmlopt.rank_only"]
    return work


def _einsum_rank(node: ir.Node) -> int | None:
    attr = node.attributes.get("equation")
    if attr is None:
        return None
    equation = str(attr.value).replace(" ", "")
    if "->" not in equation or "..." in equation:
        return None
    return len(equation.split("->", 1)[1])
