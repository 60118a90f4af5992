"""The target is resolved once: one meaning for a missing --ort-version, one place that reads versions."""

from __future__ import annotations

import pathlib

import onnxruntime
import pytest

import dmlopt
from dmlopt.report import html_page as html_report
from dmlopt.errors import UsageError
from dmlopt.passes import PassContext
from dmlopt.target import DEFAULT_TARGET, Target, available_versions
from tests.conftest import conv_leaky_model, one_error_line

BUNDLED_CNN = pathlib.Path(dmlopt.__file__).parent / "data" / "cnn_relu.onnx"


def test_directml_without_a_version_is_the_newest_table():
    newest = available_versions()[-1]
    t = Target.resolve("dml", None)
    assert (t.ep, t.ort_version, t.table_version, t.asked) == ("dml", newest, newest, None)
    assert "newest DirectML table" in t.describe() and newest in t.describe()


@pytest.mark.parametrize("asked, table", [("1.20", "1.19"), ("1.28", "1.24"), ("1.18.1", "1.18"), ("1.14", "1.14"),
                                          ("1.10", "1.14"), ("newest", None)])
def test_directml_keeps_the_version_asked_and_finds_its_table(asked, table):
    t = Target.resolve("dml", asked)
    table = table or available_versions()[-1]
    assert t.table_version == table
    assert t.ort_version == (asked if asked != "newest" else table)
    assert t.asked == asked


@pytest.mark.parametrize("ep", ["cuda", "cpu"])
def test_cuda_and_cpu_without_a_version_are_the_installed_onnxruntime(ep):
    t = Target.resolve(ep, None)
    assert t.ort_version == onnxruntime.__version__ and t.table_version is None
    assert Target.resolve(ep, "1.16").ort_version == "1.16"


def test_version_comparisons():
    t = Target.resolve("dml", "1.14")
    assert t.older_than("1.15") and t.at_least("1.14") and t.at_least((1, 13)) and not t.at_least((1, 19))
    assert Target.resolve("dml", "1.19.2").at_least("1.19")


@pytest.mark.parametrize("ep, version, says", [("npu", None, "unknown target 'npu'"),
                                               ("dml", "abc", "cannot read an ONNX Runtime version")])
def test_bad_target_or_version_is_a_usage_error(ep, version, says):
    with pytest.raises(UsageError, match=says):
        Target.resolve(ep, version)


def test_cli_refuses_an_unreadable_version_in_one_line(cli, tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(conv_leaky_model().SerializeToString())
    r = cli("optimize", path, "-o", tmp_path / "out.onnx", "--ort-version", "x.y")
    assert r.code == 2 and "cannot read an ONNX Runtime version" in one_error_line(r.err)
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("ep, asked, predicted, deployed", [
    ("dml", None, "newest", "newest"),
    ("dml", "1.20", "1.19", "1.20"),  # between tables: predicted from the 1.19 table, deployed as asked
    ("dml", "1.10", "1.14", "1.10"),
    ("cuda", None, None, None),        # this onnxruntime build: the caller names it
    ("cuda", "1.18", "1.18", "1.18"),
    ("cpu", "1.20", "1.20", "1.20"),
])
def test_the_version_predicted_from_and_the_version_deployed(ep, asked, predicted, deployed):
    target = Target.resolve(ep, asked)
    newest = available_versions()[-1]
    expected = tuple(newest if v == "newest" else v for v in (predicted, deployed))
    assert (target.predicted_version, target.deployed_version) == expected


def test_pass_context_defaults_to_the_documented_target_and_resolves_strings():
    assert PassContext().target == DEFAULT_TARGET == Target.resolve("dml", None)
    context = PassContext(target="cuda", ort_version="1.18")
    assert context.target == Target.resolve("cuda", "1.18")
    with pytest.raises(ValueError):
        PassContext(target=Target.resolve("dml", "1.14"), ort_version="1.18")


def test_report_names_the_resolved_target():
    result = dmlopt.optimize(conv_leaky_model(), target="cpu", passes=["leaky-relu"], retime=False)
    assert result.report.ort_version is None  # as asked: the JSON key keeps its meaning
    line = f"cpu, ORT {onnxruntime.__version__} (the onnxruntime installed here)"
    assert result.report.to_dict()["target_resolved"] == line
    assert f"target: {line}" in result.report.to_table()


def test_inspect_refuses_an_unreadable_version_in_one_line(cli):
    r = cli("inspect", BUNDLED_CNN, "--ep", "dml", "--ort-version", "abc")
    assert r.code == 2 and "cannot read an ONNX Runtime version" in one_error_line(r.err)


def test_html_report_names_the_resolved_version():
    result = dmlopt.optimize(conv_leaky_model(), target="dml", ort_version="1.20", passes=["leaky-relu"],
                             retime=False)
    assert "target <b>dml, ORT 1.20 (DirectML table 1.19)</b>" in html_report.render(result.report)
