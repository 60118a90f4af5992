"""Hostile models: `inspect`, `optimize` and `validate` answer exit 2 and one clear line.

Each case is a file a user (or an attacker) could hand dmlopt: damaged bytes, graphs that
break ONNX's rules, opsets nothing here knows, external data that is missing or points out
of the model's folder.  For each, every command must print exactly one line on stderr that
starts with ``dmlopt: error:`` and names the problem, exit 2, print no traceback and write
nothing (the folder is compared before and after).  The in-process runs are fast; a few
cases also go through ``python -m dmlopt`` so that what ONNX Runtime's C++ side prints on
the real stderr is seen too.

The bad inputs of issue 2 (missing file, a directory, junk, a 100-byte truncation, empty,
missing external data for optimize, usage errors) are in test_cli.py and not repeated here.
"""

from __future__ import annotations

import os
import pathlib
import random
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dmlopt
from dmlopt.errors import InputError
from tests.conftest import conv_leaky_model, one_error_line

COMMANDS = ("inspect", "optimize", "validate")


def _vi(name, shape=(2, 3), dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def _model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "hostile", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _write(folder: pathlib.Path, name: str, model_or_bytes) -> pathlib.Path:
    path = folder / name
    data = model_or_bytes if isinstance(model_or_bytes, bytes) else model_or_bytes.SerializeToString()
    path.write_bytes(data)
    return path


def _external(location: str, offset: str = "0", length: str = "24") -> onnx.ModelProto:
    """y = x + W, W a 2x3 float initializer stored externally at `location`."""
    w = numpy_helper.from_array(np.ones((2, 3), np.float32), "W")
    model = _model([helper.make_node("Add", ["x", "W"], ["y"])], [_vi("x")], [_vi("y")], [w])
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return model


def _relu(**io) -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"])], io.get("inputs", [_vi("x")]), io.get("outputs", [_vi("y")]))


def cycle(d):
    """a = x + b, b = Relu(a): no order runs it."""
    return _write(d, "cycle.onnx", _model([helper.make_node("Add", ["x", "b"], ["a"]),
                                           helper.make_node("Relu", ["a"], ["b"])], [_vi("x")], [_vi("a")]))


def undefined_value(d):
    return _write(d, "ghost.onnx", _model([helper.make_node("Add", ["x", "ghost"], ["y"])], [_vi("x")], [_vi("y")]))


def undefined_value_in_if_branch(d):
    then = helper.make_graph([helper.make_node("Add", ["x", "ghost"], ["t"])], "then", [], [_vi("t")])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e")])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    return _write(d, "ghost_if.onnx", _model([node], [_vi("x"), _vi("c", (), TensorProto.BOOL)], [_vi("y")]))


def duplicate_output_names(d):
    """Two nodes both write y (not SSA)."""
    return _write(d, "dup.onnx", _model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])],
                                        [_vi("x")], [_vi("y")]))


def duplicate_initializer_names(d):
    a = numpy_helper.from_array(np.ones((2, 3), np.float32), "W")
    b = numpy_helper.from_array(np.zeros((2, 3), np.float32), "W")
    return _write(d, "dup_init.onnx", _model([helper.make_node("Add", ["x", "W"], ["y"])], [_vi("x")], [_vi("y")], [a, b]))


def duplicate_input_names(d):
    return _write(d, "dup_in.onnx", _model([helper.make_node("Add", ["x", "x"], ["y"])], [_vi("x"), _vi("x")], [_vi("y")]))


def undeclared_domain(d):
    """A node in a domain the model imports no opset for."""
    return _write(d, "undeclared.onnx", _model([helper.make_node("Relu", ["x"], ["y"], domain="com.example")],
                                               [_vi("x")], [_vi("y")]))


