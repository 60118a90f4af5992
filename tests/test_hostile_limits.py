"""What tiny or lying files may make dmlopt allocate or read, and what validation may accept
(issue 23.1-23.3).  Each class is generated over many variants:

  1. onnx's data propagation is sized before it runs (`data_propagation_cost`): 1-D vectors
     read by Concat/Add/Mul/Squeeze... fan-outs and chains stay within a budget, real models
     keep it; an --inputs .npz is sized member by member before anything is decompressed; a
     model file over protobuf's limit is refused unread; external data with negative dims or
     packed sub-byte types is checked as strictly as the rest; locations are normalized once.
  2. validation compares dtypes first, does not pass a comparison with nothing finite in it,
     and compares sequences of uneven shapes element by element.
  3. no file a loaded model's weights are read from is replaced under it.
"""

from __future__ import annotations

import gc
import itertools
import os
import pathlib
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import dmlopt
from dmlopt.graph import shape_inference
from dmlopt.errors import InputError, OutputError
from dmlopt.io.inputs_file import read_npz
from dmlopt.runtime.validate import compare, run as run_model
from tests.test_hostile_compute import _peak_mb

DATA = pathlib.Path(dmlopt.__file__).parent / "data"


# -- 1a. data propagation --------------------------------------------------------------------------

