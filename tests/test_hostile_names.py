"""Names a model chose are escaped and cut everywhere text is printed (issue 23.7).

Generated: every hostile name (control codes, newlines, BEL, ESC sequences, bidi overrides, and
names of thousands of characters) in every place a model holds one (graph input, output, node,
dynamic dim), through every command that prints a table or a line about the model.  Every line
printed is free of control codes and bounded in length, and the output does not grow with the
name: one long name must not pad every row of a table."""

from __future__ import annotations

import itertools

import onnx
import pytest
from onnx import TensorProto, helper

from dmlopt.errors import LINE_WIDTH, printable

HOSTILE = ["\x1b[2J\x1b[31mred", "bell\x07\x07", "two\nlines", "cr\rover", "tab\tbed", "\u202eevil", "nul\x00x",
           "x" * 5000, "\x1b" * 3000, "\n" * 2000]
PLACES = ["input", "output", "node", "dim"]
# Longest line any command may print: an error line, or a table row of a few bounded cells.
MAX_LINE = LINE_WIDTH + 100


def named_model(place: str, name: str) -> onnx.ModelProto:
    names = {"input": "x", "output": "y", "node": "relu", "dim": "n"}
    names[place] = name
    nodes = [helper.make_node("Relu", [names["input"]], ["h"], name=names["node"]),
             helper.make_node("Sigmoid", ["h"], [names["output"]], name="sig")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(names["input"], TensorProto.FLOAT,
                                                                         [names["dim"], 8])],
                              [helper.make_tensor_value_info(names["output"], TensorProto.FLOAT, [names["dim"], 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def assert_bounded(text: str) -> None:
    for line in text.splitlines():
        assert len(line) <= MAX_LINE, f"a line of {len(line)} characters"
        assert all(c.isprintable() for c in line), repr(line[:200])
    assert len(text) < 40_000, "output grows with the name"


CASES = list(itertools.product(PLACES, range(len(HOSTILE))))


@pytest.mark.parametrize("place,which", CASES, ids=[f"{p}-{i}" for p, i in CASES])
def test_every_printed_line_is_escaped_and_bounded(cli, tmp_path, place, which):
    name = HOSTILE[which]
    path = tmp_path / "m.onnx"
    onnx.save(named_model(place, name), path)
    runs = [("inspect", path), ("inspect", path, "--ep", "dml"), ("validate", path, path, "--dim", "n=2"),
            ("optimize", path, "-o", tmp_path / "o.onnx", "--no-time", "--dim", "n=2"),
            ("optimize", path, "-o", tmp_path / "p.onnx", "--no-time"),
            ("bench", path, "--emulate", "dml-1.14", "--runs", "1", "--warmup", "0", "-q", "--dim", "n=2")]
    for args in runs:
        r = cli(*args)
        assert "internal error" not in r.err, (args, r.err[:500])
        assert_bounded(r.out)
        assert_bounded(r.err)
        if len(name) < 50 and r.code == 0 and place == "output" and args[0] in ("inspect", "validate"):
            assert printable(name) in r.out, args  # shown, escaped


def test_an_error_naming_a_huge_name_is_one_bounded_line(cli, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(named_model("input", "q" * 100_000), path)
    r = cli("validate", path, path, "--shape", "q" * 100_000 + ":1,8", "--shape", "nope:1")
    assert r.code == 2
    lines = r.err.splitlines()
    assert len(lines) == 1 and len(lines[0]) <= MAX_LINE, r.err[:300]


def test_printable_cuts_and_says_how_long():
    assert printable("a" * 10) == "a" * 10
    shown = printable("\x1b" * 1000, 50)
    assert len(shown) <= 50 and shown.startswith("\\x1b") and "(1000 chars)" in shown
