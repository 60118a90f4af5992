"""Tests of the einsum pass: exact op types per equation, numerics against ORT's Einsum and numpy."""

from __future__ import annotations

import string

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from dmlopt.targets.dml.einsum_support import einsum_supported, parse_equation
from dmlopt.passes import PassContext
from dmlopt.passes.einsum import EinsumPass
from dmlopt.engine.pipeline import check_model, op_counts
from dmlopt.runtime.validate import run


def einsum_model(equation, shapes, *, consts=(), dims=None, opset=17, dtype=TensorProto.FLOAT, seed=0):
    """y = Einsum(x0, x1, ...); operands listed in `consts` are initializers."""
    rng = np.random.default_rng(seed)
    inputs, inits, names = [], [], []
    for i, shape in enumerate(shapes):
        name = f"x{i}"
        names.append(name)
        if i in consts:
            inits.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name))
        else:
            inputs.append(helper.make_tensor_value_info(name, dtype, dims[i] if dims else shape))
    graph = helper.make_graph([helper.make_node("Einsum", names, ["y"], equation=equation, name="einsum")],
                              "g", inputs, [helper.make_tensor_value_info("y", dtype, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def lower(proto, target="cpu", ort_version=None, layout="fewest-transposes", mode="lower"):
    model = ir.from_proto(proto)
    options = {"einsum": mode, "einsum_layout": layout}
    p = EinsumPass(PassContext(target=target, ort_version=ort_version, options=options))
    result = p(model)
    check_model(result.model, "einsum")
    return result, p


def feeds_for(shapes, consts=(), seed=1):
    rng = np.random.default_rng(seed)
    return {f"x{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes) if i not in consts}


def assert_same(proto, model, feeds):
    ref = run(ir.from_proto(proto), feeds)["y"]
    got = run(model, feeds)["y"]
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(ref).max())))


def computing_ops(model):
    return {k: v for k, v in op_counts(model).items() if k != "Constant"}


# ** SAM's relative-position equations **

SAM_SHAPES = [(12, 5, 7, 16), (5, 6, 16)]  # b h w c, h k c (sizes distinct so a mix-up shows)
SAM_W_SHAPES = [(12, 5, 7, 16), (7, 6, 16)]  # b h w c, w k c


def test_sam_height_term_becomes_one_matmul_with_a_folded_weight():
    proto = einsum_model("bhwc,hkc->bhwk", SAM_SHAPES, consts=(1,))
    result, p = lower(proto)
    assert result.modified
    assert computing_ops(result.model) == {"MatMul": 1}
    assert_same(proto, result.model, feeds_for(SAM_SHAPES, (1,)))
    assert [s.action for s in p.sites] == ["rewrote"]


def test_sam_width_term_fewest_transposes_is_a_batch_of_vector_products():
    proto = einsum_model("bhwc,wkc->bhwk", SAM_W_SHAPES, consts=(1,))
    result, _ = lower(proto, layout="fewest-transposes")
    assert computing_ops(result.model) == {"MatMul": 1, "Reshape": 2}
    assert_same(proto, result.model, feeds_for(SAM_W_SHAPES, (1,)))


def test_sam_width_term_largest_matmul_transposes_around_a_gemm():
    proto = einsum_model("bhwc,wkc->bhwk", SAM_W_SHAPES, consts=(1,))
    result, _ = lower(proto, layout="largest-matmul")
    assert computing_ops(result.model) == {"MatMul": 1, "Transpose": 2}
    assert_same(proto, result.model, feeds_for(SAM_W_SHAPES, (1,)))


@pytest.mark.parametrize("batch,expected", [(12, {"MatMul": 1, "Reshape": 2}),  # 12*5*7*6 = 2520 <= 4096
                                            (120, {"MatMul": 1, "Transpose": 2})])  # 25200 elements: a GEMM
def test_sam_width_term_by_size_takes_vector_products_only_when_small(batch, expected):
    shapes = [(batch,) + SAM_W_SHAPES[0][1:], SAM_W_SHAPES[1]]
    proto = einsum_model("bhwc,wkc->bhwk", shapes, consts=(1,))
    result, p = lower(proto, layout="by-size")
    assert computing_ops(result.model) == expected
    assert_same(proto, result.model, feeds_for(shapes, (1,)))
    assert "(by-size)" in p.sites[0].detail


def test_by_size_is_the_directml_default_without_tuning():
    proto = einsum_model("bhwc,wkc->bhwk", SAM_W_SHAPES, consts=(1,))
    result, p = lower(proto, target="dml", layout="auto")
    assert computing_ops(result.model) == {"MatMul": 1, "Reshape": 2}
    assert any("einsum_layout=auto without tuning" in n and "by-size" in n for n in p.notes)


@pytest.mark.parametrize("equation,shapes", [("bhwc,hkc->bhwk", SAM_SHAPES), ("bhwc,wkc->bhwk", SAM_W_SHAPES)])
def test_sam_terms_with_a_symbolic_batch_need_no_shape_arithmetic(equation, shapes):
    proto = einsum_model(equation, shapes, consts=(1,), dims=[("B",) + shapes[0][1:], None])
    result, _ = lower(proto)
    counts = op_counts(result.model)
    assert "Einsum" not in counts and "Shape" not in counts
    for batch in (3, 12):
        run_shapes = [(batch,) + shapes[0][1:], shapes[1]]
        assert_same(proto, result.model, feeds_for(run_shapes, (1,)))


def test_two_symbolic_dims_merged_are_read_from_shape_at_run_time():
    shapes = [(2, 3), (3, 4, 5)]  # k and l merge into MatMul's N; splitting them back needs their sizes
    proto = einsum_model("ij,jkl->ikl", shapes, dims=[(2, 3), (3, "K", "L")])
    result, _ = lower(proto)
    counts = op_counts(result.model)
    assert counts["Shape"] == 2 and counts["MatMul"] == 1 and counts["Reshape"] == 2 and "Einsum" not in counts
    assert_same(proto, result.model, feeds_for(shapes))
    assert_same(proto, result.model, feeds_for([(2, 3), (3, 2, 6)]))


# ** one operand, several operands, broadcasting, ellipsis **

@pytest.mark.parametrize("equation,shape,ops", [
    ("ij->ji", (3, 4), {"Transpose": 1}),
    ("ijk->kij", (2, 3, 4), {"Transpose": 1}),
    ("ijk->ik", (2, 3, 4), {"ReduceSum": 1}),
    ("ijk->ki", (2, 3, 4), {"ReduceSum": 1, "Transpose": 1}),
    ("ijk->", (2, 3, 4), {"ReduceSum": 1}),
    ("ij->ij", (3, 4), {"Identity": 1}),
    ("...ij->...ji", (2, 3, 4), {"Transpose": 1}),
])
def test_one_operand_transposes_and_reductions(equation, shape, ops):
    proto = einsum_model(equation, [shape])
    result, _ = lower(proto)
    assert computing_ops(result.model) == ops
    assert_same(proto, result.model, feeds_for([shape]))


def test_full_reduction_of_a_constant_stays_a_scalar():
    proto = einsum_model("ab->", [(2, 3)], consts=(0,))
    result, _ = lower(proto)  # check_model (strict shape inference) inside
    (output,) = result.model.graph.outputs  # folded: the output is now a constant
    assert output.const_value is not None and output.const_value.numpy().shape == ()
    np.testing.assert_allclose(run(result.model, {})["y"], numpy_helper.to_array(proto.graph.initializer[0]).sum(),
                               rtol=1e-6)


def test_opset_12_uses_the_axes_attribute():
    proto = einsum_model("ijk->ki", [(2, 3, 4)], opset=12)
    result, _ = lower(proto)
    (reduce,) = [n for n in result.model.graph if n.op_type == "ReduceSum"]
    assert list(reduce.attributes.get_ints("axes")) == [1]
    assert_same(proto, result.model, feeds_for([(2, 3, 4)]))


@pytest.mark.parametrize("equation,shapes,ops", [
    ("ij,jk->ik", [(3, 4), (4, 5)], {"MatMul": 1}),
    ("bij,bkj->bik", [(2, 3, 4), (2, 5, 4)], {"MatMul": 1, "Reshape": 3}),  # vector products, no Transpose
    ("abc,cd,de->abe", [(2, 3, 4), (4, 5), (5, 6)], {"MatMul": 2}),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)], {"MatMul": 1}),
    ("ij,jk", [(2, 3), (3, 4)], {"MatMul": 1}),  # implicit output "ik"
    ("i,j->ij", [(3,), (4,)], {"MatMul": 1, "Reshape": 2}),
    ("ij,ij->", [(3, 4), (3, 4)], {"MatMul": 1, "Reshape": 3}),
])
def test_two_and_more_operands(equation, shapes, ops):
    proto = einsum_model(equation, shapes)
    result, _ = lower(proto)
    assert computing_ops(result.model) == ops
    assert_same(proto, result.model, feeds_for(shapes))


