"""The pipeline: a copy is rewritten, each pass is checked and recorded, failures are named."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import dmlopt
from dmlopt.errors import UsageError
from dmlopt.engine.pipeline import PassBroke, op_counts
from tests.conftest import conv_leaky_model


def test_input_model_is_not_modified():
    model = dmlopt.load(conv_leaky_model())
    before = [n.op_type for n in model.graph]
    result = dmlopt.optimize(model, passes=["cleanup"])
    assert [n.op_type for n in model.graph] == before == ["Conv", "LeakyRelu", "Identity"]
    assert [n.op_type for n in result.model.graph] == ["Conv", "LeakyRelu"]
    assert result.passed


def test_report_records_each_pass():
    result = dmlopt.optimize(conv_leaky_model(), passes="cleanup")
    (entry,) = result.report.passes
    assert entry["name"] == "cleanup" and entry["modified"] is True
    assert entry["op_counts_before"] == {"Conv": 1, "Identity": 1, "LeakyRelu": 1}
    assert entry["op_counts_after"] == {"Conv": 1, "LeakyRelu": 1}
    assert entry["nodes_before"] == 3 and entry["nodes_after"] == 2
    assert entry["seconds"] >= 0
    assert result.report.validation["passed"] is True
    assert "cleanup" in result.report.to_table()


def test_unknown_pass_option_and_target_are_usage_errors():
    with pytest.raises(UsageError, match="unknown pass 'nope'"):
        dmlopt.optimize(conv_leaky_model(), passes=["nope"])
    with pytest.raises(UsageError, match="unknown option 'no_such_option'"):
        dmlopt.optimize(conv_leaky_model(), no_such_option=1)
    with pytest.raises(UsageError, match="unknown target"):
        dmlopt.optimize(conv_leaky_model(), target="tpu")


def test_a_pass_that_breaks_the_model_is_caught(monkeypatch):
    from dmlopt.passes import cleanup

    def break_it(self, model):
        node = next(iter(model.graph))
        node.attributes["pads"] = ir.AttrInt64s("pads", [1, 1])  # wrong rank for a 2D Conv
        return ir.passes.PassResult(model, True)

    monkeypatch.setattr(cleanup.CleanupPass, "call", break_it)
    with pytest.raises(PassBroke, match="pass 'cleanup' produced an invalid model"):
        dmlopt.optimize(conv_leaky_model(), passes=["cleanup"])


def test_numerics_failure_is_bisected_to_the_pass(monkeypatch):
    from dmlopt.passes import cleanup

    def wrong_slope(self, model):
        for node in model.graph:
            if node.op_type == "LeakyRelu":
                node.attributes["alpha"] = ir.AttrFloat32("alpha", 0.5)
        return ir.passes.PassResult(model, True)

    monkeypatch.setattr(cleanup.CleanupPass, "call", wrong_slope)
    result = dmlopt.optimize(conv_leaky_model(), passes=["cleanup"])
    assert not result.passed
    assert result.report.broken_by == "cleanup"
    with pytest.raises(dmlopt.CheckFailed, match="first failing pass: cleanup"):
        from dmlopt.engine.pipeline import require_valid

        require_valid(result)


def _bloat_model(n=200_000):
    """y = x + ConstantOfShape([n]) + Range(0, n): folding would store 2 x n floats."""
    shape = numpy_helper.from_array(np.array([n], dtype=np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["c"],
                          value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.5])),
         helper.make_node("Cast", ["shape"], ["limit_vec"], to=TensorProto.FLOAT),
         helper.make_node("ReduceMax", ["limit_vec"], ["limit"], keepdims=0),
         helper.make_node("Range", ["zero", "limit", "one"], ["r"]),
         helper.make_node("Add", ["x", "c"], ["a"]),
         helper.make_node("Add", ["a", "r"], ["y"])],
        "bloat", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])],
        [shape, numpy_helper.from_array(np.array(0, np.float32), "zero"),
         numpy_helper.from_array(np.array(1, np.float32), "one")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_cleanup_never_grows_the_model_more_than_one_percent():
    model = dmlopt.load(_bloat_model())
    from dmlopt.io.model import initializer_bytes

    before = initializer_bytes(model)
    result = dmlopt.optimize(model, passes=["cleanup"])
    assert result.passed
    after = initializer_bytes(result.model)
    assert after <= before * 1.01 + 4096
    counts = op_counts(result.model)
    assert counts.get("ConstantOfShape", 0) + counts.get("Expand", 0) >= 1  # the big tensor stayed an op
    assert any("1%" in n or "grew" in n for n in result.report.passes[0]["notes"])


def test_cleanup_still_folds_small_constants():
    a = numpy_helper.from_array(np.arange(4, dtype=np.float32), "a")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["a", "a"], ["aa"]), helper.make_node("Add", ["x", "aa"], ["y"])],
        "fold", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [a])
    result = dmlopt.optimize(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                             passes=["cleanup"])
    assert op_counts(result.model) == {"Add": 1}
    assert result.passed


def _counting(monkeypatch, cls) -> list[int]:
    """Count the runs of pass `cls` (each call of its `call`)."""
    runs = []
    call = cls.call

    def counted(self, model):
        runs.append(1)
        return call(self, model)

    monkeypatch.setattr(cls, "call", counted)
    return runs


def _mean_time(models, target, *, baseline=None, **kw):
    """bench.compare with float16 and fused attention measured fastest (deterministic)."""
    def ms(m):
        half = any(v.dtype == ir.DataType.FLOAT16 for v in m.graph.initializers.values())
        return (1.0 if half else 2.0) - (0.5 if "com.microsoft.MultiHeadAttention" in op_counts(m) else 0.0)

    times = {name: ms(m) for name, m in models.items()}
    base = baseline or next(iter(models))
    return {"provider": "FakeExecutionProvider", "baseline": base, "models": {
        name: {"latency_ms": {"median": t, "min": t, "p90": t}, "ratio_median": t / times[base], "copies": 0}
        for name, t in times.items()}}


@pytest.mark.parametrize("tune, builds, attention_runs", [(False, 3, 4), (True, 4, 6)])
def test_tuning_shares_the_pipeline_before_each_option(monkeypatch, tune, builds, attention_runs):
    """The passes before an option run once for all its candidates: the first pass runs for the
    untuned default output, once for the shared prefix and once for the output written (with --tune,
    once more for the float16 candidate, whose precision changes the earlier passes' defaults)."""
    from dmlopt.runtime import bench
    from dmlopt.passes.attention import AttentionPass
    from dmlopt.passes.attention_test import hf_attention
    from dmlopt.passes.cleanup import CleanupPass

    monkeypatch.setattr(bench, "compare", _mean_time)
    first, attention = _counting(monkeypatch, CleanupPass), _counting(monkeypatch, AttentionPass)
    options = {"tune": True} if tune else {"fp16": True, "attention": "auto"}
    original = dmlopt.load(hf_attention())
    before = op_counts(original)
    result = dmlopt.optimize(original, target="cpu", retime=False, **options)
    assert result.passed and "com.microsoft.MultiHeadAttention" in op_counts(result.model)
    assert len(first) == builds
    # attention: the same runs less the prefix's (it stops before attention), plus each of its 2
    # candidates alone on the shared prefix, plus (with --tune, where later options are decided too)
    # the prefix moving past attention once decided.
    assert len(attention) == attention_runs
    assert op_counts(original) == before  # candidates never touch the input
    names = [p["name"] for p in result.report.passes]
    assert len(names) == len(set(names)) and "attention" in names  # the report describes the output's run only
