"""Every rewrite family dmlopt emits for --target dml, validated on the real DirectML EP at each ORT
version of the host (Wine, DMLOPT_DML_HOST; skipped without it).

Why: the CPU EP validates the graph dmlopt wrote, but on the target DirectML runs its own kernels
for the contrib ops dmlopt emits (MultiHeadAttention, SkipLayerNormalization, FusedMatMul,
SimplifiedLayerNormalization) and for the forms it rewrites to.  `optimize(..., dml_host=...)`
validates its output there (the report's real_ep) with the CPU validation's tolerances; each case
also names the op its rewrite emits, which the newest version must show (the rewrite happened) and
which must not have fallen back to the CPU EP (so DirectML's kernel is what was checked)."""

from __future__ import annotations

import pathlib

import onnx
import pytest

import dmlopt
from dmlopt.graph.check import op_counts
from dmlopt.passes.attention_test import hf_attention
from dmlopt.passes.conv_transpose_test import conv_transpose_model
from dmlopt.passes.linear_gemm_test import mlp_model
from dmlopt.passes.norm_fusion_test import mean_variance_model, rms_model, skip_model
from dmlopt.passes.op_versions_test import grid_sample_model, group_norm_model
from dmlopt.passes.pad_concat_test import pad_model
from dmlopt.passes.prelu_test import prelu_model
from tests.test_calibrate import einsum_model

VERSIONS = ("1.17.3", "1.19.2", "1.24.3", "1.31.1")
DATA = pathlib.Path(dmlopt.__file__).parent / "data"
CNN = DATA / "cnn_leaky.onnx"
SAM = DATA / "sam_small.onnx"  # Conv -> LeakyRelu -> Conv chains: every LeakyRelu strategy applies
# Cases whose model needs a newer ORT than some versions: (case, versions) -> why.
NEEDS = {("group-norm", "1.17.3"): "GroupNormalization-21 needs opset 21, which ORT 1.17 does not load"}
# Emitted ops the real EP runs on the CPU at a version (measured), so the check there is the CPU kernel's.
OLDEST_IR = 9  # ORT 1.17 reads IR versions up to 9


def parsed(text: str) -> onnx.ModelProto:
    return onnx.parser.parse_model(f'<ir_version: {OLDEST_IR}, opset_import: ["" : 17]>\n' + text)


def with_ir(model):
    """The model as an exporter of ORT 1.17's time writes it: IR version 9 at most."""
    model = dmlopt.load(model)
    model.ir_version = min(model.ir_version or OLDEST_IR, OLDEST_IR)
    return model


def nary_and_gelu() -> onnx.ModelProto:
    return onnx.parser.parse_model(f'<ir_version: {OLDEST_IR}, opset_import: ["" : 20]>\n' + """
    g (float[2, 3] a, float[2, 3] b, float[2, 3] c) => (float[2, 3] y) {
        s = Sum(a, b, c)
        m = Max(a, b, c)
        t = Add(s, m)
        y = Gelu <approximate = "tanh"> (t)
    }""")


def fused_matmul() -> onnx.ModelProto:
    return parsed("""g (float[6, 5, 8] q, float[6, 7, 8] k) => (float[6, 5, 7] y) {
        kt = Transpose <perm = [0, 2, 1]> (k)
        y = MatMul(q, kt)
    }""")


# name -> (model builder, passes (None: the default pipeline), pass options, op the rewrite emits)
CASES = {
    "attention-mha": (lambda: hf_attention(batch=1), None, {}, "com.microsoft.MultiHeadAttention"),
    "skip-layer-norm": (skip_model, ["norm-fusion"], {"norm_fusion": "fuse"},
                        "com.microsoft.SkipLayerNormalization"),
    "simplified-layer-norm": (rms_model, ["norm-fusion"], {"norm_fusion": "fuse"}, "SimplifiedLayerNormalization"),
    "instance-norm": (mean_variance_model, ["norm-fusion"], {"norm_fusion": "fuse"}, "InstanceNormalization"),
    "fused-matmul": (fused_matmul, ["transpose"], {}, "com.microsoft.FusedMatMul"),
    "einsum-lower": (einsum_model, ["einsum"], {"einsum": "lower"}, "MatMul"),
    "leaky-decompose": (lambda: CNN, ["leaky-relu"], {"leaky_relu": "decompose"}, "Max"),
    "leaky-relu-split": (lambda: CNN, ["leaky-relu"], {"leaky_relu": "relu-split"}, "Relu"),
    "leaky-conv-split": (lambda: CNN, ["leaky-relu"], {"leaky_relu": "conv-split"}, "Relu"),
    "leaky-channel-fold": (lambda: CNN, ["leaky-relu"], {"leaky_relu": "channel-fold"},
                           "Relu"),
    "conv-transpose-subpixel": (conv_transpose_model, ["conv-transpose"], {"conv_transpose": "subpixel"},
                                "DepthToSpace"),
    "prelu": (lambda: prelu_model(0.2), ["prelu"], {}, "LeakyRelu"),
    "linear-gemm": (lambda: mlp_model("half"), ["linear-gemm"], {}, "Gemm"),
    "group-norm": (lambda: group_norm_model(opset=21), ["op-versions"], {}, "InstanceNormalization"),
    "copies-nary-gelu": (nary_and_gelu, ["copies"], {}, "Add"),
    "fp16-cnn": (lambda: CNN, None, {"fp16": True}, "Cast"),
    "sam-small": (lambda: SAM, None, {}, "com.microsoft.MultiHeadAttention"),
    "sam-small-fp16": (lambda: SAM, None, {"fp16": True}, "com.microsoft.MultiHeadAttention"),
    "sam-relpos-fold": (lambda: SAM, None, {"relpos_bias": "fold"}, "com.microsoft.MultiHeadAttention"),
    "einsum-largest-matmul": (einsum_model, ["einsum"], {"einsum": "lower", "einsum_layout": "largest-matmul"},
                              "MatMul"),
    "grid-sample-16": (grid_sample_model, ["op-versions"], {}, "GridSample"),
    "pad-concat": (pad_model, ["pad-concat"], {"pad_concat": "concat"}, "Concat"),
}


@pytest.mark.dml_host
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", list(CASES))
def test_rewrite_validates_on_the_real_directml_ep(dml_host, case, version):
    if version not in dml_host.versions:
        pytest.skip(f"ORT {version} is not installed in the DirectML host {dml_host.root}")
    if (case, version) in NEEDS:
        pytest.skip(NEEDS[case, version])
    build, passes, options, emitted = CASES[case]
    model = with_ir(build())
    result = dmlopt.optimize(model, target="dml", ort_version=version, passes=passes, retime=False,
                             dml_host=dml_host.root, **options)
    real = result.report.real_ep
    assert real is not None and real.get("host", {}).get("ort_version") == version, real
    assert result.passed and real["passed"], result.report.to_table()
    op = emitted.rpartition(".")[2]
    # GridSample-16 at 1.17.3 runs on DirectML too (a standalone kernel), as the measured 1.17 table says
    if op_counts(result.model).get(emitted, 0):  # DirectML's own kernel ran the emitted op, not the CPU EP's
        assert op not in real["placement"]["cpu_ops"], real["placement"]
    if version == dml_host.versions[-1]:
        assert op_counts(result.model).get(emitted, 0) > 0, (case, op_counts(result.model))
