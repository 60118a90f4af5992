"""Hostile paths, names and signals (issue 14, items 1-3, 8's NUL location, 9 and 10).

Each test is a file or a command line an attacker or a careless script could hand dmlopt:
a --report that names the input or the output, -o onto a FIFO or a device, external data
of a Constant (or of a tensor in a function or a subgraph) that a file in the working folder
would shadow, a NUL byte in a location, SIGTERM mid-run, NaN in a JSON answer, tensor names
holding newlines and terminal codes, sparse tensors, graphs nested past protobuf's depth,
onnxscript's log lines.  Refusals are exit 2, one ``dmlopt: error:`` line, nothing written
(the folder is compared, FIFOs and links included, before and after).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pathlib
import signal
import stat
import subprocess
import sys

import numpy as np
import onnx_ir as ir
import onnx
import pytest
from google.protobuf.internal.encoder import _VarintBytes
from onnx import TensorProto, helper, numpy_helper

import dmlopt
from dmlopt.report import optimize_report as report_mod
from dmlopt.errors import InputError, OutputError
from dmlopt.report.optimize_report import Report
from dmlopt.runtime.validate import run
from tests.conftest import conv_leaky_model, one_error_line
from tests.test_guarantees import _interrupt_when, _leftovers, big_model  # noqa: F401 - big_model is a fixture

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")


def _vi(name, shape=(2, 3), dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def _model(nodes, inputs, outputs, initializers=(), functions=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "paths", inputs, outputs, list(initializers))
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("local", 1)] if functions else [])
    return helper.make_model(graph, opset_imports=opsets, functions=list(functions))


def _relu() -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x")], [_vi("y")])


def _save(folder: pathlib.Path, name: str, model: onnx.ModelProto) -> pathlib.Path:
    path = folder / name
    path.write_bytes(model.SerializeToString())
    return path


def _external_tensor(name: str, location: str, shape=(2, 3)) -> TensorProto:
    """A float tensor whose data lives at `location` (no bytes inline)."""
    t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shape), data_location=TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", "0"), ("length", str(4 * math.prod(shape)))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return t


def _entries(folder: pathlib.Path) -> dict[str, str]:
    """Every entry: regular files by content, FIFOs, links and folders by kind (not read)."""
    out = {}
    for p in sorted(folder.iterdir()):
        mode = os.lstat(p).st_mode
        if stat.S_ISLNK(mode):
            out[p.name] = "link -> " + os.readlink(p)
        elif stat.S_ISREG(mode):
            out[p.name] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[p.name] = stat.filemode(mode)
    return out


def _refused(cli, folder, *argv, fragment: str) -> None:
    before = _entries(folder)
    r = cli(*argv)
    assert r.code == 2, (r.code, r.err)
    assert fragment in one_error_line(r.err), r.err
    assert r.out == ""
    assert _entries(folder) == before


# -- 1. --report may not name the input, its data, OUT or OUT's data -------------------------------


def _with_data(folder: pathlib.Path, name: str, data_name: str) -> pathlib.Path:
    """conv_leaky_model with every initializer in `data_name` beside it."""
    path = folder / name
    onnx.save(conv_leaky_model(), path, save_as_external_data=True, location=data_name, size_threshold=0)
    return path


def test_report_may_not_overwrite_the_input_model(cli, tmp_path):
    """A model is any file name: `m.html` is read as protobuf, so `--report m.html` would be it."""
    path = _save(tmp_path, "m.html", conv_leaky_model())
    _refused(cli, tmp_path, "optimize", path, "-o", tmp_path / "out.onnx", "--report", path,
             fragment="--report " + str(path) + ": refusing to overwrite the input model")


def test_report_may_not_overwrite_the_inputs_external_data(cli, tmp_path):
    path = _with_data(tmp_path, "m.onnx", "weights.json")
    _refused(cli, tmp_path, "optimize", path, "-o", tmp_path / "out.onnx", "--report", tmp_path / "weights.json",
             fragment="refusing to overwrite the input model's external data")


def test_report_may_not_be_the_output(cli, tmp_path):
    path = _save(tmp_path, "m.onnx", conv_leaky_model())
    _refused(cli, tmp_path, "optimize", path, "-o", tmp_path / "out.json", "--report", tmp_path / "out.json",
             fragment="refusing to overwrite the output model")


def test_report_may_not_lead_to_the_outputs_data_file(cli, tmp_path):
    """A report name ends in .json/.html and OUT's data in .data, so only a link reaches it."""
    path = _save(tmp_path, "m.onnx", conv_leaky_model())
    os.symlink(tmp_path / "out.onnx.data", tmp_path / "report.json")  # dangling until the output is written
    _refused(cli, tmp_path, "optimize", path, "-o", tmp_path / "out.onnx", "--report", tmp_path / "report.json",
             fragment="refusing to overwrite the output model's external data")


