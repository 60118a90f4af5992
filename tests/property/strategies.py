"""Hypothesis strategies that build small valid ONNX graphs around what each pass rewrites.

Every strategy draws a `Case`: a ModelProto (checked by onnx's checker with strict shape
inference before it is handed out), the keyword arguments for ``dmlopt.optimize`` (shapes,
dims, pass options) and extra input feeds to validate with (both branches of an If).
Tensors stay tiny (a few hundred elements) so one example costs a few milliseconds.

Shared pieces:
  * `Builder`: nodes, inputs, initializers, Constant nodes; names unique across subgraphs.
  * `embed`: the pattern straight in the main graph, in both branches of an If (condition a
    graph input, validated both ways), or in a Loop body (two iterations, scan output).
  * constants come from a numpy generator seeded by hypothesis, so shrinking still works on
    the seed, the shapes and the attributes.
"""

from __future__ import annotations

import dataclasses
import itertools
import string
from typing import Any, Callable, Sequence

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
FLOAT = TensorProto.FLOAT

# LeakyRelu / PRelu slopes: the degenerate ones first (the issue names 0, 1, negative, > 1).
SPECIAL_ALPHAS = (0.0, 1.0, -1.0, 0.5, 2.0, 0.01, 0.1, 0.2, -0.3, 1.5, 3.0, -2.5)
ALPHAS = st.one_of(st.sampled_from(SPECIAL_ALPHAS),
                   st.floats(-4.0, 4.0, allow_nan=False, width=32))


@dataclasses.dataclass
class Case:
    """One generated model and how to run the pass on it."""

    model: onnx.ModelProto
    options: dict[str, Any] = dataclasses.field(default_factory=dict)  # optimize(**options)
    feeds: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)  # extra validations
    label: str = ""
    tags: set[str] = dataclasses.field(default_factory=set)  # features a known bug needs (test_regressions)

    def __repr__(self) -> str:  # what hypothesis prints for a failing example
        return f"Case({self.label!r}, options={self.options!r})\n{onnx.printer.to_text(self.model)}"


class Builder:
    """A graph under construction; `sub()` gives a body builder sharing the name counter."""

    def __init__(self, seed: int, counter: itertools.count | None = None, opset: int = OPSET):
        self.rng = np.random.default_rng(seed)
        self.counter = counter if counter is not None else itertools.count()
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[str] = []
        self.initializers: list[onnx.TensorProto] = []
        self.parent: Builder | None = None
        self.domains: dict[str, int] = {}

    def name(self, prefix: str) -> str:
        return f"{prefix}{next(self.counter)}"

    def sub(self) -> "Builder":
        b = Builder(0, self.counter, self.opset)
        b.rng, b.parent = self.rng, self
        return b

    def root(self) -> "Builder":
        return self if self.parent is None else self.parent.root()

    def input(self, shape: Sequence[int | str], dtype: int = FLOAT, name: str | None = None) -> str:
        name = name or self.name("in")
        self.inputs.append(helper.make_tensor_value_info(name, dtype, list(shape)))
        return name

    def const(self, array: np.ndarray, *, as_node: bool = False, in_root: bool = True) -> str:
        """An initializer (of the main graph by default, read from bodies as outer values) or a
        Constant node here."""
        name = self.name("c")
        tensor = numpy_helper.from_array(np.asarray(array), name)
        if as_node:
            self.nodes.append(helper.make_node("Constant", [], [name], value=tensor))
        else:
            (self.root() if in_root else self).initializers.append(tensor)
        return name

    def weights(self, shape: Sequence[int], scale: float = 1.0, dtype=np.float32) -> np.ndarray:
        return (self.rng.standard_normal(shape) * scale).astype(dtype)

    def op(self, op_type: str, inputs: Sequence[str], n_out: int = 1, domain: str = "", **attrs) -> Any:
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.name("n_"), domain=domain,
                                           **attrs))
        if domain:
            self.root().domains.setdefault(domain, 1)
        return outs[0] if n_out == 1 else outs

    def graph(self, name: str, outputs: Sequence[onnx.ValueInfoProto]) -> onnx.GraphProto:
        return helper.make_graph(self.nodes, name, self.inputs, list(outputs), self.initializers)


def finish(b: Builder, outputs: Sequence[str], ir_version: int | None = None) -> onnx.ModelProto:
    """A model whose outputs carry inferred types and shapes; checked strictly."""
    opsets = [helper.make_opsetid("", b.opset)] + [helper.make_opsetid(d, v) for d, v in b.domains.items()]
    untyped = [helper.make_value_info(o, onnx.TypeProto()) for o in outputs]
    model = helper.make_model(b.graph("prop", untyped), opset_imports=opsets)
    if ir_version is not None:
        model.ir_version = ir_version
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    types = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input)}
    del model.graph.output[:]
    for o in outputs:
        model.graph.output.append(_typed(types.get(o), o))
    onnx.checker.check_model(model, full_check=True)
    return model


def finish_or_reject(b: Builder, outputs: Sequence[str]) -> onnx.ModelProto:
    """`finish`, or tell hypothesis the draw was invalid (a kernel larger than its input...)."""
    from hypothesis import assume

    try:
        return finish(b, outputs)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, ValueError):
        assume(False)
        raise AssertionError("unreachable")


def _typed(info: onnx.ValueInfoProto | None, name: str) -> onnx.ValueInfoProto:
    if info is None or not info.type.HasField("tensor_type") or not info.type.tensor_type.elem_type:
        raise ValueError(f"shape inference gave no type for {name}")
    if any(d.HasField("dim_value") and d.dim_value <= 0 for d in info.type.tensor_type.shape.dim):
        raise ValueError(f"{name} would be empty: the properties need elements to compare")
    out = onnx.ValueInfoProto()
    out.CopyFrom(info)
    return out


def body_output(b: Builder, name: str, like: onnx.ValueInfoProto | None = None, dtype: int = FLOAT):
    return helper.make_tensor_value_info(name, dtype, None) if like is None else like


# -- putting a pattern somewhere: main graph, If branches, Loop body ---------------------------

Pattern = Callable[[Builder, str], str]  # (builder, input value) -> output value


