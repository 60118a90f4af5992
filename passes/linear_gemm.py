"""linear-gemm: Linear layers on static shapes -> Gemm, once, instead of at every session creation.

ORT's MatMulAddFusion (a basic-level optimization, so for every execution provider, DirectML
included) rewrites ``Add(MatMul(a, W), b)`` into ``Reshape -> Gemm -> Reshape`` each time a
session is created, when the shapes are static.  Done here, the Reshapes merge with their
neighbours, the transformer MLP runs its activation on the 2-D rows between two Gemms, and
the saved graph is what runs: fewer nodes, less work at session creation.  It runs after the
fusions that read MatMul + Add (attention, order 60), and needs static shapes (freeze-shapes).

Rewrites:
  Add(MatMul(a, W), b)  ->  Gemm(a, W, b)                          a 2-D
  Add(MatMul(a, W), b)  ->  Reshape(Gemm(Reshape(a, [M, K]), W, b), [..., N])
                            a static, rank > 2, next to a view op (the Reshapes merge into it)
  Linear2(act(Linear1(a)))  ->  Reshape(Gemm2(act(Gemm1(Reshape(a, [M, K])))), [..., N])
                            the transformer MLP; act elementwise with size-1 constant operands
  Reshape(Reshape(x, s1), s2)  ->  Reshape(x, s2);   Reshape(x, shape(x))  ->  x

Cases:
  1. W a 2-D constant, b one constant value per output column ([N] or [1, N]), float types.
  2. Rank > 2 next to no view op, outside an MLP: declined (two Reshapes for one Add saved).
  3. Dynamic shapes: declined (the rows M are unknown; freeze them first with --shape/--dim).
  4. Numerics: the Gemm adds the bias in its accumulation; equal within float rounding.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript.rewriter import pattern
from onnxscript.rewriter.rules import common as common_rules

from dmlopt.passes._base import DmlPass, SiteRule, apply_rules, eliminate_identities, remove_unused_nodes
from dmlopt.passes._shared import (DeduplicateInitializers, ReshapeNoOp, constant_array, infer_static_dims, is_static,
                                   show_shape)

# Weights and biases of exported linears may be Constant nodes as well as initializers.
_constant = functools.partial(constant_array, constant_nodes=True)
GEMM_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE)
VIEW_OPS = ("Reshape", "Squeeze", "Unsqueeze", "Flatten")


class LinearGemmPass(DmlPass):
    """MatMul + bias Add on static shapes -> Gemm (what ORT would redo at each session creation)."""

    name = "linear-gemm"
    summary = "Linear layers (MatMul + bias) on static shapes -> Gemm, the MLP on 2-D rows (ORT's MatMulAddFusion, once)"
    order = 65.0

    needs_fresh_names = True  # for the Reshape shapes it adds

    def prepare(self, model: ir.Model, sites) -> None:
        super().prepare(model, sites)
        infer_static_dims(model)  # static dims where onnx can tell (freeze-shapes leaves them all set)

    def rewrite(self, model: ir.Model) -> bool:
        count = 0
        rules = [LinearToGemm.rule(self), LinearToGemm.rule(self, bias_first=True)]
        merges = [common_rules.reshape_reshape_rule, ReshapeNoOp.rule(self)]
        for _ in range(4):
            done = mlps_to_gemm(self, model) + apply_rules(model, rules)
            if not done:
                break
            count += done
            apply_rules(model, merges)
            remove_unused_nodes(model)
        if count:
            eliminate_identities(model)
            remove_unused_nodes(model)
            DeduplicateInitializers()(model)  # the Reshape shapes of equal sites
            common_passes.NameFixPass()(model)
            infer_static_dims(model)  # the new Reshape/Gemm values
        return count > 0


class LinearToGemm(SiteRule):
    """``Add(MatMul(a, W), b)`` -> ``Gemm(a, W, b)``; for rank > 2, between Reshapes to and from 2D.

    What ORT's MatMulAddFusion does at every session creation, done once: the static shape
    gives the 2D size, the bias lands in the GEMM (one DirectML GEMM, no separate Add), and
    the Reshapes merge into their neighbours.  Above rank 2 it is only done next to a view
    op (so the Reshapes merge and no node is added).
    """

    def __init__(self, owner, bias_first: bool = False):
        super().__init__(owner, f"LinearToGemm{'Commuted' if bias_first else ''}")
        self.bias_first = bias_first

    def pattern(self, op, a, w, b):
        product = op.MatMul(a, w)
        return op.Add(b, product) if self.bias_first else op.Add(product, b)

    def check(self, context, a, w, b, **_):
        weight, bias, out = _constant(w), _constant(b), context.output_values[0]
        if weight is None or weight.ndim != 2 or bias is None:
            return pattern.MatchResult().fail("weight not a 2-D constant or bias not a constant")
        if a.dtype not in GEMM_TYPES or not is_static(a) or not is_static(out) or len(a.shape) < 2:
            return pattern.MatchResult().fail("input not static, or not a Gemm type")
        if bias.size != weight.shape[1] or bias.ndim > 2 or (bias.ndim == 2 and bias.shape[0] != 1):
            return pattern.MatchResult().fail("bias is not one value per output column")
        rank = len(a.shape)
        if rank > 2:
            producer = a.producer()
            before = producer is not None and producer.op_type in VIEW_OPS and len(a.uses()) == 1
            after = all(use.node.op_type in VIEW_OPS for use in out.uses()) and not out.is_graph_output()
            if not (before or after):
                return self.decline(context.output_values[0].producer(),
                                    "no Reshape next to it: a Gemm would add two Reshapes")
        self._rows = int(np.prod(a.shape.dims[:-1], dtype=np.int64))
        self._out_dims, self._name = list(out.shape.dims), out.name
        return pattern.MatchResult()

    def rewrite(self, op, a, w, b, **_):
        if len(self._out_dims) == 2:
            return op.Gemm(a, w, b)
        k = int(_constant(w).shape[0])
        rows = np.array([self._rows, k], dtype=np.int64)
        rows_shape = op.initializer(ir.tensor(rows, name=self.owner.fresh(f"{self._name}_rows")))
        out_shape = op.initializer(ir.tensor(np.array(self._out_dims, dtype=np.int64),
                                             name=self.owner.fresh(f"{self._name}_shape")))
        return op.Reshape(op.Gemm(op.Reshape(a, rows_shape), w, b), out_shape)


ELEMENTWISE_UNARY = frozenset({"Abs", "Cast", "Ceil", "Celu", "Clip", "Elu", "Erf", "Exp", "Floor", "Gelu",
                               "HardSigmoid", "HardSwish", "Identity", "LeakyRelu", "Log", "Mish", "Neg",
                               "Reciprocal", "Relu", "Round", "Selu", "Sigmoid", "Sign", "Softplus", "Softsign",
                               "Sqrt", "Tanh"})
ELEMENTWISE_BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"})


def mlps_to_gemm(owner: DmlPass, model: ir.Model) -> int:
    """``Linear2(act(Linear1(a)))`` on a rank > 2 input -> Reshape, Gemm, act, Gemm, Reshape.

    The transformer MLP (LayerNorm -> Linear -> GELU -> Linear): no Reshape sits next to either
    Linear, so one at a time each would need two; together the activation runs on the 2-D
    rows [M, N] between the two Gemms and only the outer Reshapes remain (as many nodes as
    before, the biases inside the GEMMs).  ``act`` is any region of elementwise ops whose
    other operands are size-1 constants of rank <= 2, so the 2-D layout computes the same.
    A graph walk, not a rule: the region has any number of nodes.
    """
    count = 0
    for graph in model.graphs():
        for add1 in list(graph):
            first = _linear(add1)
            if first is None or first[0].graph is not graph:
                continue
            matmul1, a, w1, b1 = first
            start = add1.outputs[0]
            if not is_static(a) or len(a.shape) < 3 or a.dtype not in GEMM_TYPES:
                continue
            region = _elementwise_region(start)
            if region is None:
                continue
            nodes, exit_node = region
            second = _linear_from_matmul(exit_node)
            if second is None:
                continue
            matmul2, add2, w2, b2 = second
            if not is_static(add2.outputs[0]):
                continue
            rows = int(np.prod(a.shape.dims[:-1], dtype=np.int64))
            out_dims = list(add2.outputs[0].shape.dims)
            _rewrite_mlp(graph, owner.fresh, a, rows, (matmul1, add1, w1, b1), nodes, (matmul2, add2, w2, b2), out_dims)
            owner.rewrote(add1, f"MLP on {show_shape(a.shape)}: two Linears -> Gemms on [{rows}, *] rows, "
                                f"{len(nodes)} activation nodes between")
            count += 1
    return count


def _linear(add: ir.Node):
    """(MatMul, a, W, b) when `add` is ``Add(MatMul(a, W), b)`` with a 2-D constant W and a bias b."""
    if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.inputs) != 2:
        return None
    for i in (0, 1):
        producer, bias = add.inputs[i].producer() if add.inputs[i] is not None else None, add.inputs[1 - i]
        if producer is not None and producer.op_type == "MatMul" and producer.domain in ("", "ai.onnx") \
                and len(producer.outputs[0].uses()) == 1:
            found = _linear_parts(producer, bias)
            if found is not None:
                return (producer, *found)
    return None


def _linear_from_matmul(matmul: ir.Node):
    """(MatMul, Add, W, b) when `matmul`'s only user is the bias Add of a Linear."""
    if matmul.op_type != "MatMul" or matmul.domain not in ("", "ai.onnx") or len(matmul.outputs[0].uses()) != 1 \
            or matmul.outputs[0].is_graph_output():
        return None
    add = next(iter(matmul.outputs[0].uses())).node
    found = _linear(add)
    if found is None or found[0] is not matmul:
        return None
    return matmul, add, found[2], found[3]


