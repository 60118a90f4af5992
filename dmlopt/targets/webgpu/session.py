"""The WebGPU session dmlopt recommends: provider options with their reasons.

Option names and values are the EP's (``webgpu_provider_options.h``, read by the plug-in as
``ep.webgpuexecutionprovider.<name>``; the keys are listed in the plug-in library).  What is
recommended on a reason from ORT's source rather than a measurement says so; nothing is chosen by
a time measured on a software adapter.
"""

from __future__ import annotations

from typing import Any, Callable

from dmlopt.targets.graph_capture import Readiness
from dmlopt.targets.webgpu import registry

Put = Callable[[str, str, Any, str], None]


def recommend(cfg: dict[str, Any], put: Put, readiness: Readiness | None, precision: str,
              measured: set[str] = frozenset()) -> None:
    """Fill the WebGPU part of a session configuration `cfg` (session_config.recommend); options in
    `measured` were set from a measurement on a GPU (optimize --tune) and are left as they are."""
    not_set = cfg["not_set"]
    if "preferredLayout" not in measured:
        # Measured on lavapipe (ORT 1.32, plug-in 0.4.0; placement only): NHWC adds 2 Transposes to the
        # 7-Conv CNN (at the graph's input and output) and none to SAM small, whose patch-embed Conv
        # output meets the graph's own NHWC permute; NCHW runs FusedConv instead.  Which is faster is a
        # GPU's question: optimize --tune / bench --tune-ep time both there.
        put("provider_options", "preferredLayout", registry.DEFAULT_LAYOUT,
            "the native EP's default (webgpu_provider_factory.cc): ORT's layout transformer moves Conv, pools, "
            "norms and DepthToSpace to NHWC, with Transposes only where the layouts meet; named so a build "
            "whose default differs (the JS API says NCHW) runs the layout dmlopt validated; optimize --tune on "
            "a GPU times NCHW against it")
    put("provider_options", "validationMode", "disabled",
        "production: Dawn's API validation costs CPU time per dispatch; use 'basic' or 'full' when debugging")
    put("provider_options", "powerPreference", "high-performance",
        "the device: Dawn takes the discrete GPU on a machine with two (ORT's default, named so a build or host "
        "that defaults otherwise does not run on a laptop's integrated GPU)")
    put("provider_options", "storageBufferCacheMode", "bucket",
        "ORT's default (webgpu_provider_factory.cc): storage buffers reused by size bucket across runs, what "
        "dmlopt validated; with enableGraphCapture ORT keeps its own graph-mode buffers for the captured run")
    put("provider_options", "uniformBufferCacheMode", "simple",
        "ORT's default for uniform buffers (small per-dispatch parameters), named with the storage mode")
    if readiness is not None and readiness.ready:
        put("provider_options", "enableGraphCapture", "1",
            f"{readiness.line()} ({readiness.basis}); run with IO binding on the device (the first run captures, "
            "later runs replay)")
    else:
        not_set["provider_options.enableGraphCapture"] = (readiness.line() if readiness is not None
                                                          else "graph-capture readiness was not checked")
    if precision == "float16":
        cfg["requires_shader_f16"] = True
        cfg["reasons"]["requires_shader_f16"] = (
            "the model is float16: the WebGPU EP needs the adapter's shader-f16 feature and fails at run time "
            "without it (no fallback); the snippet checks with a first run and loads 'fp32_model' instead when "
            "there is one (dmlopt optimize --fp16 --fp32-sibling)")


# The session part of session_config's snippet for WebGPU (a str.format template: braces doubled).
# The plug-in is registered once per process; with "requires_shader_f16" one run outside graph capture
# checks the adapter, and "fp32_model" (when dmlopt wrote one) is loaded where it fails.
SNIPPET_SESSION = """import numpy as np
import onnxruntime_ep_webgpu  # pip install onnxruntime-ep-webgpu

if not any(d.ep_name == cfg["provider"] for d in ort.get_ep_devices()):
    ort.register_execution_provider_library("webgpu", onnxruntime_ep_webgpu.get_library_path())
device = next(d for d in ort.get_ep_devices() if d.ep_name == cfg["provider"])
so.add_provider_for_devices([device], cfg["provider_options"])
session = ort.InferenceSession(model_path, sess_options=so)
if cfg.get("requires_shader_f16"):  # without the adapter's shader-f16 the first run fails (no fallback)
    dims = cfg["free_dimension_overrides"]
    probe = {{i.name: np.zeros([d if isinstance(d, int) else dims.get(d, 1) for d in i.shape],
                              np.float16 if i.type == "tensor(float16)" else np.float32)
             for i in session.get_inputs()}}
    no_capture = ort.RunOptions()
    no_capture.add_run_config_entry("gpu_graph_id", "-1")  # this run outside graph capture
    try:
        session.run(None, probe, no_capture)
    except Exception:
        if not cfg.get("fp32_model"):
            raise
        model_path = os.path.join(os.path.dirname(model_path), cfg["fp32_model"])
        session = ort.InferenceSession(model_path, sess_options=so)
"""
