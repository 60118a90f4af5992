"""ONNX Runtime sessions for dmlopt: providers by target, sessions from in-memory models, inputs.

Why one module: validation (CPU EP), timing (DirectML/CUDA/CPU) and tuning all need the
same three things: which provider a target means and whether it is here; a session
from an ``onnx_ir.Model`` (bytes when small, a temporary file with external data when
over protobuf's 2 GB); and concrete inputs for an input whose dims may be symbolic.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
from typing import Any, Iterator, Mapping

import numpy as np
import onnx
import onnx_ir as ir

from dmlopt import limits
from dmlopt.graph import input_sizes
from dmlopt.io import scratch
from dmlopt.errors import TEXT_WIDTH, InputError, ProviderError, printable
from dmlopt.graph.shape_inference import (check_function_expansion, proto_with, split_initializers, weightless_proto,
                                          without_external_data)
from dmlopt.runtime import vulkan as webgpu_adapter, webgpu_host

PROVIDERS = {
    "dml": "DmlExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "cpu": "CPUExecutionProvider",
    "webgpu": "WebGpuExecutionProvider",
}
# "auto" means the best GPU provider present, else the CPU (WebGPU only when named: it may be software).
AUTO_ORDER = ("dml", "cuda", "cpu")


# ORT's telemetry uploader (Linux/macOS builds since 1.29) starts when onnxruntime is imported and
# keeps a session file (.ses) in TMPDIR: dmlopt leaves nothing behind, so it is off unless the user
# set the switch. It must be set before the import: disable_telemetry_events() comes too late.
TELEMETRY_SWITCH = "ORT_DISABLE_TELEMETRY"
TELEMETRY_OFF = "1"


def ort():
    os.environ.setdefault(TELEMETRY_SWITCH, TELEMETRY_OFF)
    import onnxruntime  # lazily: commands that never run a model start without loading it

    return onnxruntime


def child_environment() -> dict[str, str]:
    """The environment for a child process that imports onnxruntime: telemetry off as in `ort`."""
    return {TELEMETRY_SWITCH: TELEMETRY_OFF, **os.environ}


def available_providers() -> list[str]:
    return list(ort().get_available_providers())


def has_target(target: str) -> bool:
    if target == "webgpu":  # a plug-in: present once registered with a device (dmlopt.runtime.webgpu_host)
        return webgpu_missing() is None
    return PROVIDERS[target] in available_providers()


def webgpu_missing() -> str | None:
    """Why the WebGPU EP cannot run here (None: it can): no plug-in or device, or (Linux, where Dawn
    runs on Vulkan) no Vulkan adapter, which Dawn reports only when a session starts."""
    device, why = webgpu_host.ep_device(ort())
    if device is None:
        return why
    if sys.platform != "win32":
        chosen, why = webgpu_adapter.chosen()
        if chosen is None:
            return f"no adapter for Dawn: {why}"
    return None


def timing_refusal(target: str) -> str | None:
    """Why times on `target` here must not choose anything (None: they may): WebGPU on a software
    adapter (lavapipe) runs, so placement and numerics are real, but its times are not a GPU's."""
    if target != "webgpu":
        return None
    chosen, why = webgpu_adapter.chosen()
    if chosen is not None and chosen.software:
        return f"the WebGPU adapter is software ({chosen.name}): its times are no basis for a speed claim or a choice"
    return None


def resolve_ep(ep: str) -> str:
    """'auto' -> the best target present; a named target must be present (never a silent fallback)."""
    if ep == "auto":
        for target in AUTO_ORDER:
            if has_target(target):
                return target
        return "cpu"
    if ep not in PROVIDERS:
        raise ProviderError(f"unknown execution provider '{ep}' (choose from auto, {', '.join(PROVIDERS)})")
    if not has_target(ep):
        raise ProviderError(
            f"{PROVIDERS[ep]} is not available here; providers present: {', '.join(available_providers())}"
            + (" (DirectML needs onnxruntime-directml on Windows)" if ep == "dml" else "")
            + (" (CUDA needs onnxruntime-gpu: pip install 'dmlopt[gpu]')" if ep == "cuda" else "")
            + (f" ({webgpu_missing()})" if ep == "webgpu" else ""))
    return ep


def provider_entry(target: str, options: Mapping[str, Any] | None = None):
    name = PROVIDERS[target]
    opts = dict(options or {})
    if target == "dml" and not {"performance_preference", "device_filter"} & set(opts):
        # device_id wins over a performance preference in the DirectML factory: set it only alone.
        opts.setdefault("device_id", 0)
    return (name, {k: str(v) for k, v in opts.items()}) if opts else name


