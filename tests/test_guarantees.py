"""The README's guarantees, each tested.

1. The input model (and its external data) is never modified, whatever the run's outcome.
2. Outputs are written atomically: an interrupted run (SIGINT included) or a failed write
   leaves no partial file and no temporary folder, and an older output stays intact.
3. Initializers no pass touched come out byte for byte, external data included, and the
   output's external data lives next to the output.
4. A model that fails validation is not written unless forced, and then the report says so
   (the basic case is test_cli.py::test_failed_validation_writes_nothing_unless_forced).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import dmlopt
from dmlopt.io import model as model_io
from dmlopt.errors import OutputError
from tests.conftest import conv_leaky_model

BUNDLED = pathlib.Path(dmlopt.__file__).parent / "data"


def _hashes(folder: pathlib.Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _leftovers(folder: pathlib.Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp") or p.name.startswith("dmlopt-"))


def _mixed_model() -> onnx.ModelProto:
    """A Conv+LeakyRelu site the passes rewrite (new weights) beside initializers of several
    dtypes that no pass has a reason to touch (each read by an op with a graph input)."""
    rng = np.random.default_rng(0)
    base = conv_leaky_model(batch=1)
    g = base.graph
    extra = {
        "table": rng.standard_normal((50, 8)).astype(np.float32),
        "bias16": rng.standard_normal((4,)).astype(np.float16),
        "offsets": rng.integers(-1000, 1000, (4,)).astype(np.int64),
        "codes": rng.integers(-128, 127, (50,)).astype(np.int8),
        "mask": rng.integers(0, 2, (50,)).astype(bool),
    }
    g.initializer.extend(numpy_helper.from_array(v, k) for k, v in extra.items())
    g.input.extend([helper.make_tensor_value_info("idx", TensorProto.INT64, [3]),
                    helper.make_tensor_value_info("h", TensorProto.FLOAT16, [4]),
                    helper.make_tensor_value_info("i", TensorProto.INT64, [4])])
    g.node.extend([helper.make_node("Gather", ["table", "idx"], ["rows"]),
                   helper.make_node("Add", ["h", "bias16"], ["h2"]),
                   helper.make_node("Add", ["i", "offsets"], ["i2"]),
                   helper.make_node("Gather", ["codes", "idx"], ["c2"]),
                   helper.make_node("Gather", ["mask", "idx"], ["m2"])])
    g.output.extend([helper.make_tensor_value_info("rows", TensorProto.FLOAT, [3, 8]),
                     helper.make_tensor_value_info("h2", TensorProto.FLOAT16, [4]),
                     helper.make_tensor_value_info("i2", TensorProto.INT64, [4]),
                     helper.make_tensor_value_info("c2", TensorProto.INT8, [3]),
                     helper.make_tensor_value_info("m2", TensorProto.BOOL, [3])])
    return base


UNTOUCHED = ("table", "bias16", "offsets", "codes", "mask")


def _external_copy(model: onnx.ModelProto, folder: pathlib.Path, name="model.onnx") -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=name + ".data",
              size_threshold=0)
    return path


def _initializers(path: pathlib.Path) -> dict[str, np.ndarray]:
    proto = onnx.load(str(path))  # external data read from the model's own folder
    return {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}


# -- 1. the input is never modified --------------------------------------------------------------


def _corrupting_cleanup(monkeypatch):
    """Make the cleanup pass wrong on purpose (LeakyRelu slope 0.9) so validation fails."""
    from dmlopt.passes import cleanup

    real = cleanup.CleanupPass.call

    def corrupt(self, model):
        result = real(self, model)
        for node in model.graph:
            if node.op_type == "LeakyRelu":
                node.attributes["alpha"] = ir.AttrFloat32("alpha", 0.9)
        return result

    monkeypatch.setattr(cleanup.CleanupPass, "call", corrupt)


RUNS = {
    "default pipeline, --shape": (lambda d: _write_proto(d, conv_leaky_model()), ["--shape", "x:1,3,8,8"]),
    "bundled CNN": (lambda d: _copy(BUNDLED / "cnn_leaky.onnx", d), []),
    "external data": (lambda d: _external_copy(_mixed_model(), d), []),
    "named passes, --no-validate": (lambda d: _external_copy(_mixed_model(), d),
                                    ["--passes", "cleanup,leaky-relu", "--leaky-relu", "decompose", "--no-validate"]),
}


def _write_proto(folder, proto, name="model.onnx"):
    path = folder / name
    onnx.save(proto, path)
    return path


def _copy(src: pathlib.Path, folder: pathlib.Path) -> pathlib.Path:
    path = folder / src.name
    path.write_bytes(src.read_bytes())
    return path


@pytest.mark.parametrize("run", sorted(RUNS))
def test_optimize_never_modifies_the_input(cli, tmp_path, run):
    build, flags = RUNS[run]
    src = tmp_path / "in"
    src.mkdir()
    path = build(src)
    before = _hashes(src)
    r = cli("optimize", path, "-o", tmp_path / "out.onnx", "-q", *flags)
    assert r.code == 0, r.err
    assert _hashes(src) == before
    assert sorted(p.name for p in src.iterdir()) == sorted(before)


@pytest.mark.parametrize("force", [False, True])
def test_failed_validation_leaves_the_input_alone(cli, tmp_path, monkeypatch, force):
    _corrupting_cleanup(monkeypatch)
    src = tmp_path / "in"
    path = _external_copy(_mixed_model(), src)
    before = _hashes(src)
    r = cli("optimize", path, "-o", tmp_path / "out.onnx", "--passes", "cleanup", *(["--force"] if force else []))
    assert r.code == 1
    assert _hashes(src) == before
    assert (tmp_path / "out.onnx").exists() == force


def test_the_api_leaves_the_callers_model_alone():
    """optimize works on a clone: the ir.Model or ModelProto handed in is unchanged."""
    proto = conv_leaky_model()
    proto_bytes = proto.SerializeToString()
    model = ir.from_proto(proto)
    model_bytes = ir.to_proto(model).SerializeToString()
    for given in (proto, model):
        result = dmlopt.optimize(given, shapes={"x": [1, 3, 8, 8]}, leaky_relu="conv-split")
        assert result.passed
        assert result.report.output["op_counts"] != result.report.input["op_counts"]  # it did rewrite
    assert proto.SerializeToString() == proto_bytes
    assert ir.to_proto(model).SerializeToString() == model_bytes


def test_output_may_not_be_the_inputs_data_file_or_a_link_to_the_input(cli, tmp_path):
    """-o out.onnx would write out.onnx.data: refused when that is the input's data file;
    a symlink to the input is refused like the input itself."""
    path = tmp_path / "model.onnx"
    onnx.save(conv_leaky_model(), path, save_as_external_data=True, location="out.onnx.data", size_threshold=0)
    os.symlink(path, tmp_path / "link.onnx")
    before = _hashes(tmp_path)
    for out in ("out.onnx", "link.onnx"):
        r = cli("optimize", path, "-o", tmp_path / out)
        assert r.code == 2
        assert "refusing to overwrite the input model" in r.err
    assert _hashes(tmp_path) == before


# -- 2. atomic outputs ---------------------------------------------------------------------------

# 300 MB of weights: saving them takes long enough to signal the process mid-write.
BIG = 75_000_000


@pytest.fixture(scope="module")
def big_model(tmp_path_factory) -> pathlib.Path:
    """y = Gather(W, idx), W = arange(BIG) as float32 in external data (written directly)."""
    folder = tmp_path_factory.mktemp("big_in")
    np.arange(BIG, dtype=np.float32).tofile(folder / "big.onnx.data")
    w = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[BIG], data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "big.onnx.data"), ("offset", "0"), ("length", str(BIG * 4))):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph([helper.make_node("Gather", ["W", "idx"], ["y"])], "big",
                              [helper.make_tensor_value_info("idx", TensorProto.INT64, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [w])
    path = folder / "big.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _stopped(pid: int, timeout: float = 10.0) -> bool:
    """Wait until the kernel shows `pid` stopped (state T in /proc/PID/stat) or gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            return False
        if state in "Tt":
            return True
        if state in "ZX":
            return False
        time.sleep(0.0005)
    return False


