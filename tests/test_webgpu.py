"""--target webgpu on the real WebGPU EP (the onnxruntime-ep-webgpu plug-in; Dawn on Vulkan: Mesa's
lavapipe in CI, a GPU's driver elsewhere).  Skipped, with the reason, where no adapter exists.

What is checked against the EP itself: its placement facts that the passes' WebGPU defaults rest on
(Conv+LeakyRelu fused, no FusedMatMul kernel, GridSample 16 only), the MultiHeadAttention probe and
the pipeline's per-site decline, validation on the EP, the session configuration run as written.
No test here times anything: on a software adapter times mean nothing (benchmarks/webgpu.py).
"""

from __future__ import annotations

import importlib.resources
import json

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import dmlopt
from dmlopt.report import html_page as html_report
from dmlopt.runtime import bench, sessions as runtime
from dmlopt.targets import session_config
from dmlopt.engine.pipeline import op_counts
from dmlopt.runtime import vulkan as adapter
from dmlopt.targets.webgpu import kernels, placement, registry
from passes.op_versions_test import group_norm_model

MISSING = runtime.webgpu_missing()
pytestmark = [pytest.mark.webgpu,
              pytest.mark.skipif(MISSING is not None, reason=f"no WebGPU adapter here: {MISSING}")]
DATA = importlib.resources.files("dmlopt.data")


def bundled(name: str) -> ir.Model:
    return ir.load(str(DATA / name))


def one_node(op, domain, shapes, opset=17, **attrs) -> ir.Model:
    inputs = [helper.make_tensor_value_info(f"i{k}", TensorProto.FLOAT, s) for k, s in enumerate(shapes)]
    node = helper.make_node(op, [f"i{k}" for k in range(len(shapes))], ["o"], domain=domain, **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                                 helper.make_opsetid("com.microsoft", 1)]))


def test_an_adapter_is_named():
    chosen, why = adapter.chosen()
    assert chosen is not None, why
    assert chosen.name and chosen.kind in adapter.TYPES.values()
    refusal = runtime.timing_refusal("webgpu")
    assert (refusal is not None) is chosen.software
    if chosen.software:
        assert "software" in refusal and chosen.name in refusal


def test_conv_leaky_relu_fuses_on_webgpu_as_conv_relu_does():
    """The reason --leaky-relu defaults to keep on WebGPU: ORT fuses the activation into the Conv there,
    so the LeakyRelu CNN runs as many kernels as its Relu twin, one per Conv."""
    leaky, relu = (placement.measure(bundled(n)) for n in ("cnn_leaky.onnx", "cnn_relu.onnx"))
    counts = op_counts(bundled("cnn_leaky.onnx"))
    assert leaky["measured"] and relu["measured"]
    on_ep = leaky["nodes_by_provider"]["WebGpuExecutionProvider"]
    assert on_ep == relu["nodes_by_provider"]["WebGpuExecutionProvider"]
    assert on_ep < counts["Conv"] + counts["LeakyRelu"] and not leaky["copies"]
    assert "LeakyRelu" in registry.FUSES_CONV_ACTIVATION


@pytest.mark.parametrize("op, domain, shapes, opset, attrs, on_cpu", [
    ("FusedMatMul", "com.microsoft", [[2, 4, 8], [2, 6, 8]], 17, {"transB": 1}, True),
    ("GridSample", "", [[1, 2, 4, 4], [1, 3, 3, 2]], 20, {}, True),
    ("GridSample", "", [[1, 2, 4, 4], [1, 3, 3, 2]], 16, {}, False),
])
def test_registry_facts_hold_on_the_ep(op, domain, shapes, opset, attrs, on_cpu):
    measured = placement.measure(one_node(op, domain, shapes, opset, **attrs))
    assert ("CPUExecutionProvider" in measured["nodes_by_provider"]) is on_cpu, measured
    if op == "FusedMatMul":
        assert (domain, op) in registry.NO_KERNEL
    else:
        since = 16 if opset < 20 else opset
        assert (since in registry.REGISTERED_VERSIONS[("", "GridSample")]) is not on_cpu


def test_mha_probe_is_right_at_short_sequences():
    """Up to 31 tokens WebGPU's MultiHeadAttention matches the CPU EP on every adapter seen so far."""
    assert kernels.probe_mha(2, 2, 25, 25, 8, 8, bias=True) < kernels.TOLERANCE["float32"]
    assert kernels.check("MultiHeadAttention", dict(batch=2, heads=2, seq_q=25, seq_kv=25, head_qk=8, head_v=8,
                                                    bias=True, dtype="float32")) is None