def opset_from_the_future(d):
    return _write(d, "opset99.onnx", _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x")], [_vi("y")], opset=99))


def ml_opset_from_the_future(d):
    model = _relu()
    model.opset_import.append(helper.make_opsetid("ai.onnx.ml", 99))
    return _write(d, "ml99.onnx", model)


def ir_version_from_the_future(d):
    model = _relu()
    model.ir_version = 99
    return _write(d, "ir99.onnx", model)


def no_graph(d):
    model = onnx.ModelProto(ir_version=8)
    model.opset_import.append(helper.make_opsetid("", 17))
    return _write(d, "nograph.onnx", model)


def no_outputs(d):
    return _write(d, "nooutputs.onnx", _relu(outputs=[]))


def input_without_type(d):
    return _write(d, "notype.onnx", _relu(inputs=[helper.make_value_info("x", onnx.TypeProto())]))


def missing_external_data(d):
    return _write(d, "ext_missing.onnx", _external("weights.bin"))


def truncated_external_data(d):
    (d / "short.bin").write_bytes(np.ones(3, np.float32).tobytes())  # 12 of the 24 bytes
    return _write(d, "ext_short.onnx", _external("short.bin"))


def external_length_disagrees_with_shape(d):
    (d / "w.bin").write_bytes(np.ones(6, np.float32).tobytes())
    return _write(d, "ext_len.onnx", _external("w.bin", length="8"))


def external_offset_not_a_number(d):
    (d / "w.bin").write_bytes(np.ones(6, np.float32).tobytes())
    return _write(d, "ext_offset.onnx", _external("w.bin", offset="abc"))


def external_data_escapes_the_folder(d):
    """Enough ../ to reach / from any temp folder: the location resolves to /etc/passwd."""
    return _write(d, "escape.onnx", _external("../" * 40 + "etc/passwd"))


def external_data_escapes_by_relative_path(d):
    return _write(d, "escape2.onnx", _external("../../etc/passwd"))


def external_data_absolute_path(d):
    return _write(d, "absolute.onnx", _external("/etc/passwd"))


def external_data_symlink_out_of_the_folder(d):
    os.symlink("/etc/passwd", d / "link.bin")
    return _write(d, "symlink.onnx", _external("link.bin"))


def huge_declared_dim(d):
    return _write(d, "huge.onnx", _relu(inputs=[_vi("x", (2**40, 2**40))], outputs=[_vi("y", (2**40, 2**40))]))


def random_bytes(d):
    rng = random.Random(7)
    return _write(d, "random.onnx", bytes(rng.randrange(256) for _ in range(4096)))


# case -> (builder, a fragment the one error line must contain, commands that refuse it)
HOSTILE = {
    "cycle": (cycle, "topologically sorted", COMMANDS),
    "value nothing produces": (undefined_value, "'ghost' is read by a node but no node", COMMANDS),
    "value nothing produces, in an If branch": (undefined_value_in_if_branch, "'ghost' is read by a node", COMMANDS),
    "duplicate output names": (duplicate_output_names, "'y' is redeclared", COMMANDS),
    "duplicate initializer names": (duplicate_initializer_names, "initializer 'W' is defined twice", COMMANDS),
    "duplicate input names": (duplicate_input_names, "'x' has been used as graph input names multiple times", COMMANDS),
    "undeclared domain": (undeclared_domain, "No opset import for domain 'com.example'", COMMANDS),
    "opset newer than onnx knows": (opset_from_the_future, "opset 99 of ai.onnx, newer than the installed onnx",
                                    COMMANDS),
    "ai.onnx.ml opset newer than onnx knows": (ml_opset_from_the_future, "opset 99 of ai.onnx.ml", COMMANDS),
    "ir_version newer than onnx knows": (ir_version_from_the_future, "ir_version 99", COMMANDS),
    "no graph": (no_graph, "no graph", COMMANDS),
    "graph with no outputs": (no_outputs, "its graph has no outputs", COMMANDS),
    "input without a type": (input_without_type, "'type' of 'value_info' is required", COMMANDS),
    "missing external data": (missing_external_data, "external data file 'weights.bin' for tensor 'W' is missing",
                              COMMANDS),
    "truncated external data": (truncated_external_data, "too short for tensor 'W'", COMMANDS),
    "external length disagrees with the shape": (external_length_disagrees_with_shape,
                                                 "is 8 bytes, but its shape and type need 24", COMMANDS),
    "external offset not a number": (external_offset_not_a_number, "offset 'abc' of tensor 'W' is not a byte count",
                                     COMMANDS),
    "external data escapes the folder": (external_data_escapes_the_folder, "outside the model's folder", COMMANDS),
    "external data ../../etc/passwd": (external_data_escapes_by_relative_path, "outside the model's folder", COMMANDS),
    "external data absolute path": (external_data_absolute_path, "outside the model's folder", COMMANDS),
    "external data symlink out of the folder": (external_data_symlink_out_of_the_folder, "outside the model's folder",
                                                COMMANDS),
    "random bytes": (random_bytes, "not a", COMMANDS),
    # Legitimate to describe, impossible to validate: see test_huge_declared_dim_is_described_not_validated.
    "huge declared dim": (huge_declared_dim, "GiB of random data", ("optimize", "validate")),
}


def _argv(command: str, path: pathlib.Path, folder: pathlib.Path) -> list:
    if command == "inspect":
        return ["inspect", path]
    if command == "optimize":
        return ["optimize", path, "-o", folder / "out.onnx"]
    good = _write(folder, "good_ref.onnx", _relu())
    return ["validate", good, path]


def _files(folder: pathlib.Path) -> dict[str, bytes]:
    """Every entry in the folder (temp folders included), with file contents."""
    return {p.name: (p.read_bytes() if p.is_file() else b"<dir>") for p in folder.iterdir()}


CASES = [(case, command) for case, (_, _, commands) in HOSTILE.items() for command in commands]


@pytest.mark.parametrize("case,command", CASES, ids=[f"{c}-{cmd}" for c, cmd in CASES])
def test_hostile_model_is_refused_with_one_line(cli, tmp_path, case, command):
    build, fragment, _ = HOSTILE[case]
    path = build(tmp_path)
    argv = _argv(command, path, tmp_path)
    before = _files(tmp_path)
    r = cli(*argv)
    assert r.code == 2, (case, command, r.code, r.err)
    line = one_error_line(r.err)
    assert fragment in line, line
    assert r.out == ""
    assert _files(tmp_path) == before  # nothing written, no temp folder left, the input untouched


def test_escaping_external_data_is_refused_by_the_api_before_anything_reads_it(tmp_path):
    path = external_data_escapes_the_folder(tmp_path)
    with pytest.raises(InputError, match="outside the model's folder"):
        dmlopt.load(path)
    with pytest.raises(InputError, match="outside the model's folder"):
        dmlopt.optimize(str(path))


@pytest.mark.parametrize("build", [cycle, undefined_value, duplicate_output_names, opset_from_the_future, no_outputs])
def test_hostile_model_proto_is_an_input_error_in_the_api(build, tmp_path):
    proto = onnx.load(build(tmp_path))
    with pytest.raises(InputError):
        dmlopt.optimize(proto)
    with pytest.raises(InputError):
        dmlopt.inspect(proto)


def test_custom_domain_is_described_by_inspect_but_not_optimized(cli, tmp_path):
    """A custom op in a declared domain (``com.example.MyOp``) is a legitimate model: plugins and
    vendor ops ship this way, and the onnx checker accepts it.  So `inspect` describes it
    (exit 0).  `optimize` cannot check numerics without running the op on ORT, which does not
    know it, so it refuses with exit 2 and ORT's one-line reason and writes nothing; `validate`
    likewise.  (`optimize --no-validate` would write it: the user opted out of the check.)"""
    model = _model([helper.make_node("MyOp", ["x"], ["y"], domain="com.example")], [_vi("x")], [_vi("y")])
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    path = _write(tmp_path, "custom.onnx", model)
    r = cli("inspect", path, "--json")
    assert r.code == 0 and r.err == ""
    assert '"com.example.MyOp": 1' in r.out
    for command in ("optimize", "validate"):
        argv = _argv(command, path, tmp_path)
        before = _files(tmp_path)
        r = cli(*argv)
        assert r.code == 2, r.err
        assert "com.example:MyOp" in one_error_line(r.err) and "not a registered function/op" in r.err
        assert _files(tmp_path) == before


def test_huge_declared_dim_is_described_not_validated(cli, tmp_path):
    """An input declared [2**40, 2**40] is valid ONNX (inspect describes it, exit 0), but no
    random input of that size can be made: optimize and validate refuse before allocating,
    naming --shape (the HOSTILE table checks their exit 2)."""
    path = huge_declared_dim(tmp_path)
    r = cli("inspect", path)
    assert r.code == 0
    assert "1099511627776x1099511627776" in r.out
    r = cli("optimize", path, "-o", tmp_path / "out.onnx")
    assert r.code == 2 and "--shape" in one_error_line(r.err)
    assert not (tmp_path / "out.onnx").exists()


def test_zero_size_dim_is_a_valid_model_and_optimizes(cli, tmp_path):
    """A static 0-size batch is legal ONNX (empty tensors): every command accepts it, the
    default pipeline runs on it without crashing, and the written model runs on ORT with an
    empty output of the right shape.  The comparison is vacuous (no elements), which is why
    the pass properties are tested on non-empty tensors (tests/property)."""
    path = _write(tmp_path, "zero.onnx", conv_leaky_model(batch=0))
    assert cli("inspect", path).code == 0
    r = cli("optimize", path, "-o", tmp_path / "out.onnx", "-q")
    assert r.code == 0, r.err
    from dmlopt.runtime.validate import run

    y = run(dmlopt.load(tmp_path / "out.onnx"), {"x": np.zeros((0, 3, 8, 8), np.float32)})["y"]
    assert y.shape == (0, 4, 8, 8)
    assert cli("validate", path, tmp_path / "out.onnx").code == 0


def test_negative_declared_dim_is_treated_as_unknown(cli, tmp_path):
    """Some exporters write -1 for "unknown"; validation then feeds size 1 there, not a crash."""
    path = _write(tmp_path, "neg.onnx", _relu(inputs=[_vi("x", (-1, 3))], outputs=[_vi("y", (-1, 3))]))
    r = cli("validate", path, path, "--json")
    assert r.code == 0, r.err
    assert '"x": [\n      1,\n      3\n    ]' in r.out


# -- damaged bytes: seeded truncations and bit flips of a real model ------------------------------


def _good_bytes() -> bytes:
    return conv_leaky_model().SerializeToString()


def _flipped(data: bytes, seed: int) -> bytes:
    rng = random.Random(seed)
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(out))
        out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


