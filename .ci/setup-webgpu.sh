#!/usr/bin/env bash
# CI: what the WebGPU tests (pytest -m webgpu) need on a Debian runner without a GPU; run it inside the
# activated virtual environment (after .ci/run's `. .venv/bin/activate`):
#   - the plug-in EP: pip install -e ".[webgpu]" (onnxruntime-ep-webgpu);
#   - a Vulkan loader and Mesa's lavapipe (software Vulkan) for Dawn.  bookworm's Mesa 22.3 lacks a
#     feature Dawn requires: on bookworm, Mesa >= 25 comes from bookworm-backports.
# The tests skip with the reason where this fails.  dmlopt sets the plug-in's own switch
# ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1 itself (ORT's Linux device discovery lists DRM GPUs only).
set -euo pipefail
cd "$(dirname "$0")/.."
codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
suite=()
if [ "$codename" = bookworm ]; then
  SOURCES=/etc/apt/sources.list.d/dmlopt-bookworm-backports.sources   # the same file the DirectML setup writes
  if [ ! -e "$SOURCES" ]; then
    cat > "$SOURCES" <<'DEB822'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
DEB822
  fi
  suite=(-t bookworm-backports)
fi
installed=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)
if [ -z "$installed" ] || dpkg --compare-versions "$installed" lt 25; then
  apt-get update -qq
  apt-get install -y -qq "${suite[@]}" mesa-vulkan-drivers libvulkan1 >/dev/null
fi
pip install -q -e ".[webgpu]"
python - <<'PY'
from dmlopt.runtime import sessions as runtime
missing = runtime.webgpu_missing()
print("WebGPU EP:", "ready" if missing is None else f"not usable ({missing})")
PY
