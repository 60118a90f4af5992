"""Models dmlopt builds for ONNX Runtime load in the oldest ORT it supports (issue 30, item 1).

onnx's `make_model` stamps the installed onnx's newest IR version: with onnx 1.23 that is IR 14, which
ORT 1.24 (the WebGPU plug-in's oldest) and 1.30 refuse, and every WebGPU attention probe failed.  The
old-ORT check runs the models in a child with onnxruntime 1.24.4 from DMLOPT_TEST_OLD_ORT (a
`pip install --target` folder; .ci/run makes one) and skips, saying why, without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import onnx
import pytest
from onnx import helper

import dmlopt
from dmlopt.runtime import ort_model
from dmlopt.targets.webgpu import kernels
from models import cnn, onnx_builder
from tests import shape_models
from tests.conftest import conv_leaky_model

OLD_ORT = os.environ.get("DMLOPT_TEST_OLD_ORT")


@pytest.mark.parametrize("opset, want", [(7, 8), (13, 8), (17, 8), (18, 8), (19, 9), (21, 10)])
def test_oldest_ir_version_that_holds_the_opset(opset, want):
    assert ort_model.ir_version_for({"": opset, "com.microsoft": 1}) == want


def test_newer_than_onnx_knows_gets_onnx_own_ir_version():
    assert ort_model.ir_version_for({"": 10_000}) == onnx.IR_VERSION


def test_built_models_pass_onnx_checker_at_their_ir_version():
    for model in _built_models().values():
        onnx.checker.check_model(model, full_check=True)
        assert model.ir_version == ort_model.ir_version_for(model.opset_import)


def _built_models() -> dict[str, onnx.ModelProto]:
    g = onnx_builder.Graph()
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])
    built = {
        "webgpu mha probe": kernels.mha_model(1, 2, 8, 8, 4, 4, bias=True, dtype="float32"),
        "webgpu mha probe fp16": kernels.mha_model(1, 2, 8, 8, 4, 4, bias=False, dtype="float16"),
        "onnx_builder": g.model([x], g("Relu", "x"), shape=[1, 4]),
        "shape_models.unet": shape_models.unet(),
        "conftest conv_leaky": conv_leaky_model(),
        "models.cnn": cnn.build_cnn(channels=4, height=8, width=8),
    }
    result = dmlopt.optimize(conv_leaky_model(batch=1), target="webgpu", validate=False)
    built["optimize --target webgpu output"] = dmlopt.io.model.to_proto(result.model)
    return built


_CHILD = r"""
import json, sys, numpy as np, onnx, onnxruntime as ort
out = {}
for path in sys.argv[1:]:
    model = onnx.load(path)
    try:
        s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        feeds = {}
        for i in s.get_inputs():
            shape = [d if isinstance(d, int) else 8 for d in i.shape]
            feeds[i.name] = np.ones(shape, np.float16 if "float16" in i.type else np.float32)
        s.run(None, feeds)
        out[path] = "ok " + ort.__version__
    except Exception as e:
        out[path] = str(e).splitlines()[0][:300]
print(json.dumps(out))
"""


@pytest.mark.skipif(not OLD_ORT, reason="no old ONNX Runtime: set DMLOPT_TEST_OLD_ORT=DIR "
                                        "(pip install --target DIR onnxruntime==1.24.4; .ci/run does)")
def test_built_models_run_on_onnxruntime_1_24(tmp_path):
    paths = {}
    for i, (name, model) in enumerate(_built_models().items()):
        paths[name] = str(tmp_path / f"m{i}.onnx")
        onnx.save(model, paths[name])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([OLD_ORT, *sys.path]))
    done = subprocess.run([sys.executable, "-c", _CHILD, *paths.values()], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    failed = {name: results[p] for name, p in paths.items() if not results[p].startswith("ok 1.24")}
    assert not failed, failed

