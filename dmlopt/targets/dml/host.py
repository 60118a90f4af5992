"""The real DirectML EP away from Windows: a host folder made by the dml-wine kit's setup.sh.

Why: dmlopt's promise ("validated and re-timed on DirectML") needs the real DmlExecutionProvider.
On Windows it is onnxruntime-directml in this process; elsewhere it is the Windows build of ONNX
Runtime (onnxruntime-node, which ships DirectML.dll) run by Windows node.exe under Wine, on vkd3d
and whatever Vulkan device the machine has (lavapipe when there is no GPU).  The folder is found
through ``--dml-host DIR`` or ``DMLOPT_DML_HOST=DIR``; it holds one ``ort-<version>/`` per ORT
version.

Each call runs one model in one child process (every DirectML session under lavapipe holds GBs of
shared memory until its process ends), under ``timeout``; tensors go through .npy files and the
result through a JSON file (Windows node.exe under Wine cannot write to a pipe), ORT's verbose log
to a file that ``ort_log`` reads.  A host that is absent or broken is a ProviderError (exit 2)
naming what is missing, never a hang or a traceback.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import pathlib
import re
import secrets
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
from typing import Any, Callable, Mapping

import numpy as np
import onnx
import onnx_ir as ir

from dmlopt.io import scratch
from dmlopt.runtime import process_tree
from dmlopt.errors import InputError, ProviderError, UsageError, printable
from dmlopt.runtime import ort_model
from dmlopt.targets.dml import adapter, host_answer, host_names, ort_log

__all__ = ["ENV_VAR", "HOW_TO", "Host", "HostRun", "configured", "find", "open_host", "placement_summary"]

ENV_VAR = "DMLOPT_DML_HOST"
TIMEOUT_VAR = "DMLOPT_DML_TIMEOUT"
RUN_MARK = "DMLOPT_DML_HOST_RUN"  # in the environment of every process of one host run (process_tree)
DEFAULT_TIMEOUT_S = 600
# Where a host comes from, in words that hold for a pip install too (the kit is not in the wheel).
SETUP = ("the dml-wine kit's setup.sh (dmlopt's README, 'The real DirectML EP on Linux', says where it is and "
         "how to run it)")
HOW_TO = ("to run the real DirectML EP here, make a DirectML host (a folder with Wine, ONNX Runtime's Windows "
          f"builds and Vulkan) with {SETUP}, and pass --dml-host DIR (or set {ENV_VAR}=DIR)")
MAX_TIMEOUT_S = 7 * 24 * 3600  # `timeout` and Popen.wait both take it; a larger one is a typo
RESULT_BYTES = 2**20  # the runner's result.json: times and a list of outputs
PROFILE_PREFIX = "ort_profile"  # ORT's profile of a host run: <prefix>_<date>.json in the run's folder
PROFILE_BYTES = 2**26
SOFTWARE_NOTE = "software rendering: not GPU speed"
RUNNER = pathlib.Path(__file__).with_name("runner.js")
TOOLS = ("wine", "xvfb-run", "timeout")
FILES = ("node.exe", "d3d12.dll", "libvkd3d-1.dll", "libvkd3d-shader-1.dll")
VERSION_DIR = re.compile(r"^ort-(\d+\.\d+\.\d+)$")
# A disconnected node only the CPU EP runs: with it ORT lists every node by name ("All nodes placed
# on [EP]" lists none), compiled DirectML partitions (DmlFusedNode_*) included.  Not counted.
PROBE_NODE = "dmlopt_probe"
PROBE_OPSET = 10  # StringNormalizer


def configured(flag: str | os.PathLike | None = None) -> str | None:
    """The host folder asked for: the flag, else the environment variable, else None."""
    value = os.fspath(flag) if flag else os.environ.get(ENV_VAR, "")
    return value or None


def find(flag: str | os.PathLike | None = None) -> "Host | None":
    """The host when one is configured (checked: a broken one is an error), else None."""
    folder = configured(flag)
    if folder is None:
        return None
    timeout_s()  # the environment's time limit is checked with the folder, before any work
    return open_host(folder)


def open_host(folder: str | os.PathLike) -> "Host":
    root = pathlib.Path(folder).expanduser()
    where = f"the DirectML host {printable(os.fspath(folder), 300)!r}"
    if not root.is_dir():
        raise ProviderError(f"{where} is not a folder; {HOW_TO}")
    check_paths(root.resolve())
    missing = [t for t in TOOLS if shutil.which(t) is None]
    missing += [f for f in FILES if not (root / f).is_file()]
    if not (root / "prefix").is_dir():
        missing.append("prefix/ (the Wine prefix)")
    versions = versions_in(root)
    if not versions:
        missing.append("ort-<version>/ (no ONNX Runtime installed)")
    if missing:
        raise ProviderError(f"{where} is incomplete: missing {', '.join(missing)} (make it again "
                            f"with {SETUP})")
    return Host(root.resolve(), tuple(versions))


# Paths that reach Wine: a double quote breaks Wine's command line (node.exe exits 53 or 1, no
# result), whitespace in the temp folder breaks xvfb-run (seen as DirectML's DXGI error 887A0004),
# and the DLLs under a long host folder pass Windows' 260-character path limit (node.exe dies,
# 0xc06d007e).  Such paths are refused before any work, naming the path.
HOST_PATH_CHARS = 160  # the longest file Windows loads under it (ort-V/.../x64/*.dll) is ~80 more
TEMP_PATH_CHARS = 200  # the job's files sit ~40 deeper; 240 was seen to work
BREAKS_WINE = re.compile(r'["\x00-\x1f\x7f]')
BREAKS_XVFB_RUN = re.compile(r"\s")


def check_paths(root: pathlib.Path) -> None:
    """UsageError (exit 2) naming the path when the host folder or the temp folder cannot reach Wine."""
    shown = printable(os.fspath(root), 300)
    if BREAKS_WINE.search(os.fspath(root)):
        raise UsageError(f"the DirectML host folder {shown!r} holds a double quote or a control character, which "
                         "Wine's command line cannot carry: move or link it to a path without one")
    if len(os.fspath(root)) > HOST_PATH_CHARS:
        raise UsageError(f"the DirectML host folder {shown!r} is {len(os.fspath(root))} characters long: the DLLs "
                         f"under it would pass Windows' 260-character path limit (at most {HOST_PATH_CHARS}); move "
                         "or link it to a shorter path")
    temp = tempfile.gettempdir()
    shown = printable(temp, 300)
    if BREAKS_WINE.search(temp) or BREAKS_XVFB_RUN.search(temp):
        raise UsageError(f"the temp folder {shown!r} (TMPDIR) holds whitespace, a double quote or a control "
                         "character, which xvfb-run and Wine's command line cannot carry to the DirectML host: set "
                         "TMPDIR to a folder without them")
    if len(temp) > TEMP_PATH_CHARS:
        raise UsageError(f"the temp folder {shown!r} (TMPDIR) is {len(temp)} characters long: the DirectML host's "
                         f"files in it would pass Windows' path limit (at most {TEMP_PATH_CHARS}); set TMPDIR to a "
                         "shorter folder")


def versions_in(root: pathlib.Path) -> list[str]:
    found = []
    for entry in root.iterdir() if root.is_dir() else ():
        m = VERSION_DIR.match(entry.name)
        if m and (entry / "node_modules" / "onnxruntime-node" / "package.json").is_file():
            found.append(m.group(1))
    return sorted(found, key=lambda v: tuple(int(p) for p in v.split(".")))


def windows_path(path: str | os.PathLike) -> str:
    """Wine's Z: drive maps the Linux root."""
    return "Z:" + os.fspath(path).replace("/", "\\")


