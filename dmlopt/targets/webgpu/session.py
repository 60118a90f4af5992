"""The WebGPU session dmlopt recommends: provider options with their reasons.

Option names and values are the EP's (``webgpu_provider_options.h``, read by the plug-in as
``ep.webgpuexecutionprovider.<name>``; the keys are listed in the plug-in library).  What is
recommended on a reason from ORT's source rather than a measurement says so; nothing is chosen by
a time measured on a software adapter.
"""

from __future__ import annotations

from typing import Any, Callable

from dmlopt.graph_capture import Readiness
from dmlopt.targets.webgpu import registry

Put = Callable[[str, str, Any, str], None]


def recommend(cfg: dict[str, Any], put: Put, readiness: Readiness | None, precision: str) -> None:
    """Fill the WebGPU part of a session configuration `cfg` (session_config.recommend)."""
    not_set = cfg["not_set"]
    put("provider_options", "preferredLayout", registry.DEFAULT_LAYOUT,
        "the native EP's default (webgpu_provider_factory.cc): ORT's layout transformer moves Conv, pools, "
        "norms and DepthToSpace to NHWC; named so a build whose default differs (the JS API says NCHW) runs "
        "the layout dmlopt validated")
    put("provider_options", "validationMode", "disabled",
        "production: Dawn's API validation costs CPU time per dispatch; use 'basic' or 'full' when debugging")
    put("provider_options", "powerPreference", "high-performance",
        "Dawn takes the discrete GPU on a machine with two (a laptop's integrated GPU otherwise)")
    put("provider_options", "storageBufferCacheMode", "bucket",
        "ORT's default for storage buffers: buffers are reused by size bucket across runs")
    if readiness is not None and readiness.ready:
        put("provider_options", "enableGraphCapture", "1",
            f"{readiness.line()}; run with IO binding on the device (the first run captures, later runs replay)")
    else:
        not_set["provider_options.enableGraphCapture"] = (readiness.line() if readiness is not None
                                                          else "graph-capture readiness was not checked")
    if precision == "float16":
        cfg["requires_shader_f16"] = True
        cfg["reasons"]["requires_shader_f16"] = (
            "the model is float16: the WebGPU EP needs the adapter's shader-f16 feature and fails at run time "
            "without it (no fallback); the snippet checks with a first run and loads 'fp32_model' instead when "
            "there is one (dmlopt optimize --fp16 --fp32-sibling)")