@contextlib.contextmanager
def model_source(model: ir.Model) -> Iterator[str | bytes]:
    """Bytes for ORT when the model fits in one protobuf, else a temp file with external data."""
    proto = ir.to_proto(model)
    if proto.ByteSize() < 2**31 - 1 and not has_external_data(model):
        yield proto.SerializeToString()
        return
    with scratch.folder("dmlopt-ort-") as tmp:
        path = tmp / "model.onnx"
        ir.save(model, path, external_data="model.onnx.data")
        yield str(path)


# Types whose tensor's numpy() array holds exactly the bytes ORT reads (no packed 4-bit types, no
# ml_dtypes stand-ins): only these weights are handed to ORT by reference.
SHAREABLE_TYPES = frozenset({
    ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE, ir.DataType.BOOL,
    ir.DataType.INT8, ir.DataType.INT16, ir.DataType.INT32, ir.DataType.INT64,
    ir.DataType.UINT8, ir.DataType.UINT16, ir.DataType.UINT32, ir.DataType.UINT64,
})
PLACEHOLDER_FILE = "shared-by-reference.bin"


class WeightValues:
    """One OrtValue per weight tensor, for every session made with this cache.

    Why: a loaded model's tensor makes a new array on each ``numpy()`` (it reads the protobuf's
    bytes), so without this each session would hold its own host copy; the candidates of one
    timing round share most tensors (``ir.Model.clone`` shares them), so they share one copy.
    Each entry keeps its tensor alive, so an id is never reused while the cache lives."""

    def __init__(self) -> None:
        self._values: dict[int, tuple[ir.TensorProtocol, Any]] = {}

    def get(self, tensor: ir.TensorProtocol):
        entry = self._values.get(id(tensor))
        if entry is None or entry[0] is not tensor:
            value = ort().OrtValue.ortvalue_from_numpy(np.ascontiguousarray(tensor.numpy()))
            entry = self._values[id(tensor)] = (tensor, value)
        return entry[1]


@contextlib.contextmanager
def shared_weights_source(model: ir.Model, cache: WeightValues | None = None
                          ) -> Iterator[tuple[str, list[tuple[str, Any]]]]:
    """A model file for ORT that holds no large weight, and the weights as OrtValues to share.

    Why: serializing for ORT copied every weight twice (proto, then bytes) and ORT made its own
    copy; a weight given with ``SessionOptions.add_initializer`` is used in place instead.  Such
    an initializer must still be declared in the model: it is written as external data in an
    empty placeholder file, so a read of it (which sharing never does) would fail, not see zeros.
    `cache`: the OrtValues come from it (shared with other sessions) instead of fresh arrays.
    """
    cache = WeightValues() if cache is None else cache
    shared = shareable_weights(model)
    chosen = set(shared)
    with scratch.folder("dmlopt-ort-") as tmp:
        proto = proto_with(model, initializers=[v for v in model.graph.initializers.values() if v not in chosen])
        weights = []
        for value in shared:
            tensor = value.const_value
            ort_value = cache.get(tensor)
            proto.graph.initializer.append(_placeholder(value.name, tensor, tensor.nbytes))
            weights.append((value.name, ort_value))
        (tmp / PLACEHOLDER_FILE).touch()
        path = tmp / "model.onnx"
        with open(path, "wb") as f:
            f.write(proto.SerializeToString())
        yield str(path), weights


def shareable_weights(model: ir.Model) -> list[ir.Value] | None:
    """The main-graph weights ORT can take by reference: the large ones and any in external data
    (the temporary model file cannot point at the user's data file).  None when a tensor left in
    the model would still be external (a subgraph's, a graph input's default, an odd type)."""
    small, large = split_initializers(model)
    candidates = [*large, *(v for v in small if isinstance(v.const_value, ir.ExternalTensor))]
    shared = [v for v in candidates if v.const_value is not None and v.const_value.dtype in SHAREABLE_TYPES
              and v.const_value.nbytes > 0]
    chosen = set(shared)
    for graph in model.graphs():
        for value in graph.initializers.values():
            if value not in chosen and isinstance(value.const_value, ir.ExternalTensor):
                return None
    return shared