@dataclasses.dataclass(frozen=True)
class Host:
    root: pathlib.Path
    versions: tuple[str, ...]

    def choose(self, asked: str | None) -> str:
        """The installed version asked for (exact, or the newest patch of MAJOR.MINOR); None or
        'auto': the newest installed.  Anything else: exit 2 naming the installed ones."""
        if asked in (None, "", "auto"):
            return self.versions[-1]
        if asked in self.versions:
            return asked
        same = [v for v in self.versions if v.startswith(asked + ".")] if asked.count(".") == 1 else []
        if same:
            return same[-1]
        raise UsageError(f"ONNX Runtime {asked} is not installed in the DirectML host {self.root}; installed: "
                         f"{', '.join(self.versions)} (add it with {SETUP}, "
                         f"giving it {self.root} and {asked})")

    def package(self, version: str) -> pathlib.Path:
        return self.root / f"ort-{version}" / "node_modules" / "onnxruntime-node"

    def describe(self, version: str) -> dict[str, Any]:
        """What a report names: ORT version, DirectML.dll version, the device DirectML uses (asked inside
        the host: dmlopt.targets.dml.adapter), software or not."""
        found = device(self, version)
        software = found["software"]
        return {**describe(self.root, self.package(version), version),
                "vulkan_device": found["name"], "device_source": found["source"],
                "software": software, "note": SOFTWARE_NOTE if software else None}

    def run(self, model: ir.Model, feeds: Mapping[str, np.ndarray], version: str, *, level: str = "all",
            fusion: bool = True, list_nodes: bool = True, warmup: int = 0, runs: int = 1,
            timeout: float | None = None, profile: bool = False) -> "HostRun":
        """Run `model` once per warm-up and timed run on the real DirectML EP of ORT `version`."""
        return run(self, model, feeds, version, level=level, fusion=fusion, list_nodes=list_nodes,
                   warmup=warmup, runs=runs, timeout=timeout, profile=profile)


