"""The recommended session (dmlopt.targets.session_config): what it sets and why, the file beside the
optimized model, and the snippet that creates a working ORT session from it."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import dmlopt
from dmlopt.targets import session_config
from dmlopt.targets.graph_capture import graph_capture_readiness
from tests.conftest import conv_leaky_model

GROUPS = ("provider_options", "session_options", "session_config_entries", "free_dimension_overrides")


def _every_entry_has_a_reason(cfg):
    for group in GROUPS:
        for key in cfg[group]:
            assert cfg["reasons"].get(f"{group}.{key}"), f"{group}.{key} has no reason"


def _tuning(best_options, ratio, provider="DmlExecutionProvider"):
    """bench.tune_ep's result shape for two option sets, the baseline first."""
    base = {k: v for k, v in best_options.items()}
    base["disable_metacommands"] = "false"
    return {"provider": provider, "baseline": "disable_metacommands=false", "best": "disable_metacommands=true",
            "varied": ["disable_metacommands"], "best_options": best_options,
            "models": {"disable_metacommands=false": {"ratio_median": 1.0, "provider_options": base,
                                                      "latency_ms": {"runs": 5}},
                       "disable_metacommands=true": {"ratio_median": ratio, "provider_options": best_options,
                                                     "latency_ms": {"runs": 5}}}}


def test_directml_ready_model_gets_graph_capture_and_reasons():
    m = dmlopt.load(conv_leaky_model(batch=1))
    cfg = session_config.recommend(m, "dml", readiness=graph_capture_readiness(m, "dml"))
    assert cfg["provider"] == "DmlExecutionProvider"
    assert cfg["session_config_entries"] == {"ep.dml.enable_graph_capture": "1"}
    assert cfg["provider_options"] == {"device_id": "0"}
    assert cfg["session_options"]["graph_optimization_level"] == "ORT_ENABLE_ALL"
    assert cfg["free_dimension_overrides"] == {}
    assert "disable_metacommands" not in cfg["provider_options"]
    assert "provider_options.disable_metacommands" in cfg["not_set"]
    _every_entry_has_a_reason(cfg)


def test_not_ready_model_gets_no_graph_capture_and_overrides_only_for_dims_the_user_fixed():
    m = dmlopt.load(conv_leaky_model(batch="N"))
    readiness = graph_capture_readiness(m, "dml")
    cfg = session_config.recommend(m, "dml", readiness=readiness)
    assert cfg["session_config_entries"] == {}
    assert cfg["not_set"]["session_config_entries.ep.dml.enable_graph_capture"] == readiness.line()
    assert cfg["free_dimension_overrides"] == {}  # issue 31: not pinned at a size dmlopt chose
    assert "did not fix it" in cfg["not_set"]["free_dimension_overrides.N"]
    assert session_config.recommend(m, "dml", dims={"N": 4})["free_dimension_overrides"] == {"N": 4}
    _every_entry_has_a_reason(cfg)


def test_metacommands_are_disabled_only_when_measured_faster():
    m = dmlopt.load(conv_leaky_model(batch=1))
    faster = session_config.recommend(m, "dml", ep_tuning=_tuning({"disable_metacommands": "true"}, 0.8))
    assert faster["provider_options"]["disable_metacommands"] == "true"
    assert "x0.800" in faster["reasons"]["provider_options.disable_metacommands"]
    slower = session_config.recommend(m, "dml", ep_tuning=_tuning({"disable_metacommands": "true"}, 1.05))
    assert "disable_metacommands" not in slower["provider_options"]


def test_cuda_options():
    m = dmlopt.load(conv_leaky_model(batch=1))
    ready = graph_capture_readiness(m, "cuda")
    cfg = session_config.recommend(m, "cuda", readiness=ready)
    assert cfg["provider"] == "CUDAExecutionProvider"
    assert cfg["provider_options"]["cudnn_conv_algo_search"] == "EXHAUSTIVE"
    assert cfg["provider_options"].get("enable_cuda_graph") == ("1" if ready.ready else None)
    assert "provider_options.prefer_nhwc" in cfg["not_set"]
    assert "execution_mode" not in cfg["session_options"]
    _every_entry_has_a_reason(cfg)


def test_config_path():
    assert session_config.config_path("a/b.onnx") == "a/b.session.json"
    assert session_config.config_path("model") == "model.session.json"


def _run_snippet(config_path):
    scope: dict = {}
    exec(compile(session_config.snippet(config_path), "snippet", "exec"), scope)  # noqa: S102 - the tested text
    return scope["session"]


