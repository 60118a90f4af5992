"""fp16 repair: when float16 fails validation, the nodes that need float32 are found and kept."""

from __future__ import annotations

import json

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import pytest

import dmlopt
from dmlopt.engine import fp16_repair
from dmlopt.runtime.validate import DEFAULT_TOLERANCES, make_inputs, validate

HALF_TOL = DEFAULT_TOLERANCES["float16"]
F16, F32 = ir.DataType.FLOAT16, ir.DataType.FLOAT


def text_model(body: str, inputs: str, outputs: str, inits: str = "") -> ir.Model:
    model = ir.from_onnx_text(f"""<ir_version: 8, opset_import: ["" : 17]>
        g ({inputs}) => ({outputs}) <{inits}> {{ {body} }}""")
    for node in model.graph:
        node.name = f"n_{node.outputs[0].name}"
    return model


def overflow_model() -> ir.Model:
    """x*1000 squared (~1e6, beyond float16's 65504: inf), then scaled back down by 2**-20."""
    return text_model("""
        up = Mul (x, k1000)
        sq = Mul (up, up)
        down = Mul (sq, k2m20)
        y = Relu (down)
    """, "float[4,8] x", "float[4,8] y", "float[1] k1000 = {1000.0}, float[1] k2m20 = {9.5367431640625e-07}")


def precision_model() -> ir.Model:
    """(s + 1000) - 1000: in range everywhere, but float16 holds s + 1000 only to 0.5."""
    return text_model("""
        s = Mul (x, half)
        a = Add (s, big)
        b = Sub (a, big)
        y = Tanh (b)
    """, "float[4,8] x", "float[4,8] y", "float[1] half = {0.5}, float[1] big = {1000.0}")


def underflow_model() -> ir.Model:
    """x*1e-9 is below float16's smallest subnormal: it flushes to zero before x*1e9 scales it back."""
    return text_model("""
        tiny = Mul (x, k1)
        y = Mul (tiny, k2)
        z = Relu (y)
    """, "float[4,8] x", "float[4,8] z", "float[1] k1 = {1e-9}, float[1] k2 = {1e9}")


def fp16_of(model: ir.Model) -> dict[str, ir.DataType]:
    return {n.name: n.outputs[0].dtype for n in model.graph}


def optimize(model, **options):
    return dmlopt.optimize(model, target="cpu", passes=["fp16"], fp16=True, retime=False, **options)


def test_overflow_keeps_exactly_the_nodes_that_make_or_read_the_value():
    model = overflow_model()
    strict = optimize(model, fp16_repair=False)
    assert not strict.passed and strict.report.validation["outputs"][0]["max_abs"] == float("inf")
    result = optimize(model)
    assert result.passed, result.report.to_table()
    record = result.report.fp16_repair
    kept = {k["node"]: k for k in record["kept"]}
    assert set(kept) == {"n_sq", "n_down"}
    assert {k["found_by"] for k in kept.values()} == {"overflow"}
    assert kept["n_sq"]["max_abs"] > 65504 and "'sq'" in kept["n_sq"]["detail"]
    assert record["validation_runs"] == 1 and record["max_runs"] == 24
    dtypes = fp16_of(result.model)
    assert dtypes["n_up"] == F16 and dtypes["n_y"] == F16  # the rest stays float16
    assert dtypes["n_sq"] == F32 and dtypes["n_down"] == F32
    # The written model validates on its own; the report's fp16 entry is the repaired run.
    v = validate(model, result.model, atol=HALF_TOL[0], rtol=HALF_TOL[1])
    assert v.passed, v.to_table()
    fp16_entry = result.report.passes[-1]
    assert [p["name"] for p in result.report.passes] == ["fp16"]
    assert sorted(s["node"] for s in fp16_entry["sites"] if "--fp16-keep-nodes" in s["detail"]) == ["n_down", "n_sq"]


def test_underflow_is_detected_from_the_float32_values():
    model = underflow_model()
    assert not optimize(model, fp16_repair=False).passed
    result = optimize(model)
    assert result.passed, result.report.to_table()
    kept = {k["node"]: k["found_by"] for k in result.report.fp16_repair["kept"]}
    assert kept == {"n_tiny": "underflow", "n_y": "underflow"}
    assert fp16_of(result.model)["n_z"] == F16