def test_report_may_not_be_a_hard_link_to_the_input(cli, tmp_path):
    path = _save(tmp_path, "m.onnx", conv_leaky_model())
    os.link(path, tmp_path / "report.json")
    _refused(cli, tmp_path, "optimize", path, "-o", tmp_path / "out.onnx", "--report", tmp_path / "report.json",
             fragment="refusing to overwrite the input model")


def test_a_good_report_beside_the_output_is_written(cli, tmp_path):
    path = _save(tmp_path, "m.onnx", conv_leaky_model())
    r = cli("optimize", path, "-o", tmp_path / "out.onnx", "--report", tmp_path / "out.json", "-q")
    assert r.code == 0, r.err
    assert json.loads((tmp_path / "out.json").read_text())["written"] == str(tmp_path / "out.onnx")
    onnx.checker.check_model(onnx.load(tmp_path / "out.onnx"))


# -- 3. -o, OUT's data file and --report onto a FIFO or a device -----------------------------------


@needs_fifo
@pytest.mark.parametrize("where", ["-o", "-o via a symlink", "OUT's data file", "--report"])
def test_a_fifo_is_never_replaced(cli, tmp_path, where):
    path = _save(tmp_path, "m.onnx", conv_leaky_model())
    out, report = tmp_path / "out.onnx", None
    if where == "-o":
        os.mkfifo(out)
    elif where == "-o via a symlink":
        os.mkfifo(tmp_path / "fifo")
        os.symlink(tmp_path / "fifo", out)
    elif where == "OUT's data file":
        os.mkfifo(tmp_path / "out.onnx.data")
    else:
        report = tmp_path / "r.json"
        os.mkfifo(report)
    argv = ["optimize", path, "-o", out] + (["--report", report] if report else [])
    _refused(cli, tmp_path, *argv, fragment="is not a regular file (a FIFO, device or socket): refusing to replace it")


def _device(folder: pathlib.Path, name: str) -> pathlib.Path:
    """A character device in `folder`: a copy of /dev/null's node where mknod is allowed
    (root), else a symlink to /dev/null.  Never /dev/null itself: a broken check run as root
    would replace the machine's /dev/null (it did, before the fix)."""
    path = folder / name
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (OSError, AttributeError):
        if not os.path.exists("/dev/null"):
            pytest.skip("no device nodes here")
        os.symlink("/dev/null", path)  # a rename would replace the link, never /dev/null
    return path


@pytest.mark.parametrize("where", ["-o", "--report"])
def test_a_device_is_never_replaced(cli, tmp_path, where):
    path = _save(tmp_path, "m.onnx", conv_leaky_model())
    if where == "-o":
        device, argv = _device(tmp_path, "null.onnx"), ["-o", tmp_path / "null.onnx"]
    else:
        device, argv = _device(tmp_path, "null.json"), ["-o", tmp_path / "out.onnx", "--report", tmp_path / "null.json"]
    _refused(cli, tmp_path, "optimize", path, *argv,
             fragment=f"{device}: exists and is not a regular file (a FIFO, device or socket)")
    assert stat.S_ISCHR(os.stat(device).st_mode)


