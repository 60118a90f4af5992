"""Facts about ORT's WebGPU EP read from its source (onnxruntime/core/providers/webgpu, 2025-2026),
for the passes' WebGPU defaults and for a prediction where the EP cannot run here.

Each entry names where it comes from; what can be measured is measured instead (``kernels``,
``placement``) and the tests check these facts against the EP on lavapipe where it runs.
"""

from __future__ import annotations

# webgpu_execution_provider.cc: GridSample is registered for opsets 16-19 only (one kernel, since 16);
# a GridSample-20/22 node has no WebGPU kernel and runs on the CPU with copies around it.
REGISTERED_VERSIONS = {("", "GridSample"): frozenset({16})}

# graph_transformer_utils.cc: ConvActivationFusion lists the WebGPU EP (LeakyRelu among the fused
# activations), so Conv+LeakyRelu is one kernel there and dmlopt's LeakyRelu splits only add nodes.
FUSES_CONV_ACTIVATION = frozenset({"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "HardSigmoid"})

# SkipLayerNormFusion lists WebGPU (PR #32294 says so); SimplifiedLayerNormFusion does not (#29841, open).
ORT_FUSES_AT_LOAD = frozenset({"SkipLayerNormalization"})

# Contrib ops the WebGPU EP has no kernel for (measured on lavapipe, plug-in 0.4.0: the node lands on
# the CPU with copies around it; MatmulTransposeFusion is not run for WebGPU either).
# GroupNormalization (18, 21) has no kernel either: ORT inlines its function body, 23-27 nodes with two
# of its shape computations (Div, Concat) on the CPU; dmlopt's InstanceNormalization form is 5 nodes,
# all on WebGPU (measured on an [1, 8, 16, 16] input, 4 groups).
NO_KERNEL = frozenset({("com.microsoft", "FusedMatMul"), ("", "GroupNormalization")})


def no_kernel(ep: str) -> frozenset[tuple[str, str]]:
    """(domain, op) pairs a pass must not write for target `ep` (only WebGPU's are tabled here)."""
    return NO_KERNEL if ep == "webgpu" else frozenset()

# WebGpuSupportedFloatTypes(): float and float16 kernels (float16 needs the adapter's shader-f16).
FLOAT_TYPES = ("float32", "float16")

# webgpu_provider_factory.cc: the native EP's preferred layout is NHWC (the layout transformer moves
# Conv, ConvTranspose, pools, BatchNormalization, InstanceNormalization, DepthToSpace to NHWC).
DEFAULT_LAYOUT = "NHWC"

# Measured on the GPU (NVIDIA H100, ORT 1.30.0, plug-in 0.4.0; SAM ViT-B 1024 `--target webgpu --fp16`, relative
# L2 of the output on the WebGPU EP against the float32 export on the CPU EP, benchmarks/webgpu_vitb.py):
# every op in float16 1.7e-2 (float16 validation allows 1e-2); Gemm+MatMul kept in float32 1.0e-2; Conv kept
# 1.4e-2; LayerNorm, attention, Gelu+Add, reductions, Add/Mul or MatMul alone kept: 1.7e-2 each (no change).
# WebGPU's float16 matrix products (Gemm, MatMul, Conv) lose the accuracy, not dmlopt's conversion: for
# --target webgpu --fp16 they compute in float32 (`fp16_target_keep`).
FP16_KEEP_FLOAT32 = ("Gemm", "MatMul", "Conv")


def fp16_keep_float32(ep: str) -> tuple[str, ...]:
    """Op types that target `ep`'s float16 kernels compute too inaccurately for float16 validation."""
    return FP16_KEEP_FLOAT32 if ep == "webgpu" else ()