def _check_damaged(cli, folder: pathlib.Path, path: pathlib.Path, good: pathlib.Path) -> set[int]:
    """Damaged bytes may still be a valid model (a flip in a weight): then exit 0 (or 1 when
    numerics differ).  Whatever the outcome: no traceback, at most one line on stderr, an
    `dmlopt: error:` line with every exit 2, and an output only when optimize succeeded."""
    codes = set()
    out = folder / "out.onnx"
    for argv in (["inspect", path], ["optimize", path, "-o", out, "-q"], ["validate", good, path]):
        r = cli(*argv)
        codes.add(r.code)
        assert r.code in (0, 1, 2), (argv, r.code, r.err)
        assert "Traceback" not in r.err and "internal error" not in r.err, r.err
        if r.code == 2:
            one_error_line(r.err)
        if argv[0] == "optimize":
            lines = [line for line in r.err.splitlines() if line.strip()]
            assert len(lines) <= 1, r.err
            assert out.exists() == (r.code == 0), (r.code, r.err)
            if out.exists():
                onnx.checker.check_model(onnx.load(out))
                out.unlink()
        leftovers = [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]
        assert not leftovers
    return codes


def test_bit_flipped_models_never_crash(cli, tmp_path):
    good = _write(tmp_path, "good.onnx", _good_bytes())
    seen = set()
    for seed in range(40):
        path = _write(tmp_path, "flipped.onnx", _flipped(_good_bytes(), seed))
        seen |= _check_damaged(cli, tmp_path, path, good)
    assert 2 in seen  # the seeds do hit structure, not only weights