def test_mha_verdict_follows_the_probe():
    """At SAM's 64-token global block the verdict is whatever the adapter computes (lavapipe: wrong)."""
    site = dict(batch=1, heads=3, seq_q=64, seq_kv=64, head_qk=8, head_v=8, bias=True, dtype="float32")
    error = kernels.probe_mha(1, 3, 64, 64, 8, 8, bias=True)
    verdict = kernels.check("MultiHeadAttention", site)
    assert (verdict is not None) is (error > kernels.TOLERANCE["float32"])
    if verdict is not None:
        assert "S=64 T=64" in verdict and "rel L2" in verdict


@pytest.fixture(scope="module")
def small_sam():
    return dmlopt.optimize(str(DATA / "sam_small.onnx"), target="webgpu")


def test_optimize_for_webgpu_validates_on_the_ep_and_declines_what_it_computes_wrongly(small_sam):
    result = small_sam
    rep = result.report.to_dict()
    on_ep = rep["validation"]["webgpu"]
    assert rep["validation"]["passed"] and rep["validation"]["cpu_passed"] and on_ep["passed"], on_ep
    assert on_ep["optimized"]["outputs"][0]["max_abs"] < 1e-3
    attention = next(p for p in rep["passes"] if p["name"] == "attention")
    sites = [s for s in attention["sites"] if s["op"] == "MatMul"]
    assert len(sites) == 3  # two windowed blocks (25 tokens) and the global one (64 tokens)
    for s in sites:
        tokens = 64 if "blocks.2" in s["node"] else 25
        error = kernels.probe_mha(1, 3, tokens, tokens, 8, 8, bias=True)
        assert (s["action"] == "declined") is (error > kernels.TOLERANCE["float32"]), s
        if s["action"] == "declined":
            assert "computes MultiHeadAttention wrongly" in s["detail"]
    # nothing lands on the CPU: no FusedMatMul was written for the declined block
    assert "com.microsoft.FusedMatMul" not in op_counts(result.model)
    capture = rep["graph_capture"]
    assert capture["placement"]["measured"] and capture["ready"], capture["line"]


def test_the_model_fused_for_directml_is_caught_on_the_webgpu_ep():
    """The issue's case: a model dmlopt validated on the CPU EP for DirectML, run on WebGPU; validation with
    --ep webgpu tells it apart where the adapter's MultiHeadAttention is wrong (lavapipe)."""
    dml = dmlopt.optimize(str(DATA / "sam_small.onnx"), target="dml", retime=False)
    wrong = kernels.probe_mha(1, 3, 64, 64, 8, 8, bias=True) > kernels.TOLERANCE["float32"]
    v = dmlopt.validate(str(DATA / "sam_small.onnx"), dml.model, ep="webgpu")
    assert v.passed is not wrong, v.to_table()


