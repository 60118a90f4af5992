"""The WebGPU host: the ``onnxruntime-ep-webgpu`` plug-in registered into the installed onnxruntime.

Why this way: the plug-in is the supported distribution (the whole-ORT ``onnxruntime-webgpu`` wheel
stopped at 1.27 and installs a second module named ``onnxruntime``).  The plug-in offers itself only
for devices ORT's discovery lists, and on Linux that reads /sys/class/drm: a container or CI runner
without a DRM GPU gets no WebGPU device, although Vulkan (Mesa's lavapipe, or a GPU's driver) can
run it.  The plug-in's documented switch for that case, the environment variable
``ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1`` read when the library is registered, offers the EP on
the CPU device; Dawn then picks the Vulkan adapter itself (a GPU's before lavapipe).  dmlopt sets
it only when the user has not, and says so (``describe``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
from typing import Any

PROVIDER = "WebGpuExecutionProvider"
PLUGIN = "onnxruntime_ep_webgpu"
PLUGIN_DISTRIBUTION = "onnxruntime-ep-webgpu"
REGISTRATION = "webgpu"
SOFTWARE_SWITCH = "ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER"


_SWITCH = {"by": "unset"}


@functools.lru_cache(maxsize=1)
def _load(ort_module: Any) -> tuple[Any | None, str]:
    """(the EP device, '') or (None, why not), registering the plug-in once per process."""
    try:
        plugin = importlib.import_module(PLUGIN)
    except ImportError:
        return None, f"the WebGPU plug-in is not installed (pip install {PLUGIN_DISTRIBUTION}, or 'dmlopt[webgpu]')"
    if not hasattr(ort_module, "register_execution_provider_library"):
        return None, f"onnxruntime {ort_module.__version__} cannot load plug-in EPs (the plug-in needs 1.24.4 or newer)"
    if SOFTWARE_SWITCH in os.environ:
        _SWITCH["by"] = "user"
    else:
        os.environ[SOFTWARE_SWITCH] = "1"  # read by the plug-in when it is registered
        _SWITCH["by"] = "dmlopt"
    if not os.environ.get("DMLOPT_DEBUG"):
        # The plug-in warns (ORT's default logger, stderr) that the switch is on: dmlopt says it instead
        # where a time is reported (`offered_how`).
        ort_module.set_default_logger_severity(3)
    try:
        ort_module.register_execution_provider_library(REGISTRATION, plugin.get_library_path())
    except Exception as e:  # noqa: BLE001 - ORT raises its own types
        return None, f"the WebGPU plug-in did not register: {str(e).strip().splitlines()[0][:200]}"
    devices = [d for d in ort_module.get_ep_devices() if d.ep_name == PROVIDER]
    if not devices:
        return None, "the WebGPU plug-in offers no device on this machine"
    return devices[0], ""


def ep_device(ort_module: Any) -> tuple[Any | None, str]:
    """The OrtEpDevice to give ``SessionOptions.add_provider_for_devices``, or (None, why not)."""
    return _load(ort_module)


def plugin_version() -> str | None:
    try:
        return importlib.metadata.version(PLUGIN_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def offered_how(ort_module: Any) -> str | None:
    """How the EP got its device when ORT listed no GPU (None: ORT listed one): through the switch."""
    device, _ = _load(ort_module)
    if device is None or "GPU" in str(device.device.type):
        return None
    return (f"ORT lists no GPU device here; the plug-in offered the EP through {SOFTWARE_SWITCH}=1 "
            f"(set by {_SWITCH['by']}) and Dawn chose the adapter")