def embed(b: Builder, x: str, pattern: Pattern, where: str, feeds: list, x_dtype: int = FLOAT,
          tags: set | None = None) -> str:
    """Apply `pattern` to x in the main graph ('main'), in both branches of an If ('if') whose
    condition is a graph input (validated with both values), or in a two-iteration Loop ('loop',
    its cond input a constant True, or left out: 'loop-empty-cond' in `tags`)."""
    if where == "main":
        return pattern(b, x)
    if where == "if":
        cond = b.input([], TensorProto.BOOL, name=b.name("cond"))
        branches = []
        for label in ("then", "else"):
            sub = b.sub()
            y = pattern(sub, x)
            branches.append(sub.graph(label, [helper.make_tensor_value_info(y, x_dtype, None)]))
        feeds.extend([{cond: np.array(True)}, {cond: np.array(False)}])
        return b.op("If", [cond], then_branch=branches[0], else_branch=branches[1])
    if where == "loop":
        sub = b.sub()
        it, cond_in = sub.name("iter"), sub.name("cond_in")
        sub.inputs = [helper.make_tensor_value_info(it, TensorProto.INT64, []),
                      helper.make_tensor_value_info(cond_in, TensorProto.BOOL, [])]
        y = pattern(sub, x)
        cond_out = sub.op("Identity", [cond_in])
        body = sub.graph("body", [helper.make_tensor_value_info(cond_out, TensorProto.BOOL, []),
                                  helper.make_tensor_value_info(y, x_dtype, None)])
        trips = b.const(np.array(2, np.int64))
        cond = ""
        if b.rng.integers(0, 2):
            cond = b.const(np.array(True))
        elif tags is not None:
            tags.add("loop-empty-cond")
        return b.op("Loop", [trips, cond], body=body)
    raise ValueError(where)


WHERE = st.sampled_from(["main"] * 6 + ["if", "loop"])


def _seed():
    return st.integers(0, 2**32 - 1)


# -- LeakyRelu and the linear ops it follows ----------------------------------------------------


