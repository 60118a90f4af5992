"""Print the Vulkan physical devices of this machine as JSON: [{name, type}], first one first.

Why: under Wine, DirectML runs on whatever Vulkan device vkd3d gets (through Wine's Vulkan, which
sits on this machine's loader), and a software device (Mesa's lavapipe, type "cpu") makes every
timing meaningless as GPU speed.  Run as a script in a child process (host.py does, with a timeout):
a broken Vulkan driver can crash the process that asks.  Plain ctypes, no dmlopt import.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import sys

TYPES = {0: "other", 1: "integrated-gpu", 2: "discrete-gpu", 3: "virtual-gpu", 4: "cpu"}
# VkPhysicalDeviceProperties: apiVersion, driverVersion, vendorID, deviceID, deviceType (uint32
# each), deviceName[256], then fields not read here; the buffer is larger than the whole struct.
PROPERTIES_BYTES = 4096
NAME_OFFSET = 20


class InstanceCreateInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                ("pApplicationInfo", ctypes.c_void_p), ("enabledLayerCount", ctypes.c_uint32),
                ("ppEnabledLayerNames", ctypes.c_void_p), ("enabledExtensionCount", ctypes.c_uint32),
                ("ppEnabledExtensionNames", ctypes.c_void_p)]


def devices() -> list[dict[str, str]]:
    name = ctypes.util.find_library("vulkan") or "libvulkan.so.1"
    vk = ctypes.CDLL(name)
    info = InstanceCreateInfo(sType=1)  # VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO
    instance = ctypes.c_void_p()
    if vk.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance)) != 0:
        raise RuntimeError("vkCreateInstance failed")
    try:
        count = ctypes.c_uint32(0)
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
        handles = (ctypes.c_void_p * count.value)()
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), handles)
        found = []
        for handle in handles[: count.value]:
            buf = ctypes.create_string_buffer(PROPERTIES_BYTES)
            vk.vkGetPhysicalDeviceProperties(ctypes.c_void_p(handle), buf)
            kind = int.from_bytes(buf.raw[16:20], "little")
            text = buf.raw[NAME_OFFSET:NAME_OFFSET + 256].split(b"\0", 1)[0].decode("utf-8", "replace")
            found.append({"name": text, "type": TYPES.get(kind, str(kind))})
        return found
    finally:
        vk.vkDestroyInstance(instance, None)


if __name__ == "__main__":
    try:
        print(json.dumps({"devices": devices()}))
    except Exception as e:  # noqa: BLE001 - the parent reports it as "unknown device"
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        sys.exit(0)
