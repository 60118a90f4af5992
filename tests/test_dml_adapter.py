"""The DirectML host names the adapter its DirectML really uses, asked inside the host run (issue 30, item 5).

A Vulkan query outside the host saw no device on the GPU machine ("Vulkan device unknown") and the host's
GPU times could not be told from software ones.  The device now comes from the host run's own log: ORT's
device discovery (DXGI adapter 0, ORT 1.22+) or vkd3d's traced device choice.
"""

from __future__ import annotations

import json

import pytest

from dmlopt.targets.dml import adapter, host
from tests import fake_dml_host
from tests.test_dml_host_boundary import fake, identity_model  # noqa: F401 (fake: a fixture)

NVIDIA = ("2026-12-06 [I:onnxruntime:onnxruntime-node, device_discovery_common.cc:34] Discovered OrtHardwareDevice "
          "{vendor_id:0x10de, device_id:0x2330, vendor:NVIDIA, type:1, metadata: [Description=NVIDIA H100 80GB HBM3, "
          "DxgiAdapterNumber=0, DxgiHighPerformanceIndex=0, DxgiVideoMemory=81559 MB, LUID=1008, ]}")
CPU_DEVICE = ("Discovered OrtHardwareDevice {vendor_id:0x8086, device_id:0x0, vendor:Intel, type:0, "
              "metadata: [Description=Intel, ]}")
LAVAPIPE = ("Discovered OrtHardwareDevice {vendor_id:0x10005, device_id:0x0, vendor:, type:1, metadata: "
            "[Description=llvmpipe (LLVM 15.0.6, 256 bits), DxgiAdapterNumber=0, DxgiVideoMemory=24151 MB, ]}")
VKD3D = "vkd3d:0024:trace:vkd3d_select_physical_device Using device: NVIDIA H100 80GB HBM3, 0x10de:0x2330."


def test_dxgi_adapter_zero_from_ort_device_discovery():
    found = adapter.from_log("\n".join([CPU_DEVICE, NVIDIA]))
    assert found["name"] == "NVIDIA H100 80GB HBM3" and found["vendor_id"] == 0x10DE and not found["software"]
    assert "DXGI adapter 0" in found["source"]


def test_a_description_holding_commas_is_read_whole_and_lavapipe_is_software():
    found = adapter.from_log(LAVAPIPE)
    assert found["name"] == "llvmpipe (LLVM 15.0.6, 256 bits)" and found["software"]


def test_vkd3d_trace_where_ort_has_no_device_discovery():
    found = adapter.from_log("noise\n" + VKD3D)
    assert found["name"] == "NVIDIA H100 80GB HBM3" and not found["software"] and "vkd3d" in found["source"]
    assert adapter.from_log("no device named here") is None


def test_a_second_adapter_is_not_the_one_directml_uses():
    second = NVIDIA.replace("DxgiAdapterNumber=0", "DxgiAdapterNumber=1")
    assert adapter.from_log(second + "\n" + LAVAPIPE)["software"]


def test_a_driver_name_is_bounded_printable_text():
    found = adapter.from_log(NVIDIA.replace("NVIDIA H100 80GB HBM3", "GPU\x1b[2J" + "x" * 500))
    assert "\x1b" not in found["name"] and len(found["name"]) <= adapter.NAME_CHARS


def saying(log_line: str, respond: str = fake_dml_host.ECHO) -> str:
    """A fake host's respond.py that first writes `log_line` where ORT's log goes (the run's stderr)."""
    return f"import sys\nprint({log_line!r}, file=sys.stderr)\n" + respond


def test_a_host_on_a_gpu_is_named_as_its_run_sees_it(cli, fake, tmp_path):
    """Whatever Vulkan this process sees, the host's own run decides: a GPU there is a GPU."""
    root = fake(saying(NVIDIA))
    described = host.open_host(root).describe(fake_dml_host.VERSION)
    assert described["vulkan_device"] == "NVIDIA H100 80GB HBM3" and described["software"] is False
    assert described["note"] is None
    m = identity_model(tmp_path / "m.onnx")
    r = cli("validate", m, m, "--ep", "dml", "--dml-host", root, "--json")
    assert r.code == 0, r.err
    assert "NVIDIA H100 80GB HBM3" in r.out and "software rendering" not in r.out


def test_a_software_adapter_in_the_host_is_labelled(cli, fake, tmp_path):
    root = fake(saying(LAVAPIPE))
    described = host.open_host(root).describe(fake_dml_host.VERSION)
    assert described["software"] is True and described["note"] == host.SOFTWARE_NOTE


@pytest.mark.dml_host
def test_the_real_host_names_its_device_from_inside(dml_host):
    for version in dml_host.versions:
        described = dml_host.describe(version)
        assert "host run" in described["device_source"], json.dumps(described)
        assert described["vulkan_device"] and "unknown" not in described["vulkan_device"]