def _children(pid: int) -> list[int]:
    """The processes `pid` forked (dmlopt's supervised worker), from /proc."""
    try:
        return [int(c) for c in pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _pending(pid: int, sig: int, timeout: float = 10.0) -> bool:
    """Wait until `sig` is pending for `pid` (the supervisor has passed it on to the frozen worker)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = pathlib.Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        masks = [int(line.split()[1], 16) for line in status.splitlines() if line.startswith(("ShdPnd:", "SigPnd:"))]
        if any(m & (1 << (sig - 1)) for m in masks):
            return True
        time.sleep(0.0005)
    return False


def _interrupt_when(proc: subprocess.Popen, appeared, timeout: float = 120.0, sig=signal.SIGINT) -> bool:
    """Poll until `appeared()` is true, then send `sig` (SIGINT) while it still is; False if the
    process ended first.  Where the platform allows, the process and its worker (dmlopt runs the
    command in a supervised child: dmlopt.cli.supervisor) are frozen (SIGSTOP, waited for) and the
    moment checked again; the signal goes to the process, which is resumed and passes it on, and
    the worker resumes only once the signal waits for it: on a loaded machine the moment cannot
    pass between the check and the signal."""
    freeze = hasattr(signal, "SIGSTOP") and pathlib.Path(f"/proc/{proc.pid}/stat").exists()
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if appeared():
            if not freeze:
                proc.send_signal(sig)
                return True
            workers = _children(proc.pid)
            frozen = [proc.pid, *workers]
            for pid in frozen:
                os.kill(pid, signal.SIGSTOP)
            try:
                if all(_stopped(pid) for pid in frozen) and appeared():  # frozen: still so when the signal is taken
                    proc.send_signal(sig)
                    os.kill(proc.pid, signal.SIGCONT)
                    for pid in workers:
                        _pending(pid, sig)
                    return True
            finally:
                for pid in frozen:
                    try:
                        os.kill(pid, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
        time.sleep(0.002)
    return False


@pytest.mark.parametrize("moment", ["while saving", "while validating"])
def test_sigint_leaves_no_partial_output(big_model, tmp_path, moment):
    """SIGINT mid-save (the temporary folder `.out.onnx.*.tmp` beside the output exists) or
    mid-validation (ORT's temporary copy of the model exists): exit 130, one line, no
    out.onnx, no out.onnx.data, no temporary folder anywhere, the input untouched."""
    out_dir, tmp_dir = tmp_path / "out", tmp_path / "tmp"
    out_dir.mkdir()
    tmp_dir.mkdir()
    before = _hashes(big_model.parent)
    env = dict(os.environ, TMPDIR=str(tmp_dir))
    proc = subprocess.Popen([sys.executable, "-m", "dmlopt", "optimize", str(big_model), "-o", str(out_dir / "out.onnx"),
                             "--passes", "cleanup", "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    if moment == "while saving":
        watched, pattern = out_dir, (".out.onnx.", ".tmp")
    else:
        watched, pattern = tmp_dir, ("dmlopt-ort-", "")
    hit = _interrupt_when(proc, lambda: any(p.name.startswith(pattern[0]) and p.name.endswith(pattern[1])
                                            for p in watched.iterdir()))
    _, err = proc.communicate(timeout=120)
    assert hit, f"the run ended before the moment came: {err}"
    assert proc.returncode == 130, err
    assert err.strip() == "dmlopt: interrupted; nothing was written"
    assert list(out_dir.iterdir()) == []
    assert _leftovers(tmp_dir) == []
    assert _hashes(big_model.parent) == before


def test_interrupted_or_failed_save_keeps_the_old_output(tmp_path, monkeypatch):
    """In-process, deterministic: a KeyboardInterrupt or an OSError inside the write leaves
    the previous out.onnx as it was and no temporary folder."""
    out = tmp_path / "out.onnx"
    old = conv_leaky_model(seed=1)
    onnx.save(old, out)
    old_bytes = out.read_bytes()
    real_save = ir.save

    def half_then(exc):
        def save(model, path, **kw):
            pathlib.Path(path).write_bytes(b"half a model")
            raise exc
        return save

    for exc, expected in ((KeyboardInterrupt(), KeyboardInterrupt), (OSError(28, "No space left on device"),
                                                                      OutputError)):
        monkeypatch.setattr(ir, "save", half_then(exc))
        monkeypatch.setattr(dmlopt.io.model, "save_inline", half_then(exc))  # single-file .onnx writer
        with pytest.raises(expected):
            dmlopt.save(dmlopt.load(conv_leaky_model()), out)
        assert out.read_bytes() == old_bytes
        assert _leftovers(tmp_path) == []
    monkeypatch.setattr(ir, "save", real_save)


def test_interrupt_between_the_data_and_the_model_leaves_no_data_file(tmp_path, monkeypatch):
    """With external data, save renames two files; a KeyboardInterrupt at the second rename
    must not leave out.onnx.data without its out.onnx."""
    real_replace = os.replace
    calls = []

    def replace(src, dst):
        if pathlib.Path(dst).parent == tmp_path:  # save's renames (onnx_ir renames inside the temp folder)
            calls.append(dst)
            if len(calls) == 2:
                raise KeyboardInterrupt
        return real_replace(src, dst)

    monkeypatch.setattr(model_io.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        dmlopt.save(dmlopt.load(conv_leaky_model()), tmp_path / "out.onnx", external_data=True)
    assert [pathlib.Path(c).name for c in calls] == ["out.onnx.data", "out.onnx"]
    assert list(tmp_path.iterdir()) == []


def test_bad_report_path_fails_before_anything_is_written(cli, tmp_path, model_path):
    for report, fragment in (("report.txt", "must end in .json or .html"),
                             (str(tmp_path / "missing" / "r.json"), "missing/r.json: folder")):
        r = cli("optimize", model_path, "-o", tmp_path / "out.onnx", "--report", report)
        assert r.code == 2 and fragment in r.err, r.err
        assert not (tmp_path / "out.onnx").exists()


# -- 3. untouched initializers byte for byte -----------------------------------------------------


def _assert_untouched_preserved(src: pathlib.Path, out: pathlib.Path) -> None:
    before, after = _initializers(src), _initializers(out)
    assert set(UNTOUCHED) <= set(after)
    for name in set(before) & set(after):
        assert after[name].dtype == before[name].dtype, name
        assert after[name].shape == before[name].shape, name
        assert after[name].tobytes() == before[name].tobytes(), name


def test_untouched_external_initializers_survive_optimize_byte_for_byte(cli, tmp_path):
    """The CLI's default pipeline rewrites the Conv site and leaves the rest; the output,
    written in another folder, carries its own data file (not a reference to the input's)."""
    src = _external_copy(_mixed_model(), tmp_path / "in")
    out = tmp_path / "out" / "model.dml.onnx"
    out.parent.mkdir()
    r = cli("optimize", src, "-o", out, "-q", "--leaky-relu", "conv-split", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["output"]["op_counts"].get("LeakyRelu", 0) == 0  # the site was rewritten
    _assert_untouched_preserved(src, out)
    locations = {e.value for t in onnx.load(out, load_external_data=False).graph.initializer
                 for e in t.external_data if e.key == "location"}
    assert locations == {"model.dml.onnx.data"}
    assert (out.parent / "model.dml.onnx.data").is_file()


@pytest.mark.parametrize("external", [True, False, None])
def test_untouched_initializers_survive_the_api_save(tmp_path, external):
    """load -> optimize -> save, with the weights saved external, inline, or as save decides."""
    src = _external_copy(_mixed_model(), tmp_path / "in")
    result = dmlopt.optimize(dmlopt.load(src), leaky_relu="decompose")
    assert result.passed
    (tmp_path / "out").mkdir()
    out = dmlopt.save(result.model, tmp_path / "out" / "m.onnx", external_data=external)
    _assert_untouched_preserved(src, out)
    inline = not (out.parent / "m.onnx.data").exists()
    assert inline == (external is False)


# -- 4. failed validation: written only when forced, and then the report says so ------------------


def test_forced_output_is_recorded_in_the_json_and_html_reports(cli, tmp_path, model_path, monkeypatch):
    _corrupting_cleanup(monkeypatch)
    out = tmp_path / "out.onnx"
    r = cli("optimize", model_path, "-o", out, "--passes", "cleanup", "--report", tmp_path / "r.json")
    assert r.code == 1 and not out.exists()
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["written"] is None and report["forced"] is False and report["broken_by"] == "cleanup"
    r = cli("optimize", model_path, "-o", out, "--passes", "cleanup", "--force", "--report", tmp_path / "r.html")
    assert r.code == 1 and out.exists()
    assert "output written anyway because of --force" in r.err
    assert "forced despite failed validation" in (tmp_path / "r.html").read_text()
    # the forced file is the failing model itself, not a repaired one
    alphas = [a.f for n in onnx.load(out).graph.node for a in n.attribute if n.op_type == "LeakyRelu"]
    assert alphas == [pytest.approx(0.9)]