@pytest.mark.parametrize("dims", [["--dim", "N=1"], []])
def test_snippet_creates_a_working_session_from_the_written_file(cli, tmp_path, dims):
    """optimize writes OUT.session.json; with the CPU EP standing in (cpu_stand_in), the snippet
    creates a session of the written model whose outputs match the original."""
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(conv_leaky_model(batch="N"), src)
    r = cli("optimize", src, "-o", out, *dims)
    assert r.code == 0, r.err
    written = tmp_path / "out.session.json"
    cfg = json.loads(written.read_text())
    assert cfg["format"] == session_config.FORMAT and cfg["model"] == "out.onnx"
    assert "N" not in cfg["free_dimension_overrides"]  # --dim N=1 froze it; without, N stays free
    assert ("free_dimension_overrides.N" in cfg["not_set"]) == (not dims)
    stand_in = tmp_path / "cpu.session.json"
    stand_in.write_text(json.dumps(session_config.cpu_stand_in(cfg)))
    session = _run_snippet(str(stand_in))
    assert session.get_providers()[0] == "CPUExecutionProvider"
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(session.run(None, {"x": x})[0], ref, rtol=1e-4, atol=1e-5)
    if not dims:  # issue 31: validated at N=1, the session still takes the user's batch of 3
        x3 = np.concatenate([x, x, x])
        np.testing.assert_allclose(session.run(None, {"x": x3})[0], np.concatenate([ref] * 3), rtol=1e-4, atol=1e-5)
    assert "session configuration: " in r.out and "ort.InferenceSession" in json.loads(
        cli("optimize", src, "-o", out, "--json", *dims).out)["session_config"]["snippet"]
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_snippet_refuses_a_silent_fallback(tmp_path):
    """Unchanged, the DirectML file fails on a machine without DirectML instead of running on CPU."""
    m = dmlopt.load(conv_leaky_model(batch=1))
    model = tmp_path / "m.onnx"
    dmlopt.save(m, model)
    path = session_config.write(session_config.recommend(m, "dml"), tmp_path / "m.session.json", model)
    with pytest.warns(UserWarning), pytest.raises(AssertionError, match="CPUExecutionProvider"):
        _run_snippet(path)  # ORT warns and falls back to the CPU; the snippet's assert stops it


def test_report_json_and_html_carry_the_configuration(cli, tmp_path):
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(conv_leaky_model(batch=1), src)
    assert cli("optimize", src, "-o", out, "-q", "--report", tmp_path / "r.json").code == 0
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["graph_capture"]["ready"] is True
    assert rep["session_config"]["path"] == str(tmp_path / "out.session.json")
    assert rep["session_config"]["config"]["session_config_entries"] == {"ep.dml.enable_graph_capture": "1"}
    assert cli("optimize", src, "-o", out, "-q", "--report", tmp_path / "r.html").code == 0
    page = (tmp_path / "r.html").read_text()
    assert 'id="session"' in page and "ep.dml.enable_graph_capture" in page and "InferenceSession" in page


def test_no_session_config_writes_none(cli, tmp_path):
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(conv_leaky_model(batch=1), src)
    r = cli("optimize", src, "-o", out, "-q", "--no-session-config", "--report", tmp_path / "r.json")
    assert r.code == 0 and out.exists()
    assert not (tmp_path / "out.session.json").exists()
    assert json.loads((tmp_path / "r.json").read_text())["session_config"] is None


def test_refuses_to_replace_a_file_that_is_not_a_session_config(cli, tmp_path):
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(conv_leaky_model(batch=1), src)
    precious = tmp_path / "out.session.json"
    precious.write_text("my notes")
    r = cli("optimize", src, "-o", out, "-q")
    assert r.code == 2 and "not a dmlopt session configuration" in r.err
    assert precious.read_text() == "my notes" and not out.exists()  # refused before any work


def test_refuses_to_write_over_the_input(cli, tmp_path):
    src = tmp_path / "out.session.json"  # an input model whose name is the configuration's
    onnx.save(conv_leaky_model(batch=1), src)
    before = src.read_bytes()
    r = cli("optimize", src, "-o", tmp_path / "out.onnx", "-q")
    assert r.code == 2 and "refusing to overwrite the input model" in r.err
    assert src.read_bytes() == before


def test_an_earlier_configuration_is_replaced(cli, tmp_path):
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(conv_leaky_model(batch="N"), src)
    assert cli("optimize", src, "-o", out, "-q").code == 0
    assert cli("optimize", src, "-o", out, "-q", "--dim", "N=1").code == 0
    assert json.loads((tmp_path / "out.session.json").read_text())["free_dimension_overrides"] == {}


def test_readme_shows_the_snippet_dmlopt_writes():
    readme = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(readme, "README.md"), encoding="utf-8") as f:
        assert session_config.snippet("out.session.json") in f.read()


def test_a_dim_the_user_sized_with_shape_is_pinned_and_a_chosen_image_size_is_not(tmp_path):
    """A detector with dynamic H/W validated at dmlopt's size: the file leaves H/W free (the
    README's snippet refused 640x640, "Got: 640 Expected: 32"); --shape names a size: pinned."""
    src = tmp_path / "det.onnx"
    onnx.save(conv_leaky_model(batch="N", size="S"), src)
    free = dmlopt.optimize(src, target="cpu", passes=["cleanup"], retime=False)
    cfg = free.report.session_config["config"]
    assert cfg["free_dimension_overrides"] == {} and "free_dimension_overrides.S" in cfg["not_set"]
    fixed = dmlopt.optimize(src, target="cpu", passes=["cleanup"], retime=False, shapes={"x": [2, 3, 40, 40]})
    fixed_cfg = fixed.report.session_config["config"]
    assert fixed_cfg["free_dimension_overrides"] in ({}, {"N": 2, "S": 40})  # frozen by --shape, else pinned
    assert "free_dimension_overrides.S" not in fixed_cfg["not_set"]
