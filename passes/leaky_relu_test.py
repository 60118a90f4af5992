"""leaky-relu: every strategy is exact for every alpha, or declines with a reason."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import dmlopt
from dmlopt.passes import PassContext
from dmlopt.passes.leaky_relu import STRATEGIES, LeakyReluPass, fold_layout, relu_linear_cost
from dmlopt.engine.pipeline import check_model, op_counts

REWRITING = [s for s in STRATEGIES if s != "keep"]
ALPHAS = st.sampled_from([0.0, 1.0, -0.5, 2.5, 0.01, 0.2]) | st.floats(-3, 3, allow_nan=False, width=32)
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
rng = np.random.default_rng(0)


# -- graph builders --------------------------------------------------------------------------------

def make_model(nodes, inputs, outputs, initializers=None, opset=17) -> onnx.ModelProto:
    """inputs: {name: shape}; outputs: {name: rank}; initializers: {name: array}."""
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [f"{n}{i}" for i in range(r)]) for n, r in outputs.items()],
        [numpy_helper.from_array(np.asarray(a, dtype=np.float32), n) for n, a in (initializers or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def weights(*shape):
    return rng.standard_normal(shape).astype(np.float32) * 0.5


def conv_leaky(alpha, cin=3, cout=4, size=(6, 5), groups=1, kernel=3, dilations=(1, 1), strides=(1, 1), pads=1,
               bias=True):
    inits = {"w": weights(cout, cin // groups, kernel, kernel)}
    conv_inputs = ["x", "w"]
    if bias:
        inits["b"] = weights(cout)
        conv_inputs.append("b")
    nodes = [helper.make_node("Conv", conv_inputs, ["z"], name="conv", group=groups, dilations=list(dilations),
                              strides=list(strides), pads=[pads] * 4),
             helper.make_node("LeakyRelu", ["z"], ["y"], name="leaky", alpha=alpha)]
    return make_model(nodes, {"x": [1, cin, *size]}, {"y": 4}, inits)


def rewrite(proto, strategy, target="cpu"):
    original = dmlopt.load(proto)
    p = LeakyReluPass(PassContext(target=target, options={"leaky_relu": strategy}))
    result = p(original.clone())
    check_model(result.model, "leaky-relu")
    return original, result.model, p


def assert_exact(original, rewritten):
    v = dmlopt.validate(original, rewritten)
    assert v.passed, v.to_table()


def compute_counts(model):
    return {op: n for op, n in op_counts(model).items() if op != "Constant"}


def sites(p, action):
    return [s for s in p.sites if s.action == action]


# -- degenerate alphas ---------------------------------------------------------------------------------

@pytest.mark.parametrize("strategy", REWRITING)
def test_alpha_zero_is_relu_and_alpha_one_is_identity(strategy):
    original, out, p = rewrite(conv_leaky(0.0), strategy)
    assert compute_counts(out) == {"Conv": 1, "Relu": 1}
    assert_exact(original, out)
    original, out, p = rewrite(conv_leaky(1.0), strategy)
    assert compute_counts(out) == {"Conv": 1, "Identity": 1}
    assert_exact(original, out)
    (site,) = p.sites
    assert site.action == "rewrote" and site.extra["strategy"] == strategy and site.extra["alpha"] == 1.0


def test_keep_changes_nothing_and_logs_each_site():
    original, out, p = rewrite(conv_leaky(0.1), "keep")
    assert compute_counts(out) == {"Conv": 1, "LeakyRelu": 1}
    assert [(s.action, s.extra["strategy"]) for s in p.sites] == [("kept", "keep")]


# -- decompose ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("alpha, op", [(0.1, "Max"), (-0.5, "Max"), (0.999, "Max"), (2.5, "Min"), (1.001, "Min")])
def test_decompose_uses_max_below_one_and_min_above(alpha, op):
    original, out, p = rewrite(conv_leaky(alpha), "decompose")
    assert compute_counts(out) == {"Conv": 1, "Mul": 1, op: 1}
    assert_exact(original, out)
    assert p.sites[0].extra["form"] == f"{op}(z, a*z)"


# -- relu-split ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("alpha, expected", [
    (0.5, {"Relu": 1, "Add": 1, "Mul": 1}),   # 0.5*(Relu(z) + z)
    (2.0, {"Relu": 1, "Sub": 1, "Mul": 1}),   # 2z - Relu(z)
    (-1.0, {"Relu": 1, "Sub": 1, "Mul": 1}),  # 2Relu(z) - z
    (0.1, {"Relu": 2, "Mul": 1, "Sub": 1}),   # Relu(z) - Relu(-0.1z)
    (3.0, {"Relu": 2, "Mul": 1, "Sub": 1}),
    (-0.5, {"Relu": 2, "Mul": 1, "Add": 1}),  # Relu(z) + Relu(-0.5z)
])
def test_relu_split_takes_the_cheaper_form(alpha, expected):
    original, out, p = rewrite(conv_leaky(alpha), "relu-split")
    assert compute_counts(out) == {"Conv": 1, **expected}
    assert sum(expected.values()) == min(relu_linear_cost(alpha), 4)
    assert_exact(original, out)


# -- conv-split ----------------------------------------------------------------------------------------

def conv_transpose_leaky(alpha, cin=4, cout=3, groups=1, kernel=4, stride=2, pads=1, output_padding=0, bias=True):
    inits = {"w": weights(cin, cout // groups, kernel, kernel)}
    inputs = ["x", "w"]
    if bias:
        inits["b"] = weights(cout)
        inputs.append("b")
    nodes = [helper.make_node("ConvTranspose", inputs, ["z"], name="convt", group=groups, strides=[stride] * 2,
                              pads=[pads] * 4, output_padding=[output_padding] * 2),
             helper.make_node("LeakyRelu", ["z"], ["y"], name="leaky", alpha=alpha)]
    return make_model(nodes, {"x": [1, cin, 5, 4]}, {"y": 4}, inits)


def gemm_leaky(alpha, trans_a=0, trans_b=0, bias_shape=(5,), gemm_alpha=1.0, beta=1.0, m=3, k=4, n=5):
    inits = {"B": weights(*((n, k) if trans_b else (k, n)))}
    inputs = ["a", "B"]
    if bias_shape is not None:
        inits["C"] = weights(*bias_shape)
        inputs.append("C")
    nodes = [helper.make_node("Gemm", inputs, ["z"], name="gemm", transA=trans_a, transB=trans_b, alpha=gemm_alpha,
                              beta=beta),
             helper.make_node("LeakyRelu", ["z"], ["y"], name="leaky", alpha=alpha)]
    return make_model(nodes, {"a": [k, m] if trans_a else [m, k]}, {"y": 2}, inits)


def matmul_leaky(alpha, constant_side=1, batch=(2,), k=4, n=5):
    if constant_side == 1:
        inputs, inits, x_shape = ["x", "W"], {"W": weights(k, n)}, [*batch, 3, k]
    else:
        inputs, inits, x_shape = ["W", "x"], {"W": weights(3, k)}, [*batch, k, n]
    nodes = [helper.make_node("MatMul", inputs, ["z"], name="matmul"),
             helper.make_node("LeakyRelu", ["z"], ["y"], name="leaky", alpha=alpha)]
    return make_model(nodes, {"x": x_shape}, {"y": len(batch) + 2}, inits)


@pytest.mark.parametrize("build, producer", [
    (conv_leaky, "Conv"), (conv_transpose_leaky, "ConvTranspose"), (gemm_leaky, "Gemm"), (matmul_leaky, "MatMul")])
@pytest.mark.parametrize("alpha, combine", [(0.1, "Add"), (-0.5, "Add"), (2.5, "Sub")])
def test_conv_split_makes_two_producers_and_one_relu(build, producer, alpha, combine):
    original, out, p = rewrite(build(alpha), "conv-split")
    assert compute_counts(out) == {producer: 2, "Relu": 1, combine: 1}
    assert_exact(original, out)
    (site,) = p.sites
    assert site.action == "rewrote" and site.extra["strategy"] == "conv-split" and site.extra["alpha"] == pytest.approx(alpha)
    relu = next(n for n in out.graph if n.op_type == "Relu")
    assert relu.inputs[0].producer().op_type == producer  # the branch that fuses: Relu right after the producer


def test_conv_split_gemm_scales_alpha_and_beta_not_weights():
    original, out, _ = rewrite(gemm_leaky(0.2, trans_a=1, trans_b=1, bias_shape=(3, 5), gemm_alpha=0.7, beta=1.3), "conv-split")
    gemms = [n for n in out.graph if n.op_type == "Gemm"]
    assert sorted(round(g.attributes.get_float("alpha"), 5) for g in gemms) == [round(0.7 * 0.2, 5), round(0.7 * 0.8, 5)]
    assert all(g.inputs[1].name == "B" for g in gemms)
    assert_exact(original, out)


def test_conv_split_on_matmul_with_constant_on_the_left():
    original, out, _ = rewrite(matmul_leaky(0.3, constant_side=0), "conv-split")
    assert compute_counts(out) == {"MatMul": 2, "Relu": 1, "Add": 1}
    assert_exact(original, out)


def test_conv_split_drops_the_old_weights():
    _, out, _ = rewrite(conv_leaky(0.1), "conv-split")
    assert "w" not in out.graph.initializers and "b" not in out.graph.initializers
    assert len(out.graph.initializers) == 4


# -- channel-fold --------------------------------------------------------------------------------------

def conv_chain(alpha, producer="Conv", consumer="Conv", c=4, groups_p=1, groups_q=1, bias=True, cin=2, cout=3):
    """x -> P -> LeakyRelu -> Q -> y with c channels in between."""
    def layer(op, name, ci, co, groups, x, y):
        k = 3
        w = weights(co, ci // groups, k, k) if op == "Conv" else weights(ci, co // groups, k, k)
        inits = {f"{name}.w": w}
        inputs = [x, f"{name}.w"]
        if bias:
            inits[f"{name}.b"] = weights(co)
            inputs.append(f"{name}.b")
        return helper.make_node(op, inputs, [y], name=name, group=groups, pads=[1] * 4), inits

    p_node, p_inits = layer(producer, "p", cin * groups_p, c, groups_p, "x", "z")
    q_node, q_inits = layer(consumer, "q", c, cout * groups_q, groups_q, "y0", "y")
    nodes = [p_node, helper.make_node("LeakyRelu", ["z"], ["y0"], name="leaky", alpha=alpha), q_node]
    return make_model(nodes, {"x": [1, cin * groups_p, 5, 6]}, {"y": 4}, {**p_inits, **q_inits})


@pytest.mark.parametrize("producer, consumer", [("Conv", "Conv"), ("Conv", "ConvTranspose"),
                                                ("ConvTranspose", "Conv"), ("ConvTranspose", "ConvTranspose")])
@pytest.mark.parametrize("alpha", [0.1, -0.5, 2.5])
def test_channel_fold_doubles_the_channels_between(producer, consumer, alpha):
    original, out, p = rewrite(conv_chain(alpha, producer, consumer), "channel-fold")
    assert compute_counts(out) == ({producer: 1, "Relu": 1, consumer: 1} if producer != consumer
                                   else {producer: 2, "Relu": 1})
    assert_exact(original, out)
    relu = next(n for n in out.graph if n.op_type == "Relu")
    assert relu.inputs[0].producer().op_type == producer
    assert sites(p, "rewrote")[0].extra["strategy"] == "channel-fold"


@pytest.mark.parametrize("groups_p, groups_q", [(2, 1), (1, 2), (2, 4), (4, 2), (4, 4), (4, 1)])
def test_channel_fold_keeps_group_structure(groups_p, groups_q):
    original, out, _ = rewrite(conv_chain(0.2, c=4, groups_p=groups_p, groups_q=groups_q), "channel-fold")
    assert compute_counts(out) == {"Conv": 2, "Relu": 1}
    assert_exact(original, out)


def test_fold_layout_puts_each_group_in_one_run():
    positive, negative = fold_layout(6, 2, 3)  # producer groups of 3 channels, consumer groups of 2
    assert positive.tolist() == [0, 2, 4, 6, 8, 10] and negative.tolist() == [1, 3, 5, 7, 9, 11]
    positive, negative = fold_layout(4, 2, 1)
    assert positive.tolist() == [0, 1, 4, 5] and negative.tolist() == [2, 3, 6, 7]


def dense_chain(alpha, producer="Gemm", consumer="MatMul", trans_b_p=0, trans_b_q=0, bias_shape=(4,), rows=2,
                trans_a_q=0):
    """x [rows, 3] -> P -> [rows, 4] -> LeakyRelu -> Q -> [rows, 5] (transA on Q needs rows = 4)."""
    nodes, inits = [], {}
    if producer == "Gemm":
        inits["p.w"] = weights(4, 3) if trans_b_p else weights(3, 4)
        inputs = ["x", "p.w"]
        if bias_shape is not None:
            inits["p.b"] = weights(*bias_shape)
            inputs.append("p.b")
        nodes.append(helper.make_node("Gemm", inputs, ["z"], name="p", transB=trans_b_p, alpha=0.9, beta=1.1))
    else:
        inits["p.w"] = weights(3, 4)
        nodes.append(helper.make_node("MatMul", ["x", "p.w"], ["z"], name="p"))
    nodes.append(helper.make_node("LeakyRelu", ["z"], ["y0"], name="leaky", alpha=alpha))
    if consumer == "Gemm":
        inits["q.w"] = weights(5, 4) if trans_b_q else weights(4, 5)
        inits["q.b"] = weights(5)
        nodes.append(helper.make_node("Gemm", ["y0", "q.w", "q.b"], ["y"], name="q", transA=trans_a_q, transB=trans_b_q))
    else:
        inits["q.w"] = weights(4, 5)
        nodes.append(helper.make_node("MatMul", ["y0", "q.w"], ["y"], name="q"))
    return make_model(nodes, {"x": [rows, 3]}, {"y": 2}, inits)


@pytest.mark.parametrize("producer, consumer, trans_b_p, trans_b_q, bias_shape", [
    ("Gemm", "MatMul", 0, 0, (4,)), ("Gemm", "Gemm", 1, 1, (1, 4)), ("MatMul", "Gemm", 0, 1, None),
    ("MatMul", "MatMul", 0, 0, None), ("Gemm", "Gemm", 0, 0, ())])
def test_channel_fold_dense(producer, consumer, trans_b_p, trans_b_q, bias_shape):
    original, out, _ = rewrite(dense_chain(-0.3, producer, consumer, trans_b_p, trans_b_q, bias_shape), "channel-fold")
    assert compute_counts(out).get("Relu") == 1 and "LeakyRelu" not in compute_counts(out)
    assert_exact(original, out)


def test_channel_fold_declines_a_bias_that_varies_by_row():
    _, out, p = rewrite(dense_chain(0.1, "Gemm", "MatMul", bias_shape=(2, 4)), "channel-fold")
    assert compute_counts(out)["LeakyRelu"] == 1
    assert "not one value per output channel" in sites(p, "declined")[0].detail


def test_channel_fold_declines_without_a_linear_consumer():
    _, out, p = rewrite(conv_leaky(0.1), "channel-fold")
    assert compute_counts(out) == {"Conv": 1, "LeakyRelu": 1}
    (site,) = p.sites
    assert site.action == "declined" and "consumers: none" in site.detail


def test_channel_fold_declines_a_shared_leaky_output():
    model = conv_chain(0.1)
    model.graph.node.append(helper.make_node("Relu", ["y0"], ["r"], name="other"))
    model.graph.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 4, 5, 6]))
    _, out, p = rewrite(model, "channel-fold")
    assert compute_counts(out)["LeakyRelu"] == 1
    assert "the LeakyRelu output has 2 consumers" in sites(p, "declined")[0].detail


def test_channel_fold_declines_gemm_consumer_with_trans_a():
    _, out, p = rewrite(dense_chain(0.1, "MatMul", "Gemm", rows=4, trans_a_q=1), "channel-fold")
    assert compute_counts(out)["LeakyRelu"] == 1
    assert "transA=1" in sites(p, "declined")[0].detail


def test_channel_fold_chains_through_a_cnn():
    original, out, p = rewrite(dmlopt.load(BUNDLED_CNN), "channel-fold")
    assert compute_counts(out) == {"Conv": 6, "ConvTranspose": 1, "Relu": 6}
    conv_channels = [n.inputs[1].const_value.shape[0] for n in out.graph if n.op_type == "Conv"]
    assert conv_channels == [32] * 6  # 16 channels, each doubled
    assert_exact(original, out)


# -- declines ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["conv-split", "channel-fold"])
def test_producer_with_two_consumers_is_declined(strategy):
    model = conv_chain(0.1)
    model.graph.node.append(helper.make_node("Relu", ["z"], ["r"], name="other"))
    model.graph.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 4, 5, 6]))
    original, out, p = rewrite(model, strategy)
    assert compute_counts(out)["LeakyRelu"] == 1
    (site,) = sites(p, "declined")
    assert site.node == "leaky" and "the Conv output has 2 consumers" in site.detail
    assert_exact(original, out)


def test_conv_split_declines_non_constant_weights_and_other_producers():
    nodes = [helper.make_node("Conv", ["x", "w"], ["z"], name="conv"),
             helper.make_node("LeakyRelu", ["z"], ["y"], name="leaky", alpha=0.1),
             helper.make_node("Add", ["y", "y"], ["s"], name="add"),
             helper.make_node("LeakyRelu", ["s"], ["t"], name="leaky2", alpha=0.1)]
    model = make_model(nodes, {"x": [1, 2, 4, 4], "w": [3, 2, 1, 1]}, {"t": 4})
    _, out, p = rewrite(model, "conv-split")
    assert compute_counts(out)["LeakyRelu"] == 2
    reasons = {s.node: s.detail for s in sites(p, "declined")}
    assert reasons["leaky"] == "Conv weight is not a constant"
    assert "input comes from Add" in reasons["leaky2"]


def test_unknown_input_type_is_inferred():
    _, out, p = rewrite(conv_leaky(0.1), "decompose")  # no value_info for z: shape inference supplies it
    assert sites(p, "rewrote")


# -- subgraphs ---------------------------------------------------------------------------------------

def test_rewrites_inside_if_branches():
    def branch(name, alpha):
        return helper.make_graph(
            [helper.make_node("Conv", ["x", "w"], [f"{name}_z"], name=f"{name}_conv", pads=[1] * 4),
             helper.make_node("LeakyRelu", [f"{name}_z"], [f"{name}_y"], name=f"{name}_leaky", alpha=alpha)],
            name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [1, 3, 4, 4])])

    node = helper.make_node("If", ["cond"], ["y"], name="if", then_branch=branch("then", 0.1),
                            else_branch=branch("else", 2.5))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4]),
                                            helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [numpy_helper.from_array(weights(3, 2, 3, 3), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for strategy in ("decompose", "conv-split"):
        original, out, p = rewrite(model, strategy)
        counts = compute_counts(out)
        assert "LeakyRelu" not in counts and len(sites(p, "rewrote")) == 2
        for cond in (True, False):
            v = dmlopt.validate(original, out, inputs={"cond": np.array(cond)})
            assert v.passed, v.to_table()


def loop_without_cond(alpha):
    """``Loop(M, "")`` with no loop-carried value, its body ``Conv(LeakyRelu(Conv(x; w)); v)`` as scan output."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Conv", ["x", "w"], ["z"], name="body_conv", pads=[1] * 4),
         helper.make_node("LeakyRelu", ["z"], ["a"], name="body_leaky", alpha=alpha),
         helper.make_node("Conv", ["a", "v"], ["y_step"], name="body_consumer", pads=[1] * 4)],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_step", TensorProto.FLOAT, [1, 3, 4, 4])])
    loop = helper.make_node("Loop", ["m", ""], ["y"], name="loop", body=body)
    graph = helper.make_graph([loop], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1, 3, 4, 4])],
                              [numpy_helper.from_array(weights(3, 2, 3, 3), "w"),
                               numpy_helper.from_array(weights(3, 3, 3, 3), "v"),
                               numpy_helper.from_array(np.array(2, dtype=np.int64), "m")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("strategy", REWRITING)
def test_rewrites_inside_a_loop_keep_its_empty_cond_input(strategy):
    # onnx_ir's dead-code removal after the rules used to cut Loop(m, "") down to Loop(m): invalid.
    original, out, p = rewrite(loop_without_cond(0.3), strategy)  # rewrite() runs the checker
    loop = next(iter(out.graph))
    assert loop.op_type == "Loop" and len(loop.inputs) == 2 and loop.inputs[1] is None
    body_ops = [n.op_type for n in loop.attributes["body"].as_graph()]
    assert "LeakyRelu" not in body_ops and len(sites(p, "rewrote")) == 1
    assert_exact(original, out)


# -- properties over random graphs ----------------------------------------------------------------

@PROPERTY
@given(alpha=ALPHAS, shape=st.lists(st.integers(1, 4), min_size=1, max_size=4),
       strategy=st.sampled_from(["decompose", "relu-split"]))
def test_elementwise_strategies_are_exact(alpha, shape, strategy):
    model = make_model([helper.make_node("LeakyRelu", ["x"], ["y"], name="leaky", alpha=alpha)],
                       {"x": shape}, {"y": len(shape)})
    original, out, p = rewrite(model, strategy)
    assert "LeakyRelu" not in compute_counts(out)
    assert_exact(original, out)


@st.composite
def conv_cases(draw):
    groups = draw(st.sampled_from([1, 2]))
    kernel = draw(st.integers(1, 3))
    return dict(alpha=draw(ALPHAS), cin=groups * draw(st.integers(1, 2)), cout=groups * draw(st.integers(1, 3)),
                groups=groups, kernel=kernel, dilations=(draw(st.integers(1, 2)),) * 2,
                strides=(draw(st.integers(1, 2)),) * 2, pads=draw(st.integers(0, 2)), bias=draw(st.booleans()),
                size=(draw(st.integers(5, 7)), draw(st.integers(5, 7))))  # >= the dilated kernel


@PROPERTY
@given(case=conv_cases(), strategy=st.sampled_from(["conv-split", "decompose", "relu-split"]))
def test_conv_strategies_are_exact_on_random_convs(case, strategy):
    original, out, p = rewrite(conv_leaky(**case), strategy)
    assert "LeakyRelu" not in compute_counts(out)
    if strategy == "conv-split" and case["alpha"] not in (0.0, 1.0):
        assert compute_counts(out)["Conv"] == 2
    assert_exact(original, out)


@PROPERTY
@given(alpha=ALPHAS, groups=st.sampled_from([1, 3]), stride=st.integers(1, 3), kernel=st.integers(1, 4),
       pads=st.integers(0, 1), output_padding=st.integers(0, 1), bias=st.booleans())
def test_conv_split_is_exact_on_random_conv_transposes(alpha, groups, stride, kernel, pads, output_padding, bias):
    output_padding = min(output_padding, stride - 1)
    model = conv_transpose_leaky(alpha, cin=3, cout=3, groups=groups, kernel=kernel, stride=stride, pads=pads,
                                 output_padding=output_padding, bias=bias)
    original, out, p = rewrite(model, "conv-split")
    assert "LeakyRelu" not in compute_counts(out)
    assert_exact(original, out)


@PROPERTY
@given(alpha=ALPHAS, trans_a=st.integers(0, 1), trans_b=st.integers(0, 1),
       bias_shape=st.sampled_from([None, (), (1,), (5,), (1, 5), (3, 5), (3, 1)]),
       gemm_alpha=st.floats(-2, 2, width=32), beta=st.floats(-2, 2, width=32),
       strategy=st.sampled_from(["conv-split", "channel-fold"]))
def test_gemm_strategies_are_exact(alpha, trans_a, trans_b, bias_shape, gemm_alpha, beta, strategy):
    model = gemm_leaky(alpha, trans_a, trans_b, bias_shape, gemm_alpha, beta)
    if strategy == "channel-fold":  # append a consumer
        model.graph.output[0].name = "y0"
        model.graph.node[-1].output[0] = "y0"
        model.graph.node.append(helper.make_node("MatMul", ["y0", "q.w"], ["y"], name="q"))
        model.graph.initializer.append(numpy_helper.from_array(weights(5, 2), "q.w"))
        model.graph.output[0].name = "y"
    original, out, p = rewrite(model, strategy)
    declined = sites(p, "declined")
    if declined:  # only channel-fold's row-varying bias may be declined
        assert strategy == "channel-fold" and bias_shape in ((3, 5), (3, 1))
    else:
        assert "LeakyRelu" not in compute_counts(out)
    assert_exact(original, out)


@PROPERTY
@given(alpha=ALPHAS, producer=st.sampled_from(["Conv", "ConvTranspose"]), consumer=st.sampled_from(["Conv", "ConvTranspose"]),
       groups=st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2), (4, 2), (2, 4), (4, 4)]), bias=st.booleans())
