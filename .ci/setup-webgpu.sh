#!/usr/bin/env bash
# CI: what the WebGPU tests (pytest -m webgpu) need on a Debian bookworm runner without a GPU:
#   - the plug-in EP, into the active Python environment: pip install -e ".[webgpu]";
#   - a Vulkan loader and Mesa's lavapipe (software Vulkan) for Dawn.  bookworm's Mesa 22.3 lacks a
#     feature Dawn requires; bookworm-backports has Mesa >= 25.
# The tests skip with the reason where this fails.  dmlopt sets the plug-in's own switch
# ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1 itself (ORT's Linux device discovery lists DRM GPUs only).
set -euo pipefail
cd "$(dirname "$0")/.."
SOURCES=/etc/apt/sources.list.d/dmlopt-bookworm-backports.sources   # shared with the DirectML setup
if [ ! -e "$SOURCES" ]; then
  cat > "$SOURCES" <<'DEB822'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
DEB822
fi
installed=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)
if [ -z "$installed" ] || dpkg --compare-versions "$installed" lt 25; then
  apt-get update -qq
  apt-get install -y -qq -t bookworm-backports mesa-vulkan-drivers libvulkan1 >/dev/null
fi
pip install -q -e ".[webgpu]"
python - <<'PY'
from dmlopt import runtime
missing = runtime.webgpu_missing()
print("WebGPU EP:", "ready" if missing is None else f"not usable ({missing})")
PY