def test_largest_matmul_transposes_for_a_real_gemm():
    shapes = [(2, 3, 4), (2, 5, 4)]
    proto = einsum_model("bij,bkj->bik", shapes)
    result, _ = lower(proto, layout="largest-matmul")
    assert computing_ops(result.model) == {"MatMul": 1, "Transpose": 1}
    assert_same(proto, result.model, feeds_for(shapes))


def test_size_one_broadcast_of_a_contracted_label_sums_the_other_operand():
    shapes = [(2, 1), (3, 4)]  # j is 1 in x0 and 3 in x1: numpy sums x1 over j
    proto = einsum_model("ij,jk->ik", shapes)
    result, _ = lower(proto)
    assert computing_ops(result.model) == {"Squeeze": 1, "ReduceSum": 1, "Reshape": 2, "MatMul": 1}
    feeds = feeds_for(shapes)
    np.testing.assert_allclose(run(result.model, feeds)["y"], np.einsum("ij,jk->ik", feeds["x0"], feeds["x1"]),
                               rtol=1e-6)


# ** declines and target rules **

def test_diagonal_is_declined_with_a_reason():
    proto = einsum_model("ii->i", [(3, 3)])
    result, p = lower(proto)
    assert not result.modified
    assert op_counts(result.model) == {"Einsum": 1}
    (site,) = p.sites
    assert site.action == "declined" and "diagonal" in site.detail


