"""linear-gemm: Linear layers and transformer MLPs on static shapes become Gemms."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import dmlopt
from dmlopt.passes import PassContext
from dmlopt.passes.linear_gemm import LinearGemmPass
from tests.ir_text import text, with_weights

DATA = pathlib.Path(dmlopt.__file__).parent / "data"
RNG = np.random.default_rng(0)


def convert(model: ir.Model):
    work = model.clone()
    p = LinearGemmPass(PassContext())
    result = p(work)
    onnx.checker.check_model(ir.to_proto(result.model), full_check=True)
    return result.model, p


def main_ops(model: ir.Model) -> list[str]:
    return [n.op_type for n in model.graph]


def close(ref: ir.Model, cand: ir.Model, shape) -> None:
    """The Gemm adds the bias inside its accumulation: equal within float rounding."""
    v = dmlopt.validate(ref, cand, shapes={"x": shape})
    assert v.passed and all(o.max_rel < 1e-6 for o in v.outputs), v.to_table()


def linear_model(rank3_views: str) -> ir.Model:
    """A Linear layer (MatMul + bias Add) on a rank-3 input, with or without Reshapes around it."""
    pre = "v = Reshape(x, s_in)" if "before" in rank3_views else "v = Relu(x)"
    post = "y = Reshape(lin, s_out)" if "after" in rank3_views else "y = Relu(lin)"
    out_type = "float[2, 60]" if "after" in rank3_views else "float[2, 3, 20]"
    return with_weights(text(f"""
    g (float[2, 3, 8] x, float[8, 20] w, float[20] b) => ({out_type} y)
      <int64[3] s_in = {{0, 3, 8}}, int64[2] s_out = {{0, 60}}> {{
      {pre}
      mm = MatMul(v, w)
      lin = Add(mm, b)
      {post}
    }}
    """), w=RNG.standard_normal((8, 20)).astype(np.float32), b=RNG.standard_normal(20).astype(np.float32))


@pytest.mark.parametrize("views,expected", [
    ("before+after", ["Reshape", "Gemm", "Reshape"]),
    ("after", ["Relu", "Reshape", "Gemm", "Reshape"]),
    ("none", ["Relu", "MatMul", "Add", "Relu"]),
])
def test_linear_layers_become_gemm_next_to_reshapes(views, expected):
    model = linear_model(views)
    frozen, p = convert(model)
    assert main_ops(frozen) == expected
    if views == "none":
        assert any("a Gemm would add two Reshapes" in s.detail for s in p.sites if s.action == "declined")
    else:
        gemm = next(n for n in frozen.graph if n.op_type == "Gemm")
        assert gemm.inputs[0].shape.dims == (6, 8) and gemm.outputs[0].shape.dims == (6, 20)
    close(model, frozen, [2, 3, 8])


def test_linear_on_a_2d_input_becomes_one_gemm():
    model = with_weights(text("""
    g (float[4, 8] x, float[8, 5] w, float[1, 5] b) => (float[4, 5] y) {
      mm = MatMul(x, w)
      y = Add(b, mm)
    }
    """), w=RNG.standard_normal((8, 5)).astype(np.float32), b=RNG.standard_normal((1, 5)).astype(np.float32))
    frozen, _ = convert(model)
    assert main_ops(frozen) == ["Gemm"]
    close(model, frozen, [4, 8])


MLP = """
g (float[2, 4, 4, 8] x, float[8, 32] w1, float[32] b1, float[32, 8] w2, float[8] b2, float[{vec}] v) =>
  (float[2, 4, 4, 8] y) <float c = {{1.4142135}}, float one = {{1.0}}, float half = {{0.5}}> {{
  h = MatMul(x, w1)
  hb = Add(b1, h)
  d = Div(hb, c)
  e = Erf(d)
  e1 = Add(e, one)
  g = Mul(hb, e1)
  act = Mul(g, {second_operand})
  o = MatMul(act, w2)
  ob = Add(o, b2)
  y = Add(x, ob)
}}
"""


def mlp_model(second_operand: str) -> ir.Model:
    vec = 32
    return with_weights(text(MLP.format(vec=vec, second_operand=second_operand)),
                        w1=RNG.standard_normal((8, 32)).astype(np.float32), b1=RNG.standard_normal(32).astype(np.float32),
                        w2=RNG.standard_normal((32, 8)).astype(np.float32), b2=RNG.standard_normal(8).astype(np.float32),
                        v=RNG.standard_normal(vec).astype(np.float32))


def test_transformer_mlp_runs_on_2d_rows_between_two_gemms():
    model = mlp_model("half")
    frozen, p = convert(model)
    assert main_ops(frozen) == ["Reshape", "Gemm", "Div", "Erf", "Add", "Mul", "Mul", "Gemm", "Reshape", "Add"]
    by_op = {n.op_type: n for n in frozen.graph}
    assert by_op["Erf"].outputs[0].shape.dims == (32, 32)  # 2 * 4 * 4 rows
    assert any("two Linears -> Gemms on [32, *] rows" in s.detail for s in p.sites)
    close(model, frozen, [2, 4, 4, 8])


def test_mlp_whose_activation_reads_a_vector_stays():
    # act * v with v of 32 values broadcasts by the last axis: not a size-1 operand, left alone
    frozen, _ = convert(mlp_model("v"))
    assert main_ops(frozen).count("MatMul") == 2 and "Gemm" not in main_ops(frozen)




def test_dynamic_shapes_are_left_alone():
    model = with_weights(text("""
    g (float[N, 3, 8] x, float[8, 20] w, float[20] b) => (float[N, 60] y) {
      s_in = Constant<value = int64[3] {0, 3, 8}>()
      s_out = Constant<value = int64[2] {0, 60}>()
      v = Reshape(x, s_in)
      mm = MatMul(v, w)
      lin = Add(mm, b)
      y = Reshape(lin, s_out)
    }
    """), w=RNG.standard_normal((8, 20)).astype(np.float32), b=RNG.standard_normal(20).astype(np.float32))
    frozen, p = convert(model)
    assert "Gemm" not in main_ops(frozen)


@pytest.fixture(scope="module")
def sam_dynamic() -> pathlib.Path:
    path = DATA / "sam_small_dynamic.onnx"
    if not path.exists():
        pytest.skip("bundled SAM not built")
    return path


def test_frozen_sam_linears_and_mlps_become_gemms(sam_dynamic):
    frozen = dmlopt.optimize(sam_dynamic, shapes={"image": [1, 3, 64, 64]}, passes=["freeze-shapes"]).model
    result = dmlopt.optimize(frozen, passes=["linear-gemm"])
    before, after = main_ops(frozen), main_ops(result.model)
    assert before.count("Gemm") == 0 and after.count("Gemm") == before.count("MatMul") - after.count("MatMul")
    assert after.count("Gemm") == 4 * 3  # qkv, proj and the two MLP Linears of each of the 3 blocks
    assert len(after) <= len(before)
    assert result.passed


def test_attention_is_still_fused_in_the_default_pipeline(sam_dynamic):
    """linear-gemm runs after attention: the qkv/proj Linears it would take are MHA's by then."""
    from dmlopt.passes import all_passes

    if "attention" not in all_passes():
        pytest.skip("no attention pass registered")
    result = dmlopt.optimize(sam_dynamic, shapes={"image": [1, 3, 64, 64]}, target="dml")
    ops = [n.op_type for n in result.model.graph]
    assert ops.count("MultiHeadAttention") == 3 and "Softmax" not in ops and "Shape" not in ops
    assert ops.count("Gemm") >= 6  # the MLPs
    assert result.passed


def test_added_shapes_take_names_not_in_the_model():
    """The rule names its Reshape shapes after the Add's output; a model holding those names keeps them."""
    model = linear_model("before+after")
    for taken in ("lin_rows", "lin_shape"):  # constants the model also outputs, so they stay
        value = ir.Value(name=taken, const_value=ir.tensor(np.arange(3, dtype=np.int64)), shape=ir.Shape([3]),
                         type=ir.TensorType(ir.DataType.INT64))
        model.graph.register_initializer(value)
        model.graph.outputs.append(value)
    out, _ = convert(model)
    assert main_ops(out) == ["Reshape", "Gemm", "Reshape"]
    names = [v.name for v in out.graph.initializers.values()] + [v.name for n in out.graph for v in n.outputs]
    assert len(names) == len(set(names)), names
    assert {"lin_rows", "lin_shape"} <= set(out.graph.initializers)
    close(model, out, [2, 3, 8])
