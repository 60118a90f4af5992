#!/usr/bin/env bash
# CI: set up the real DirectML EP host (Wine 8 + Xvfb + lavapipe, Windows node.exe and the onnxruntime-node
# builds that ship DirectML.dll) with ../shared/dml-wine/setup.sh, in a folder kept between runs.
# On success prints one line for the caller to eval:   export DMLOPT_DML_HOST=DIR
# Never fails CI: on any failure it says why on stderr and prints no export line; the dml_host tests then
# skip and say why.  Usage (from .ci/run):   eval "$(.ci/setup-dml-host.sh)"
# Env: DMLOPT_DML_HOST_DIR (default /var/cache/dmlopt-dmlkit, else ~/.cache/dmlopt-dmlkit),
#      DMLOPT_DML_KIT (default ../shared/dml-wine), DMLOPT_DML_SETUP_TIMEOUT (default 1200 s).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 0
KIT=${DMLOPT_DML_KIT:-../shared/dml-wine}
VERSIONS=(1.17.3 1.19.2 1.24.3 1.31.1)
say() { echo "setup-dml-host: $*" >&2; }
sudo=()
[ "$(id -u)" = 0 ] || sudo=(sudo -n)

[ -f "$KIT/setup.sh" ] || { say "no kit at $KIT (setup.sh): the real-DirectML tests will skip"; exit 0; }
codename=$( (. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}") )
[ "$codename" = bookworm ] || { say "the kit needs Debian 12 (bookworm), this is '${codename:-unknown}': the real-DirectML tests will skip"; exit 0; }

# setup.sh derives a bookworm-backports line from /etc/apt/sources.list with awk under pipefail: where that
# file is missing (deb822-only images) it exits 2 without a message.  Give it the line first.
if ! grep -rqsE '^[^#]*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    | "${sudo[@]}" tee /etc/apt/sources.list.d/dmlopt-bookworm-backports.sources >/dev/null \
    || { say "cannot add the bookworm-backports apt source (needs root or sudo): the real-DirectML tests will skip"; exit 0; }
fi

DIR=${DMLOPT_DML_HOST_DIR:-/var/cache/dmlopt-dmlkit}
if ! mkdir -p "$DIR" 2>/dev/null; then
  "${sudo[@]}" mkdir -p "$DIR" 2>/dev/null && "${sudo[@]}" chown "$(id -u):$(id -g)" "$DIR" 2>/dev/null \
    || DIR=$HOME/.cache/dmlopt-dmlkit
  mkdir -p "$DIR" || { say "cannot create $DIR: the real-DirectML tests will skip"; exit 0; }
fi

t0=$(date +%s)
# setup.sh skips what DIR already holds (the cache) and always ends with a smoke test per version.
if timeout -k 10 "${DMLOPT_DML_SETUP_TIMEOUT:-1200}" bash "$KIT/setup.sh" "$DIR" "${VERSIONS[@]}" >&2; then
  say "host ready in $(( $(date +%s) - t0 )) s: $DIR (ORT ${VERSIONS[*]})"
  echo "export DMLOPT_DML_HOST=$DIR"
else
  say "setup.sh failed (exit $?; its log: $DIR/setup.log): the real-DirectML tests will skip"
fi
exit 0
