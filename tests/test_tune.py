"""Tuning: which options are chosen, validation of candidates, timing records, --tune needs the provider."""

from __future__ import annotations

import json

import onnx_ir as ir
import pytest

import dmlopt
from dmlopt import runtime, tune
from dmlopt.errors import ProviderError
from dmlopt.passes import PassContext
from dmlopt.passes.fp16 import Fp16Pass
from dmlopt.validate import DEFAULT_TOLERANCES
from tests.conftest import conv_leaky_model


@pytest.fixture
def model():
    return ir.from_proto(conv_leaky_model(batch=1))


def fp16_option():
    return next(o for o in Fp16Pass.options if o.name == "fp16")


def test_pending_options():
    plain = PassContext(target="cpu", options={"tune": False})
    assert tune.pending(Fp16Pass(plain), plain) == []  # fp16 defaults to off, not auto
    tuning = PassContext(target="cpu", options={"tune": True})
    assert [o.name for o in tune.pending(Fp16Pass(tuning), tuning)] == ["fp16"]
    user_set = PassContext(target="cpu", options={"tune": True, "fp16": True})
    assert tune.pending(Fp16Pass(user_set), user_set) == []  # what the user set is kept
    auto = PassContext(target="cpu", options={"tune": False, "fp16": "auto"})
    assert [o.name for o in tune.pending(Fp16Pass(auto), auto)] == ["fp16"]


def test_candidates_of_a_bool_option_are_off_then_on():
    assert tune.candidates(fp16_option()) == [False, True]


def test_fp16_uses_float16_tolerances_unless_given():
    half = DEFAULT_TOLERANCES["float16"]
    assert tune.validation_tolerances({"fp16": True}, None, None) == half
    assert tune.validation_tolerances({"fp16": True}, 0.5, None) == (0.5, half[1])
    assert tune.validation_tolerances({"fp16": False}, None, None) == (None, None)


def test_measure_times_each_candidate_that_validates(model):
    ctx = PassContext(target="cpu", options={"tune": True})
    choice, record = tune.measure(Fp16Pass(ctx), fp16_option(), [False, True], model, model, ctx)
    assert choice in (False, True)
    assert set(record["candidates"]) == {"False", "True"}
    for c in record["candidates"].values():
        assert c["median_ms"] > 0 and c["min_ms"] <= c["median_ms"] <= c["p90_ms"]
    assert record["candidates"]["False"]["ratio"] == 1.0 and record["baseline"] == "False"
    assert record["candidates"]["False"]["max_rel_error"] == 0.0
    assert record["candidates"]["True"]["max_rel_error"] > 0.0  # float16 really ran
    best = min(record["candidates"], key=lambda c: record["candidates"][c]["ratio"])
    assert str(choice) == best


def test_a_candidate_that_fails_validation_is_rejected(model):
    ctx = PassContext(target="cpu", options={"tune": True})
    choice, record = tune.measure(Fp16Pass(ctx), fp16_option(), [False, True], model, model, ctx,
                                  check={"atol": 0.0, "rtol": 0.0})
    assert choice is False
    assert record["rejected"] == {"True": "failed validation"}
    assert set(record["candidates"]) == {"False"}


def test_nothing_is_timed_when_no_choice_changes_the_graph():
    ints = ir.from_onnx_text("""<ir_version: 8, opset_import: ["" : 17]>
        g (int64[2] x) => (int64[2] y) { y = Add(x, x) }""")
    ctx = PassContext(target="cpu", options={"tune": True})
    choice, record = tune.measure(Fp16Pass(ctx), fp16_option(), [False, True], ints, ints, ctx)
    assert choice is False and record["candidates"] == {}
    assert record["how"].startswith("not timed")


def test_optimize_tune_records_every_candidate(model):
    result = dmlopt.optimize(model, target="cpu", passes=["fp16"], tune=True, retime=False)
    assert result.passed
    (choice,) = result.report.choices
    assert choice["pass"] == "fp16" and choice["option"] == "fp16"
    assert set(choice["candidates"]) == {"False", "True"}
    assert choice["how"].startswith("measured on CPUExecutionProvider")
    # The chosen variant is the one in the output: float16 initializers exactly when fp16 won.
    half = any(v.dtype == ir.DataType.FLOAT16 for v in result.model.graph.initializers.values())
    assert half == (choice["choice"] is True)


def test_optimize_retimes_when_the_target_is_here(model):
    result = dmlopt.optimize(model, target="cpu", passes=["cleanup"])
    t = result.report.timing
    assert t["provider"] == "CPUExecutionProvider"
    assert {"before_ms", "after_ms", "speedup", "runs"} <= set(t)
    assert "latency on CPUExecutionProvider" in result.report.to_table()
    assert dmlopt.optimize(model, target="cpu", passes=["cleanup"], retime=False).report.timing is None


@pytest.mark.skipif(runtime.has_target("dml"), reason="DirectML is present here")
def test_tune_for_an_absent_target_fails_before_any_work(tmp_path):
    # The model path does not exist: a ProviderError (not an InputError) shows the check came first.
    with pytest.raises(ProviderError, match="providers present: .*CPUExecutionProvider"):
        dmlopt.optimize(tmp_path / "missing.onnx", target="dml", tune=True)
    with pytest.raises(ProviderError, match="DmlExecutionProvider"):
        dmlopt.optimize(tmp_path / "missing.onnx", target="dml", retime=True)


@pytest.mark.skipif(runtime.has_target("dml"), reason="DirectML is present here")
def test_cli_tune_without_the_target_is_exit_2(cli, model_path, tmp_path):
    r = cli("optimize", model_path, "-o", tmp_path / "out.onnx", "--tune", "--target", "dml")
    assert r.code == 2
    assert "--tune needs the DmlExecutionProvider" in r.err and "CPUExecutionProvider" in r.err
    assert not (tmp_path / "out.onnx").exists()


def test_cli_fp16_flag_and_json_report(cli, model_path, tmp_path):
    report = tmp_path / "r.json"
    r = cli("optimize", model_path, "-o", tmp_path / "out.onnx", "--target", "cpu", "--fp16", "--passes", "fp16",
            "--shape", "x:1,3,8,8", "--report", report)
    assert r.code == 0, r.err
    rep = json.loads(report.read_text())
    assert rep["options"]["fp16"] is True
    assert rep["passes"][0]["name"] == "fp16" and rep["passes"][0]["op_delta"] == {"Cast": 2}
    assert rep["validation"]["passed"] and rep["validation"]["outputs"][0]["atol"] == DEFAULT_TOLERANCES["float16"][0]