# 5 ms per Relu node: the optimized model, one Relu fewer, takes half as long.
TIMED_RELU = fake_dml_host.echo("5.0 * max(1, sum(n.op_type == 'Relu' for n in graph.node))", relu=True)


def test_optimize_times_before_and_after_on_a_gpu_host(cli, fake, tmp_path):
    """Issue 30, item 5: with the host on a GPU, optimize re-times there (each model in its own host process)
    instead of "DmlExecutionProvider ... is not on this machine"."""
    import onnx
    from onnx import TensorProto, helper

    root = fake(saying(NVIDIA, TIMED_RELU))
    # Relu(Relu(x)): cleanup leaves one Relu, so the output differs from the input model (timed: 10 ms -> 5 ms)
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Relu", ["r"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), src)
    r = cli("optimize", src, "-o", tmp_path / "out.onnx", "--target", "dml", "--dml-host", root,
            "--ort-version", fake_dml_host.VERSION, "--json", "-q")
    report = json.loads(r.out)
    assert r.code == 0, r.err
    timing = report["timing"]
    assert timing and timing["provider"] == "DmlExecutionProvider", report.get("not_timed")
    assert timing["host"]["vulkan_device"] == "NVIDIA H100 80GB HBM3"
    assert timing["runs"] >= 10 and timing["verdict"].startswith("x2.00 faster"), timing
    assert report.get("not_timed") in (None, "")


def test_a_software_host_is_never_timed_by_optimize(cli, fake, tmp_path):
    root = fake(saying(LAVAPIPE))
    m = identity_model(tmp_path / "m.onnx")
    r = cli("optimize", m, "-o", tmp_path / "out.onnx", "--target", "dml", "--dml-host", root,
            "--ort-version", fake_dml_host.VERSION, "--json", "-q")
    assert r.code == 0, r.err
    report = json.loads(r.out)
    assert not report.get("timing") and "software rendering" in report["not_timed"]


def _relu_twice(path):
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Relu", ["r"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


def test_bench_compare_on_a_gpu_host(cli, fake, tmp_path):
    """`bench --ep dml --compare` on a host whose device is a GPU: each model in its own host process, A B B A."""
    import onnx
    from onnx import TensorProto, helper

    root = fake(saying(NVIDIA, TIMED_RELU))
    two = _relu_twice(tmp_path / "two.onnx")
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    one = tmp_path / "one.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), one)
    r = cli("bench", two, "--compare", one, "--ep", "dml", "--dml-host", root, "--runs", "4", "--json")
    assert r.code == 0, r.err
    out = json.loads(r.out)
    assert out["provider"] == "DmlExecutionProvider" and out["baseline"] == "two.onnx"
    assert out["models"]["one.onnx"]["ratio"]["median"] == pytest.approx(0.5)
    assert out["models"]["one.onnx"]["ratio"]["runs"] == 8 and "NVIDIA H100" in out["adapter"]
    r = cli("bench", two, "--compare", one, "--ep", "dml", "--dml-host", root, "--runs", "4")
    assert r.code == 0 and "one.onnx: x2.00 faster" in r.out and "NVIDIA H100 80GB HBM3" in r.out, r.out


def test_bench_compare_on_a_software_host_is_refused(cli, fake, tmp_path):
    root = fake(saying(LAVAPIPE))
    r = cli("bench", _relu_twice(tmp_path / "a.onnx"), "--compare", identity_model(tmp_path / "b.onnx"),
            "--ep", "dml", "--dml-host", root)
    assert r.code == 2 and "software rendering" in r.err and "Traceback" not in r.err, r.err


def test_tune_times_candidates_on_a_gpu_host(cli, fake, tmp_path):
    """--tune with the host on a GPU measures every candidate there: here a LeakyRelu costs 2x, so a strategy
    that removes it wins over the documented default (keep)."""
    import onnx

    from tests.conftest import conv_leaky_model

    root = fake(saying(NVIDIA, fake_dml_host.cpu_ort(
        "5.0 if any(n.op_type == 'LeakyRelu' for n in graph.node) else 2.5")))
    src = tmp_path / "cnn.onnx"
    onnx.save(conv_leaky_model(batch=1), src)
    r = cli("optimize", src, "-o", tmp_path / "out.onnx", "--target", "dml", "--dml-host", root,
            "--ort-version", fake_dml_host.VERSION, "--tune", "--passes", "leaky-relu", "--json", "-q")
    assert r.code == 0, r.err
    report = json.loads(r.out)
    (choice,) = [c for c in report["choices"] if c["option"] == "leaky_relu"]
    assert choice["choice"] != "keep", choice
    assert "LeakyRelu" not in {n.op_type for n in onnx.load(tmp_path / "out.onnx").graph.node}
    assert report["timing"]["verdict"].startswith("x2.00 faster"), report["timing"]