def test_channel_fold_is_exact_on_random_chains(alpha, producer, consumer, groups, bias):
    original, out, p = rewrite(conv_chain(alpha, producer, consumer, c=4, groups_p=groups[0], groups_q=groups[1],
                                          bias=bias), "channel-fold")
    assert "LeakyRelu" not in compute_counts(out)
    assert_exact(original, out)


# -- bundled and exported CNNs -------------------------------------------------------------------------

BUNDLED_CNN = str(__import__("pathlib").Path(dmlopt.__file__).parent / "data" / "cnn_leaky.onnx")


@pytest.mark.parametrize("strategy, expected", [
    ("decompose", {"Conv": 6, "ConvTranspose": 1, "Mul": 6, "Max": 6}),
    ("relu-split", {"Conv": 6, "ConvTranspose": 1, "Relu": 12, "Mul": 6, "Sub": 6}),
    ("conv-split", {"Conv": 12, "ConvTranspose": 1, "Relu": 6, "Add": 6}),
    ("channel-fold", {"Conv": 6, "ConvTranspose": 1, "Relu": 6}),
])
def test_every_strategy_validates_on_the_bundled_cnn(strategy, expected):
    result = dmlopt.optimize(BUNDLED_CNN, passes=["leaky-relu"], target="cpu", leaky_relu=strategy)
    assert result.passed, result.report.to_table()
    assert compute_counts(result.model) == expected
    entry = result.report.passes[0]
    assert [s["action"] for s in entry["sites"]] == ["rewrote"] * 6
    assert {s["strategy"] for s in entry["sites"]} == {strategy}
    assert all(s["alpha"] == pytest.approx(0.1) for s in entry["sites"])


