"""Running models on ONNX Runtime: sessions by target with their providers and inputs (sessions),
the WebGPU plug-in EP registered into onnxruntime (webgpu_host), timing (bench), numerics against
the CPU EP (validate), the Vulkan devices (vulkan), the IR version of the models dmlopt builds for
ORT (ort_model) and ending every process a run started (process_tree).

May import io, graph and the ground modules (dmlopt.errors, target, limits, version); never the
targets, which run their models through it.
"""