def _placeholder(name: str, tensor: ir.TensorProtocol, nbytes: int) -> onnx.TensorProto:
    t = onnx.TensorProto(name=name, data_type=tensor.dtype.value, dims=list(tensor.shape.numpy()),
                         data_location=onnx.TensorProto.EXTERNAL)
    for key, value in (("location", PLACEHOLDER_FILE), ("offset", "0"), ("length", str(nbytes))):
        t.external_data.add(key=key, value=value)
    return t


def has_external_data(model: ir.Model) -> bool:
    """Whether a weight of the model lives in another file."""
    for graph in model.graphs():
        for v in graph.initializers.values():
            if isinstance(v.const_value, ir.ExternalTensor):
                return True
    return False


def session(model: ir.Model, target: str = "cpu", *, provider_options=None, optimize: bool = True,
            session_config: Mapping[str, str] | None = None, free_dims: Mapping[str, int] | None = None,
            profile_dir: str | None = None, log_severity: int | None = None, level: str | None = None,
            share_weights: bool = False, weight_cache: WeightValues | None = None):
    """An InferenceSession of `model` on `target`.  `optimize=False` turns ORT's rewrites off,
    which validation uses so that the graph itself is compared, not ORT's version of it;
    `level` names a GraphOptimizationLevel instead (calibration keeps node names with ORT_ENABLE_BASIC).

    `share_weights`: ORT starts from the model's own weight arrays (`shared_weights_source`;
    from `weight_cache` when given) instead of a serialized copy, where it can:
      - CPU EP without ORT's rewrites (validation): ``add_initializer``, which ORT uses in place;
        prepacking is then off, as it would copy them again (speed is not measured there).
      - with ORT's rewrites (timing, any EP): ``add_external_initializers``, which ORT puts into
        the graph before its rewrites (``add_initializer`` is bound only after them, so a rewrite
        reading a weight would read the empty placeholder).  ORT keeps prepacking a weight given
        this way, so the CPU EP runs the same kernels on the same packed weights as from a file
        (its shared-initializer path, ``add_initializer``, would too, but it binds too late).
        ORT (1.32) still makes its own copy of each weight: what is saved is the serialized model
        and, with `weight_cache`, a host copy per session.  On GPU EPs the weights are copied to the device either way.
    A session that cannot start this way (an ORT build or EP without the API) starts from the
    serialized model."""
    check_function_expansion(model)  # ORT inlines every call when it loads the model
    rt = ort()
    rewrites = level is not None or optimize

    def options():
        so = rt.SessionOptions()
        so.graph_optimization_level = (getattr(rt.GraphOptimizationLevel, level) if level else
                                       rt.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                       else rt.GraphOptimizationLevel.ORT_DISABLE_ALL)
        if target == "dml":
            so.enable_mem_pattern = False
            so.execution_mode = rt.ExecutionMode.ORT_SEQUENTIAL
        for k, v in (session_config or {}).items():
            so.add_session_config_entry(k, str(v))
        for name, value in (free_dims or {}).items():
            so.add_free_dimension_override_by_name(name, int(value))
        if profile_dir:
            so.enable_profiling = True
            so.profile_file_prefix = os.path.join(profile_dir, "dmlopt")
        severity = log_severity
        if severity is None and not os.environ.get("DMLOPT_DEBUG"):
            severity = 4  # fatal only: ORT's errors reach the user once, as the exception dmlopt prints
        if severity is not None:
            so.log_severity_level = severity
        return so

    if target == "webgpu":  # a plug-in EP: chosen by device, not by name
        providers = None
        device, _ = webgpu_host.ep_device(rt)
        missing = webgpu_missing()
        if missing is not None:
            raise ProviderError(f"{PROVIDERS[target]} is not available here: {missing}")
        base = options

        def options():
            so = base()
            so.add_provider_for_devices([device], {k: str(v) for k, v in (provider_options or {}).items()})
            return so
    else:
        providers = [provider_entry(target, provider_options)]
        if target != "cpu":
            providers.append("CPUExecutionProvider")
    if share_weights and not rewrites and target != "cpu":
        raise ValueError("share_weights without ORT's rewrites is for CPU sessions")
    if share_weights and shareable_weights(model) is not None:
        so = options()
        if rewrites and hasattr(so, "add_external_initializers"):
            try:
                return _shared_session(rt, model, so, providers, weight_cache, external=True)
            except (InputError, RuntimeError):  # ORT's own errors are RuntimeErrors
                pass  # e.g. an EP that cannot read weights given in memory: the serialized model below
        elif not rewrites:
            so.add_session_config_entry("session.disable_prepacking", "1")
            return _shared_session(rt, model, so, providers, weight_cache, external=False)
    try:
        with model_source(model) as src:
            return _create(rt, src, options(), providers)
    except InputError as e:
        raise InputError(users_file(str(e), model)) from e