@needs_fifo
def test_the_api_refuses_a_fifo_for_the_model_and_the_report(tmp_path):
    os.mkfifo(tmp_path / "out.onnx")
    os.mkfifo(tmp_path / "r.json")
    model = dmlopt.load(conv_leaky_model())
    with pytest.raises(OutputError, match="not a regular file"):
        dmlopt.save(model, tmp_path / "out.onnx")
    rep = Report.start(model, target="cpu", ort_version=None, options={})
    with pytest.raises(OutputError, match="not a regular file"):
        report_mod.write(rep, tmp_path / "r.json")
    assert all(stat.S_ISFIFO(os.lstat(p).st_mode) for p in tmp_path.iterdir())
    assert _leftovers(tmp_path) == []


# -- 2. every tensor's external data is read from the model's folder ------------------------------

WEIGHTS = np.arange(6, dtype=np.float32).reshape(2, 3) + 1  # in the model's folder
DECOY = np.full((2, 3), 1000.0, np.float32)  # same name, in the working folder


def _constant_model() -> onnx.ModelProto:
    """y = x + Constant(value=<external w.bin>)."""
    const = helper.make_node("Constant", [], ["W"], value=_external_tensor("c", "w.bin"))
    return _model([const, helper.make_node("Add", ["x", "W"], ["y"])], [_vi("x")], [_vi("y")])


def _function_model() -> onnx.ModelProto:
    """y = local.AddW(x), the function's body holding Constant(value=<external w.bin>)."""
    const = helper.make_node("Constant", [], ["W"], value=_external_tensor("c", "w.bin"))
    body = [const, helper.make_node("Add", ["a", "W"], ["b"])]
    function = helper.make_function("local", "AddW", ["a"], ["b"], body, [helper.make_opsetid("", 17)])
    return _model([helper.make_node("AddW", ["x"], ["y"], domain="local")], [_vi("x")], [_vi("y")],
                  functions=[function])


def _subgraph_model() -> onnx.ModelProto:
    """y = If(c, then: x + W_then (an initializer of the branch, external), else: x)."""
    then = helper.make_graph([helper.make_node("Add", ["x", "Wt"], ["t"])], "then", [], [_vi("t")],
                             [_external_tensor("Wt", "w.bin")])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], [_vi("e")])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    return _model([node], [_vi("x"), _vi("c", (), TensorProto.BOOL)], [_vi("y")])


def _subgraph_constant_model() -> onnx.ModelProto:
    """y = If(c, then: x + Constant(value=<external w.bin>) inside the branch, else: x)."""
    const = helper.make_node("Constant", [], ["Wt"], value=_external_tensor("c", "w.bin"))
    then = helper.make_graph([const, helper.make_node("Add", ["x", "Wt"], ["t"])], "then", [], [_vi("t")])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], [_vi("e")])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    return _model([node], [_vi("x"), _vi("c", (), TensorProto.BOOL)], [_vi("y")])


HOLDERS = {"Constant": _constant_model, "function": _function_model, "subgraph initializer": _subgraph_model,
           "subgraph Constant": _subgraph_constant_model}


@pytest.fixture
def folders(tmp_path, monkeypatch):
    """model/ with w.bin = WEIGHTS, and a working folder cwd/ with a decoy w.bin."""
    model_dir, cwd = tmp_path / "model", tmp_path / "cwd"
    model_dir.mkdir()
    cwd.mkdir()
    WEIGHTS.tofile(model_dir / "w.bin")
    DECOY.tofile(cwd / "w.bin")
    monkeypatch.chdir(cwd)
    return model_dir, cwd


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    feeds = {"x": np.full((2, 3), 0.5, np.float32)}
    if any(i.name == "c" for i in model.graph.input):
        feeds["c"] = np.array(True)
    return feeds


@pytest.mark.parametrize("holder", HOLDERS)
def test_external_data_is_read_from_the_models_folder_not_the_working_folder(cli, folders, holder):
    model_dir, cwd = folders
    model = HOLDERS[holder]()
    path = _save(model_dir, "m.onnx", model)
    out = model_dir.parent / "out" / "out.onnx"
    out.parent.mkdir()
    r = cli("optimize", path, "-o", out, "-q", "--target", "cpu", "--no-time")
    assert r.code == 0, r.err
    expected = 0.5 + WEIGHTS
    assert np.array_equal(run(dmlopt.load(out), _feeds(model))["y"], expected)
    # and through the API: the loaded model computes with the model folder's weights
    assert np.array_equal(run(dmlopt.load(path), _feeds(model))["y"], expected)


