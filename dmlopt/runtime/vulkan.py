"""The Vulkan physical devices of this machine, read through the loader: which adapter Dawn (the
WebGPU EP) takes, and which device vkd3d gives DirectML under Wine.

Why: GPU times mean nothing without the device they were measured on, and a software device
(Mesa's lavapipe, type CPU) must never yield a speed claim or a tuning choice.  One reader for
both targets; ``python -m dmlopt.runtime.vulkan`` prints the list as JSON, for a caller that keeps a
possibly crashing driver out of its own process (the DirectML host does).  ORT does not say
which adapter Dawn picked, so dmlopt lists what Vulkan offers (Dawn prefers a discrete GPU, then an
integrated one, and takes a CPU adapter only when nothing else is there) and names the one Dawn
takes by that order.  Read with ctypes from ``libvulkan.so.1`` (the loader the plug-in needs too):
vkCreateInstance, vkEnumeratePhysicalDevices, vkGetPhysicalDeviceProperties; nothing is created
beyond an instance that is destroyed again.  ``VK_ICD_FILENAMES``/``VK_DRIVER_FILES`` choose the
drivers for both, as they do for Dawn.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import functools
import sys

TYPES = {0: "other", 1: "integrated GPU", 2: "discrete GPU", 3: "virtual GPU", 4: "CPU (software)"}
# Dawn's preference among adapters (lower first).
PREFERENCE = {2: 0, 1: 1, 3: 2, 0: 3, 4: 4}


@dataclasses.dataclass(frozen=True)
class Adapter:
    name: str
    kind: str
    vendor_id: int
    driver: str

    @property
    def software(self) -> bool:
        return self.kind == TYPES[4]

    def line(self) -> str:
        return f"{self.name} ({self.kind}, Vulkan{', ' + self.driver if self.driver else ''})"


class _AppInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("pApplicationName", ctypes.c_char_p),
                ("applicationVersion", ctypes.c_uint32), ("pEngineName", ctypes.c_char_p),
                ("engineVersion", ctypes.c_uint32), ("apiVersion", ctypes.c_uint32)]


class _CreateInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                ("pApplicationInfo", ctypes.POINTER(_AppInfo)), ("enabledLayerCount", ctypes.c_uint32),
                ("ppEnabledLayerNames", ctypes.c_void_p), ("enabledExtensionCount", ctypes.c_uint32),
                ("ppEnabledExtensionNames", ctypes.c_void_p)]


class _Properties(ctypes.Structure):
    # VkPhysicalDeviceProperties up to deviceName; the rest (limits, sparse properties) is room only.
    _fields_ = [("apiVersion", ctypes.c_uint32), ("driverVersion", ctypes.c_uint32), ("vendorID", ctypes.c_uint32),
                ("deviceID", ctypes.c_uint32), ("deviceType", ctypes.c_int), ("deviceName", ctypes.c_char * 256),
                ("rest", ctypes.c_uint8 * 2048)]


def _vulkan():
    name = "vulkan-1" if sys.platform == "win32" else "libvulkan.so.1"
    try:
        return ctypes.CDLL(name)
    except OSError:
        found = ctypes.util.find_library("vulkan")
        return ctypes.CDLL(found) if found else None


@functools.lru_cache(maxsize=1)
def vulkan_adapters() -> tuple[tuple[Adapter, ...], str]:
    """(every Vulkan physical device in the loader's order, '') or ((), why none could be listed)."""
    lib = _vulkan()
    if lib is None:
        return (), "no Vulkan loader (libvulkan.so.1): install libvulkan1 and a driver (mesa-vulkan-drivers)"
    app = _AppInfo(0, None, b"dmlopt", 1, b"dmlopt", 1, (1 << 22))  # VK_API_VERSION_1_0
    info = _CreateInfo(1, None, 0, ctypes.pointer(app), 0, None, 0, None)
    instance = ctypes.c_void_p()
    rc = lib.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance))
    if rc != 0:
        return (), f"vkCreateInstance failed (VkResult {rc}): no Vulkan driver found (check VK_ICD_FILENAMES)"
    try:
        count = ctypes.c_uint32(0)
        lib.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
        handles = (ctypes.c_void_p * count.value)()
        lib.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), handles)
        found = []
        for handle in handles[: count.value]:
            props = _Properties()
            lib.vkGetPhysicalDeviceProperties(ctypes.c_void_p(handle), ctypes.byref(props))
            found.append((PREFERENCE.get(props.deviceType, 3), Adapter(
                props.deviceName.decode("utf-8", "replace"), TYPES.get(props.deviceType, "other"),
                props.vendorID, _driver_version(props.vendorID, props.driverVersion))))
    finally:
        lib.vkDestroyInstance(instance, None)
    if not found:
        return (), "Vulkan lists no physical device (no driver, or VK_ICD_FILENAMES names none that loads)"
    return tuple(a for _, a in found), ""


def _driver_version(vendor: int, version: int) -> str:
    if vendor == 0x10DE:  # NVIDIA packs its driver version its own way
        return f"driver {version >> 22}.{(version >> 14) & 0xFF}"
    return ""


def chosen() -> tuple[Adapter | None, str]:
    """The adapter Dawn takes by its preference (discrete, integrated, virtual, other, CPU), or
    (None, why there is none)."""
    adapters, why = vulkan_adapters()
    order = {kind: PREFERENCE[code] for code, kind in TYPES.items()}
    return (min(adapters, key=lambda a: order.get(a.kind, 3)), "") if adapters else (None, why)


if __name__ == "__main__":
    import json

    listed, reason = vulkan_adapters()
    print(json.dumps({"devices": [{"name": a.name, "type": a.kind, "software": a.software} for a in listed],
                      "why": reason}))
