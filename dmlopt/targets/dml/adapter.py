"""The GPU the Wine host's DirectML really uses, read inside the host run.

Why: a Vulkan query made outside the host (dmlopt.runtime.vulkan) sees what this process's loader sees, not
what Wine's DXGI and vkd3d pick under the host's own environment: on the GPU machine (NVIDIA's
driver reached through the host's wrappers) it found no device, and the host was called "Vulkan device
unknown", its GPU times unusable.  Two places inside the run name the adapter:
  - ORT's device discovery (ORT 1.22 and later) logs each DXGI adapter at verbose level:
    ``Discovered OrtHardwareDevice {vendor_id:0x10de, ..., type:1, metadata: [Description=NVIDIA H100
    80GB HBM3, DxgiAdapterNumber=0, ...]}``; DirectML takes adapter 0 (device_id 0).
  - vkd3d, at ``VKD3D_DEBUG=trace``: ``vkd3d_select_physical_device Using device: NAME, 0xVENDOR:0xDEVICE.``
A device is software when it is Mesa's llvmpipe/lavapipe (vendor 0x10005), SwiftShader or Microsoft's
WARP: its times are CPU emulation.
"""

from __future__ import annotations

import re
from typing import Any

# type:1 is OrtHardwareDeviceType_GPU
DISCOVERED = re.compile(r"Discovered OrtHardwareDevice \{vendor_id:(0x[0-9a-fA-F]+),.*?type:1,\s*metadata: \[(.*)\]\}")
VKD3D = re.compile(r"vkd3d_select_physical_device Using device: (.*), (0x[0-9a-fA-F]+):(0x[0-9a-fA-F]+|\d+)\.\s*$")
# "Description=llvmpipe (LLVM 15.0.6, 256 bits), DxgiAdapterNumber=0, ": a value may hold ", "
META = re.compile(r"(\w+)=(.*?)(?:, (?=\w+=)|,?\s*$)")
SOFTWARE_VENDORS = {0x10005: "Mesa", 0x1414: "Microsoft"}  # Mesa's lavapipe; Microsoft's WARP / Basic Render
SOFTWARE_NAMES = re.compile(r"llvmpipe|lavapipe|swiftshader|basic render|warp", re.IGNORECASE)
NAME_CHARS = 120


def _clean(name: str) -> str:
    """The name as printable text of bounded length: it comes from a driver through a log."""
    text = "".join(c if c.isprintable() else "?" for c in name).strip()
    return text[:NAME_CHARS] or "?"


def is_software(name: str, vendor_id: int | None) -> bool:
    return vendor_id in SOFTWARE_VENDORS or bool(SOFTWARE_NAMES.search(name))


def from_log(text: str) -> dict[str, Any] | None:
    """{name, vendor_id, software, source} of the adapter DirectML uses, from a host run's log; None
    when the log names none (an ORT before 1.22 without vkd3d's trace)."""
    for line in text.splitlines():
        found = DISCOVERED.search(line)
        if not found:
            continue
        meta = dict(META.findall(found.group(2)))
        if meta.get("DxgiAdapterNumber", "0").strip() != "0":
            continue
        vendor = int(found.group(1), 16)
        name = _clean(meta.get("Description", "?"))
        return {"name": name, "vendor_id": vendor, "software": is_software(name, vendor),
                "source": "DXGI adapter 0, from ONNX Runtime's device discovery in the host run"}
    for line in text.splitlines():
        found = VKD3D.search(line)
        if found:
            vendor = int(found.group(2), 16)
            name = _clean(found.group(1))
            return {"name": name, "vendor_id": vendor, "software": is_software(name, vendor),
                    "source": "the Vulkan device vkd3d chose in the host run"}
    return None