@st.composite
def conv_attrs(draw, rank: int, c_in: int, transpose: bool = False):
    """(W shape, attrs, groups, c_out) for a Conv/ConvTranspose with c_in input channels."""
    groups = draw(st.sampled_from([g for g in (1, 2, 3, 4) if c_in % g == 0]))
    per_group_out = draw(st.integers(1, 3))
    c_out = groups * per_group_out
    kernel = [draw(st.integers(1, 3)) for _ in range(rank)]
    strides = [draw(st.integers(1, 3)) for _ in range(rank)]
    dilations = [draw(st.sampled_from([1, 1, 2])) for _ in range(rank)]
    pads = [draw(st.integers(0, k - 1)) for k in kernel] + [draw(st.integers(0, k - 1)) for k in kernel]
    attrs: dict[str, Any] = dict(kernel_shape=kernel, strides=strides, dilations=dilations, group=groups)
    if draw(st.booleans()):
        attrs["pads"] = pads
    elif draw(st.booleans()):
        # ORT's CPU Conv rejects dilations with SAME_* at run time: VALID only then
        same_ok = all(d == 1 for d in dilations)
        attrs["auto_pad"] = draw(st.sampled_from(["SAME_UPPER", "SAME_LOWER", "VALID"] if same_ok else ["VALID"]))
    if transpose:
        w_shape = [c_in, per_group_out, *kernel]
        if draw(st.booleans()):
            attrs["output_padding"] = [draw(st.integers(0, max(0, min(s, d) - 1))) for s, d in zip(strides, dilations)]
    else:
        w_shape = [c_out, c_in // groups, *kernel]
    return w_shape, attrs, c_out


@st.composite
def linear_producer(draw, b: Builder, x: str, x_shape: list, transpose_ok: bool = True):
    """P(x; W, b) for P in Conv | ConvTranspose | Gemm | MatMul (x_shape is [N, C, spatial...]
    for the convolutions, [M, K] for Gemm, [..., K] for MatMul); returns (kind, output, c_out)."""
    rank = len(x_shape) - 2
    kinds = ["Conv", "ConvTranspose"] if rank >= 1 else []
    kinds += ["Gemm", "MatMul"] if len(x_shape) == 2 else ["MatMul"]
    if not transpose_ok and "ConvTranspose" in kinds:
        kinds.remove("ConvTranspose")
    kind = draw(st.sampled_from(kinds))
    constant_as_node = draw(st.sampled_from([False, False, False, True]))
    if kind in ("Conv", "ConvTranspose"):
        w_shape, attrs, c_out = draw(conv_attrs(rank, x_shape[1], transpose=kind == "ConvTranspose"))
        w = b.const(b.weights(w_shape, 0.5), as_node=constant_as_node)
        inputs = [x, w]
        if draw(st.booleans()):
            inputs.append(b.const(b.weights([c_out]), as_node=constant_as_node))
        return kind, b.op(kind, inputs, **attrs), c_out
    k = x_shape[-1]
    n = draw(st.integers(1, 6))
    if kind == "Gemm":
        trans_b = draw(st.booleans())
        w = b.const(b.weights([n, k] if trans_b else [k, n], 0.5), as_node=constant_as_node)
        attrs = dict(transB=int(trans_b))
        if draw(st.booleans()):
            attrs["alpha"] = draw(st.sampled_from([1.0, 0.5, -1.5, 2.0]))
        inputs = [x, w]
        if draw(st.booleans()):
            inputs.append(b.const(b.weights(draw(st.sampled_from([[n], [1, n], [1], [x_shape[0], n]]))),
                                  as_node=constant_as_node))
            if draw(st.booleans()):
                attrs["beta"] = draw(st.sampled_from([1.0, 0.0, -0.5, 3.0]))
        return kind, b.op("Gemm", inputs, **attrs), n
    w = b.const(b.weights([k, n], 0.5), as_node=constant_as_node)
    return kind, b.op("MatMul", [x, w]), n


@st.composite
def leaky_relu_cases(draw):
    """LeakyRelu after Conv/ConvTranspose/Gemm/MatMul (or after nothing linear), sometimes read
    by a second consumer or a graph output (conv-split must decline), sometimes followed by a
    second linear op of the same family (channel-fold), in the main graph or a body."""
    b = Builder(draw(_seed()))
    family = draw(st.sampled_from(["conv1d", "conv2d", "conv2d", "conv3d", "gemm", "matmul", "plain"]))
    batch = draw(st.sampled_from([1, 2, "N"]))
    if family.startswith("conv"):
        rank = int(family[4])
        spatial = [draw(st.integers(3, 6 if rank < 3 else 4)) for _ in range(rank)]
        c_in = draw(st.sampled_from([1, 2, 3, 4, 6]))
        x_shape = [batch, c_in, *spatial]
    elif family == "gemm":
        x_shape = [draw(st.integers(1, 4)), draw(st.integers(1, 6))]
    elif family == "matmul":
        x_shape = [batch, draw(st.integers(1, 4)), draw(st.integers(1, 6))]
    else:
        x_shape = [batch, draw(st.integers(1, 5)), draw(st.integers(1, 5))]
    dtype = draw(st.sampled_from([FLOAT] * 8 + [TensorProto.FLOAT16, TensorProto.DOUBLE]))
    if dtype != FLOAT and family != "plain":
        dtype = FLOAT  # Conv/Gemm weights here are float32; other types go through "plain"
    x = b.input(x_shape, dtype)
    alpha = draw(ALPHAS)
    where = draw(WHERE)
    extra_reader = draw(st.sampled_from([None] * 5 + ["output", "consumer"]))
    second = draw(st.sampled_from([None, None, "same-family"]))
    feeds: list = []
    side_outputs: list[str] = []

    def pattern(sb: Builder, v: str) -> str:
        if family == "plain":
            z = sb.op("Add", [v, sb.const(np.asarray(b.weights(x_shape[1:]), dtype=_np(dtype)))])
            kind, c = "Add", None
        else:
            kind, z, c = draw(linear_producer(sb, v, x_shape))
        if extra_reader == "consumer":
            side = sb.op("Sigmoid", [z])
            z2 = sb.op("LeakyRelu", [z], alpha=alpha)
            y = sb.op("Add", [z2, side])
        else:
            y = sb.op("LeakyRelu", [z], alpha=alpha)
            if extra_reader == "output" and sb is b:
                side_outputs.append(z)
        if second and kind in ("Conv", "ConvTranspose") and extra_reader is None:
            w_shape, attrs, _ = draw(conv_attrs(len(x_shape) - 2, c))
            y = sb.op("Conv", [y, sb.const(b.weights(w_shape, 0.5))], **attrs)
        elif second and kind in ("Gemm", "MatMul") and extra_reader is None:
            n = draw(st.integers(1, 5))
            y = sb.op("MatMul", [y, sb.const(b.weights([c, n], 0.5))])
        return y

    tags: set = set()
    y = embed(b, x, pattern, where, feeds, x_dtype=dtype, tags=tags)
    model = finish_or_reject(b, [y, *side_outputs])
    dims = {"N": draw(st.integers(1, 3))} if "N" in x_shape else {}
    return Case(model, {"dims": dims} if dims else {}, feeds,
                f"{family} {where} alpha={alpha} reader={extra_reader} second={second} dtype={dtype}", tags)


def _np(dtype: int):
    return helper.tensor_dtype_to_np_dtype(dtype)


# -- PRelu ---------------------------------------------------------------------------------------


@st.composite
def prelu_cases(draw):
    """PRelu with a slope that is one value in many shapes (rewritable), slopes that differ, a
    slope that is a graph input or computed, non-float32 types, broadcasts that grow x."""
    b = Builder(draw(_seed()))
    rank = draw(st.integers(1, 4))
    x_shape = [draw(st.integers(1, 4)) for _ in range(rank)]
    if draw(st.booleans()) and rank >= 2:
        x_shape[0] = "N"
    dtype = draw(st.sampled_from([FLOAT] * 6 + [TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.INT32]))
    x = b.input(x_shape, dtype)
    concrete = [1 if d == "N" else d for d in x_shape]
    # slope shape: unidirectionally broadcastable to x (PRelu's rule), sometimes growing x
    s_rank = draw(st.integers(0, rank))
    s_shape = [draw(st.sampled_from([1, concrete[rank - s_rank + i]])) for i in range(s_rank)]
    if draw(st.integers(0, 9)) == 0 and s_rank:
        s_shape = [2] + s_shape[1:] if concrete[rank - s_rank] == 1 else s_shape  # may grow x (declined)
    alpha = draw(ALPHAS)
    kind = draw(st.sampled_from(["uniform"] * 6 + ["differ", "input", "computed", "nonfinite"]))
    np_type = _np(dtype)
    if dtype == TensorProto.INT32:
        alpha = float(int(alpha))
    feeds: list = []
    if kind == "uniform":
        slope = b.const(np.full(s_shape, alpha, dtype=np_type), as_node=draw(st.booleans()))
    elif kind == "differ":
        values = np.full(s_shape, alpha, dtype=np_type)
        if values.size > 1:
            values.flat[-1] = alpha + 1
        slope = b.const(values)
    elif kind == "input":
        slope = b.input(s_shape, dtype)
    elif kind == "computed":
        slope = b.op("Abs", [b.const(np.full(s_shape, alpha, dtype=np_type))])
    else:
        slope = b.const(np.full(s_shape, np.inf if np_type != np.int32 else 1, dtype=np_type))
    where = draw(WHERE) if kind != "input" else "main"
    y = embed(b, x, lambda sb, v: sb.op("PRelu", [v, slope]), where, feeds, x_dtype=dtype)
    try:
        model = finish(b, [y])
    except Exception:  # noqa: BLE001 - a slope shape onnx rejects: draw again
        from hypothesis import assume

        assume(False)
    return Case(model, {}, feeds, f"{kind} slope{s_shape} x{x_shape} alpha={alpha} {where} dtype={dtype}")


# -- ConvTranspose ----------------------------------------------------------------------------


@st.composite
def conv_transpose_cases(draw):
    """ConvTranspose of any rank 1-3 with random kernels, strides, pads, output_padding, groups,
    dilations, auto_pad / output_shape, bias or not, an activation after it, dynamic dims."""
    b = Builder(draw(_seed()))
    rank = draw(st.sampled_from([2, 2, 2, 2, 1, 3]))  # DepthToSpace is 2-D: 1-D and 3-D are declined
    c_in = draw(st.sampled_from([1, 2, 3, 4]))
    spatial = [draw(st.integers(1, 5 if rank < 3 else 3)) for _ in range(rank)]
    dynamic = draw(st.sampled_from([None, None, "batch", "spatial"]))
    shape: list = [draw(st.integers(1, 2)), c_in, *spatial]
    dims: dict = {}
    if dynamic == "batch":
        dims["N"] = shape[0]
        shape[0] = "N"
    elif dynamic == "spatial":
        dims["H"] = spatial[0]
        shape[2] = "H"
    x = b.input(shape)
    groups = draw(st.sampled_from([g for g in (1, 2, 4) if c_in % g == 0]))
    per_group_out = draw(st.integers(1, 3))
    kernel = [draw(st.integers(1, 4)) for _ in range(rank)]
    same_stride = draw(st.sampled_from([True, True, True, False]))
    s0 = draw(st.integers(1, 3))
    strides = [s0 if same_stride else draw(st.integers(1, 3)) for _ in range(rank)]
    dilations = [draw(st.sampled_from([1] * 4 + [2])) for _ in range(rank)]
    attrs: dict[str, Any] = dict(kernel_shape=kernel, strides=strides, group=groups)
    if draw(st.booleans()) or any(d != 1 for d in dilations):
        attrs["dilations"] = dilations
    mode = draw(st.sampled_from(["pads"] * 5 + ["auto_pad", "output_shape", "none"]))
    if mode == "pads":
        attrs["pads"] = [draw(st.integers(0, k - 1)) for k in kernel] + [draw(st.integers(0, k - 1)) for k in kernel]
    elif mode == "auto_pad":
        same_ok = all(d == 1 for d in dilations)
        attrs["auto_pad"] = draw(st.sampled_from(["SAME_UPPER", "SAME_LOWER", "VALID"] if same_ok else ["VALID"]))
    elif mode == "output_shape":
        attrs["output_shape"] = [s * st_ for s, st_ in zip(spatial, strides)]
    if mode != "output_shape" and draw(st.booleans()):
        attrs["output_padding"] = [draw(st.integers(0, max(0, max(s, d) - 1))) for s, d in zip(strides, dilations)]
    w = b.const(b.weights([c_in, per_group_out, *kernel], 0.5), as_node=draw(st.sampled_from([False] * 3 + [True])))
    inputs = [x, w]
    if draw(st.booleans()):
        inputs.append(b.const(b.weights([groups * per_group_out])))
    activation = draw(st.sampled_from([None, None, "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Neg"]))
    where = draw(WHERE)
    feeds: list = []
    opset = draw(st.sampled_from([OPSET] * 5 + [11, 13, 20]))
    b.opset = opset

    def pattern(sb: Builder, v: str) -> str:
        y = sb.op("ConvTranspose", [v, *inputs[1:]], **attrs)
        if activation == "LeakyRelu":
            y = sb.op("LeakyRelu", [y], alpha=draw(ALPHAS))
        elif activation:
            y = sb.op(activation, [y])
        return y

    y = embed(b, x, pattern, where, feeds)
    try:
        model = finish(b, [y])
    except Exception:  # noqa: BLE001 - attributes that give an empty or negative output: draw again
        from hypothesis import assume

        assume(False)
    return Case(model, {"dims": dims} if dims else {}, feeds, f"rank{rank} {attrs} act={activation} {where} opset={opset}")


# -- constant folding and dead code (cleanup) ---------------------------------------------------

UNARY = ("Relu", "Neg", "Abs", "Sigmoid", "Tanh", "Identity", "Floor", "Softsign")
BINARY = ("Add", "Sub", "Mul", "Max", "Min")


@st.composite
def fold_cases(draw):
    """A random elementwise DAG over one input and small constants: constant-only subtrees
    (foldable), Identity chains, dead nodes, Shape/Size of static values, constant Reshape
    and Transpose round trips, Expand/Tile/ConstantOfShape of constants large enough for the
    size guard, an If on a constant or a computed condition."""
    b = Builder(draw(_seed()))
    rank = draw(st.integers(1, 3))
    shape = [draw(st.integers(1, 4)) for _ in range(rank)]
    x = b.input(shape)
    values = [x]  # all broadcast to `shape`
    consts = [b.const(b.weights(shape[rank - k:]), as_node=draw(st.booleans())) for k in range(draw(st.integers(1, 3)))]
    pool = values + consts
    feeds: list = []
    for _ in range(draw(st.integers(2, 8))):
        kind = draw(st.sampled_from(["unary", "binary", "binary", "const-only", "roundtrip", "shape", "big", "if",
                                     "dead", "cast"]))
        a = draw(st.sampled_from(pool))
        if kind == "unary":
            pool.append(b.op(draw(st.sampled_from(UNARY)), [a]))
        elif kind == "binary":
            pool.append(b.op(draw(st.sampled_from(BINARY)), [a, draw(st.sampled_from(pool))]))
        elif kind == "const-only":
            c1, c2 = draw(st.sampled_from(consts)), draw(st.sampled_from(consts))
            folded = b.op(draw(st.sampled_from(BINARY)), [b.op(draw(st.sampled_from(UNARY)), [c1]), c2])
            consts.append(folded)
            pool.append(b.op("Add", [a, folded]))
        elif kind == "roundtrip":
            flat = b.op("Reshape", [a, b.const(np.array([-1], np.int64))])
            back = b.op("Reshape", [flat, b.op("Shape", [a])]) if draw(st.booleans()) else None
            if back is None:
                perm = list(draw(st.permutations(range(rank))))
                t = b.op("Transpose", [a], perm=perm)
                back = b.op("Transpose", [t], perm=[perm.index(i) for i in range(rank)])
            pool.append(back)
        elif kind == "shape":
            size = b.op("Cast", [b.op("Size", [a])], to=FLOAT)
            dim = b.op("Cast", [b.op("Gather", [b.op("Shape", [x]), b.const(np.array(-1, np.int64))])], to=FLOAT)
            pool.append(b.op("Div", [b.op("Add", [a, size]), b.op("Add", [dim, b.const(np.array(1, np.float32))])]))
        elif kind == "big":
            side = draw(st.sampled_from([2, 32, 48]))  # 48*48*4 bytes = 9 KB > the 4 KB slack
            big = draw(st.sampled_from(["ConstantOfShape", "Expand", "Tile"]))
            if big == "ConstantOfShape":
                t = b.op("ConstantOfShape", [b.const(np.array([side, side], np.int64))],
                         value=numpy_helper.from_array(np.array([0.5], np.float32)))
            elif big == "Expand":
                t = b.op("Expand", [b.const(np.array([[0.25]], np.float32)), b.const(np.array([side, side], np.int64))])
            else:
                t = b.op("Tile", [b.const(np.full((1, 1), 2.0, np.float32)), b.const(np.array([side, side], np.int64))])
            s = b.op("ReduceSum", [t], keepdims=0)
            pool.append(b.op("Mul", [a, b.op("Div", [s, b.const(np.array(float(side * side), np.float32))])]))
        elif kind == "if":
            constant = draw(st.booleans())
            cond = b.const(np.array(draw(st.booleans()))) if constant else b.op(
                "ReduceMin", [b.op("Greater", [b.op("Abs", [a]), b.const(np.array(-1.0, np.float32))])], keepdims=0)
            branches = []
            for op in ("Relu", "Neg"):
                sub = b.sub()
                branches.append(sub.graph(op, [helper.make_tensor_value_info(sub.op(op, [a]), FLOAT, None)]))
            pool.append(b.op("If", [cond], then_branch=branches[0], else_branch=branches[1]))
        elif kind == "dead":
            b.op("Exp", [a])  # nothing reads it
        else:
            pool.append(b.op("Cast", [b.op("Cast", [a], to=TensorProto.DOUBLE)], to=FLOAT))
    outputs = list(dict.fromkeys([pool[-1], draw(st.sampled_from(pool[1:] if len(pool) > 1 else pool))]))
    outputs = [o for o in outputs if o not in consts] or [pool[-1]]
    outputs = [b.op("Identity", [b.op("Identity", [o])]) if draw(st.booleans()) else o for o in outputs]
    model = finish_or_reject(b, outputs)
    return Case(model, {}, feeds, f"shape{shape}")


# -- dynamic dims and the shape arithmetic they keep alive (freeze-shapes) -------------------------


@st.composite
def shape_chain_cases(draw):
    """x: [N, C, H] with N (and sometimes H) symbolic, read through shape chains: Reshape to
    Concat(Shape(x)[0], -1), Expand/ConstantOfShape of Shape(x), Range over a dim, Size, a
    Slice to a computed end, an If on Equal(Shape(x)[0], k); frozen by `dims`, by `shapes`, or
    not at all (the pass must then leave the model as it is)."""
    b = Builder(draw(_seed()))
    n, c, h = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    h_dynamic = draw(st.booleans())
    x = b.input(["N", c, "H" if h_dynamic else h])
    shape_x = b.op("Shape", [x])

    def dim(i):
        return b.op("Gather", [shape_x, b.const(np.array(i, np.int64))])

    def dim1(i):
        return b.op("Unsqueeze", [dim(i), b.const(np.array([0], np.int64))])

    y = x
    feeds: list = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flatten", "expand", "cos", "range", "size", "slice", "if", "reshape-back"]))
        if kind == "flatten":
            flat = b.op("Reshape", [y, b.op("Concat", [dim1(0), b.const(np.array([-1], np.int64))], axis=0)])
            y = b.op("Reshape", [b.op("Relu", [flat]), shape_x])
        elif kind == "expand":
            y = b.op("Add", [y, b.op("Expand", [b.const(b.weights([1, c, 1])), shape_x])])
        elif kind == "cos":
            y = b.op("Mul", [y, b.op("ConstantOfShape", [shape_x],
                                     value=numpy_helper.from_array(np.array([1.5], np.float32)))])
        elif kind == "range":
            r = b.op("Cast", [b.op("Range", [b.const(np.array(0, np.int64)), dim(2), b.const(np.array(1, np.int64))])],
                     to=FLOAT)
            y = b.op("Add", [y, r])
        elif kind == "size":
            y = b.op("Div", [y, b.op("Cast", [b.op("Size", [y])], to=FLOAT)])
        elif kind == "slice":
            end = b.op("Add", [b.op("Div", [dim1(2), b.const(np.array([2], np.int64))]), b.const(np.array([1], np.int64))])
            part = b.op("Slice", [y, b.const(np.array([0], np.int64)), end, b.const(np.array([2], np.int64))])
            y = b.op("Concat", [part, y], axis=2)
            shape_x = b.op("Shape", [y])
        elif kind == "if":
            cond = b.op("Equal", [dim(0), b.const(np.array(draw(st.integers(1, 3)), np.int64))])
            branches = []
            for op in ("Sigmoid", "Neg"):
                sub = b.sub()
                branches.append(sub.graph(op, [helper.make_tensor_value_info(sub.op(op, [y]), FLOAT, None)]))
            y = b.op("If", [cond], then_branch=branches[0], else_branch=branches[1])
        else:
            y = b.op("Reshape", [b.op("Reshape", [y, b.const(np.array([0, -1], np.int64))]), shape_x])
    model = finish_or_reject(b, [y])
    h_value = draw(st.integers(1, 4))
    how = draw(st.sampled_from(["dims", "dims", "shapes", "partial", "nothing"]))
    if how == "dims":
        options = {"dims": {"N": n, **({"H": h_value} if h_dynamic else {})}}
    elif how == "shapes":
        options = {"shapes": {x: [n, c, h_value if h_dynamic else h]}}
    elif how == "partial":
        options = {"dims": {"N": n}}
    else:
        options = {}
    return Case(model, options, feeds, f"N={n} C={c} H={'H' if h_dynamic else h} {how}")


# -- Einsum -------------------------------------------------------------------------------------


@st.composite
def einsum_cases(draw):
    """A random Einsum: 1-3 operands over labels a-f (sizes 1-4: size-1 broadcasting included),
    repeated labels (diagonals), an ellipsis with broadcast batch dims, implicit output ("no
    ->"), summed and permuted output labels, constant operands, a symbolic dim."""
    b = Builder(draw(_seed()))
    labels = "abcdef"
    sizes = {l: draw(st.integers(1, 4)) for l in labels}
    n_ops = draw(st.sampled_from([2, 2, 2, 1, 3]))
    operands = []
    for _ in range(n_ops):
        rank = draw(st.integers(0 if n_ops > 1 else 1, 4))
        ops = list(draw(st.lists(st.sampled_from(labels[:5]), min_size=rank, max_size=rank, unique=True)))
        if rank >= 2 and draw(st.integers(0, 9)) == 0:
            ops[-1] = ops[0]  # a diagonal (declined by the pass)
        operands.append(ops)
    ellipsis = draw(st.integers(0, 5)) == 0
    batch = [draw(st.sampled_from([1, 2, 3])) for _ in range(draw(st.integers(1, 2)))] if ellipsis else []
    used = list(dict.fromkeys(l for ops in operands for l in ops))
    implicit = draw(st.integers(0, 5)) == 0
    out = list(draw(st.permutations([l for l in used if draw(st.booleans())])))
    inputs, feeds, dims = [], [], {}
    symbolic = draw(st.integers(0, 4)) == 0
    sym_label = used[0] if used and symbolic else None
    for i, ops in enumerate(operands):
        shape: list = [sizes[l] for l in ops]
        if ellipsis:
            # right-aligned broadcast: some operands carry fewer (or size-1) batch dims
            mine = batch[len(batch) - draw(st.integers(0, len(batch))):]
            mine = [d if draw(st.booleans()) else 1 for d in mine]
            shape = mine + shape
        concrete = list(shape)
        if sym_label is not None and sym_label in ops and not ellipsis:
            shape[ops.index(sym_label)] = "S"
            dims["S"] = sizes[sym_label]
        if draw(st.sampled_from([False, False, True])) and "S" not in shape:
            inputs.append(b.const(b.weights(concrete)))
        else:
            inputs.append(b.input(shape))
        operands[i] = (["..."] if ellipsis else []) + ops
    lhs = ",".join("".join(ops) for ops in operands)
    equation = lhs if implicit else lhs + "->" + ("..." if ellipsis else "") + "".join(out)
    y = b.op("Einsum", inputs, equation=equation)
    if all(i.startswith("c") for i in inputs):
        y = b.op("Add", [y, b.op("ReduceSum", [b.input([1])], keepdims=1)])  # a graph input to feed
    model = finish_or_reject(b, [y])
    target = draw(st.sampled_from(["dml", "dml", "cuda", "cpu"]))
    ort_version = draw(st.sampled_from([None, "1.14", "1.18", "1.19", "1.23"])) if target == "dml" else None
    options: dict[str, Any] = {"target": target, "ort_version": ort_version}
    if dims:
        options["dims"] = dims
    return Case(model, options, feeds, f"{equation} sizes={sizes} {target} {ort_version}")


# -- Transposes around MatMul / Softmax / elementwise / reductions (transpose) -------------------


@st.composite
def transpose_cases(draw):
    """A chain over x of random Transposes, elementwise ops (unary; binary with a constant of a
    broadcast shape, or with a second Transposed input), Softmax/LogSoftmax on an axis,
    reductions (keepdims 0/1) and MatMul/Gemm, in the main graph or a body."""
    b = Builder(draw(_seed()))
    b.opset = draw(st.sampled_from([OPSET, OPSET, 13, 11]))
    rank = draw(st.integers(2, 4))
    shape = [draw(st.integers(1, 4)) for _ in range(rank)]
    x = b.input(shape)
    where = draw(st.sampled_from(["main"] * 5 + ["if"]))
    feeds: list = []
    steps = draw(st.lists(st.sampled_from(["transpose", "transpose", "unary", "binary-const", "binary-pair",
                                           "softmax", "reduce", "matmul"]), min_size=2, max_size=7))

    def pattern(sb: Builder, v: str) -> str:
        cur, shp = v, list(shape)
        for step in steps:
            r = len(shp)
            if step == "transpose":
                p = list(draw(st.permutations(range(r))))
                cur, shp = sb.op("Transpose", [cur], perm=p), [shp[i] for i in p]
            elif step == "unary":
                cur = sb.op(draw(st.sampled_from(["Relu", "Neg", "Sigmoid", "Abs"])), [cur])
            elif step == "binary-const":
                k = draw(st.integers(0, r))
                cshape = [d if draw(st.booleans()) else 1 for d in shp[r - k:]]
                const = sb.const(b.weights(cshape), as_node=draw(st.booleans()))
                ops = [cur, const] if draw(st.booleans()) else [const, cur]
                cur = sb.op(draw(st.sampled_from(["Add", "Mul", "Sub", "Max"])), ops)
            elif step == "binary-pair":
                p = list(draw(st.permutations(range(r))))
                inverse = [p.index(i) for i in range(r)]
                base = [shp[i] for i in inverse]
                other = sb.op("Transpose", [sb.const(b.weights(base))], perm=p)
                cur = sb.op("Add", [cur, other])
            elif step == "softmax":
                axis = draw(st.integers(-r, r - 1))
                cur = sb.op(draw(st.sampled_from(["Softmax", "LogSoftmax"])), [cur], axis=axis)
            elif step == "reduce":
                axes = sorted(draw(st.sets(st.integers(0, r - 1), min_size=1, max_size=r)))
                keep = draw(st.integers(0, 1))
                if keep == 0 and len(axes) == r:
                    axes = axes[:-1] or axes
                    if len(axes) == r:
                        keep = 1
                op = draw(st.sampled_from(["ReduceSum", "ReduceMean", "ReduceMax"]))
                axes_as_input = (op == "ReduceSum" and b.opset >= 13) or b.opset >= 18
                if axes_as_input:
                    cur = sb.op(op, [cur, sb.const(np.array(axes, np.int64))], keepdims=keep)
                else:
                    cur = sb.op(op, [cur], axes=axes, keepdims=keep)
                shp = [d for i, d in enumerate(shp) if i not in axes] if not keep else \
                    [1 if i in axes else d for i, d in enumerate(shp)]
            elif step == "matmul" and r >= 2:
                n = draw(st.integers(1, 4))
                if r == 2 and draw(st.booleans()):
                    w = sb.const(b.weights([n, shp[-1]]))
                    cur = sb.op("Gemm", [cur, w], transB=1)
                else:
                    cur = sb.op("MatMul", [cur, sb.const(b.weights([shp[-1], n]))])
                shp = shp[:-1] + [n]
        return cur

    y = embed(b, x, pattern, where, feeds)
    model = finish_or_reject(b, [y])
    return Case(model, {}, feeds, f"{shape} {steps} opset={b.opset} {where}")


# -- scaled dot-product attention (attention) -----------------------------------------------------


@st.composite
def attention_cases(draw):
    """Multi-head attention as exporters write it: q/k/v projections (separate, or one packed
    qkv MatMul split by Slice), heads cut by Reshape+Transpose, scores by MatMul (k transposed
    by the head Transpose or a separate one), a scalar scale on q, k or the scores (Mul or
    Div), an optional additive bias of several broadcast shapes, Softmax, the context MatMul
    and the head merge.  Variants the pass must decline: Softmax not over the last axis, a
    Where mask, probabilities also read elsewhere, a scale after the bias, symbolic dims."""
    b = Builder(draw(_seed()))
    batch, seq, heads, head = draw(st.integers(1, 2)), draw(st.integers(1, 5)), draw(st.integers(1, 3)), \
        draw(st.integers(1, 4))
    embed_dim = heads * head
    symbolic = draw(st.integers(0, 6)) == 0
    x = b.input(["B" if symbolic else batch, seq, embed_dim])
    packed = draw(st.booleans())
    variant = draw(st.sampled_from(["plain"] * 6 + ["softmax-axis", "where-mask", "probs-read", "scale-after-bias"]))
    scale_on = draw(st.sampled_from(["q", "k", "scores", "none"]))
    scale_op = draw(st.sampled_from(["Mul", "Div"]))
    bias = draw(st.sampled_from([None, None, "full", "heads", "seq"]))

    def split_heads(v, k_layout=False):
        r = b.op("Reshape", [v, b.const(np.array([0, seq, heads, head], np.int64))])
        return b.op("Transpose", [r], perm=[0, 2, 3, 1] if k_layout else [0, 2, 1, 3])

    if packed:
        qkv = b.op("MatMul", [x, b.const(b.weights([embed_dim, 3 * embed_dim], 0.5))])
        parts = [b.op("Slice", [qkv, b.const(np.array([i * embed_dim], np.int64)),
                                b.const(np.array([(i + 1) * embed_dim], np.int64)), b.const(np.array([2], np.int64))])
                 for i in range(3)]
    else:
        parts = [b.op("MatMul", [x, b.const(b.weights([embed_dim, embed_dim], 0.5))]) for _ in range(3)]
    q, k, v = parts
    scale = b.const(np.array(draw(st.sampled_from([0.5, 1 / np.sqrt(head), 2.0, 0.125])), np.float32))
    if scale_on == "q":
        q = b.op(scale_op, [q, scale])
    if scale_on == "k":
        k = b.op(scale_op, [k, scale])
    k_direct = draw(st.booleans())
    qh = split_heads(q)
    kh = split_heads(k, k_layout=True) if k_direct else b.op("Transpose", [split_heads(k)], perm=[0, 1, 3, 2])
    vh = split_heads(v)
    scores = b.op("MatMul", [qh, kh])
    if scale_on == "scores" and variant != "scale-after-bias":
        scores = b.op(scale_op, [scores, scale])
    if bias is not None:
        shape = {"full": [batch, heads, seq, seq], "heads": [1, heads, seq, seq], "seq": [seq, seq]}[bias]
        if symbolic and bias == "full":
            shape = [1, heads, seq, seq]
        scores = b.op("Add", [scores, b.const(b.weights(shape))])
    if variant == "scale-after-bias":
        scores = b.op("Mul", [scores, scale])
    if variant == "where-mask":
        mask = b.const(b.rng.integers(0, 2, (seq, seq)).astype(bool))
        scores = b.op("Where", [mask, scores, b.const(np.array(-1e4, np.float32))])
    probs = b.op("Softmax", [scores], axis=2 if variant == "softmax-axis" else -1)
    context = b.op("MatMul", [probs, vh])
    merged = b.op("Reshape", [b.op("Transpose", [context], perm=[0, 2, 1, 3]),
                              b.const(np.array([0, seq, embed_dim], np.int64))])
    y = b.op("MatMul", [merged, b.const(b.weights([embed_dim, embed_dim], 0.5))])
    outputs = [y] + ([b.op("ReduceSum", [probs], keepdims=0)] if variant == "probs-read" else [])
    model = finish_or_reject(b, outputs)
    target = draw(st.sampled_from(["cpu", "cuda", "dml", "dml"]))
    ort_version = draw(st.sampled_from([None, "1.14", "1.18", "1.23"])) if target == "dml" else None
    options: dict[str, Any] = {"target": target, "ort_version": ort_version}
    if symbolic:
        options["dims"] = {"B": batch}
    return Case(model, options, [], f"B{batch} S{seq} N{heads} H{head} packed={packed} {variant} scale={scale_on}/"
                                    f"{scale_op} bias={bias} k_direct={k_direct} {target} {ort_version}")


# -- what DirectML leaves on the CPU (copies) -----------------------------------------------------


@st.composite
def copies_cases(draw):
    """n-ary Sum/Max/Min/Mean (1-5 inputs, broadcasting), Gelu (opset 20, none/tanh),
    LayerNormalization with or without bias and with Mean/InvStdDev used or not, Cast pairs
    (lossless and lossy, float and int), an If on a constant or computed condition."""
    b = Builder(draw(_seed()))
    kind = draw(st.sampled_from(["nary", "nary", "gelu", "layernorm", "cast", "if"]))
    b.opset = 20 if kind == "gelu" else draw(st.sampled_from([OPSET, 18, 20]))
    rank = draw(st.integers(1, 3))
    shape = [draw(st.integers(1, 4)) for _ in range(rank)]
    dtype = draw(st.sampled_from([FLOAT] * 4 + [TensorProto.INT64, TensorProto.INT32])) if kind in ("nary", "cast") \
        else FLOAT
    x = b.input(shape, dtype)
    outputs = []
    feeds: list = []
    if kind == "nary":
        op = draw(st.sampled_from(["Sum", "Max", "Min", "Mean"]))
        if dtype != FLOAT and op in ("Sum", "Mean"):
            dtype = FLOAT
            x = b.input(shape, FLOAT)
        args = [x]
        for _ in range(draw(st.integers(0, 4))):
            k = draw(st.integers(0, rank))
            cshape = [d if draw(st.booleans()) else 1 for d in shape[rank - k:]]
            values = b.weights(cshape, 3.0)
            args.append(b.const(values.astype(_np(dtype)) if dtype == FLOAT else np.round(values).astype(_np(dtype)))
                        if draw(st.booleans()) else b.input(cshape, dtype))
        outputs.append(b.op(op, draw(st.permutations(args))))
    elif kind == "gelu":
        outputs.append(b.op("Gelu", [x], approximate=draw(st.sampled_from(["none", "tanh"]))))
    elif kind == "layernorm":
        axis = draw(st.integers(-rank, rank - 1))
        norm_shape = shape[axis:] if axis < 0 else shape[axis:]
        inputs = [x, b.const(b.weights(norm_shape))]
        if draw(st.booleans()):
            inputs.append(b.const(b.weights(norm_shape) if draw(st.booleans()) else np.zeros(norm_shape, np.float32)))
        n_out = draw(st.integers(1, 3))
        outs = b.op("LayerNormalization", inputs, n_out=n_out, axis=axis, epsilon=1e-5)
        outs = [outs] if n_out == 1 else outs
        outputs.append(outs[0])
        if n_out > 1 and draw(st.booleans()):
            outputs.append(outs[draw(st.integers(1, n_out - 1))])  # a used Mean/InvStdDev: declined
    elif kind == "cast":
        mid = draw(st.sampled_from([TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.INT32,
                                    TensorProto.FLOAT, TensorProto.INT8, TensorProto.BOOL]))
        y = b.op("Cast", [b.op("Cast", [x], to=mid)], to=dtype)
        outputs.append(b.op("Add", [y, y]) if dtype != TensorProto.BOOL else y)
    else:
        constant = draw(st.booleans())
        cond = b.const(np.array(draw(st.booleans()))) if constant else b.input([], TensorProto.BOOL)
        if not constant:
            feeds.extend([{cond: np.array(True)}, {cond: np.array(False)}])
        branches = []
        for op in ("Relu", "Sigmoid"):
            sub = b.sub()
            branches.append(sub.graph(op, [helper.make_tensor_value_info(sub.op(op, [x]), FLOAT, None)]))
        outputs.append(b.op("If", [cond], then_branch=branches[0], else_branch=branches[1]))
    model = finish_or_reject(b, outputs)
    ort_version = draw(st.sampled_from([None, "1.14", "1.18", "1.23"]))
    return Case(model, {"target": "dml", "ort_version": ort_version}, feeds,
                f"{kind} shape={shape} dtype={dtype} opset={b.opset} ort={ort_version}")


# -- float16 (fp16) -------------------------------------------------------------------------------


@st.composite
def fp16_cases(draw):
    """A small network of float32 ops fp16 converts or keeps: Conv, MatMul/Gemm, Add/Mul with
    constants, Relu/Sigmoid/Tanh, Softmax, LayerNormalization, ReduceMean, Resize, Concat,
    a Shape->Cast->Div index computation (kept float32), Range (kept), an If (kept)."""
    b = Builder(draw(_seed()))
    b.opset = draw(st.sampled_from([OPSET, 18]))
    c, h = draw(st.integers(1, 4)), draw(st.integers(2, 5))
    x = b.input([1, c, h, h])
    y = x
    feeds: list = []
    for _ in range(draw(st.integers(1, 5))):
        step = draw(st.sampled_from(["conv", "act", "affine", "softmax", "layernorm", "reduce", "resize", "concat",
                                     "index", "range", "if", "matmul"]))
        if step == "conv":
            y = b.op("Conv", [y, b.const(b.weights([c, c, 3, 3], 0.3)), b.const(b.weights([c]))], pads=[1, 1, 1, 1])
        elif step == "act":
            y = b.op(draw(st.sampled_from(["Relu", "Sigmoid", "Tanh", "LeakyRelu", "Abs"])), [y])
        elif step == "affine":
            y = b.op(draw(st.sampled_from(["Add", "Mul", "Sub"])), [y, b.const(b.weights([c, 1, 1]))])
        elif step == "softmax":
            y = b.op("Softmax", [y], axis=-1)
        elif step == "layernorm":
            y = b.op("LayerNormalization", [y, b.const(b.weights([h])), b.const(b.weights([h]))], axis=-1)
        elif step == "reduce":
            y = b.op("Add", [y, b.op("ReduceMean", [y], axes=[2, 3], keepdims=1) if b.opset < 18 else
                             b.op("ReduceMean", [y, b.const(np.array([2, 3], np.int64))], keepdims=1)])
        elif step == "resize":
            r = b.op("Resize", [y, "", b.const(np.array([1, 1, 2, 2], np.float32))], mode="nearest")
            y = b.op("MaxPool", [r], kernel_shape=[2, 2], strides=[2, 2])
        elif step == "concat":
            y = b.op("Slice", [b.op("Concat", [y, b.op("Neg", [y])], axis=1), b.const(np.array([0], np.int64)),
                               b.const(np.array([c], np.int64)), b.const(np.array([1], np.int64))])
        elif step == "index":
            n = b.op("Cast", [b.op("Gather", [b.op("Shape", [y]), b.const(np.array(3, np.int64))])], to=FLOAT)
            y = b.op("Div", [y, b.op("Floor", [b.op("Div", [n, b.const(np.array(2.0, np.float32))])])]) if h >= 2 else y
        elif step == "range":
            r = b.op("Range", [b.const(np.array(0.0, np.float32)), b.const(np.array(float(h), np.float32)),
                               b.const(np.array(1.0, np.float32))])
            y = b.op("Add", [y, b.op("Mul", [r, b.const(np.array(0.1, np.float32))])])
        elif step == "if":
            cond = b.input([], TensorProto.BOOL)
            feeds.extend([{cond: np.array(True)}, {cond: np.array(False)}])
            branches = []
            for op in ("Relu", "Tanh"):
                sub = b.sub()
                branches.append(sub.graph(op, [helper.make_tensor_value_info(sub.op(op, [y]), FLOAT, None)]))
            y = b.op("If", [cond], then_branch=branches[0], else_branch=branches[1])
        else:
            y = b.op("MatMul", [y, b.const(b.weights([h, h], 0.4))])
    model = finish_or_reject(b, [y])
    keep_io = draw(st.booleans())
    return Case(model, {"fp16": True, "keep_io_types": keep_io}, feeds, f"c={c} h={h} keep_io={keep_io}")


# -- Linear layers: Add(MatMul(a, W), b) (linear-gemm) ---------------------------------------------


@st.composite
def linear_cases(draw):
    """Linear layers as exporters write them: Add(MatMul(a, W), b) with a of rank 2-4, the bias
    of shape [N], [1, N], a scalar or one of a's rows (declined), on either side of the Add;
    next to view ops (Reshape/Flatten) or not; the transformer MLP Linear -> act -> Linear
    with Gelu-style or Relu activations; a dynamic batch (declined unless frozen)."""
    b = Builder(draw(_seed()))
    rank = draw(st.integers(2, 4))
    lead = [draw(st.integers(1, 3)) for _ in range(rank - 2)]
    m, k = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    shape: list = [*lead, m, k]
    dynamic = draw(st.integers(0, 5)) == 0
    dims = {}
    if dynamic:
        dims["B"] = shape[0]
        shape[0] = "B"
    x = b.input(shape)
    concrete = [dims.get(d, d) if isinstance(d, str) else d for d in shape]
    v = x
    if draw(st.booleans()) and rank > 2:  # a view op before the Linear
        v = b.op("Reshape", [b.op("Relu", [v]), b.const(np.array([0] * (rank - 1) + [-1], np.int64))])

    def linear(a, k_in):
        n = draw(st.integers(1, 5))
        y = b.op("MatMul", [a, b.const(b.weights([k_in, n], 0.5))])
        bias_shape = draw(st.sampled_from([[n], [n], [1, n], [], [concrete[-2], n]]))
        bias = b.const(b.weights(bias_shape))
        return b.op("Add", [y, bias] if draw(st.booleans()) else [bias, y]), n

    y, n = linear(v, k)
    if draw(st.booleans()):  # an MLP: act between two Linears
        act = draw(st.sampled_from(["Relu", "Sigmoid", "Tanh", "gelu-erf", "mul-const"]))
        if act == "gelu-erf":
            e = b.op("Erf", [b.op("Div", [y, b.const(np.array(1.4142135, np.float32))])])
            y = b.op("Mul", [b.op("Mul", [y, b.op("Add", [e, b.const(np.array(1.0, np.float32))])]),
                             b.const(np.array(0.5, np.float32))])
        elif act == "mul-const":
            y = b.op("Mul", [y, b.const(b.weights([1, n]))])
        else:
            y = b.op(act, [y])
        y, n = linear(y, n)
    if draw(st.booleans()) and rank > 2:  # a view op after
        y = b.op("Reshape", [y, b.const(np.array([0, -1], np.int64))])
    model = finish_or_reject(b, [y])
    freeze = dynamic and draw(st.booleans())
    return Case(model, {"dims": dims} if freeze else {}, [], f"{shape} dynamic={dynamic} frozen={freeze}")