def test_precision_error_is_found_by_bisection():
    model = precision_model()
    assert not optimize(model, fp16_repair=False).passed
    result = optimize(model)
    assert result.passed, result.report.to_table()
    record = result.report.fp16_repair
    assert [(k["node"], k["found_by"]) for k in record["kept"]] == [("n_a", "bisection"), ("n_b", "bisection")]
    assert 1 < record["validation_runs"] <= record["max_runs"]
    dtypes = fp16_of(result.model)
    assert dtypes["n_a"] == F32 and dtypes["n_b"] == F32 and dtypes["n_s"] == F16 and dtypes["n_y"] == F16
    assert validate(model, result.model, atol=HALF_TOL[0], rtol=HALF_TOL[1]).passed


def test_no_set_within_the_bound_refuses_as_before():
    result = optimize(precision_model(), fp16_repair_runs=2)
    assert not result.passed
    record = result.report.fp16_repair
    assert record["passed"] is False and record["validation_runs"] == 2
    assert "within 2 validation runs" in record["reason"]
    assert result.report.broken_by == "fp16"
    assert "fp16 repair: FAILED" in result.report.to_table()


def test_search_bisects_to_a_minimal_set_in_topological_order():
    """Two separate places lose precision: each pair is found by its own bisections."""
    model = text_model("""
        a = Add (x, big)
        b = Sub (a, big)
        c = Relu (b)
        d = Mul (c, two)
        e = Add (x, big)
        f = Sub (e, big)
        g = Add (d, f)
        y = Tanh (g)
    """, "float[4,8] x", "float[4,8] y", "float[1] big = {1000.0}, float[1] two = {2.0}")
    result = optimize(model)
    assert result.passed, result.report.to_table()
    record = result.report.fp16_repair
    assert [k["node"] for k in record["kept"]] == ["n_a", "n_b", "n_e", "n_f"]
    assert all(fp16_of(result.model)[n] == F16 for n in ("n_c", "n_d", "n_g", "n_y"))


def test_value_ranges_are_read_in_bounded_batches(monkeypatch):
    model = overflow_model()
    monkeypatch.setattr(fp16_repair, "PROBE_BATCH_VALUES", 2)
    runs = []
    real_run = fp16_repair.run
    monkeypatch.setattr(fp16_repair, "run", lambda m, feeds: runs.append(len(m.graph.outputs)) or real_run(m, feeds))
    feeds = make_inputs(model, model)
    common_passes.ShapeInferencePass()(model)  # value_ranges reads typed values
    ranges = fp16_repair.value_ranges(model, feeds)
    assert runs == [2, 2]  # four node outputs, at most two a run
    up = feeds["x"] * 1000
    assert ranges["sq"][0] == pytest.approx(float(np.max(up * up)), rel=1e-6)
    assert ranges["x"][0] == pytest.approx(float(np.max(np.abs(feeds["x"]))))
    assert [v.name for v in model.graph.outputs] == ["y"]


def test_cli_repairs_and_no_fp16_repair_keeps_the_refusal(cli, tmp_path):
    src = tmp_path / "overflow.onnx"
    dmlopt.save(overflow_model(), src)
    out = tmp_path / "out.onnx"
    strict = cli("optimize", src, "-o", out, "--target", "cpu", "--fp16", "--no-fp16-repair", "--no-time")
    assert strict.code == 1 and "nothing was written" in strict.err
    assert not out.exists()
    report = tmp_path / "r.json"
    r = cli("optimize", src, "-o", out, "--target", "cpu", "--fp16", "--no-time", "--report", report)
    assert r.code == 0, r.err
    assert "fp16 repair: 2 nodes kept in float32, 2 in float16 (1 validation run, at most 24)" in r.out
    assert "n_sq" in r.out and "overflow" in r.out
    rep = json.loads(report.read_text())
    assert rep["fp16_repair"]["passed"] is True and rep["validation"]["passed"] is True
    written = dmlopt.load(out)
    assert validate(overflow_model(), written, atol=HALF_TOL[0], rtol=HALF_TOL[1]).passed
    inits = {v.name: v.dtype for v in written.graph.initializers.values()}
    assert inits == {"k1000": F16, "k2m20": F32}  # n_up reads its weight in float16; n_down stays float32


def test_html_report_lists_the_kept_nodes():
    from dmlopt.report import html_page as html_report
    from tests.test_html_report import parse

    page = parse(html_report.render(optimize(overflow_model()).report))
    rows = page.tables["fp16-repair"]
    assert [(row[0], row[2]) for row in rows] == [("n_sq", "overflow"), ("n_down", "overflow")]
    refused = parse(html_report.render(optimize(precision_model(), fp16_repair_runs=2).report))
    assert "fp16-repair" not in refused.tables