def test_truncated_models_are_refused(cli, tmp_path):
    data = _good_bytes()
    good = _write(tmp_path, "good.onnx", data)
    for fraction in (0.05, 0.25, 0.5, 0.75, 0.9, 0.99):
        path = _write(tmp_path, "cut.onnx", data[: int(len(data) * fraction)])
        codes = _check_damaged(cli, tmp_path, path, good)
        assert codes == {2}, (fraction, codes)


def test_random_bytes_are_refused(cli, tmp_path):
    rng = random.Random(3)
    good = _write(tmp_path, "good.onnx", _good_bytes())
    for size in (1, 7, 64, 1000, 50_000):
        path = _write(tmp_path, "junk.onnx", bytes(rng.randrange(256) for _ in range(size)))
        assert _check_damaged(cli, tmp_path, path, good) == {2}, size


# -- the real process: what ORT's C++ side prints reaches the real stderr too ---------------------

SUBPROCESS_CASES = ["cycle", "value nothing produces", "opset newer than onnx knows", "external data escapes the folder",
                    "huge declared dim"]


@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_hostile_model_through_python_m_dmlopt(tmp_path, case):
    build, fragment, commands = HOSTILE[case]
    path = build(tmp_path)
    command = commands[-1]  # validate: both models go through ORT's loader if nothing stops them first
    argv = [str(a) for a in _argv(command, path, tmp_path)]
    before = _files(tmp_path)
    r = subprocess.run([sys.executable, "-m", "dmlopt", *argv], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert fragment in one_error_line(r.stderr)
    assert r.stdout == ""
    assert _files(tmp_path) == before


def test_bit_flipped_model_through_python_m_dmlopt(tmp_path):
    """A flip that onnx's checker misses (a Conv's pads attribute losing entries) reaches ORT's
    loader: its C++ error must still come out as one line."""
    good = _write(tmp_path, "good.onnx", _good_bytes())
    path = _write(tmp_path, "flipped.onnx", _flipped(_good_bytes(), 14))
    for argv in (["optimize", path, "-o", tmp_path / "out.onnx"], ["validate", good, path]):
        r = subprocess.run([sys.executable, "-m", "dmlopt", *map(str, argv)], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 2, r.stderr
        assert "ONNX Runtime cannot load the model" in one_error_line(r.stderr)
    assert not (tmp_path / "out.onnx").exists()


def test_reader_that_goes_away_is_not_an_error(tmp_path):
    """`dmlopt inspect m.onnx | head -1`: the pipe closes before dmlopt writes; no traceback,
    no 'internal error' line, exit 141 (128 + SIGPIPE) as a shell pipeline would report."""
    path = _write(tmp_path, "model.onnx", _good_bytes())
    proc = subprocess.Popen([sys.executable, "-m", "dmlopt", "inspect", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # long before the interpreter has started: its first write gets EPIPE
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141
    assert err == ""


def test_model_ort_loads_but_cannot_run_is_one_line_on_the_real_stderr(tmp_path):
    """A Conv with dilations and auto_pad=SAME_UPPER is valid ONNX that ORT's CPU EP refuses at
    run time; ORT's own C++ error log must not add lines before dmlopt's."""
    w = numpy_helper.from_array(np.ones((2, 2, 3, 3), np.float32), "W")
    conv = helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[3, 3], dilations=[2, 2], auto_pad="SAME_UPPER")
    path = _write(tmp_path, "dilated_same.onnx", _model([conv], [_vi("x", (1, 2, 6, 6))], [_vi("y", (1, 2, 6, 6))], [w]))
    r = subprocess.run([sys.executable, "-m", "dmlopt", "validate", str(path), str(path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    assert "Dilation not supported" in one_error_line(r.stderr)