def test_an_external_constant_stays_on_disk(cli, folders):
    """A main-graph Constant over external data is not read at load: it becomes an initializer of
    the same name that keeps the reference into the model's folder (a large one stays mmapped)."""
    model_dir, cwd = folders
    path = _save(model_dir, "m.onnx", _constant_model())
    model = dmlopt.load(path)
    assert [n.op_type for n in model.graph] == ["Add"]
    tensor = model.graph.initializers["W"].const_value
    assert isinstance(tensor, ir.ExternalTensor) and pathlib.Path(tensor.path) == model_dir / "w.bin"
    assert np.array_equal(run(model, _feeds(_constant_model()))["y"], 0.5 + WEIGHTS)
    assert "W" in {o.name for o in model.graph[0].inputs}
    _refused(cli, cwd, "inspect", _save(model_dir, "bad.onnx", onnx.ModelProto.FromString(
        _constant_model().SerializeToString().replace(b"w.bin", b"../w."))), fragment="outside the model's folder")


def test_an_external_constant_in_a_subgraph_stays_on_disk(cli, folders):
    """The same in an If branch: the Constant becomes an initializer of the branch, still a
    reference into the model's folder; the optimized model computes with those weights."""
    model_dir, cwd = folders
    path = _save(model_dir, "m.onnx", _subgraph_constant_model())
    model = dmlopt.load(path)
    then = model.graph[0].attributes["then_branch"].as_graph()
    assert [n.op_type for n in then] == ["Add"]
    tensor = then.initializers["Wt"].const_value
    assert isinstance(tensor, ir.ExternalTensor) and pathlib.Path(tensor.path) == model_dir / "w.bin"
    assert np.array_equal(run(model, _feeds(_subgraph_constant_model()))["y"], 0.5 + WEIGHTS)
    out = cwd / "out.onnx"
    assert cli("optimize", path, "-o", out, "-q", "--target", "cpu", "--no-time").code == 0
    assert np.array_equal(run(dmlopt.load(out), _feeds(_subgraph_constant_model()))["y"], 0.5 + WEIGHTS)


@pytest.mark.parametrize("holder", HOLDERS)
def test_external_data_only_in_the_working_folder_is_missing(cli, folders, holder):
    model_dir, cwd = folders
    (model_dir / "w.bin").unlink()
    path = _save(model_dir, "m.onnx", HOLDERS[holder]())
    for argv in (["inspect", path], ["optimize", path, "-o", cwd / "out.onnx"]):
        _refused(cli, cwd, *argv, fragment="external data file 'w.bin' for tensor")


@pytest.mark.parametrize("holder", HOLDERS)
def test_external_data_outside_the_folder_is_refused_wherever_the_tensor_is(cli, tmp_path, holder):
    # "../w." leads out of the folder; a swap of as many bytes keeps every length field valid
    path = tmp_path / "m.onnx"
    path.write_bytes(HOLDERS[holder]().SerializeToString().replace(b"w.bin", b"../w."))
    _refused(cli, tmp_path, "inspect", path, fragment="outside the model's folder")


@pytest.mark.parametrize("holder", HOLDERS)
def test_a_nul_byte_in_a_location_is_bad_input(cli, tmp_path, holder):
    path = tmp_path / "m.onnx"
    path.write_bytes(HOLDERS[holder]().SerializeToString().replace(b"w.bin", b"w\x00bin"))
    for argv in (["inspect", path], ["optimize", path, "-o", tmp_path / "out.onnx"]):
        line = one_error_line(cli(*argv).err)
        assert "holds a NUL byte" in line and "w\\x00bin" in line, line


def test_a_nul_byte_in_an_initializers_location_is_bad_input_for_every_command(cli, tmp_path):
    model = _model([helper.make_node("Add", ["x", "W"], ["y"])], [_vi("x")], [_vi("y")],
                   [_external_tensor("W", "w\x00.bin")])
    path = _save(tmp_path, "m.onnx", model)
    good = _save(tmp_path, "good.onnx", _relu())
    for argv in (["inspect", path], ["optimize", path, "-o", tmp_path / "out.onnx"], ["validate", good, path]):
        _refused(cli, tmp_path, *argv, fragment="holds a NUL byte")


