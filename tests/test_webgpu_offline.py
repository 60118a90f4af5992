"""--target webgpu without the EP: the defaults per pass, the placement predicted from dmlopt's table,
graph-capture readiness from it, the session configuration and its snippet, the CLI's choices."""

from __future__ import annotations

import importlib.resources

import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import dmlopt
from dmlopt.targets import session_config
from dmlopt.passes import all_passes
from dmlopt.target import EPS, Target
from dmlopt.targets.webgpu import placement, registry

DATA = importlib.resources.files("dmlopt.data")


def test_webgpu_is_a_target_with_the_installed_ort():
    assert "webgpu" in EPS
    target = Target.resolve("webgpu")
    assert target.ep == "webgpu" and target.table_version is None and target.deployed_version is None


@pytest.mark.parametrize("pass_name, option, expected", [
    ("leaky-relu", "leaky_relu", "keep"),        # ORT fuses Conv+LeakyRelu for WebGPU
    ("einsum", "einsum", "lower"),               # its Einsum is a generic loop shader
    ("einsum", "einsum_layout", "largest-matmul"),
    ("attention", "attention", "fuse"),          # ORT runs no AttentionFusion for WebGPU
])
def test_webgpu_defaults(pass_name, option, expected):
    opt = next(o for o in all_passes()[pass_name].options if o.name == option)
    assert opt.default_for("webgpu") == expected
    assert "--target webgpu" in opt.default_provenance("webgpu")


def gridsample_then_fused_matmul(opset=20):
    nodes = [helper.make_node("GridSample", ["x", "grid"], ["g"], name="gs"),
             helper.make_node("Relu", ["g"], ["r"], name="relu"),
             helper.make_node("FusedMatMul", ["r", "r"], ["y"], name="fmm", domain="com.microsoft", transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4]),
                                           helper.make_tensor_value_info("grid", TensorProto.FLOAT, [1, 4, 4, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])])
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                                 helper.make_opsetid("com.microsoft", 1)]))


@pytest.mark.parametrize("opset, cpu_ops", [(20, ["GridSample", "FusedMatMul"]), (16, ["FusedMatMul"])])
def test_predicted_placement_and_readiness(opset, cpu_ops):
    predicted = placement.predict(gridsample_then_fused_matmul(opset))
    assert [n["op"] for n in predicted["cpu_nodes"]] == cpu_ops and not predicted["measured"]
    # copies where a value crosses: GridSample-20 -> Relu -> FusedMatMul is two crossings, GridSample-16 one
    assert len(predicted["copies"]) == (2 if opset == 20 else 1)
    readiness = placement.readiness(gridsample_then_fused_matmul(opset), predicted)
    assert not readiness.ready and "predicted" in readiness.basis
    assert {b["kind"] for b in readiness.blockers} == {"cpu_nodes", "copies"}
    assert ("com.microsoft", "FusedMatMul") in registry.no_kernel("webgpu") and not registry.no_kernel("dml")


def test_session_config_for_webgpu(tmp_path):
    model = dmlopt.load(str(DATA / "cnn_leaky.onnx"))
    ready = placement.readiness(model, placement.predict(model))
    cfg = session_config.recommend(model, "webgpu", readiness=ready, precision="float16")
    options = cfg["provider_options"]
    assert cfg["provider"] == "WebGpuExecutionProvider"
    assert options["preferredLayout"] == "NHWC" and options["validationMode"] == "disabled"
    assert options["enableGraphCapture"] == "1" and "provider_options.enableGraphCapture" in cfg["reasons"]
    assert cfg["requires_shader_f16"] is True and "shader-f16" in cfg["reasons"]["requires_shader_f16"]
    not_ready = placement.readiness(gridsample_then_fused_matmul(), placement.predict(gridsample_then_fused_matmul()))
    cfg = session_config.recommend(model, "webgpu", readiness=not_ready)
    assert "enableGraphCapture" not in cfg["provider_options"] and "requires_shader_f16" not in cfg
    assert "node(s) on the CPU" in cfg["not_set"]["provider_options.enableGraphCapture"]
    text = session_config.snippet(tmp_path / "m.session.json", "webgpu")
    compile(text, "snippet", "exec")
    assert "add_provider_for_devices" in text and "register_execution_provider_library" in text
    assert "add_provider_for_devices" not in session_config.snippet(tmp_path / "m.session.json")


def test_cli_takes_webgpu(cli, tmp_path):
    out = tmp_path / "o.onnx"
    r = cli("optimize", DATA / "cnn_leaky.onnx", "-o", out, "--target", "webgpu", "--no-validate", "-q")
    assert r.code == 0 and out.exists(), r.err
    report = cli("inspect", out, "--ep", "webgpu", "--json")
    assert report.code == 0 and '"graph_capture"' in report.out


def test_fp32_sibling_needs_fp16(cli, tmp_path):
    r = cli("optimize", DATA / "sam_small.onnx", "-o", tmp_path / "o.onnx", "--target", "webgpu", "--fp32-sibling")
    assert r.code == 2 and "--fp16" in r.err and not (tmp_path / "o.onnx").exists()


def test_fp32_sibling_is_written_beside_a_float16_model(cli, tmp_path):
    out = tmp_path / "cnn16.onnx"
    r = cli("optimize", DATA / "cnn_leaky.onnx", "-o", out, "--target", "cpu", "--fp16", "--fp32-sibling", "-q")
    assert r.code == 0, r.err
    sibling = ir.load(str(tmp_path / "cnn16.fp32.onnx"))
    assert all(v.dtype == ir.DataType.FLOAT for v in sibling.graph.initializers.values())
    assert dmlopt.validate(str(DATA / "cnn_leaky.onnx"), sibling).passed
