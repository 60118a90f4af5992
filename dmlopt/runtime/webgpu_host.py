"""The WebGPU host: the ``onnxruntime-ep-webgpu`` plug-in registered into the installed onnxruntime.

Why this way: the plug-in is the supported distribution (the whole-ORT ``onnxruntime-webgpu`` wheel
stopped at 1.27 and installs a second module named ``onnxruntime``).  The plug-in offers itself only
for devices ORT's discovery lists, and on Linux that reads /sys/class/drm: a container or CI runner
without a DRM GPU gets no WebGPU device, although Vulkan (Mesa's lavapipe, or a GPU's driver) can
run it.  The plug-in's documented switch for that case, the environment variable
``ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1`` read when the library is registered, offers the EP on
the CPU device; Dawn then picks the Vulkan adapter itself (a GPU's before lavapipe).  dmlopt sets
it only when the user has not, and says so (``describe``).

A plug-in library that crashes when it is loaded or makes its first session (abort() in a
constructor, a broken driver under Dawn) would take the whole command with it (exit 134, "the
worker process died of SIGABRT").  So before this process registers it, a child process does the
same (``python -m dmlopt.runtime.webgpu_host``: registration, devices, one session on a one-node
model), once per process; a child that dies makes the EP unavailable here with one line naming
the library and the signal.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
from typing import Any

PROVIDER = "WebGpuExecutionProvider"
PLUGIN = "onnxruntime_ep_webgpu"
PLUGIN_DISTRIBUTION = "onnxruntime-ep-webgpu"
REGISTRATION = "webgpu"
SOFTWARE_SWITCH = "ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER"


_SWITCH = {"by": "unset"}
PROBE_TIMEOUT_S = 120  # Dawn's start on lavapipe takes seconds; a hang is a broken plug-in too


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
    crashed = _probe_in_child(plugin.get_library_path())
    if crashed:
        return None, crashed
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


def _probe_in_child(library: str) -> str | None:
    """Why the plug-in cannot be loaded in this process (it killed or hung the child that loaded
    it), or None.  The child's other failures are left to the registration here, which reports them."""
    env = {**os.environ, "ORT_DISABLE_TELEMETRY": os.environ.get("ORT_DISABLE_TELEMETRY", "1")}
    try:
        done = subprocess.run([sys.executable, "-m", __name__], capture_output=True, timeout=PROBE_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, env=env)
    except subprocess.TimeoutExpired:
        return (f"the WebGPU plug-in ({library}) did not register and start a session within {PROBE_TIMEOUT_S} s "
                "in a test process: not loaded here")
    except OSError as e:
        return f"cannot test the WebGPU plug-in in a child process: {e.strerror or e}"
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        return (f"the WebGPU plug-in ({library}) crashed the process that loaded it ({name}): not loaded here; "
                f"reinstall it (pip install --force-reinstall {PLUGIN_DISTRIBUTION}) or use another --ep")
    if done.returncode > 1:  # 1: the child's own report of an ordinary failure, met again here
        return (f"the WebGPU plug-in ({library}) ended the process that loaded it (exit status {done.returncode}): "
                "not loaded here")
    return None


def _child() -> int:
    """Register the plug-in, list its devices and run a one-node session: what the parent is about
    to do.  Exit 0, or 1 with a JSON line saying why (a crash is the parent's finding)."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    ort.set_default_logger_severity(4)
    try:
        plugin = importlib.import_module(PLUGIN)
        if SOFTWARE_SWITCH not in os.environ:
            os.environ[SOFTWARE_SWITCH] = "1"
        ort.register_execution_provider_library(REGISTRATION, plugin.get_library_path())
        devices = [d for d in ort.get_ep_devices() if d.ep_name == PROVIDER]
        if devices:
            graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe",
                                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
            so = ort.SessionOptions()
            so.add_provider_for_devices(devices[:1], {})
            session = ort.InferenceSession(model.SerializeToString(), so)
            session.run(None, {"x": np.ones(2, np.float32)})
    except Exception as e:  # noqa: BLE001 - reported, and met again by the parent
        print(json.dumps({"ok": False, "error": str(e)[:200]}))
        return 1
    print(json.dumps({"ok": True}))
    return 0


if __name__ == "__main__":
    sys.exit(_child())