@functools.lru_cache(maxsize=None)
def describe(root: pathlib.Path, package: pathlib.Path, version: str) -> dict[str, Any]:
    dll = next(iter(sorted(package.glob("bin/*/win32/x64/DirectML.dll"))), None)
    return {"host": "wine", "folder": str(root), "ort_version": version,
            "directml_dll": dll_version(dll) if dll else "missing"}


# (host folder, ORT version) -> the adapter its DirectML uses, from a run's own log (adapter.from_log)
_DEVICES: dict[tuple[pathlib.Path, str], dict[str, Any]] = {}


def device(host: "Host", version: str) -> dict[str, Any]:
    """The adapter the host's DirectML uses: from the log of a run already made, else from one probe
    run (a single Relu, vkd3d tracing its device choice); where the run names none, the first
    Vulkan device this process sees, said so."""
    key = (host.root, version)
    if key not in _DEVICES:
        try:
            model = ir.from_proto(ort_model.make_model(_relu_graph(), {"": 13}))
            log = run(host, model, {"x": np.zeros((1, 4), np.float32)}, version, list_nodes=False,
                      trace_device=True, describe_host=False).log
        except (InputError, ProviderError) as e:  # the failure shows again where the real work runs
            log = str(e)
        found = adapter.from_log(log)
        if found is None:
            devices = vulkan_devices()
            first = devices[0] if devices else None
            found = {"name": first["name"] if first else "unknown (no Vulkan device found)", "vendor_id": None,
                     "software": bool(first) and first["software"],
                     "source": "the first Vulkan device this process sees (the host run named none)"}
        _DEVICES[key] = found
    return _DEVICES[key]


def _relu_graph() -> onnx.GraphProto:
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])
    return onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "dmlopt_adapter_probe", [x], [y])


def dll_version(path: pathlib.Path) -> str:
    """The file version of a Windows DLL (VS_FIXEDFILEINFO), else its size and hash."""
    data = path.read_bytes()
    at = data.find(b"\xbd\x04\xef\xfe")
    if at >= 0 and at + 16 <= len(data):
        ms, ls = struct.unpack_from("<II", data, at + 8)
        return f"{ms >> 16}.{ms & 0xFFFF}.{ls >> 16}.{ls & 0xFFFF}"
    return f"unversioned ({len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:12]})"


@functools.lru_cache(maxsize=1)
def vulkan_devices() -> tuple[dict[str, str], ...]:
    try:
        # in a child process: a broken Vulkan driver can crash the process that asks (dmlopt.runtime.vulkan)
        done = subprocess.run([sys.executable, "-m", "dmlopt.runtime.vulkan"], capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
        found = json.loads(done.stdout or "{}").get("devices", [])
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return ()
    return tuple({"name": str(d.get("name", "?")), "type": str(d.get("type", "?")), "software": d.get("software") is True}
                 for d in found)


@dataclasses.dataclass
class HostRun:
    outputs: dict[str, np.ndarray]
    session_ms: float
    warmup_ms: list[float]
    run_ms: list[float]
    log: str  # as ORT wrote it: names are the host run's (`rename` gives the model's own)
    placement: dict[str, Any]
    host: dict[str, Any]
    rename: Callable[[str], str] = str
    profile: list[dict[str, Any]] | None = None  # ORT's profile events (run(profile=True), ORT 1.24+)

    @property
    def nodes(self) -> list[dict[str, str]]:
        """Every node ORT listed, with its provider: {op, name, provider} (the probe left out)."""
        return [{**n, "name": self.rename(n["name"]), "provider": provider}
                for provider, entry in ort_log.parse_placements(self.log).items()
                for n in entry["nodes"] if n["name"] != PROBE_NODE]


def timeout_s(timeout: float | str | None = None) -> float:
    """The time limit of one host run: `timeout`, else DMLOPT_DML_TIMEOUT, else 600 s, checked like
    an option (exit 2 naming where it came from): `timeout 0` means no limit and NaN or a negative
    reaches `timeout` itself, which then fails as if the EP had."""
    where = "timeout" if timeout is not None else TIMEOUT_VAR
    text = str(timeout) if timeout is not None else os.environ.get(TIMEOUT_VAR, "").strip()
    if not text:
        return float(DEFAULT_TIMEOUT_S)
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value <= MAX_TIMEOUT_S):  # NaN fails too
        raise UsageError(f"{where}={printable(text, 40)!r}: the DirectML host's time limit must be a number of "
                         f"seconds above 0 and at most {MAX_TIMEOUT_S} (default {DEFAULT_TIMEOUT_S})")
    return value


