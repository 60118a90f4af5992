"""_folding: a fold that exposes a non-conformance the input hid is undone, and the run goes on.

ONNX's expanded AffineGrid feeds Range a [1]-shaped tensor through an If: harmless while the If's
condition is computed, refused once folding makes it constant (onnx's inference, and ORT's
optimizer, which inlines a constant-condition If itself).  The model below is that, reduced.
"""

from __future__ import annotations

import numpy as np
import onnx.parser
import onnx_ir as ir
import onnxruntime as ort
import pytest

import dmlopt
from dmlopt.passes import PassContext
from dmlopt.passes._folding import check_failure, if_condition_cone
from dmlopt.runtime.sessions import load_problem
from dmlopt.passes.copies import CopiesPass

# n is [1]-shaped in both branches: Range wants scalars, and says so once n's value is known.
RANGE_THROUGH_IF = """
<ir_version: 8, opset_import: ["" : 18]>
g (int64[2] size) => (int64[m] r) {
    zero = Constant <value_int = 0> ()
    one = Constant <value_int = 1> ()
    two = Constant <value_int = 2> ()
    rank = Size(size)
    cond = Equal(rank, two)
    n = If(cond) <then_branch = t () => (int64[k] o) { o = Constant <value_ints = [4]> () },
                  else_branch = e () => (int64[k] o) { a, o = Split <num_outputs = 2> (size) }>
    r = Range(zero, n, one)
}"""


def model() -> ir.Model:
    return ir.from_proto(onnx.parser.parse_model(RANGE_THROUGH_IF))


def loads(m: ir.Model) -> bool:
    """As a user loads it: ORT's default optimizations (they inline a constant-condition If)."""
    try:
        ort.InferenceSession(ir.to_proto(m).SerializeToString(), providers=["CPUExecutionProvider"])
        return True
    except Exception:  # noqa: BLE001
        return False


def test_the_input_loads_and_runs():
    session = ort.InferenceSession(onnx.parser.parse_model(RANGE_THROUGH_IF).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    assert session.run(None, {"size": np.array([3, 5])})[0].tolist() == [0, 1, 2, 3]


def with_constant_condition() -> ir.Model:
    """The If's condition folded to a constant, the If itself kept (what cleanup wrote before)."""
    m = model()
    node = next(n for n in m.graph if n.op_type == "If")
    constant = ir.node("Constant", [], attributes={"value": ir.tensor(np.array(True))})
    m.graph.insert_before(node, constant)
    node.replace_input_with(0, constant.outputs[0])
    return m


def test_check_failure_names_what_ort_refuses_where_onnx_checks_pass():
    m = model()
    assert check_failure(m, strict=True, before=m.clone()) is None and load_problem(m, level="basic") is None
    folded = with_constant_condition()
    assert check_failure(folded, strict=True) is None  # onnx does not inline the If
    why = check_failure(folded, strict=True, before=m)
    assert why and "ONNX Runtime refuses it" in why and "Range" in why
    assert check_failure(folded, strict=True, before=folded.clone()) is None  # the input was refused too


def test_the_condition_cone_is_what_computes_the_condition():
    m = model()
    assert sorted(n.op_type for n in m.graph if id(n) in if_condition_cone(m)) == ["Constant", "Equal", "Size"]


@pytest.mark.parametrize("passes", [["cleanup"], ["freeze-shapes"], None], ids=["cleanup", "freeze-shapes", "all"])
@pytest.mark.parametrize("target", ["dml", "cpu", "webgpu"])
def test_the_fold_is_undone_and_the_run_goes_on(passes, target):
    result = dmlopt.optimize(model(), passes=passes, target=target, retime=False)
    assert result.passed and loads(result.model)
    assert "If" in [n.op_type for n in result.model.graph]
    notes = [n for p in result.report.passes for n in p["notes"]]
    assert any("folding undone" in n and "Range" in n for n in notes), notes


def test_copies_keeps_an_if_whose_inlining_fails_and_says_why():
    p = CopiesPass(PassContext(target="dml", ort_version="1.23"))
    result = p(with_constant_condition())  # onnx's inference refuses the inlined Range
    assert not result.modified and "If" in [n.op_type for n in result.model.graph]
    (site,) = [s for s in p.sites if s.op == "If"]
    assert site.action == "declined" and "inlining it fails a check" in site.detail and "Range" in site.detail