# -- 9. SIGTERM is handled like SIGINT ------------------------------------------------------------


@pytest.mark.parametrize("moment,sig", [("while saving", signal.SIGTERM), ("while validating", signal.SIGTERM),
                                        ("while saving", getattr(signal, "SIGHUP", signal.SIGTERM))],
                         ids=["SIGTERM while saving", "SIGTERM while validating", "SIGHUP while saving"])
def test_sigterm_leaves_no_partial_output_and_no_weight_copy(big_model, tmp_path, moment, sig):  # noqa: F811
    """SIGTERM (or SIGHUP) mid-save (`.out.onnx.*.tmp/` beside the output exists) or
    mid-validation (ORT's copy of the weights, `dmlopt-ort-*`, exists in the system temp
    folder): exit 128 + signal, one line, nothing in the output folder, nothing left in the
    temp folder, the input untouched."""
    before = _entries(big_model.parent)
    for attempt in range(3):  # a run whose moment a loaded machine let pass unseen is run again
        out_dir, tmp_dir = tmp_path / f"out{attempt}", tmp_path / f"tmp{attempt}"
        out_dir.mkdir()
        tmp_dir.mkdir()
        argv = ["optimize", str(big_model), "-o", str(out_dir / "out.onnx"), "--passes", "cleanup", "-q"]
        proc = subprocess.Popen([sys.executable, "-m", "dmlopt", *argv], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=dict(os.environ, TMPDIR=str(tmp_dir)))
        watched, prefix, suffix = ((out_dir, ".out.onnx.", ".tmp") if moment == "while saving"
                                   else (tmp_dir, "dmlopt-ort-", ""))
        hit = _interrupt_when(proc, lambda: any(p.name.startswith(prefix) and p.name.endswith(suffix)
                                                for p in watched.iterdir())
                              and not (out_dir / "out.onnx").exists(), sig=sig)
        _, err = proc.communicate(timeout=120)
        if hit:
            break
    assert hit, f"the run ended before the moment came, 3 times: {err}"
    assert proc.returncode == 128 + sig, err
    assert err.strip() == f"dmlopt: terminated ({signal.Signals(sig).name}); nothing was written"
    assert list(out_dir.iterdir()) == []
    assert list(tmp_dir.iterdir()) == []  # ORT's telemetry session file (.ses) included
    assert _entries(big_model.parent) == before


# -- 10. JSON is valid JSON -----------------------------------------------------------------------