def with_probe(model: ir.Model) -> ir.Model | None:
    """A shallow copy of `model` with the disconnected CPU-only probe node (None: opset too old)."""
    if model.opset_imports.get("", 0) < PROBE_OPSET:
        return None
    copy = model.clone()
    graph = copy.graph
    taken = {v.name for v in graph.inputs} | {v.name for v in graph.outputs} | {n.name for n in graph}
    if {f"{PROBE_NODE}_in", f"{PROBE_NODE}_out", PROBE_NODE} & taken:
        return None
    source = ir.Value(name=f"{PROBE_NODE}_in", type=ir.TensorType(ir.DataType.STRING), shape=ir.Shape([1]))
    node = ir.Node("", "StringNormalizer", [source], name=PROBE_NODE)
    node.outputs[0].name = f"{PROBE_NODE}_out"
    node.outputs[0].type, node.outputs[0].shape = ir.TensorType(ir.DataType.STRING), ir.Shape([1])
    graph.inputs.append(source)
    graph.append(node)
    graph.outputs.append(node.outputs[0])
    return copy


def run(host: Host, model: ir.Model, feeds: Mapping[str, np.ndarray], version: str, *, level: str = "all",
        fusion: bool = True, list_nodes: bool = True, warmup: int = 0, runs: int = 1,
        timeout: float | None = None, trace_device: bool = False, describe_host: bool = True,
        profile: bool = False) -> HostRun:
    """`trace_device`: vkd3d traces its device choice into the log (dmlopt.targets.dml.adapter);
    `describe_host=False`: the run's `host` is left empty (the device probe's own run)."""
    limit = timeout_s(timeout)
    names = host_names.SafeNames(model)  # no name of the model reaches JavaScript or ORT's log
    model = names.model
    probed = with_probe(model) if list_nodes else None
    with scratch.folder("dmlopt-dmlhost-") as tmp:
        (tmp / "out").mkdir()
        path = tmp / "model.onnx"
        ir.save(probed or model, path, external_data="model.onnx.data" if _needs_external(model) else None)
        inputs = []
        for i, (name, value) in enumerate(feeds.items()):
            if name not in names.inputs:
                continue
            file = tmp / f"in{i}.npy"
            np.save(file, np.ascontiguousarray(value), allow_pickle=False)
            inputs.append([names.inputs[name], windows_path(file)])
        job = {"ort": windows_path(host.package(version)), "model": windows_path(path), "inputs": inputs,
               "strings": [[f"{PROBE_NODE}_in", [1]]] if probed is not None else [],
               "outputs_dir": windows_path(tmp / "out"), "result": windows_path(tmp / "result.json"),
               "session": {"optLevel": level, "disableFusion": not fusion, "verbose": True,
                           **({"profile": windows_path(tmp / PROFILE_PREFIX)} if profile else {})},
               "warmup": int(warmup), "runs": int(runs)}
        (tmp / "job.json").write_text(json.dumps(job), encoding="utf-8")
        log_path = tmp / "log.txt"
        rc = _launch(host, version, tmp / "job.json", log_path, limit, trace_device)
        log = log_path.read_text(encoding="utf-8", errors="replace") if log_path.exists() else ""
        if (host.root, version) not in _DEVICES and (named := adapter.from_log(log)) is not None:
            _DEVICES[(host.root, version)] = named
        if rc in (124, 137) or rc < 0:
            raise ProviderError(f"the DirectML host (ORT {version}) did not finish within {limit:g} s "
                                f"(set {TIMEOUT_VAR}=SECONDS for a larger model; under lavapipe a big model "
                                "takes minutes)")
        where = f"the DirectML host (ORT {version}, {host.root})"
        wanted = _expected_outputs(model)
        try:
            data = _read_result(tmp / "result.json")
            answer = None if data is None else host_answer.read_result(data, warmup=int(warmup), runs=int(runs),
                                                                        outputs=list(wanted))
            if answer is not None and answer["ok"]:
                outputs = host_answer.read_outputs(tmp / "out", answer, wanted)
                events = _read_profile(tmp, names.original) if profile else None
        except host_answer.HostAnswerError as e:
            raise host_answer.HostAnswerError(f"{where} answered badly: {e}") from None
        if answer is None or not answer["ok"]:
            reason = (answer or {}).get("error") or _failure_line(log) or f"exit status {rc}, no result"
            reason = printable(names.original(reason), 500)  # the model's own names again, escaped
            if "for float16 tensors" in reason:  # onnxruntime-node 1.17's binding: no float16 in or out
                reason = (f"onnxruntime-node {version} cannot pass float16 tensors in or out of a session; keep "
                          "float32 inputs and outputs (optimize --fp16 keeps them by default) or use ORT 1.19 or "
                          f"newer ({reason})")
            raise InputError(f"the real DirectML EP (ORT {version}, {host.root}) failed: {reason}")
    return HostRun(outputs={names.outputs[k]: v for k, v in outputs.items()}, session_ms=answer["session_ms"],
                   warmup_ms=answer["warmup_ms"], run_ms=answer["run_ms"], log=log,
                   placement=placement_summary(log, names.original),
                   host=host.describe(version) if describe_host else {},
                   rename=names.original, profile=events)


