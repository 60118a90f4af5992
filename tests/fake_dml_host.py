"""A stand-in for the DirectML host's outside (tests of what dmlopt does with a host's answers).

Why: what comes back from the real host (result.json, the .npy outputs, the log) is untrusted
input; these tests make the host answer badly on purpose, on any machine.  The folder has the
files `open_host` checks for; `wine` and `xvfb-run` on the PATH are scripts: xvfb-run runs its
command, wine runs `respond.py` in the host folder with `job` (the job file, Linux paths) and
`linux(path)` defined, as the runner would have.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import numpy as np

VERSION = "1.17.3"

WINE = f"""#!{sys.executable}
import json, os, pathlib, sys
def linux(p):
    return p[2:].replace('\\\\', '/') if p.startswith('Z:') else p
node, runner, job_path = sys.argv[1:4]
job = json.loads(pathlib.Path(linux(job_path)).read_text())
here = pathlib.Path(linux(node)).parent
exec(compile((here / 'respond.py').read_text(), 'respond.py', 'exec'))
"""

XVFB_RUN = """#!/bin/sh
[ "$1" = "-a" ] && shift
exec "$@"
"""

def echo(ms: str = "1.0", relu: bool = False) -> str:
    """respond.py code answering as the runner does for a model of Identity nodes (input k back as output
    k; `relu`: through Relu, for a model of Relus), with as many times as the job asks for, each `ms` (a
    Python expression; `graph` is the model's graph)."""
    return f"""
import numpy as np, onnx
graph = onnx.load(linux(job['model'])).graph
files = dict(job['inputs'])
outs = []
for i, (inp, out) in enumerate(zip(graph.input, graph.output)):
    if inp.name not in files:
        continue
    data = np.load(linux(files[inp.name]))
    data = np.maximum(data, 0) if {relu!r} else data
    np.save(os.path.join(linux(job['outputs_dir']), f'out{{i}}.npy'), data)
    outs.append({{'name': out.name, 'file': f'out{{i}}.npy', 'dtype': 'float32', 'shape': []}})
""" + _answer(ms)


def _answer(ms: str) -> str:
    """respond.py's last lines: result.json with the outputs listed in `outs` and each time `ms`."""
    return f"""ms = {ms}
pathlib.Path(linux(job['result'])).write_text(json.dumps(
    {{'ok': True, 'ort_version': '1.17.3', 'session_ms': 1.0, 'warmup_ms': [ms] * job['warmup'],
     'run_ms': [ms] * max(1, job['runs']), 'outputs': outs}}))
"""


ECHO = echo()


def make(tmp_path: pathlib.Path, respond: str = ECHO) -> tuple[pathlib.Path, str]:
    """A fake host folder answering with `respond` (Python) and the PATH that finds its tools."""
    root = tmp_path / "fakehost"
    (root / "prefix").mkdir(parents=True)
    (root / f"ort-{VERSION}" / "node_modules" / "onnxruntime-node").mkdir(parents=True)
    (root / f"ort-{VERSION}" / "node_modules" / "onnxruntime-node" / "package.json").write_text('{"version": "1.17.3"}')
    for name in ("node.exe", "d3d12.dll", "libvkd3d-1.dll", "libvkd3d-shader-1.dll"):
        (root / name).write_bytes(b"MZ")
    (root / "respond.py").write_text(respond)
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    for name, text in (("wine", WINE), ("xvfb-run", XVFB_RUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return root, f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def answer(result: object, files: dict[str, np.ndarray | bytes] | None = None) -> str:
    """respond.py code that writes `result` as result.json (a string: written as is; @0 stands
    for the name the host run gives the model's first output) and `files` into the outputs folder
    (arrays as .npy, bytes as they are)."""
    text = result if isinstance(result, str) else json.dumps(result)
    lines = ["import numpy as np, io, onnx", f"result_text = {text!r}", f"files = {_files(files or {})!r}",
             "first = onnx.load(linux(job['model'])).graph.output[0].name",
             "result_text = result_text.replace('@0', first)",  # a safe name: no JSON escaping needed
             "out = pathlib.Path(linux(job['outputs_dir']))",
             "for name, data in files.items(): (out / name).write_bytes(data)",
             "pathlib.Path(linux(job['result'])).write_text(result_text)"]
    return "\n".join(lines) + "\n"


def _files(files: dict[str, np.ndarray | bytes]) -> dict[str, bytes]:
    import io
    out = {}
    for name, data in files.items():
        if isinstance(data, np.ndarray):
            buf = io.BytesIO()
            np.save(buf, data, allow_pickle=False)
            data = buf.getvalue()
        out[name] = data
    return out


def cpu_ort(ms: str = "1.0") -> str:
    """respond.py code answering as the runner does for any model: ONNX Runtime's CPU EP computes the
    outputs (right numerics), with as many times as the job asks for, each `ms` (a Python expression;
    `graph` is the model's graph)."""
    return """
import numpy as np, onnx, onnxruntime
graph = onnx.load(linux(job['model'])).graph
feeds = {name: np.load(linux(path)) for name, path in dict(job['inputs']).items()}
feeds.update({name: np.full(dims, 'probe', dtype=object) for name, dims in job.get('strings', [])})
try:
    session = onnxruntime.InferenceSession(linux(job['model']), providers=['CPUExecutionProvider'])
    values = session.run(None, feeds)
except Exception as e:
    pathlib.Path(linux(job['result'])).write_text(json.dumps({'ok': False, 'error': str(e)[:300]}))
    raise SystemExit(1)
outs = []
for i, (out, data) in enumerate(zip(graph.output, values)):
    if data.dtype == object:  # the placement probe's string output: the runner keeps only tensors of numbers
        continue
    np.save(os.path.join(linux(job['outputs_dir']), f'out{i}.npy'), data)
    outs.append({'name': out.name, 'file': f'out{i}.npy', 'dtype': str(data.dtype), 'shape': list(data.shape)})
""" + _answer(ms)
