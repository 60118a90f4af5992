"""A WebGPU plug-in library that dies when it is loaded (issue 32.6): a fake `onnxruntime_ep_webgpu`
whose library calls abort() in its constructor, or raises SIGSEGV.  `inspect --ep webgpu` and
`validate --ep webgpu` run as programs: one line and exit 2 (or the prediction, for inspect),
never a dead command (exit 134, "the worker process died of SIGABRT")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import one_error_line
from tests.test_dml_host_boundary import identity_model

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or not sys.platform.startswith("linux"),
                                reason="needs gcc and Linux to build the broken library")

DEATHS = {"abort": "#include <stdlib.h>\n__attribute__((constructor)) static void die(void) { abort(); }\n",
          "segv": "#include <signal.h>\n__attribute__((constructor)) static void die(void) { raise(SIGSEGV); }\n"}


def broken_plugin(tmp_path, death: str):
    """A folder to put first on PYTHONPATH: onnxruntime_ep_webgpu whose library dies on load."""
    src = tmp_path / "die.c"
    src.write_text(DEATHS[death])
    lib = tmp_path / "libbroken_webgpu.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    package = tmp_path / "site" / "onnxruntime_ep_webgpu"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"def get_library_path():\n    return {str(lib)!r}\n")
    return tmp_path / "site"


@pytest.mark.parametrize("death", list(DEATHS))
def test_a_plugin_that_dies_on_load_is_one_line(tmp_path, death):
    site = broken_plugin(tmp_path, death)
    m = identity_model(tmp_path / "m.onnx")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    for args in (["validate", m, m, "--ep", "webgpu"], ["bench", m, "--ep", "webgpu", "--runs", "1"]):
        r = subprocess.run([sys.executable, "-m", "dmlopt", *map(str, args)], env=env, capture_output=True, text=True,
                           timeout=300)
        line = one_error_line(r.stderr)
        assert r.returncode == 2 and "WebGPU plug-in" in line and "SIG" in line, (args, line)
    r = subprocess.run([sys.executable, "-m", "dmlopt", "inspect", str(m), "--ep", "webgpu"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 2), r.stderr
    assert "died" not in r.stderr and "internal error" not in r.stderr, r.stderr
    if r.returncode == 2:
        assert "WebGPU plug-in" in one_error_line(r.stderr)