def test_integer_types_matmul_lacks_are_declined():
    proto = einsum_model("ij,jk->ik", [(3, 4), (4, 5)], dtype=TensorProto.INT8)
    result, p = lower(proto)
    assert op_counts(result.model) == {"Einsum": 1}
    assert p.sites[0].action == "declined" and "INT8" in p.sites[0].detail


def test_dml_before_1_19_keeps_table_forms_and_lowers_the_rest():
    table_form = einsum_model("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)])
    result, p = lower(table_form, target="dml", ort_version="1.18.1")
    assert op_counts(result.model) == {"Einsum": 1} and p.sites[0].action == "kept"
    sam = einsum_model("bhwc,hkc->bhwk", SAM_SHAPES, consts=(1,))
    result, _ = lower(sam, target="dml", ort_version="1.18.1")
    assert "Einsum" not in op_counts(result.model)


@pytest.mark.parametrize("target,version", [("dml", "1.19.0"), ("dml", None), ("cuda", None), ("cpu", "1.17")])
def test_other_targets_lower_every_expressible_form(target, version):
    proto = einsum_model("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)])
    result, _ = lower(proto, target=target, ort_version=version)
    assert computing_ops(result.model) == {"MatMul": 1}


def test_keep_leaves_every_einsum_and_says_which_the_target_runs_on_the_cpu():
    sam = einsum_model("bhwc,hkc->bhwk", SAM_SHAPES, consts=(1,))
    result, p = lower(sam, target="cuda", mode="keep")
    assert op_counts(result.model) == {"Einsum": 1} and p.sites[0].action == "kept"
    assert not result.modified
    result, p = lower(sam, target="dml", ort_version="1.18", mode="keep")  # not in DirectML's table
    assert op_counts(result.model) == {"Einsum": 1} and "on the CPU" in p.sites[0].detail


@pytest.mark.parametrize("target,expected", [("dml", {"MatMul": 1, "Reshape": 2}),  # by-size: small
                                             ("cuda", {"Einsum": 1})])
def test_pipeline_defaults_per_target(target, expected):
    """Through dmlopt.optimize without --tune: auto -> the target's default, provider here or not."""
    import dmlopt

    proto = onnx.shape_inference.infer_shapes(einsum_model("bhwc,wkc->bhwk", SAM_W_SHAPES, consts=(1,)))
    result = dmlopt.optimize(proto, passes="einsum", target=target, tune=False)
    assert computing_ops(result.model) == expected
    assert result.passed


def test_einsum_in_an_if_branch_is_lowered():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal(SAM_SHAPES[1]).astype(np.float32), "w")
    out_shape = [12, 5, 7, 6]
    zeros = numpy_helper.from_array(np.zeros(out_shape, np.float32), "zeros")
    then_graph = helper.make_graph([helper.make_node("Einsum", ["a", "w"], ["t"], equation="bhwc,hkc->bhwk")],
                                   "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, out_shape)], [w])
    else_graph = helper.make_graph([helper.make_node("Identity", ["zeros"], ["e"])], "else", [],
                                   [helper.make_tensor_value_info("e", TensorProto.FLOAT, out_shape)], [zeros])
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph)], "g",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("a", TensorProto.FLOAT, SAM_SHAPES[0])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result, _ = lower(proto)
    assert "Einsum" not in op_counts(result.model) and op_counts(result.model)["MatMul"] == 1
    feeds = {"cond": np.array(True), "a": rng.standard_normal(SAM_SHAPES[0]).astype(np.float32)}
    np.testing.assert_allclose(run(result.model, feeds)["y"], run(ir.from_proto(proto), feeds)["y"], rtol=1e-5,
                               atol=1e-5)