def vector_model(op: str, size: int, fanout: int, source: str = "input") -> onnx.ModelProto:
    """A 1-D vector of `size` elements (a graph input or an int64 initializer) read `fanout`
    times by `op` (Concat reads it `fanout` times in one node)."""
    inputs, inits = [], []
    if source == "input":
        inputs.append(helper.make_tensor_value_info("v", TensorProto.INT64, [size]))
    else:
        inits.append(numpy_helper.from_array(np.arange(size, dtype=np.int64), "v"))
    if op == "Concat":
        nodes = [helper.make_node("Concat", ["v"] * fanout, ["y0"], axis=0)]
        outs = [helper.make_tensor_value_info("y0", TensorProto.INT64, [size * fanout])]
    else:
        nodes = [helper.make_node(op, ["v", "v"] if op in ("Add", "Mul") else ["v"], [f"y{k}"]) for k in range(fanout)]
        outs = [helper.make_tensor_value_info(f"y{k}", TensorProto.INT64, [size]) for k in range(fanout)]
    graph = helper.make_graph(nodes, "vectors", inputs, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


HOSTILE_VECTORS = [(op, size, fanout, source) for op, size, fanout, source in itertools.product(
    ["Concat", "Add", "Mul", "Identity"], [1 << 16, 1 << 20, 1 << 22], [40, 200], ["input", "initializer"])
    if size * fanout > shape_inference.DATA_PROP_BUDGET and not (source == "initializer" and size > 1 << 20)]


@pytest.mark.parametrize("op,size,fanout,source", HOSTILE_VECTORS)
def test_a_costly_data_propagation_is_left_off(op, size, fanout, source):
    m = dmlopt.load(vector_model(op, size, fanout, source))
    assert shape_inference.data_propagation_cost(m) > shape_inference.DATA_PROP_BUDGET
    assert not shape_inference.data_propagation_allowed(m)


@pytest.mark.parametrize("name", ["sam_small", "sam_small_dynamic", "cnn_leaky", "cnn_relu"])
def test_real_models_keep_data_propagation(name):
    assert shape_inference.data_propagation_allowed(dmlopt.load(DATA / f"{name}.onnx"))




@pytest.mark.parametrize("command", [["inspect"], ["inspect", "--ep", "dml"], ["optimize", "--no-validate", "-q"],
                                     ["optimize", "--no-validate", "-q", "--passes", "freeze-shapes,linear-gemm,copies"]])
def test_a_200_byte_model_does_not_take_gigabytes(tmp_path, command):
    """One 1-D input of a million elements concatenated with itself 40 times: 2.9 GB before."""
    path = tmp_path / "tiny.onnx"
    onnx.save(vector_model("Concat", 1_000_000, 40), path)
    assert path.stat().st_size < 300
    argv = [command[0], str(path), *(["-o", str(tmp_path / "o.onnx")] if command[0] == "optimize" else []), *command[1:]]
    rc, peak_mb, err = _peak_mb(argv)  # VmHWM: not the peak of pytest, which the child's ru_maxrss inherits
    assert rc == 0, err
    assert peak_mb < 600, f"{peak_mb} MB"


# -- 1b. --inputs .npz sized before it is read -------------------------------------------------

def _npy_header(shape, dtype="<f4") -> bytes:
    import io
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _lying_npz(path, how: str, cap: int):
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        if how == "header asks for more than the member holds":
            z.writestr("x.npy", _npy_header((cap,)) + b"\0" * 16)
        elif how == "one member over the cap":
            z.writestr("x.npy", _npy_header((cap // 4 + 16,)) + b"\0" * (cap + 64))
        elif how == "members together over the cap":
            for k in range(4):
                z.writestr(f"x{k}.npy", _npy_header((cap // 12,)) + b"\0" * (cap // 3))
        elif how == "object array":
            z.writestr("x.npy", _npy_header((2,), "|O") + b"\0" * 16)
        elif how == "not an array":
            z.writestr("notes.txt", b"hello")
        elif how == "negative dim":
            z.writestr("x.npy", _npy_header((-5,)) + b"\0" * 16)


LIES = ["header asks for more than the member holds", "one member over the cap", "members together over the cap",
        "object array", "not an array"]


@pytest.mark.parametrize("how", LIES)
def test_a_lying_npz_is_refused_before_it_is_decompressed(tmp_path, how):
    cap = 4 << 20  # as the 2 GiB cap, at a size a test can write
    path = tmp_path / "in.npz"
    _lying_npz(path, how, cap)
    assert path.stat().st_size < 200_000
    with pytest.raises(InputError):
        read_npz(path, cap=cap)


def test_a_good_npz_is_read(tmp_path):
    path = tmp_path / "in.npz"
    np.savez_compressed(path, x=np.arange(12, dtype=np.float32).reshape(3, 4), n=np.array(3))
    got = read_npz(path)
    assert set(got) == {"x", "n"} and got["x"].shape == (3, 4) and float(got["x"][2, 3]) == 11.0


@pytest.mark.parametrize("what", ["missing", "folder", "fifo", "not a zip"])
def test_an_inputs_path_that_is_no_npz_file_is_one_line(cli, model_path, tmp_path, what):
    path = tmp_path / "in.npz"
    if what == "folder":
        path.mkdir()
    elif what == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("no FIFOs here")
        os.mkfifo(path)
    elif what == "not a zip":
        path.write_bytes(b"PK not really")
    r = cli("validate", model_path, model_path, "--inputs", path)  # a FIFO must not block
    assert r.code == 2 and r.err.startswith("dmlopt: error: ") and len(r.err.splitlines()) == 1, r.err


# -- 1c. model files and external data --------------------------------------------------------

def test_a_model_file_over_protobufs_limit_is_refused_unread(tmp_path):
    path = tmp_path / "huge.onnx"
    with open(path, "wb") as f:
        f.truncate(2**31 + 10)  # sparse: no disk used, and a read would take 2 GB
    with pytest.raises(InputError, match="over protobuf's 2 GiB limit"):
        dmlopt.load(path)


def _external_model(folder: pathlib.Path, dtype: int, dims: list[int], nbytes: int, location="w.bin") -> pathlib.Path:
    (folder / "w.bin").write_bytes(b"\x11" * nbytes)
    t = TensorProto(name="W", data_type=dtype, dims=dims, data_location=TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", "0")):
        e = t.external_data.add()
        e.key, e.value = key, value
    graph = helper.make_graph([helper.make_node("Identity", ["W"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", dtype, dims)], [t])
    path = folder / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), path)
    return path


SUB_BYTE = [(TensorProto.INT4, 4), (TensorProto.UINT4, 4), (TensorProto.FLOAT4E2M1, 4)] + \
    [(getattr(TensorProto, n), 2) for n in ("INT2", "UINT2") if hasattr(TensorProto, n)]


@pytest.mark.parametrize("dtype,bits", SUB_BYTE)
@pytest.mark.parametrize("elements", [1, 7, 1000, 4097])
def test_sub_byte_external_data_is_sized(tmp_path, dtype, bits, elements):
    need = (elements * bits + 7) // 8
    ok = _external_model(tmp_path, dtype, [elements], need)
    dmlopt.load(ok)
    short = _external_model(tmp_path, dtype, [elements], need - 1)
    with pytest.raises(InputError, match="too short"):
        dmlopt.load(short)


@pytest.mark.parametrize("dims", [[-1], [4, -2], [-3, -3], [0, -1]])
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.INT4])
def test_a_negative_external_dim_is_refused(tmp_path, dims, dtype):
    with pytest.raises(InputError, match="negative dimension"):
        dmlopt.load(_external_model(tmp_path, dtype, dims, 64))


@pytest.mark.parametrize("location", ["w.bin/", "missing/../w.bin", "./w.bin", "sub/../w.bin", "w.bin/.", ".//w.bin"])
def test_an_odd_location_is_normalized_once_and_read(cli, tmp_path, location):
    (tmp_path / "sub").mkdir()
    path = _external_model(tmp_path, TensorProto.FLOAT, [4], 16, location=location)
    m = dmlopt.load(path)
    tensor = m.graph.initializers["W"].const_value
    assert tensor.location == "w.bin"
    np.testing.assert_array_equal(tensor.numpy(), np.frombuffer(b"\x11" * 16, dtype=np.float32))
    r = cli("validate", path, path)
    assert r.code == 0, r.err


# -- 2. validation that cannot be fooled --------------------------------------------------------

NONFINITE = {"all nan": np.full(6, np.nan, np.float32), "all +inf": np.full(6, np.inf, np.float32),
             "nan and -inf": np.array([np.nan, -np.inf] * 3, np.float32)}


@pytest.mark.parametrize("ref_name,cand_name", list(itertools.product(NONFINITE, NONFINITE)))
def test_nothing_finite_to_compare_is_not_a_pass(ref_name, cand_name):
    ref, cand = NONFINITE[ref_name], NONFINITE[cand_name]
    check = compare("y", ref, cand)
    assert not check.passed and "finite" in check.reason or "NaNs differ" in check.reason
    allowed = compare("y", ref, cand, allow_nonfinite=True)
    assert allowed.passed == (ref_name == cand_name)


@pytest.mark.parametrize("ref_dtype,cand_dtype", [("float32", "bool"), ("bool", "float32"), ("float32", "int32"),
                                                  ("int64", "int32"), ("int32", "float32"), ("uint8", "int8")])
def test_a_dtype_mismatch_fails_first(ref_dtype, cand_dtype):
    ref = np.ones((2, 3), ref_dtype)
    check = compare("y", ref, np.ones((2, 3), cand_dtype))
    assert not check.passed and "dtype" in check.reason


def test_float_widths_may_differ():  # a float16 interface asked for with --fp16
    assert compare("y", np.ones(4, np.float32), np.ones(4, np.float16)).passed


@pytest.mark.parametrize("shapes", [[(2,), (3, 4)], [(1,), (0,), (5, 1, 2)]])
def test_uneven_sequences_are_compared_element_by_element(shapes):
    rng = np.random.default_rng(0)
    ref = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    assert compare("s", ref, [x.copy() for x in ref]).passed
    wrong = [x.copy() for x in ref]
    wrong[0] = wrong[0] + 1
    bad = compare("s", ref, wrong)
    assert not bad.passed and "element [0]" in bad.reason
    assert not compare("s", ref, ref[:-1]).passed


def _nan_model(op: str) -> onnx.ModelProto:
    """y = op(-|x| - 1): every value NaN (Log and Sqrt of a negative)."""
    nodes = [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["n"]),
             helper.make_node("Sub", ["n", "one"], ["m"]), helper.make_node(op, ["m"], ["y"])]
    graph = helper.make_graph(nodes, "nan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              [numpy_helper.from_array(np.ones(1, np.float32), "one")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_two_different_models_with_all_nan_outputs_do_not_validate(cli, tmp_path):
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(_nan_model("Log"), a)
    onnx.save(_nan_model("Sqrt"), b)
    r = cli("validate", a, b)
    assert r.code == 1 and "no finite values" in r.out, r.out
    assert cli("validate", a, b, "--allow-nonfinite").code == 0


def _sequence_model(extra: float) -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x", "e"], ["x2"]),
             helper.make_node("SequenceConstruct", ["x2", "z"], ["s"])]
    graph = helper.make_graph(nodes, "seq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                                             helper.make_tensor_value_info("z", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array([extra], np.float32), "e")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_sequence_outputs_of_uneven_shapes_validate(cli, tmp_path):
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(_sequence_model(0.0), a)
    onnx.save(_sequence_model(1.0), b)
    assert cli("validate", a, a).code == 0
    r = cli("validate", a, b)
    assert r.code == 1 and "internal error" not in r.err, r.err


# -- 3. the weights under a loaded model ---------------------------------------------------------

def _weights_model(folder: pathlib.Path) -> pathlib.Path:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])], [w, b])
    path = folder / "in.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path,
              save_as_external_data=True, location="in.onnx.data", size_threshold=0)
    return path


WHO = ["the optimized model", "the loaded model", "another model loaded from the file"]


@pytest.mark.parametrize("who,external", list(itertools.product(WHO, [None, True, False])))
def test_a_file_a_loaded_model_reads_is_never_replaced(tmp_path, who, external):
    """Saving over the input: its .data (which the live models map lazily) is refused; an inline
    save (external_data=False) replaces only the .onnx, which no model reads after loading."""
    path = _weights_model(tmp_path)
    data = (tmp_path / "in.onnx.data").read_bytes()
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    mine = dmlopt.load(path)
    other = dmlopt.load(path)
    result = dmlopt.optimize(mine, retime=False)
    saved = {"the optimized model": result.model, "the loaded model": mine,
             "another model loaded from the file": other}[who]
    if external is False:
        dmlopt.save(saved, path, external_data=False)
    else:
        with pytest.raises(OutputError, match="weights of a loaded model are read from it"):
            dmlopt.save(saved, path, external_data=external)
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert (tmp_path / "in.onnx.data").read_bytes() == data
    for model in (mine, other, result.model):
        np.testing.assert_allclose(run_model(model, {"x": x})["y"], want, rtol=1e-5, atol=1e-5)


def test_a_model_whose_weights_are_in_memory_may_replace_its_file(tmp_path):
    path = _weights_model(tmp_path)
    m = dmlopt.load(path)
    import onnx_ir as ir
    m = ir.external_data.load_to_model(m)
    gc.collect()  # the loaded ExternalTensors are gone with their model
    dmlopt.save(m, path)
    assert dmlopt.load(path).graph.initializers["w"].const_value.numpy().shape == (64, 64)


@pytest.mark.parametrize("atol,rtol", [(float("nan"), None), (None, float("inf")), (-1.0, None), (None, -0.1)])
def test_the_api_refuses_tolerances_that_pass_or_fail_everything(model_path, atol, rtol):
    with pytest.raises(dmlopt.errors.UsageError, match="tolerance"):
        dmlopt.validate(model_path, model_path, atol=atol, rtol=rtol)
