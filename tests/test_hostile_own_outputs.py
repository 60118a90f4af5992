"""Every command accepts every model dmlopt writes (issue 22.5, 23.9): the outputs of the
default pipeline for each target and bundled model go through inspect, validate and
bench --emulate for every placement table, and the emulated split computes what the
whole model computes (contrib ops such as MultiHeadAttention included)."""

from __future__ import annotations

import pathlib

import numpy as np
import onnxruntime as ort
import pytest

import dmlopt
from dmlopt.runtime import sessions as runtime
from dmlopt.targets.dml import emulate, placement

DATA = pathlib.Path(dmlopt.__file__).parent / "data"
MODELS = ["sam_small", "cnn_leaky"]
TARGETS = ["dml", "cuda", "cpu"]
VERSIONS = ["1.14", "1.18", "1.23"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """dmlopt's own outputs: (model, target) -> path."""
    folder = tmp_path_factory.mktemp("own")
    out = {}
    for name in MODELS:
        for target in TARGETS:
            path = folder / f"{name}-{target}.onnx"
            result = dmlopt.optimize(DATA / f"{name}.onnx", target=target, retime=False)
            dmlopt.save(result.model, path)
            out[name, target] = path
    return out


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("target", TARGETS)
def test_every_command_accepts_dmlopts_output(cli, written, name, target):
    path = written[name, target]
    for args in (["inspect", path], ["inspect", path, "--ep", "dml"], ["validate", DATA / f"{name}.onnx", path],
                 *(["bench", path, "--emulate", f"dml-{v}", "--runs", "1", "--warmup", "0", "-q"] for v in VERSIONS)):
        r = cli(*args)
        assert r.code == 0, (args, r.err)
        assert "internal error" not in r.err


@pytest.mark.parametrize("version", VERSIONS)
def test_emulated_split_of_contrib_ops_computes_the_whole_model(written, version):
    m = dmlopt.load(written["sam_small", "dml"])
    assert any(n.domain == "com.microsoft" for n in m.graph), "the default pipeline writes contrib ops here"
    p = placement.predict(m, ort_version=version)
    session = emulate.EmulatedSession(m, p, "cpu")
    feeds = runtime.random_inputs(runtime.input_specs(m), seed=3)
    whole = ort.InferenceSession(str(written["sam_small", "dml"]), providers=["CPUExecutionProvider"])
    want = whole.run(None, feeds)
    got = session.run(feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