# A copy dmlopt writes for ORT (model_source, shared_weights_source): ORT's messages name it.
TEMP_COPY = re.compile(r"\S*dmlopt-ort-[^/\\\s]*[/\\]model\.onnx(\.data)?")
SOURCE_KEY = "dmlopt.source"  # model.meta: the file a model was loaded from (dmlopt.io.model.load)


def users_file(text: str, model: ir.Model) -> str:
    """`text` with the path of dmlopt's temporary copy replaced by the user's file (or, for a model
    made in memory, said to be dmlopt's copy of it)."""
    source = model.meta.get(SOURCE_KEY)
    what = f"{source} (through dmlopt's temporary copy)" if source else "dmlopt's temporary copy of the model"
    return TEMP_COPY.sub(lambda m: what + (" data" if m.group(1) else ""), text)


def _shared_session(rt, model, so, providers, cache, *, external: bool):
    with shared_weights_source(model, cache) as (src, weights):
        if external:
            so.add_external_initializers([name for name, _ in weights], [value for _, value in weights])
        else:
            for name, value in weights:
                so.add_initializer(name, value)
        try:
            sess = _create(rt, src, so, providers)
        except InputError as e:
            raise InputError(users_file(str(e), model)) from e
    sess.dmlopt_shared_weights = weights  # ORT reads these buffers while the session lives
    return sess


# Dawn prints these to stderr when it makes a device on lavapipe (whose limits it clamps): nothing the
# user can act on, so they are dropped; every other line written meanwhile is passed on.
DAWN_NOISE = re.compile(r"^Warning: max\w+ artificially reduced from \d+ to \d+")


@contextlib.contextmanager
def _without_dawn_noise() -> Iterator[None]:
    """Hold what is written to file descriptor 2 (Dawn writes there, not to sys.stderr) and pass on
    all of it but DAWN_NOISE lines; with DMLOPT_DEBUG set, nothing is held."""
    if os.environ.get("DMLOPT_DEBUG"):
        yield
        return
    sys.stderr.flush()
    try:
        with scratch.capture_stderr() as box:
            yield
    finally:
        kept = [line for line in box["text"].splitlines(keepends=True) if not DAWN_NOISE.match(line)]
        if kept:
            os.write(2, "".join(kept).encode("utf-8"))


def _create(rt, src, so, providers):
    try:
        if providers is None:  # chosen in `so` (add_provider_for_devices): the WebGPU plug-in
            with _without_dawn_noise():
                return rt.InferenceSession(src, sess_options=so)
        return rt.InferenceSession(src, sess_options=so, providers=providers)
    except Exception as e:  # noqa: BLE001 - ORT raises its own exception types
        raise InputError(f"ONNX Runtime cannot load the model: {_first_line(e)}") from e


NUMPY_TYPES = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16,
    "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32, "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_,
}


def input_specs(model: ir.Model, shapes: Mapping[str, list[int]] | None = None,
                dims: Mapping[str, int] | None = None, *,
                fixed: Mapping[tuple[str, int], int] | None = None,
                basis: list[str] | None = None) -> dict[str, tuple[list[int], Any]]:
    """Concrete (shape, numpy dtype) per graph input: user shapes and dims, then the sizes the
    model implies (dmlopt.graph.input_sizes; FreeDims, an InputError, when nothing sizes a dim).
    `fixed`: sizes by (input, axis) from another model; `basis` gets where each size came from."""
    for value in input_sizes.runtime_inputs(model):
        if value.type is not None and not isinstance(value.type, ir.TensorType):
            raise InputError(f"input '{value.name}' is a {value.type}, not a tensor: dmlopt can only feed tensors")
    sizes = input_sizes.choose(model, shapes, dims, fixed=fixed)
    if basis is not None:
        basis.extend(sizes.basis)
    specs = {value.name: (sizes.shapes[value.name], value.dtype.numpy() if value.dtype is not None else np.float32)
             for value in input_sizes.runtime_inputs(model)}
    for name, (shape, dtype) in specs.items():
        _check_materialisable(name, shape, dtype)
    return specs