def _expected_outputs(model: ir.Model) -> dict[str, tuple[np.dtype | None, list]]:
    """The outputs the runner writes back (all but string ones): name -> (numpy dtype, dims)."""
    found = {}
    for v in model.graph.outputs:
        dtype = v.dtype
        if dtype == ir.DataType.STRING:
            continue
        try:
            np_dtype = np.dtype(dtype.numpy()) if dtype is not None else None
        except (TypeError, ValueError, AttributeError):
            np_dtype = None
        dims = list(v.shape.dims) if v.shape is not None else None
        found[v.name] = (np_dtype, dims)
    return found


def _needs_external(model: ir.Model) -> bool:
    total = sum(v.const_value.nbytes for g in model.graphs() for v in g.initializers.values()
                if v.const_value is not None)
    return total > 2**30


def environment(host: Host, version: str, temp: pathlib.Path | None = None, token: str | None = None,
                trace_device: bool = False) -> dict[str, str]:
    """The host's environment: Wine's settings, `temp` as its TMPDIR (xvfb-run's folder and Wine's
    server directory land there, not in the system temp folder, and each run gets a wineserver of
    its own), and `token` marking every process of the run (process_tree)."""
    env = dict(os.environ)
    env.update({"WINEPREFIX": str(host.root / "prefix"), "WINEDLLOVERRIDES": "mscoree,mshtml=;winedbg.exe=d;d3d12=n",
                "WINEDEBUG": env.get("WINEDEBUG", "err+all,fixme-all"), "VKD3D_DEBUG": env.get("VKD3D_DEBUG", "err"),
                "VKD3D_SHADER_DEBUG": env.get("VKD3D_SHADER_DEBUG", "err"),
                # ORT 1.31's telemetry (WinHTTP + SQLite) deadlocks the first session under Wine.
                "ORT_DISABLE_TELEMETRY": "1"})
    if trace_device:
        env["VKD3D_DEBUG"] = "trace"
    if temp is not None:
        env["TMPDIR"] = str(temp)
    if token is not None:
        env[RUN_MARK] = token
    env.pop("DISPLAY", None)  # xvfb-run gives Wine its own X display
    return env


def _launch(host: Host, version: str, job: pathlib.Path, log_path: pathlib.Path, limit: float,
            trace_device: bool = False) -> int:
    """Run the host on `job` in its own process group, its temp folder beside the job; however
    this ends (done, time limit, interrupt), every process of the run is ended before it returns:
    Wine's server and services leave the group, so they are found by the run's mark."""
    temp = job.parent / "tmp"
    temp.mkdir()
    token = secrets.token_hex(8)
    runner = shutil.copy(RUNNER, job.parent / RUNNER.name)  # beside the job: dmlopt's own path may not suit Wine
    command = ["timeout", "-k", "10", f"{limit:g}", "xvfb-run", "-a", "wine", str(host.root / "node.exe"),
               windows_path(runner), windows_path(job)]
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=environment(host, version, temp, token, trace_device), start_new_session=True)
        except OSError as e:
            raise ProviderError(f"cannot start the DirectML host: {e}") from e
        try:
            return proc.wait(timeout=limit + 30)
        except BaseException:  # a hang past timeout's own kill, or an interrupt: end the whole group
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except OSError:
                pass
            raise
        finally:
            with scratch.uninterrupted():  # an interrupt waits until nothing of the run is left
                process_tree.end_marked(RUN_MARK, token)
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                proc.wait()