def _linear_parts(matmul: ir.Node, bias: ir.Value):
    """(a, W, b) of ``MatMul(a, W) + b`` if W is a 2-D constant and b one value per column."""
    a, w = matmul.inputs
    weight, b = _constant(w), _constant(bias)
    if weight is None or weight.ndim != 2 or b is None:
        return None
    if b.size != weight.shape[1] or b.ndim > 2 or (b.ndim == 2 and b.shape[0] != 1):
        return None
    return a, w, bias


def _elementwise_region(start: ir.Value):
    """(nodes, exit MatMul) when everything reading `start` is elementwise up to one MatMul's input 0."""
    nodes: list[ir.Node] = []
    inside = {start}
    grew = True
    while grew:  # a node joins once all its tensor inputs are inside (x * erf(x): both)
        grew = False
        for value in list(inside):
            for use in value.uses():
                node = use.node
                if node not in nodes and _region_op(node, inside, start.shape):
                    nodes.append(node)
                    inside.add(node.outputs[0])
                    grew = True
    exits = {use.node for value in inside for use in value.uses() if use.node not in nodes}
    if len(exits) != 1 or not nodes or any(v.is_graph_output() for v in inside):
        return None
    exit_node = exits.pop()
    if exit_node.op_type != "MatMul" or exit_node.inputs[0] not in inside or exit_node.inputs[1] in inside:
        return None
    return nodes, exit_node