# ** the DirectML support table **

@pytest.mark.parametrize("equation,n,version,expected", [
    ("ij,jk->ik", 2, "1.18", True),
    ("xy,yz->xz", 2, "1.12", True),  # only the structure counts
    ("bij,bkj->bik", 2, "1.16", True),
    ("bhwc,hkc->bhwk", 2, "1.18", False),
    ("bhwc,hkc->bhwk", 2, "1.19", True),
    ("aibj,ajbk->aibk", 2, "1.13", False),  # NHCW forms came with 1.14
    ("aibj,ajbk->aibk", 2, "1.14", True),
    ("ij->ji", 1, "1.15", True),
    ("ijk->", 1, "1.15", True),
    ("ij,ij->ij", 2, "1.15", True),
    ("...ij,...jk->...ik", 2, "1.20", False),  # ellipsis never
    ("ij,jk,kl->il", 3, "1.20", False),  # three operands never
    ("abcdefghi->", 1, "1.20", False),  # over 8 labels
    ("ij,jk->ik", 2, None, False),  # no version: nothing assumed
])
def test_einsum_supported(equation, n, version, expected):
    assert einsum_supported(equation, n, version) is expected


def test_parse_equation_implicit_output_follows_numpy():
    assert parse_equation("ba,cb").output == "ac"
    assert parse_equation("...ij,jk").output == ".ik"
    assert parse_equation("Ba,aB").output == ""


# ** property: random equations against numpy **

