"""What the WebGPU EP's kernels compute on this adapter, measured before a pass writes a fused node.

Why: a fusion dmlopt validates on the CPU EP can compute differently on the target.  Measured here
(lavapipe, Mesa 25.0.7, onnxruntime-ep-webgpu 0.4.0 on onnxruntime 1.32): WebGPU's float32
MultiHeadAttention matches the CPU EP up to 31 tokens and is off by rel L2 6e-2 and more from 32
tokens on (its flash-attention path), so SAM's 64-token global blocks came out wrong while its
25-token windows were right.  A site is therefore probed on the EP at its own shapes (one node,
seeded inputs, the CPU EP as reference) and the pass declines it with the measured error when the
EP gets it wrong.  Results are cached per shape for the process.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir

from dmlopt.runtime import ort_model, sessions as runtime
from dmlopt.errors import DmlOptError

# Relative L2 error above which a probed kernel is wrong (float32: the CPU EP and a correct GPU kernel
# agree to about 1e-6; float16 inputs are compared after rounding, so a looser bound).
TOLERANCE = {"float32": 1e-3, "float16": 2e-2}
MS_DOMAIN = "com.microsoft"


def check(op_type: str, site: Mapping[str, Any]) -> str | None:
    """A decline reason when the EP computes `op_type` at `site`'s shapes wrongly, else None.
    Only MultiHeadAttention is probed (the one fusion found wrong on an adapter so far)."""
    if op_type != "MultiHeadAttention":
        return None
    key = tuple(sorted((k, v) for k, v in site.items()))
    return _mha(key)


def mha_model(batch: int, heads: int, seq_q: int, seq_kv: int, head_qk: int, head_v: int,
              bias: bool, dtype: str) -> onnx.ModelProto:
    """One com.microsoft MultiHeadAttention node with 3D Q/K/V (and a (1, N, S, T) bias)."""
    elem = onnx.TensorProto.FLOAT16 if dtype == "float16" else onnx.TensorProto.FLOAT
    inputs = [oh.make_tensor_value_info("q", elem, [batch, seq_q, heads * head_qk]),
              oh.make_tensor_value_info("k", elem, [batch, seq_kv, heads * head_qk]),
              oh.make_tensor_value_info("v", elem, [batch, seq_kv, heads * head_v])]
    names = ["q", "k", "v"]
    if bias:
        inputs.append(oh.make_tensor_value_info("bias", elem, [1, heads, seq_q, seq_kv]))
        names += ["", "", "bias"]
    node = oh.make_node("MultiHeadAttention", names, ["out"], domain=MS_DOMAIN, num_heads=heads)
    graph = oh.make_graph([node], "mha_probe", inputs,
                          [oh.make_tensor_value_info("out", elem, [batch, seq_q, heads * head_v])])
    return ort_model.make_model(graph, {"": 17, MS_DOMAIN: 1})


def probe_mha(batch: int, heads: int, seq_q: int, seq_kv: int, head_qk: int, head_v: int,
              bias: bool = False, dtype: str = "float32", seed: int = 0) -> float:
    """Relative L2 error of the EP's MultiHeadAttention against the CPU EP's on seeded inputs."""
    model = ir.from_proto(mha_model(batch, heads, seq_q, seq_kv, head_qk, head_v, bias, dtype))
    rng = np.random.default_rng(seed)
    np_type = np.float16 if dtype == "float16" else np.float32
    feeds = {"q": rng.standard_normal((batch, seq_q, heads * head_qk)),
             "k": rng.standard_normal((batch, seq_kv, heads * head_qk)),
             "v": rng.standard_normal((batch, seq_kv, heads * head_v))}
    if bias:
        feeds["bias"] = rng.standard_normal((1, heads, seq_q, seq_kv))
    feeds = {k: v.astype(np_type) for k, v in feeds.items()}
    got = _run(model, feeds, "webgpu")
    want = _run(model, {k: v.astype(np.float32) for k, v in feeds.items()} if dtype == "float16" else feeds, "cpu",
                float32=dtype == "float16")
    got, want = got.astype(np.float64), want.astype(np.float64)
    scale = float(np.linalg.norm(want)) or 1.0
    return float(np.linalg.norm(got - want)) / scale


def _run(model: ir.Model, feeds, target: str, float32: bool = False) -> np.ndarray:
    if float32:  # the CPU EP's MultiHeadAttention is float32 only: the reference runs the float32 twin
        proto = ir.to_proto(model)
        for value in (*proto.graph.input, *proto.graph.output):
            value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
        model = ir.from_proto(proto)
    sess = runtime.session(model, target, optimize=False)
    return np.asarray(sess.run(None, feeds)[0])


@functools.lru_cache(maxsize=256)
def _mha(key: tuple[tuple[str, Any], ...]) -> str | None:
    site = dict(key)
    dtype = site.get("dtype", "float32")
    try:
        error = probe_mha(site["batch"], site["heads"], site["seq_q"], site["seq_kv"], site["head_qk"],
                          site["head_v"], bool(site.get("bias")), dtype)
    except DmlOptError as e:
        return f"the WebGPU EP could not run MultiHeadAttention at these shapes: {e}"
    if not np.isfinite(error) or error > TOLERANCE.get(dtype, 1e-3):
        return (f"the WebGPU EP computes MultiHeadAttention wrongly at S={site['seq_q']} T={site['seq_kv']} "
                f"N={site['heads']} (rel L2 {error:.2g} against the CPU EP, measured on this adapter)")
    return None