def _region_op(node: ir.Node, inside: set, shape: ir.Shape) -> bool:
    if node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return False
    if node.op_type in ELEMENTWISE_UNARY:
        operands, extra = node.inputs[:1], node.inputs[1:]
    elif node.op_type in ELEMENTWISE_BINARY:
        operands, extra = [v for v in node.inputs if v in inside], [v for v in node.inputs if v not in inside]
    else:
        return False
    if not operands or any(v not in inside for v in operands):
        return False
    for value in extra:  # Clip's min/max, the scalar of a binary op
        c = _constant(value) if value is not None else np.zeros(())
        if c is None or c.size != 1 or c.ndim > 2:
            return False
    out = node.outputs[0]
    return out.shape is not None and out.shape.dims == shape.dims


def _rewrite_mlp(graph: ir.Graph, fresh, a: ir.Value, rows: int, first, nodes, second, out_dims) -> None:
    matmul1, add1, w1, b1 = first
    matmul2, add2, w2, b2 = second
    k, n1 = (int(d) for d in _constant(w1).shape)
    n2 = int(_constant(w2).shape[1])
    rows_shape = _initializer(graph, fresh(f"{add1.outputs[0].name}_rows"), np.array([rows, k], dtype=np.int64))
    out_shape = _initializer(graph, fresh(f"{add2.outputs[0].name}_shape"), np.array(out_dims, dtype=np.int64))
    def name(node: ir.Node, suffix: str) -> str | None:  # unnamed nodes are named by NameFixPass
        return f"{node.name}_{suffix}" if node.name else None

    to_rows = ir.Node("", "Reshape", [a, rows_shape], name=name(matmul1, "rows"))
    gemm1 = ir.Node("", "Gemm", [to_rows.outputs[0], w1, b1], name=name(matmul1, "gemm"))
    gemm2 = ir.Node("", "Gemm", [matmul2.inputs[0], w2, b2], name=name(matmul2, "gemm"))
    back = ir.Node("", "Reshape", [gemm2.outputs[0], out_shape], name=name(matmul2, "back"))
    ir.convenience.replace_nodes_and_values(graph, matmul1, [matmul1, add1], [to_rows, gemm1],
                                            [add1.outputs[0]], [gemm1.outputs[0]])
    ir.convenience.replace_nodes_and_values(graph, matmul2, [matmul2, add2], [gemm2, back],
                                            [add2.outputs[0]], [back.outputs[0]])
    # after the replacement, which copies the old values' (N-D) shapes onto the new ones
    for value, dims in ((to_rows.outputs[0], [rows, k]), (gemm1.outputs[0], [rows, n1]),
                        *((node.outputs[0], [rows, n1]) for node in nodes), (gemm2.outputs[0], [rows, n2])):
        value.shape, value.dtype = ir.Shape(dims), a.dtype
    back.outputs[0].shape = ir.Shape(out_dims)


def _initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, const_value=ir.tensor(array), shape=ir.Shape(array.shape),
                     type=ir.TensorType(ir.DataType.INT64))
    graph.register_initializer(value)
    return value