def _strict_loads(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_validate_json_writes_nan_as_null(cli, tmp_path):
    """Sqrt of -1 is NaN, Relu of it 0: the NaNs differ and max_abs/max_rel are NaN."""
    ref = _save(tmp_path, "sqrt.onnx", _model([helper.make_node("Sqrt", ["x"], ["y"])], [_vi("x")], [_vi("y")]))
    cand = _save(tmp_path, "relu.onnx", _relu())
    np.savez(tmp_path / "neg.npz", x=-np.ones((2, 3), np.float32))
    r = cli("validate", ref, cand, "--inputs", tmp_path / "neg.npz", "--json")
    assert r.code == 1
    out = _strict_loads(r.out)["outputs"][0]
    assert out["max_abs"] is None and out["max_rel"] is None and out["reason"] == "NaNs differ"


def test_reports_write_non_finite_numbers_as_null(tmp_path):
    rep = Report.start(dmlopt.load(conv_leaky_model()), target="cpu", ort_version=None, options={})
    rep.validation = {"passed": False, "outputs": [{"name": "y", "max_abs": float("nan"), "max_rel": float("inf"),
                                                    "cosine": np.float32("nan"), "passed": False}]}
    rep.timing = {"speedup": -math.inf, "ratios": np.array([1.5, np.nan])}
    report_mod.write(rep, tmp_path / "r.json")
    for text in (rep.to_json(), (tmp_path / "r.json").read_text()):
        d = _strict_loads(text)
        assert d["validation"]["outputs"][0] == {"name": "y", "max_abs": None, "max_rel": None, "cosine": None,
                                                 "passed": False}
        assert d["timing"] == {"speedup": None, "ratios": [1.5, None]}
    assert _strict_loads(report_mod.json_text({"a": (np.float64(2.5), np.int64(3))})) == {"a": [2.5, 3]}


# -- 10. names cannot forge a line; sparse tensors; deep nesting; library logs --------------------

FORGED = "x\n\x1b[2Kinput   forged: float [9]\x1b[31m\r\u202e"


def test_inspect_escapes_control_codes_and_newlines_in_names(cli, tmp_path):
    model = _model([helper.make_node("Relu", [FORGED], ["y\x1b]0;title\x07"], name="n\nnode")],
                   [_vi(FORGED)], [_vi("y\x1b]0;title\x07")])
    path = _save(tmp_path, "names.onnx", model)
    r = cli("inspect", path)
    assert r.code == 0, r.err
    assert not any(c in r.out for c in "\x1b\r\x07\u202e")
    lines = r.out.splitlines()
    assert lines[0] == "input   x\\n\\x1b[2Kinput   forged: float [9]\\x1b[31m\\r\\u202e: float [2x3]"
    assert lines[1] == "output  y\\x1b]0;title\\x07: float [2x3]"
    assert not any(line.startswith("input   forged") for line in lines)
    assert _strict_loads(cli("inspect", path, "--json").out)["inputs"][0]["name"] == FORGED  # JSON keeps the name


def test_optimize_table_escapes_names(cli, tmp_path):
    model = _model([helper.make_node("Relu", ["x"], [FORGED])], [_vi("x")], [_vi(FORGED)])
    path = _save(tmp_path, "names.onnx", model)
    r = cli("optimize", path, "-o", tmp_path / "out.onnx", "--target", "cpu")
    assert r.code == 0, r.err
    assert "\x1b" not in r.out and "\r" not in r.out
    assert "x\\n\\x1b[2Kinput   forged" in r.out


def test_validate_table_escapes_names(cli, tmp_path):
    model = _model([helper.make_node("Relu", ["x"], [FORGED])], [_vi("x")], [_vi(FORGED)])
    path = _save(tmp_path, "names.onnx", model)
    r = cli("validate", path, path)
    assert r.code == 0, r.err
    assert "\x1b" not in r.out and "\r" not in r.out and "x\\n\\x1b[2Kinput   forged" in r.out
    assert _strict_loads(cli("validate", path, path, "--json").out)["outputs"][0]["name"] == FORGED


def test_a_name_in_an_error_cannot_forge_a_second_line(cli, tmp_path):
    a = numpy_helper.from_array(np.ones((2, 3), np.float32), FORGED)
    b = numpy_helper.from_array(np.zeros((2, 3), np.float32), FORGED)
    path = _save(tmp_path, "dup.onnx", _model([helper.make_node("Add", ["x", FORGED], ["y"])], [_vi("x")], [_vi("y")],
                                              [a, b]))
    line = one_error_line(cli("inspect", path).err)
    assert "initializer 'x\\n\\x1b[2Kinput" in line and "\x1b" not in line


def _sparse(name="S") -> onnx.SparseTensorProto:
    values = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), name)
    indices = numpy_helper.from_array(np.array([0, 4], np.int64), name + "_indices")
    return helper.make_sparse_tensor(values, indices, [2, 3])