@st.composite
def random_equations(draw):
    """A two-operand equation with every label role, random orders, sizes, constants, symbolic dims."""
    letters = iter(string.ascii_letters)
    roles = {role: [next(letters) for _ in range(draw(st.integers(0, hi)))]
             for role, hi in (("batch", 2), ("contract", 2), ("free_a", 2), ("free_b", 2), ("sum_a", 1),
                              ("sum_b", 1), ("bcast", 1))}
    a = roles["batch"] + roles["contract"] + roles["free_a"] + roles["sum_a"] + roles["bcast"]
    b = roles["batch"] + roles["contract"] + roles["free_b"] + roles["sum_b"] + roles["bcast"]
    out = roles["batch"] + roles["free_a"] + roles["free_b"] + roles["bcast"]
    a, b, out = (draw(st.permutations(x)) for x in (a, b, out))
    sizes = {l: draw(st.integers(1, 4)) for l in a + b}
    for label in roles["bcast"]:  # size 1 on one side, larger on the other
        sizes[label] = draw(st.integers(2, 4))
    side = draw(st.sampled_from([0, 1]))
    shape_a = [1 if (l in roles["bcast"] and side == 0) else sizes[l] for l in a]
    shape_b = [1 if (l in roles["bcast"] and side == 1) else sizes[l] for l in b]
    const = draw(st.sampled_from([(), (0,), (1,)]))
    symbolic = draw(st.booleans())
    swap = draw(st.booleans())
    terms, shapes = [a, b], [shape_a, shape_b]
    if swap:
        terms, shapes = terms[::-1], shapes[::-1]
        const = tuple(1 - c for c in const)
    equation = f"{''.join(terms[0])},{''.join(terms[1])}->{''.join(out)}"
    layout = draw(st.sampled_from(["fewest-transposes", "largest-matmul"]))
    return equation, [tuple(s) for s in shapes], const, symbolic, layout


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_equations())
def test_random_equations_lower_exactly(case):
    equation, shapes, consts, symbolic, layout = case
    dims = None
    if symbolic:  # the first axis of each non-constant operand becomes symbolic, like a batch
        dims = [((f"d{i}",) + s[1:] if s and i not in consts and s[0] != 1 else s) for i, s in enumerate(shapes)]
    proto = einsum_model(equation, shapes, consts=consts, dims=dims)
    result, p = lower(proto, layout=layout)
    assert "Einsum" not in op_counts(result.model), [s.detail for s in p.sites]
    feeds = feeds_for(shapes, consts)
    operands = [feeds[f"x{i}"] if i not in consts else
                numpy_helper.to_array(next(t for t in proto.graph.initializer if t.name == f"x{i}"))
                for i in range(len(shapes))]
    expected = np.einsum(equation, *operands)
    got = run(result.model, feeds)["y"]
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(expected).max())))


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_matmul_shaped_equations_need_no_transpose(data):
    """batch+M+K times batch+K+N -> batch+M+N: lowered to one MatMul, whatever the letters."""
    letters = data.draw(st.permutations(list("pqrstuvw")))
    nb, nm, nk, nn = (data.draw(st.integers(lo, 2)) for lo in (0, 1, 1, 1))
    batch, m, k, n = (letters[:nb], letters[nb:nb + nm], letters[nb + nm:nb + nm + nk],
                      letters[nb + nm + nk:nb + nm + nk + nn])
    equation = f"{''.join(batch + m + k)},{''.join(batch + k + n)}->{''.join(batch + m + n)}"
    sizes = {l: data.draw(st.integers(2, 3)) for l in letters}
    shapes = [tuple(sizes[l] for l in batch + m + k), tuple(sizes[l] for l in batch + k + n)]
    proto = einsum_model(equation, shapes)
    result, _ = lower(proto)
    counts = computing_ops(result.model)
    assert counts.get("Transpose", 0) == 0 and counts["MatMul"] == 1
    assert_same(proto, result.model, feeds_for(shapes))


def test_the_model_stays_valid_onnx():
    proto = einsum_model("bhwc,wkc->bhwk", SAM_W_SHAPES, consts=(1,))
    result, _ = lower(proto)
    onnx.checker.check_model(ir.to_proto(result.model), full_check=True)
