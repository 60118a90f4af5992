"""The ONNX Runtime session dmlopt recommends for an optimized model, as JSON beside it.

Why: the rewritten graph is half of the speed; the other half is how the session is made
(adapter, graph capture, fixed dims, optimization level), and users otherwise copy options
from issue threads.  ``dmlopt optimize`` writes ``OUT.session.json`` (``--no-session-config``
turns it off): every entry carries its reason, and ``snippet()`` is the Python that creates the
session from the file.  Option names are ORT's: DirectML provider options from
``dml_provider_factory.cc`` (device_id, disable_metacommands), session config keys
(``ep.dml.enable_graph_capture``), CUDA provider options from ``cuda_execution_provider_info.cc``
(cudnn_conv_algo_search, enable_cuda_graph, prefer_nhwc).

Nothing is recommended on a guess where a measurement decides: disable_metacommands and
prefer_nhwc only appear when `ep_tuning` (``bench.tune_ep``'s result on this model) measured them
faster.  `cpu_stand_in` is the documented rule for trying the file where the target's provider
is absent: the provider becomes CPUExecutionProvider with no provider options, everything else
stays (ORT accepts session config keys it does not use).
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import onnx_ir as ir

from dmlopt.errors import OutputError, printable
from dmlopt.targets.graph_capture import Readiness
from dmlopt.io.jsontext import json_text
from dmlopt.io.model import check_destination, write_text
from dmlopt.target import Target
from dmlopt.targets.webgpu import session as webgpu_session

__all__ = ["FORMAT", "config_path", "cpu_stand_in", "recommend", "snippet", "write"]

FORMAT = "dmlopt-session-config/1"
PROVIDERS = {"dml": "DmlExecutionProvider", "cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider",
             "webgpu": "WebGpuExecutionProvider"}
SUFFIX = ".session.json"
# Provider options taken from a measurement (bench.TUNE_GRID varies them), never set on a guess.
MEASURED_OPTIONS = ("disable_metacommands", "performance_preference", "cudnn_conv_algo_search", "prefer_nhwc",
                    "preferredLayout")


def config_path(output: str | os.PathLike) -> str:
    """Where the configuration of model `output` goes: OUT with its suffix replaced."""
    root, ext = os.path.splitext(os.fspath(output))
    return (root if ext.lower() == ".onnx" else os.fspath(output)) + SUFFIX


def recommend(model: ir.Model, target: Target | str, *, ort_version: str | None = None,
              readiness: Readiness | None = None, ep_tuning: Mapping[str, Any] | None = None,
              dims: Mapping[str, int] | None = None, precision: str = "float32") -> dict[str, Any]:
    """The session configuration for `model` (already optimized) on `target`, as a JSON-ready dict.

    `readiness`: graph_capture_readiness of the model (graph capture is enabled only when ready);
    `ep_tuning`: ``bench.tune_ep`` on the model (measured provider options); `dims`: the sizes the
    user fixed (--dim, and --shape's named dims): only these are pinned, never a size dmlopt chose
    to validate with (a detector validated at 32x32 would refuse a 640x640 image).  A resolved `Target` gives its
    `deployed_version` (else the graph-capture check's version is named)."""
    if isinstance(target, Target):
        target, ort_version = target.ep, target.deployed_version
    if ort_version is None and readiness is not None:
        ort_version = readiness.ort_version
    cfg: dict[str, Any] = {"format": FORMAT, "model": None, "target": target, "ort_version": ort_version,
                           "provider": PROVIDERS[target], "provider_options": {}, "session_options": {},
                           "session_config_entries": {}, "free_dimension_overrides": {}, "reasons": {},
                           "not_set": {}}

    def put(group: str, key: str, value: Any, reason: str) -> None:
        cfg[group][key] = value
        cfg["reasons"][f"{group}.{key}"] = reason

    put("session_options", "graph_optimization_level", "ORT_ENABLE_ALL",
        "ORT's level-2 fusions and, on DirectML, its Conv/Gemm+activation fusion need ORT_ENABLE_EXTENDED or "
        "higher; ORT's DirectML sample uses ORT_ENABLE_ALL")
    if target == "dml":
        put("session_options", "enable_mem_pattern", False,
            "the DirectML EP needs memory patterns off (ORT turns them off itself in newer releases)")
        put("session_options", "execution_mode", "ORT_SEQUENTIAL",
            "the DirectML EP runs sequentially (one Run at a time per session)")
    measured = _measured_options(ep_tuning)
    if target == "dml" and "performance_preference" not in measured:  # device_id would override a preference
        put("provider_options", "device_id", "0",
            "DXGI adapter index; 0 is the default adapter, which on a laptop may be the integrated GPU: use the "
            "index of the GPU to run on (dmlopt bench --tune-ep times the adapters' performance preference)")
    for key, (value, why) in measured.items():
        put("provider_options", key, value, why)
    if target == "dml" and "disable_metacommands" not in measured:
        cfg["not_set"]["provider_options.disable_metacommands"] = (
            "not measured faster on this model (dmlopt optimize --tune measures it on the DirectML machine); "
            "metacommands are the vendor's fast paths and stay on")
    if target == "cuda":
        if "cudnn_conv_algo_search" not in measured:
            put("provider_options", "cudnn_conv_algo_search", "EXHAUSTIVE",
                "ORT's default: cuDNN benchmarks every Conv's algorithms on the first run (slow first run, fast "
                "after); --tune measures HEURISTIC and DEFAULT")
        if "prefer_nhwc" not in measured:
            cfg["not_set"]["provider_options.prefer_nhwc"] = "not measured faster on this model (--tune measures it)"
    if target == "webgpu":  # its options and graph capture: dmlopt.targets.webgpu.session
        webgpu_session.recommend(cfg, put, readiness, precision, measured=set(measured))
    _graph_capture(cfg, put, target, readiness)
    for name in _dynamic_dims(model):
        if name in (dims or {}):
            value = int(dims[name])
            put("free_dimension_overrides", name, value,
                f"'{name}' is still dynamic in the model and you fixed it at {value} (--dim/--shape): a fixed value "
                "lets ORT fold the shape arithmetic and the provider compile static shapes")
        else:  # a size dmlopt chose to validate with is not the user's: pinning it refuses every other size
            cfg["not_set"][f"free_dimension_overrides.{name}"] = (
                f"'{name}' is dynamic and you did not fix it, so the session takes any size; when every run uses "
                f"one size, pin it (dmlopt optimize --dim {name}=SIZE, or add_free_dimension_override_by_name) "
                "so ORT folds the shape arithmetic")
    return cfg


def _measured_options(ep_tuning: Mapping[str, Any] | None) -> dict[str, tuple[str, str]]:
    """Provider options whose measured best differs from ORT's default, with the measurement."""
    if not ep_tuning or not ep_tuning.get("best_options"):
        return {}
    models = ep_tuning.get("models") or {}
    best = ep_tuning["best"]
    ratio = (models.get(best) or {}).get("ratio_median")
    baseline = ep_tuning.get("baseline")
    spread = (models.get(best) or {}).get("ratio") or {}
    if best == baseline or ratio is None or ratio >= 1.0 or spread.get("verdict", "faster") != "faster":
        return {}  # no option recommended on a difference inside the noise
    found = {}
    defaults = (models.get(baseline) or {}).get("provider_options") or {}
    for key in ep_tuning.get("varied") or []:
        value = str(ep_tuning["best_options"][key])
        if key in MEASURED_OPTIONS and value != str(defaults.get(key)):
            found[key] = (value, f"measured on {ep_tuning.get('provider')}: {best} ran x{ratio:.3f} the time of "
                                 f"{baseline} (median of per-pair ratios over {_runs(models, best)} runs"
                                 + (f", p10-p90 {spread['p10']:.3f}-{spread['p90']:.3f}" if spread else "") + ")")
    return found


def _runs(models: Mapping[str, Any], name: str) -> Any:
    return ((models.get(name) or {}).get("latency_ms") or {}).get("runs", "?")


def _graph_capture(cfg: dict[str, Any], put, target: str, readiness: Readiness | None) -> None:
    key = {"dml": ("session_config_entries", "ep.dml.enable_graph_capture"),
           "cuda": ("provider_options", "enable_cuda_graph")}.get(target)
    if key is None:
        return
    if readiness is not None and readiness.ready:
        put(*key, "1", f"{readiness.line()}; run the session with IO binding (inputs and outputs on the device, "
                       "same addresses each run): the first run captures, later runs replay")
    else:
        why = readiness.line() if readiness is not None else "graph-capture readiness was not checked"
        cfg["not_set"][".".join(key)] = why


def _dynamic_dims(model: ir.Model) -> list[str]:
    names: list[str] = []
    for v in model.graph.inputs:
        if v.name in model.graph.initializers or v.shape is None:
            continue
        for d in v.shape.dims:
            name = getattr(d, "value", None) if not isinstance(d, int) else None
            if name and name not in names:
                names.append(name)
    return names


def cpu_stand_in(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """`cfg` for a machine without the target's provider: CPUExecutionProvider, no provider options,
    everything else unchanged.  For trying the file and its snippet, not for deployment."""
    out = json.loads(json.dumps(cfg))
    out["provider"] = PROVIDERS["cpu"]
    out["provider_options"] = {}
    out["reasons"] = {k: v for k, v in out["reasons"].items() if not k.startswith("provider_options.")}
    out["stand_in"] = f"{cfg['provider']} replaced by CPUExecutionProvider (dmlopt.targets.session_config.cpu_stand_in)"
    return out


SNIPPET = '''\
import json
import os

import onnxruntime as ort

config_path = {path!r}
with open(config_path, encoding="utf-8") as f:
    cfg = json.load(f)
so = ort.SessionOptions()
enums = {{"graph_optimization_level": ort.GraphOptimizationLevel, "execution_mode": ort.ExecutionMode}}
for key, value in cfg["session_options"].items():
    setattr(so, key, getattr(enums[key], value) if key in enums else value)
for key, value in cfg["session_config_entries"].items():
    so.add_session_config_entry(key, value)
for name, value in cfg["free_dimension_overrides"].items():
    so.add_free_dimension_override_by_name(name, value)
model_path = os.path.join(os.path.dirname(os.path.abspath(config_path)), cfg["model"])
providers = [(cfg["provider"], cfg["provider_options"])]
if cfg["provider"] != "CPUExecutionProvider":
    providers.append("CPUExecutionProvider")
session = ort.InferenceSession(model_path, sess_options=so, providers=providers)
assert session.get_providers()[0] == cfg["provider"], session.get_providers()  # never a silent CPU run
'''


GENERIC_SESSION = """providers = [(cfg["provider"], cfg["provider_options"])]
if cfg["provider"] != "CPUExecutionProvider":
    providers.append("CPUExecutionProvider")
session = ort.InferenceSession(model_path, sess_options=so, providers=providers)
"""


def snippet(path: str | os.PathLike, target: str | None = None) -> str:
    """Python that creates the session the configuration file at `path` describes (`target` webgpu:
    the plug-in EP's registration and the shader-f16 check, dmlopt.targets.webgpu.session)."""
    if target == "webgpu":
        return SNIPPET.replace(GENERIC_SESSION, webgpu_session.SNIPPET_SESSION).format(path=os.fspath(path))
    return SNIPPET.format(path=os.fspath(path))


def write(cfg: Mapping[str, Any], path: str | os.PathLike, model_path: str | os.PathLike,
          *, protected: Mapping[str, str] | None = None) -> str:
    """Write `cfg` for the model at `model_path` to `path` atomically; returns the path.

    Refuses a `protected` path (path -> what it is: the input model, its data, the output model)
    and an existing file that is not a dmlopt session configuration."""
    path = os.fspath(path)
    check_path(path, protected)
    data = dict(cfg)
    model_dir = os.path.dirname(os.path.abspath(path))
    data["model"] = os.path.relpath(os.path.abspath(model_path), model_dir).replace(os.sep, "/")
    write_text(path, json_text(data) + "\n", "the session configuration")
    return path


def check_path(path: str | os.PathLike, protected: Mapping[str, str] | None = None) -> None:
    """Fail before any work when the configuration could not be written (model.check_destination:
    a protected path, a folder, a FIFO or device) or would replace something that is not an
    earlier dmlopt session configuration."""
    path = os.fspath(path)
    check_destination(path, dict(protected or {}), label="session configuration ")
    if os.path.exists(path) and not _is_session_config(path):
        raise OutputError(f"{printable(path)}: exists and is not a dmlopt session configuration; refusing to "
                          "overwrite it (move it, or pass --no-session-config)")


def earlier_config(output: str | os.PathLike) -> str | None:
    """An earlier run's session configuration beside `output`, which a new model without one
    must not keep (it describes the previous model): its path, or None."""
    path = config_path(output)
    return path if os.path.isfile(path) and _is_session_config(path) else None


def _is_session_config(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False