def test_sparse_initializer_is_named_as_unsupported(cli, tmp_path):
    """It used to read "value 'S' is read by a node but no node ... defines it"."""
    graph = helper.make_graph([helper.make_node("Add", ["x", "S"], ["y"])], "g", [_vi("x")], [_vi("y")],
                              sparse_initializer=[_sparse()])
    path = _save(tmp_path, "sparse.onnx", helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    good = _save(tmp_path, "good.onnx", _relu())
    for argv in (["inspect", path], ["optimize", path, "-o", tmp_path / "out.onnx"], ["validate", good, path]):
        _refused(cli, tmp_path, *argv, fragment="sparse initializer 'S' is not supported")
    with pytest.raises(InputError, match="sparse initializer"):
        dmlopt.load(onnx.load(path))


def test_sparse_constant_is_named_as_unsupported(cli, tmp_path):
    """It used to read "Sparse tensors are not supported yet. Please contribute ... onnx-ir"."""
    const = helper.make_node("Constant", [], ["S"], sparse_value=_sparse(), name="sparse_const")
    path = _save(tmp_path, "sparse.onnx", _model([const, helper.make_node("Add", ["x", "S"], ["y"])], [_vi("x")],
                                                 [_vi("y")]))
    _refused(cli, tmp_path, "inspect", path,
             fragment="node 'sparse_const' has a sparse tensor attribute 'sparse_value'")


def _field(number: int, payload: bytes) -> bytes:
    return _VarintBytes(number << 3 | 2) + _VarintBytes(len(payload)) + payload


def _nested_ifs(depth: int) -> bytes:
    """`depth` If nodes, each in the then-branch of the one above: written as raw protobuf,
    since protobuf itself refuses to build a message deeper than it can read."""
    body = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "leaf", [], [_vi("o")]).SerializeToString()
    head = helper.make_node("If", ["c"], ["o"]).SerializeToString()
    then = helper.make_attribute("then_branch", helper.make_graph([], "t", [], []))
    then.ClearField("g")
    other = helper.make_attribute("else_branch", helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "e",
                                                                   [], [_vi("o")])).SerializeToString()
    output = _field(12, _vi("o").SerializeToString())  # GraphProto.output
    for _ in range(depth):
        node = head + _field(5, then.SerializeToString() + _field(6, body)) + _field(5, other)  # NodeProto.attribute
        body = _field(1, node) + _field(2, b"b") + output  # GraphProto.node, .name
    top = _model([], [_vi("x"), _vi("c", (), TensorProto.BOOL)], [_vi("o")])
    return top.SerializeToString() + _field(7, body)  # a second ModelProto.graph merges into the first


def test_deeply_nested_graphs_get_a_clear_message(cli, tmp_path):
    shallow = tmp_path / "shallow.onnx"
    shallow.write_bytes(_nested_ifs(3))
    assert cli("inspect", shallow).code == 0  # the builder makes valid models
    for depth in (40, 5000):
        path = tmp_path / f"deep{depth}.onnx"
        path.write_bytes(_nested_ifs(depth))
        for argv in (["inspect", path], ["optimize", path, "-o", tmp_path / "out.onnx"]):
            line = one_error_line(cli(*argv).err)
            assert "graphs nested too deeply" in line and "truncated" not in line, line


def test_onnxscript_log_lines_do_not_reach_stderr(tmp_path):
    """onnxscript's constant folder logs "Skipping constant folding for op TopK with multiple
    outputs." through logging's last-resort handler: the real stderr must show dmlopt's line only."""
    c = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "C")
    k = numpy_helper.from_array(np.array([2], np.int64), "K")
    nodes = [helper.make_node("TopK", ["C", "K"], ["v", "i"], axis=0), helper.make_node("Add", ["x", "v"], ["y"])]
    model = _model(nodes, [_vi("x")], [_vi("y")], [c, k])
    path = _save(tmp_path, "topk.onnx", model)
    out = tmp_path / "out.onnx"
    argv = [sys.executable, "-m", "dmlopt", "optimize", str(path), "-o", str(out), "-q", "--passes", "cleanup"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, "DMLOPT_DEBUG": ""})
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == f"wrote {out} and {out.with_suffix('.session.json')}"
    debug = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, "DMLOPT_DEBUG": "1"})
    assert "Skipping constant folding for op TopK" in debug.stderr  # the test can fail: the line exists


def test_a_model_proto_external_data_is_checked_against_the_working_folder(tmp_path, monkeypatch):
    """A ModelProto has no folder: its external data is relative to the working folder (onnx's
    rule), and is checked there like a file's against its folder."""
    monkeypatch.chdir(tmp_path)
    WEIGHTS.tofile(tmp_path / "w.bin")
    assert np.array_equal(run(dmlopt.load(_constant_model()), {"x": np.zeros((2, 3), np.float32)})["y"], WEIGHTS)
    escaping = onnx.ModelProto.FromString(_constant_model().SerializeToString().replace(b"w.bin", b"../w."))
    with pytest.raises(InputError, match="outside the model's folder"):
        dmlopt.load(escaping)