def _check_materialisable(name: str, shape, dtype) -> None:
    """An input of `shape` must be one numpy can hold and within the inputs' limit, even an empty
    one: numpy refuses [0, 2**62] float32 (its other dims times the item size pass 2**63), which
    was "array is too big" (exit 3) after the model was rewritten."""
    dims = [int(d) for d in shape]
    shown = f"input '{printable(name, TEXT_WIDTH)}' of shape [{', '.join(map(str, dims))}]"
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:
        return  # not a numpy type: random_inputs names it
    if math.prod(dims) * itemsize > MAX_RANDOM_INPUT_BYTES:
        raise InputError(f"{shown} would take {math.prod(dims) * itemsize / 2**30:.3g} GiB of random data (limit "
                         f"{MAX_RANDOM_INPUT_BYTES / 2**30:.3g} GiB for the inputs); give a smaller --shape or --dim, "
                         "or --inputs FILE.npz")
    if any(d < 0 for d in dims) or math.prod(d for d in dims if d) * max(itemsize, 1) >= 2**63:
        raise InputError(f"{shown} cannot be made, although empty: numpy holds at most 2**63 bytes over its "
                         "non-zero dims; give a smaller --shape or --dim")


# A declared dim can be anything up to 2**63; refuse before numpy tries to allocate it.  Counted
# in the bytes really generated, over all inputs together.
MAX_RANDOM_INPUT_BYTES = limits.INPUT_BYTES
# Float16 inputs are drawn in float32 this many elements at a time.
RANDOM_CHUNK = 1 << 20


def random_inputs(specs: Mapping[str, tuple[list[int], Any]], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs: normal floats, small non-negative ints (safe as indices), random bools.

    Each is generated in its own dtype (no float64 or int64 copy of the whole input), and all
    of them together may take at most MAX_RANDOM_INPUT_BYTES."""
    rng = np.random.default_rng(seed)
    total = 0
    checked = []
    for name, (shape, dtype) in specs.items():
        dtype = np.dtype(dtype)
        if dtype.kind not in "fiub":
            kind = "string" if dtype.kind in "OUS" else str(dtype)
            raise InputError(f"input '{name}' is a {kind} tensor, which dmlopt cannot generate; "
                             "pass --inputs FILE.npz")
        nbytes = math.prod(int(d) for d in shape) * dtype.itemsize
        total += nbytes
        if total > MAX_RANDOM_INPUT_BYTES:
            what = f"input '{name}' of shape [{', '.join(map(str, shape))}]"
            raise InputError(f"{what} would bring the inputs to {total / 2**30:.3g} GiB of random data (limit "
                             f"{MAX_RANDOM_INPUT_BYTES / 2**30:.3g} GiB for all together); give a smaller --shape "
                             "or --inputs FILE.npz")
        checked.append((name, [int(d) for d in shape], dtype))
    return {name: _random_array(rng, shape, dtype) for name, shape, dtype in checked}


def _random_array(rng: np.random.Generator, shape: list[int], dtype: np.dtype) -> np.ndarray:
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape, dtype=np.bool_)
    if dtype.kind in "iu":
        return rng.integers(0, 2, size=shape, dtype=dtype)
    if dtype in (np.float32, np.float64):
        return rng.standard_normal(shape, dtype=dtype)
    out = np.empty(shape, dtype=dtype)
    flat = out.reshape(-1)
    for start in range(0, flat.size, RANDOM_CHUNK):
        stop = min(start + RANDOM_CHUNK, flat.size)
        flat[start:stop] = rng.standard_normal(stop - start, dtype=np.float32)
    return out


def load_problem(model: ir.Model, *, level: str = "disabled") -> str | None:
    """Why ONNX Runtime (this build, CPU EP: every provider falls back to it) cannot load `model`,
    whole, or None: a node no provider implements (a custom domain's op) is a load failure, not a
    DirectML fallback.  The weights are left out (large ones and external ones become inputs), so this
    is cheap and reads no file.  `level`: ORT's graph optimizations at load ("basic" inlines an If
    whose condition is constant: the folding passes' check, dmlopt.passes._folding)."""
    rt = ort()
    so = rt.SessionOptions()
    so.graph_optimization_level = {"disabled": rt.GraphOptimizationLevel.ORT_DISABLE_ALL,
                                   "basic": rt.GraphOptimizationLevel.ORT_ENABLE_BASIC}[level]
    so.log_severity_level = 4
    try:
        proto = without_external_data(weightless_proto(model))
        rt.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - ORT raises several types
        text = " ".join(str(e).split())
        return re.sub(r"^\[ONNXRuntimeError\] : \d+ : [A-Z_]+ : ", "", text) or type(e).__name__
    return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]