def test_session_config_runs_on_the_ep_with_graph_capture(small_sam, tmp_path):
    result = small_sam
    out = tmp_path / "sam.onnx"
    dmlopt.save(result.model, out)
    cfg = result.report.session_config["config"]
    assert cfg["provider"] == "WebGpuExecutionProvider"
    assert cfg["provider_options"]["validationMode"] == "disabled"
    assert cfg["provider_options"]["preferredLayout"] == "NHWC"
    assert cfg["provider_options"]["enableGraphCapture"] == "1"
    path = session_config.write(cfg, tmp_path / "sam.session.json", out)
    scope: dict = {}
    exec(compile(session_config.snippet(path, "webgpu"), "snippet", "exec"), scope)  # noqa: S102 - the tested text
    session = scope["session"]
    rt = runtime.ort()
    x = np.random.default_rng(0).standard_normal(session.get_inputs()[0].shape).astype(np.float32)
    want = rt.InferenceSession(str(DATA / "sam_small.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {session.get_inputs()[0].name: x})[0]
    binding = session.io_binding()  # graph capture: inputs and outputs on the device, as the reason says
    x_device = rt.OrtValue.ortvalue_from_numpy(x, "webgpu", 0)
    y_device = rt.OrtValue.ortvalue_from_shape_and_type(want.shape, np.float32, "webgpu", 0)
    binding.bind_ortvalue_input(session.get_inputs()[0].name, x_device)
    binding.bind_ortvalue_output(session.get_outputs()[0].name, y_device)
    for _ in range(2):  # capture, then replay
        session.run_with_iobinding(binding)
        np.testing.assert_allclose(y_device.numpy(), want, atol=1e-4, rtol=1e-4)


def test_bench_times_a_captured_run_as_the_session_file_runs_it(cli):
    """--graph-capture: device inputs and outputs bound once, capture then replay; the captured run's outputs are
    the plain session's (the GPU measured this x1.20 on SAM ViT-B: benchmarks/README.md)."""
    r = cli("bench", DATA / "cnn_leaky.onnx", "--ep", "webgpu", "--graph-capture", "--runs", "2", "--warmup", "1",
            "--json")
    assert r.code == 0, r.err
    out = json.loads(r.out)
    assert "graph capture" in out["io_binding"] and out["provider_options"]["enableGraphCapture"] == "1"
    model = bundled("cnn_leaky.onnx")
    captured = bench.Timer(model, "webgpu", graph_capture=True, profile=False)
    plain = bench.Timer(model, "webgpu", feeds=captured.feeds, profile=False)
    for _ in range(2):  # replayed runs give the same numbers
        np.testing.assert_allclose(captured.run_outputs()[0], plain.run_outputs()[0], rtol=1e-5, atol=1e-6)


def test_retime_and_tuning_time_webgpu_as_the_session_file_runs_it():
    """optimize's re-timing and tuning time WebGPU under graph capture when every model compared can be captured
    (what the session file enables), else every model without it, saying why."""
    before = bundled("cnn_leaky.onnx")
    after = dmlopt.optimize(before, target="webgpu", retime=False, validate=False).model
    timing = bench.retime(before, after, "webgpu", runs=2, warmup=1)
    assert timing["graph_capture"].startswith("on,") and "graph capture" in timing["io_binding"]
    dynamic = dmlopt.load(DATA / "sam_small_dynamic.onnx")  # shape arithmetic on the CPU: ORT refuses capture
    out = bench.compare({"fixed": bundled("sam_small.onnx"), "dynamic": dynamic}, "webgpu", runs=1, warmup=1,
                        graph_capture="as-deployed", dims={"batch": 1})
    note = out["graph_capture"]
    assert note.startswith("off: dynamic cannot be captured") and "cannot run under WebGPU graph capture" in note, note
    assert all("graph capture" not in m["io_binding"] for m in out["models"].values())


def test_cli_commands_give_the_same_placement(cli, tmp_path):
    out = tmp_path / "cnn.onnx"
    assert cli("optimize", DATA / "cnn_leaky.onnx", "-o", out, "--target", "webgpu", "--json", "-q").code == 0
    inspected = cli("inspect", out, "--ep", "webgpu", "--json")
    assert inspected.code == 0
    info = json.loads(inspected.out)
    report = json.loads(cli("optimize", DATA / "cnn_leaky.onnx", "-o", tmp_path / "again.onnx", "--target",
                            "webgpu", "--json", "-q").out)
    assert info["webgpu_placement"]["nodes_by_provider"] == report["graph_capture"]["placement"]["nodes_by_provider"]
    assert info["graph_capture"]["ready"] == report["graph_capture"]["ready"]
    # LeakyRelu kept (the WebGPU default) and validated on the EP
    assert op_counts(ir.load(str(out)))["LeakyRelu"] == op_counts(bundled("cnn_leaky.onnx"))["LeakyRelu"]
    assert report["validation"]["webgpu"]["passed"]
    validated = cli("validate", DATA / "cnn_leaky.onnx", out, "--ep", "webgpu")
    assert validated.code == 0, validated.err


def test_tuning_on_a_software_adapter_is_refused(cli, tmp_path):
    chosen, _ = adapter.chosen()
    if not chosen.software:
        pytest.skip(f"the adapter is a GPU ({chosen.line()}): tuning on it is allowed")
    r = cli("optimize", DATA / "cnn_leaky.onnx", "-o", tmp_path / "x.onnx", "--target", "webgpu", "--tune")
    assert r.code == 2 and "software" in r.err
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.parametrize("name, added", [("cnn_leaky.onnx", 2), ("sam_small.onnx", 0)])
def test_nhwc_layout_adds_transposes_only_at_the_edges(name, added, tmp_path):
    """Why dmlopt writes no layout rewrite for WebGPU: ORT's NHWC layout transformer (the EP's default)
    adds Transposes only where the layouts meet: the CNN's input and output, none in SAM (its patch-embed
    Conv output meets the graph's own permute).  Counted in ORT's optimized graph for the EP."""
    rt = runtime.ort()
    device, _ = runtime.webgpu_host.ep_device(rt)
    so = rt.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "ort.onnx")
    so.add_provider_for_devices([device], {"preferredLayout": "NHWC"})
    rt.InferenceSession(str(DATA / name), so)
    after = op_counts(ir.load(str(tmp_path / "ort.onnx"))).get("Transpose", 0)
    before = op_counts(bundled(name)).get("Transpose", 0)
    assert after <= before + added
    assert any(n.domain == "com.ms.internal.nhwc" for n in ir.load(str(tmp_path / "ort.onnx")).graph)


def test_fp16_for_webgpu_names_its_shader_f16_need_and_its_fp32_sibling(cli, tmp_path):
    out = tmp_path / "sam16.onnx"
    r = cli("optimize", DATA / "sam_small.onnx", "-o", out, "--target", "webgpu", "--fp16", "--fp32-sibling", "-q")
    assert r.code == 0, r.err
    sibling = tmp_path / "sam16.fp32.onnx"
    assert "float32 sibling" in r.err and sibling.exists()
    cfg = json.loads((tmp_path / "sam16.session.json").read_text())
    assert cfg["requires_shader_f16"] is True and cfg["fp32_model"] == "sam16.fp32.onnx"
    assert any(v.dtype == ir.DataType.FLOAT16 for v in ir.load(str(out)).graph.initializers.values())
    assert all(v.dtype != ir.DataType.FLOAT16 for v in ir.load(str(sibling)).graph.initializers.values())
    v = dmlopt.validate(str(DATA / "sam_small.onnx"), str(sibling), ep="webgpu")
    assert v.passed, v.to_table()
    scope: dict = {}
    exec(compile(session_config.snippet(tmp_path / "sam16.session.json", "webgpu"), "snippet", "exec"), scope)  # noqa: S102
    assert scope["session"].get_providers()[0] == "WebGpuExecutionProvider"



def test_a_kernel_the_ep_gets_wrong_is_caught_by_validation_on_the_ep(monkeypatch):
    """The safety net behind the per-site probe: with the probe switched off, SAM's 64-token block is fused,
    the CPU EP finds nothing, and validation on the WebGPU EP fails and names the pass (where the adapter's
    MultiHeadAttention is wrong at 64 tokens, as lavapipe's is)."""
    if kernels.probe_mha(1, 3, 64, 64, 8, 8, bias=True) <= kernels.TOLERANCE["float32"]:
        pytest.skip("this adapter computes MultiHeadAttention right at 64 tokens: nothing to catch")
    monkeypatch.setattr(kernels, "check", lambda op_type, site: None)
    result = dmlopt.optimize(str(DATA / "sam_small.onnx"), target="webgpu", retime=False)
    rep = result.report.to_dict()
    assert rep["validation"]["cpu_passed"] and not rep["validation"]["webgpu"]["passed"]
    assert not result.passed and rep["broken_by"] == "attention"
    assert "computes differently on the WebGPU EP" in rep["validation"]["webgpu"]["verdict"]


@pytest.mark.parametrize("opset", [21])  # (optimize refuses GroupNormalization-18: the checker calls it deprecated)
def test_group_norm_runs_wholly_on_webgpu_as_instance_norm(opset):
    """GroupNormalization has no WebGPU kernel: ORT inlines it with shape nodes on the CPU; dmlopt's
    InstanceNormalization form runs wholly on the EP and computes the same there."""
    original = dmlopt.load(group_norm_model(opset, (1, 8, 16, 16), 4))
    before = placement.measure(original)
    assert ("", "GroupNormalization") in registry.NO_KERNEL
    assert before["nodes_by_provider"].get("CPUExecutionProvider", 0) > 0, before
    result = dmlopt.optimize(original, target="webgpu", passes=["op-versions"], retime=False)
    after = placement.measure(result.model)
    assert "CPUExecutionProvider" not in after["nodes_by_provider"] and not after["copies"]
    assert result.report.to_dict()["validation"]["webgpu"]["passed"]


def test_bench_names_the_adapter_and_how_the_ep_got_its_device(cli):
    r = cli("bench", DATA / "cnn_leaky.onnx", "--ep", "webgpu", "--runs", "1", "--warmup", "0", "--json", "-q")
    assert r.code == 0, r.err
    out = json.loads(r.out)
    chosen, _ = adapter.chosen()
    assert out["provider"] == "WebGpuExecutionProvider" and out["adapter"] == chosen.line()
    assert ("device_note" in out) is chosen.software
    if "offered" in out:  # no DRM GPU: the plug-in's own switch offered the device
        assert "ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER" in out["offered"]
    assert out["io_binding"].endswith("outputs on cpu")  # a run includes the GPU's work


def test_html_report_shows_validation_on_the_ep(small_sam):
    page = html_report.render(small_sam.report)
    assert "On the WebGPU EP (" in page and adapter.chosen()[0].name in page
