"""dmlopt.graph.shapes: --shape/--dim parsing and the checks against a model, each error on its own."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from dmlopt.errors import UsageError
from dmlopt.graph.shapes import check_shapes, free_dimensions, parse_dim, parse_shape


@pytest.mark.parametrize("text,expected", [
    ("image:1,3,1024,1024", {"image": [1, 3, 1024, 1024]}),
    ("image:[1,3,64,64]", {"image": [1, 3, 64, 64]}),  # Polygraphy
    (" image : [ 1, 3 ] ", {"image": [1, 3]}),
    ("input:0:1,3", {"input:0": [1, 3]}),  # TensorFlow-style name: the last ':' separates
    ("mask:[]", {"mask": []}),  # Polygraphy's scalar
    ("x:7", {"x": [7]}),
])
def test_parse_shape_accepts(text, expected):
    assert parse_shape(text) == expected


def test_parse_shape_takes_a_zero_that_check_shapes_holds_to_the_model():
    """0 is legal ONNX where the model declares 0 (issue 31); elsewhere check_shapes refuses it."""
    assert parse_shape("image:0,3") == {"image": [0, 3]}


@pytest.mark.parametrize("text,message", [
    ("image", "expected NAME:D0,D1,..."),
    (":1,3", "expected NAME:D0,D1,..."),
    ("image:", "no dimensions after ':'"),
    ("image:1,,3", "empty dimension"),
    ("image:1,a,3", "'a' is not an integer"),
    ("image:1.5,3", "'1.5' is not an integer"),
    ("image:-1,3", "positive integers (got -1)"),
    ("image:[1,3", "unbalanced brackets"),
    ("image:1,3]", "unbalanced brackets"),
])
def test_parse_shape_refuses(text, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")) as e:
        parse_shape(text)
    assert str(e.value).startswith(f"--shape '{text}': ")
    assert "\n" not in str(e.value)


def test_parse_dim():
    assert parse_dim("batch=1") == {"batch": 1}
    assert parse_dim(" batch_size = 4 ") == {"batch_size": 4}


def test_parse_dim_name_holding_equals_splits_at_the_last():
    assert parse_dim("seq=len=3") == {"seq=len": 3}
    assert parse_dim("a==2") == {"a=": 2}


def test_dim_advice_for_a_name_with_equals_works(cli, tmp_path):
    """The refusal advises `--dim seq=len=N`: following it must work (#32.8)."""
    from onnx import TensorProto, helper, save
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "seq=len"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "seq=len"])])
    path = tmp_path / "m.onnx"
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    refused = cli("validate", path, path)
    assert refused.code == 2 and "--dim seq=len=N" in refused.err, refused.err
    advised = refused.err.split("--dim ")[-1].split()[0].replace("=N", "=3")
    r = cli("validate", path, path, "--dim", advised)
    assert r.code == 0, r.err
    assert "2x3" in r.out


@pytest.mark.parametrize("text,message", [
    ("batch", "expected DIM_PARAM=VALUE"),
    ("=1", "expected DIM_PARAM=VALUE"),
    ("batch=", "empty dimension"),
    ("batch=x", "'x' is not an integer"),
    ("batch=0", r"positive integers \(got 0\)"),
    ("batch=-2", r"positive integers \(got -2\)"),
])
def test_parse_dim_refuses(text, message):
    with pytest.raises(UsageError, match=message) as e:
        parse_dim(text)
    assert str(e.value).startswith(f"--dim '{text}': ")


@pytest.fixture
def model() -> ir.Model:
    m = ir.from_onnx_text("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[batch, 3, H, 64] image, float[batch, 4] extra, float[2, 2] w) => (float[batch, 3, H, 64] y) {
      y = Identity(image)
    }
    """)
    w = m.graph.inputs[2]
    w.const_value = ir.tensor(np.ones((2, 2), np.float32))
    m.graph.register_initializer(w)  # IR<4 style: an initializer listed as an input
    return m


def test_check_shapes_returns_the_dims_shapes_imply(model):
    assert check_shapes(model, {"image": [2, 3, 32, 64]}, {}) == {"batch": 2, "H": 32}
    assert check_shapes(model, {}, {"batch": 1}) == {"batch": 1}
    assert check_shapes(model, {"image": np.array([1, 3, 8, 64])}, {"batch": np.int64(1)}) == {"batch": 1, "H": 8}


@pytest.mark.parametrize("shapes,dims,message", [
    ({"imgae": [1, 3, 64, 64]}, {}, "shape for 'imgae': not an input of the model; did you mean 'image'?"),
    ({"w": [2, 2]}, {}, "shape for 'w': an initializer, not an input"),
    ({"image": [1, 3, 64]}, {}, "3 dimensions given, the input has rank 4 ([batch,3,H,64])"),
    ({"image": [1, 4, 64, 64]}, {}, "dim 1 is fixed at 3 in the model, 4 given"),
    ({"image": [1, 3, 0, 64]}, {}, "positive integers (got 0)"),
    ({"image": [1, 3, 1.5, 64]}, {}, "1.5 is not an integer"),
    ({"image": "1,3,64,64"}, {}, "expected a list of dimensions"),
    ({}, {"bach": 1}, "dim 'bach': no input has a dimension of that name; did you mean 'batch'?"),
    ({}, {"batch": 0}, "dim 'batch': dimensions must be positive integers (got 0)"),
    ({}, {"batch": True}, "True is not an integer"),
    ({"image": [2, 3, 64, 64]}, {"batch": 1}, "sets dim 'batch' to 2, but --dim batch=1 sets it to 1"),
    ({"image": [2, 3, 64, 64], "extra": [1, 4]}, {}, "shape for input 'extra' sets dim 'batch' to 1, "
                                                      "but shape for input 'image' sets it to 2"),
])
def test_check_shapes_refuses(model, shapes, dims, message):
    with pytest.raises(UsageError) as e:
        check_shapes(model, shapes, dims)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_free_dimensions(model):
    assert free_dimensions(model) == {"batch": ["image[0]", "extra[0]"], "H": ["image[2]"]}