@pytest.fixture(scope="module")
def torch_cnn(tmp_path_factory):
    from models.torch_cnn import export_torch_cnn

    return str(export_torch_cnn(tmp_path_factory.mktemp("torch") / "cnn.onnx", channels=8, height=12, width=10))


@pytest.mark.parametrize("strategy", REWRITING)
def test_every_strategy_validates_on_a_torch_export(torch_cnn, strategy):
    result = dmlopt.optimize(torch_cnn, passes=["prelu", "leaky-relu"], target="cpu", leaky_relu=strategy)
    assert result.passed, result.report.to_table()
    counts = compute_counts(result.model)
    assert "PRelu" not in counts
    leaky_sites = result.report.passes[1]["sites"]
    rewrote = [s for s in leaky_sites if s["action"] == "rewrote"]
    if strategy == "channel-fold":  # the last LeakyRelu (after the ConvTranspose) has no consumer
        assert len(rewrote) == 4 and counts["LeakyRelu"] == 1
    else:
        assert len(rewrote) == 5 and "LeakyRelu" not in counts


def test_optimize_end_to_end_with_decompose():
    result = dmlopt.optimize(dmlopt.load(BUNDLED_CNN), passes=["leaky-relu"], leaky_relu="decompose")
    assert result.passed
    assert op_counts(result.model).get("LeakyRelu") is None and op_counts(result.model)["Max"] == 6


def test_auto_uses_the_documented_default_per_target():
    """Every target keeps LeakyRelu untuned (dml: measured on a GPU through the real EP, issue 30), and
    the note says why."""
    for target, why in (("dml", "real DirectML EP"), ("cuda", "CUDA EP"), ("cpu", "CPU EP"), ("webgpu", "WebGPU")):
        _, out, p = rewrite(conv_leaky(0.1), "auto", target=target)
        assert compute_counts(out) == {"Conv": 1, "LeakyRelu": 1}
        assert "keep" in p.notes[0] and why in p.notes[0], p.notes


def test_tuning_times_every_strategy_and_keeps_a_valid_one():
    result = dmlopt.optimize(BUNDLED_CNN, passes=["leaky-relu"], target="cpu", tune=True)
    (choice,) = [c for c in result.report.choices if c["pass"] == "leaky-relu"]
    assert choice["option"] == "leaky_relu" and choice["choice"] in STRATEGIES
    assert set(choice["candidates"]) == set(STRATEGIES) and not choice["rejected"]
    assert result.passed