def _read_result(path: pathlib.Path, limit: int = RESULT_BYTES) -> Any:
    """A JSON file of the host run (result.json, ORT's profile) parsed (None when there is none); a file
    that is not JSON, too large, deeply nested or not a regular file is a HostAnswerError (the callers
    check what it holds)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise host_answer.HostAnswerError(f"{path.name} cannot be read ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            raise host_answer.HostAnswerError(f"{path.name} is not a regular file of at most {limit} bytes")
        data = f.read(limit + 1)
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise host_answer.HostAnswerError(f"{path.name} is not JSON ({printable(str(e), 200)})") from None


def _read_profile(folder: pathlib.Path, original: Callable[[str], str]) -> list[dict[str, Any]] | None:
    """ORT's profile of the run (onnxruntime-node 1.24+ writes one; None where it wrote none), checked
    by host_answer.read_profile and named with the model's own names again."""
    found = sorted(folder.glob(f"{PROFILE_PREFIX}*.json"))
    if not found:
        return None
    events = host_answer.read_profile(_read_result(found[0], PROFILE_BYTES), original, found[0].name)
    return [e for e in events if not e["name"].startswith(PROBE_NODE)]  # dmlopt's placement probe left out


FAILURE = re.compile(r"\[E:onnxruntime[^\]]*\]\s*(.*)|(page fault.*)|(Unhandled exception.*)|"
                     r"(Failed to create DXGI factory.*)|(cannot open display.*)|(command not found.*)")


def _failure_line(log: str) -> str | None:
    for line in log.splitlines():
        m = FAILURE.search(line)
        if m:
            return next(g for g in m.groups() if g).strip()[:300]
    return None


def placement_summary(log: str, rename: Callable[[str], str] = str) -> dict[str, Any]:
    """CPU nodes, copies and compiled partitions from one DirectML session's verbose log; DirectML
    nodes outside any compiled partition (a graph with dynamic shapes compiles none) are
    `dml_standalone`.

    The probe node is left out.  `listed` is False when ORT listed no node by name ("All nodes
    placed on [EP]"): then the partition count is unknown (None).  `rename`: the model's own name
    for a name of the host run (host_names)."""
    placements = ort_log.parse_placements(log)
    dml = placements.get("DmlExecutionProvider", {"count": 0, "all": False, "nodes": []})
    cpu = placements.get("CPUExecutionProvider", {"count": 0, "all": False, "nodes": []})
    cpu_nodes = [n for n in cpu["nodes"] if n["name"] != PROBE_NODE and n["op"] not in ort_log.COPY_OPS]
    probe = any(n["name"] == PROBE_NODE for n in cpu["nodes"])
    listed_copies = sum(1 for e in placements.values() for n in e["nodes"] if n["op"] in ort_log.COPY_OPS)
    copies = max(listed_copies, len(ort_log.parse_copies(log)))
    fused = sorted({n["name"] for n in dml["nodes"] if n["op"].startswith(ort_log.FUSED_PREFIXES)})
    listed = bool(dml["nodes"]) or dml["count"] == 0
    ops: dict[str, int] = {}
    for n in cpu_nodes:
        ops[rename(n["op"])] = ops.get(rename(n["op"]), 0) + 1
    dml_copies = sum(1 for n in dml["nodes"] if n["op"] in ort_log.COPY_OPS)
    standalone = dml["count"] - len(fused) - dml_copies if listed else None
    return {"found": bool(placements), "dml_nodes": dml["count"], "dml_standalone": standalone, "cpu_nodes": len(cpu_nodes) if cpu["nodes"] else cpu["count"] - int(probe),
            "cpu_ops": dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
            "cpu_node_names": [rename(n["name"]) for n in cpu_nodes], "copies": copies,
            "partitions": len(fused) if listed else None, "fused_partitions": fused, "listed": listed}
