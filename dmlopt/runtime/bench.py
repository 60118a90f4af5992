"""Timing: session creation, warm-up, then min/median/p90 latency with fixed inputs.

Noise on shared machines is large, so comparisons run the models in alternation
(A B A B ...) inside one process and report the ratio per pair and its median,
not two separately taken medians.

What a measurement holds, and why:
  1. The provider that really ran (``session.get_providers()[0]``): asking for a GPU
     provider that ORT could not start is an error, never a silent CPU run.
  2. On GPU providers, inputs are bound on the device once and outputs are bound to the
     device (IO binding), so host<->device transfers of the graph's own inputs and
     outputs are not timed; what is left are the copies inside the graph.
  3. Those copies are counted from ORT's profile of the warm-up runs (``Memcpy*`` nodes,
     op MemcpyToHost/MemcpyFromHost), then profiling is switched off before the timed
     runs, so it costs them nothing.  With ``warmup=0`` nothing is profiled.
  4. Provider options: DirectML's device_id, performance_preference, disable_metacommands;
     CUDA's cudnn_conv_algo_search, prefer_nhwc, use_tf32, enable_cuda_graph.  ``tune_ep``
     times every combination of the ones that matter and names the fastest.
  5. The same profile gives the kernel time per op type and the slowest nodes (``--profile``),
     averaged over the warm-up runs after the first.  The CUDA EP launches kernels
     asynchronously, so its per-node times hold the kernel only when CUDA_LAUNCH_BLOCKING=1 is
     set for the process (which also inflates the latency: read the proportions).
  6. Graph capture (``graph_capture=True``: CUDA's enable_cuda_graph=1, WebGPU's
     enableGraphCapture=1) replays fixed device addresses, so inputs and outputs are bound to
     OrtValues allocated once on the device, as dmlopt's session file says to run a captured model
     (WebGPU refuses host-bound inputs under capture); WebGPU's outputs are still read back in
     each timed run (HOST_OUTPUTS); a model that cannot be captured (nodes off the GPU, copies,
     outputs of unknown shape) is a one-line error naming why.
  7. Sessions start from the model's own weights (``runtime.session(share_weights=True)``: ORT
     gets them in memory before its rewrites, prepacking as from a file), and the models timed
     together share one host copy of each weight they have in common (``runtime.WeightValues``):
     tuning times every candidate at once, and the candidates share most weights.
"""

from __future__ import annotations

import collections
import itertools
import json
import math
import os
import statistics
import tempfile
import time
import weakref
from typing import Any, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from dmlopt.graph import input_sizes
from dmlopt.io import scratch
from dmlopt.runtime import sessions as runtime
from dmlopt.errors import InputError, ProviderError, UsageError, printable_tree
from dmlopt.io.progress import bar_for
from dmlopt.io.tables import format_table
from dmlopt.runtime.validate import as_input_type, make_inputs, shapes_text

# Provider options dmlopt knows, with their allowed values (None: any value).  Other keys
# are passed to ORT as they are.  Keys starting with "session." are session config entries.
PROVIDER_OPTIONS: dict[str, dict[str, Sequence[str] | None]] = {
    "dml": {"device_id": None, "performance_preference": ("default", "high_performance", "minimum_power"),
            "device_filter": ("gpu", "npu", "any"), "disable_metacommands": ("false", "true")},
    "cuda": {"device_id": None, "cudnn_conv_algo_search": ("EXHAUSTIVE", "HEURISTIC", "DEFAULT"),
             "prefer_nhwc": ("0", "1"), "use_tf32": ("0", "1"), "enable_cuda_graph": ("0", "1")},
    "cpu": {},
    # WebGPU's keys (webgpu_provider_options.h), passed to the plug-in as given.
    "webgpu": {"preferredLayout": ("NHWC", "NCHW"), "enableGraphCapture": ("0", "1"),
               "validationMode": ("disabled", "wgpuOnly", "basic", "full"),
               "powerPreference": ("high-performance", "low-power"),
               "storageBufferCacheMode": ("disabled", "lazyRelease", "simple", "bucket"),
               "uniformBufferCacheMode": ("disabled", "lazyRelease", "simple", "bucket")},
}
SPINNING = "session.intra_op.allow_spinning"
# What --tune-ep tries: every combination; each tuple starts with ORT's default.
TUNE_GRID: dict[str, dict[str, tuple[str, ...]]] = {
    # cudnn_conv_algo_search changed a CNN's time 6x on an H200; HEURISTIC beat EXHAUSTIVE by 20% at 1080p.
    "cuda": {"cudnn_conv_algo_search": ("EXHAUSTIVE", "HEURISTIC", "DEFAULT"), "prefer_nhwc": ("0", "1")},
    # Metacommands can block Conv+LeakyRelu fusion (DirectML issue #138); preference picks the adapter.
    "dml": {"disable_metacommands": ("false", "true"), "performance_preference": ("default", "high_performance")},
    # Spinning intra-op threads trade CPU time for latency.
    "cpu": {SPINNING: ("1", "0")},
    # NHWC is the native EP's default; NCHW keeps the graph's own layout (no layout Transposes).
    "webgpu": {"preferredLayout": ("NHWC", "NCHW")},
}
DEVICE_TYPES = {"cuda": "cuda", "dml": "dml", "webgpu": "webgpu"}
# Providers whose run returns before the GPU has finished when outputs stay on the device: outputs
# go to the host, so a timed run includes the GPU's work (measured: WebGPU on lavapipe timed a
# 7-Conv CNN at 0.075 ms with device outputs, the dispatch alone).
HOST_OUTPUTS = {"webgpu": "WebGPU's Run only submits the work; reading the outputs waits for it"}
CUDA_GRAPH = "enable_cuda_graph"
# The provider option that records one run as a GPU graph and replays it, per target.
GRAPH_CAPTURE = {"cuda": CUDA_GRAPH, "webgpu": "enableGraphCapture"}
# Targets timed as dmlopt's session file runs a model (optimize's re-timing, tuning): under graph capture
# when every model compared can be captured, else all without it.  WebGPU: capture removes ORT's per-node
# dispatch, a third of SAM ViT-B's run on an H100 (benchmarks/README.md), so an uncaptured time misjudges
# what a user of the session file gets.
CAPTURED_AS_DEPLOYED = ("webgpu",)
# Slowest nodes listed by --profile.
SLOWEST = 15


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def summary(times_ms: Sequence[float]) -> dict[str, float]:
    return {"min": float(min(times_ms)), "median": float(statistics.median(times_ms)),
            "p90": _percentile(times_ms, 90), "runs": len(times_ms)}


# The metadata entry dmlopt writes into an optimized model: the target it was optimized for.
TARGET_KEY = "dmlopt.target"


def target_note(models: Sequence[ir.Model], provider: str) -> str | None:
    """A line when a model optimized for one provider is timed on another (a DirectML model on the CPU)."""
    for model in models:
        target = (model.metadata_props or {}).get(TARGET_KEY)
        if target in runtime.PROVIDERS and runtime.PROVIDERS[target] != provider:
            return (f"note: optimized for {runtime.PROVIDERS[target]} (--target {target}); this timing on {provider} "
                    f"does not represent {runtime.PROVIDERS[target]}")
    return None


# A ratio whose per-pair 10th..90th percentile range holds 1 is no measurable difference.
SPREAD_PERCENTILES = (10, 90)


def ratio_summary(ratios: Sequence[float]) -> dict[str, Any]:
    """Per-pair ratios (time / baseline time) -> median, spread (p10..p90), runs and the verdict:
    'faster' or 'slower' only when the whole spread is on one side of 1."""
    lo, hi = (_percentile(ratios, q) for q in SPREAD_PERCENTILES)
    median = float(statistics.median(ratios))
    verdict = "faster" if hi < 1.0 else "slower" if lo > 1.0 else "no measurable difference"
    return {"median": median, "p10": lo, "p90": hi, "runs": len(ratios), "verdict": verdict}


def ratio_text(r: Mapping[str, Any]) -> str:
    """``x1.31 faster (time ratio 0.76, 0.72-0.80 over 20 pairs)``; inside the noise it says so."""
    spread = f"time ratio {r['median']:.3f}, p10-p90 {r['p10']:.3f}-{r['p90']:.3f} over {r['runs']} alternating pairs"
    if r["verdict"] == "no measurable difference":
        return f"no measurable difference ({spread})"
    return f"x{1 / r['median']:.2f} {'faster' if r['verdict'] == 'faster' else 'slower'} ({spread})"


# -- provider options --------------------------------------------------------------

def parse_provider_options(target: str, pairs: Sequence[str] = (), *,
                           disable_metacommands: bool = False) -> dict[str, str]:
    """``["cudnn_conv_algo_search=HEURISTIC", ...]`` -> a checked dict for `target`."""
    known = PROVIDER_OPTIONS.get(target, {})
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise UsageError(f"--provider-option {pair!r}: expected KEY=VALUE, e.g. "
                             f"{_example(target)}")
        allowed = known.get(key)
        if allowed is not None:
            match = [a for a in allowed if a.lower() == value.lower()]
            if not match:
                raise UsageError(f"--provider-option {key}: '{value}' is not one of {', '.join(allowed)}")
            value = match[0]
        elif key == "device_id" and not value.isdigit():
            raise UsageError(f"--provider-option device_id: '{value}' is not a device index")
        options[key] = value
    if disable_metacommands:
        if target != "dml":
            raise UsageError(f"--disable-metacommands applies to DirectML (--ep dml), not {target}")
        options["disable_metacommands"] = "true"
    return options


def _example(target: str) -> str:
    return {"dml": "disable_metacommands=true", "cuda": "cudnn_conv_algo_search=HEURISTIC"}.get(
        target, f"{SPINNING}=0")


def split_options(options: Mapping[str, Any] | None) -> tuple[dict[str, str], dict[str, str]]:
    """(provider options, session config entries): keys starting with 'session.' are the latter."""
    provider, config = {}, {}
    for k, v in (options or {}).items():
        (config if k.startswith("session.") else provider)[k] = str(v)
    return provider, config


def _preload_cuda() -> None:
    """onnxruntime-gpu finds the CUDA/cuDNN libraries of pip wheels only when asked to."""
    preload = getattr(runtime.ort(), "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except Exception:  # noqa: BLE001 - a failed preload shows up as the provider not starting
            pass


# -- one model's session -------------------------------------------------------------

class Timer:
    """One model's session and fixed inputs, ready to be run repeatedly."""

    def __init__(self, model: ir.Model, target: str, *, shapes=None, dims=None, feeds=None,
                 provider_options: Mapping[str, Any] | None = None, free_dims: Mapping[str, int] | None = None,
                 seed: int = 0, io_binding: bool | None = None, profile: bool = True, cuda_graph: bool = False,
                 weight_cache: runtime.WeightValues | None = None, graph_capture: bool = False):
        if target == "cuda":
            _preload_cuda()
        provider_options = dict(provider_options or {})
        if cuda_graph or graph_capture:
            if target not in GRAPH_CAPTURE:
                raise UsageError(f"graph capture applies to the CUDA and WebGPU EPs (--ep cuda, --ep webgpu), "
                                 f"not {target}")
            provider_options[GRAPH_CAPTURE[target]] = "1"
        # a captured run (CUDA graph, WebGPU graph capture); `cuda_graph` is the older spelling of the argument
        self.captured = target in GRAPH_CAPTURE and str(provider_options.get(GRAPH_CAPTURE[target], "0")) == "1"
        if self.captured:
            profile = False  # a replayed graph has no per-node events; the capture run is not a timing
            io_binding = True
        provider_opts, session_config = split_options(provider_options)
        self.target = target
        self.provider_options = dict(provider_options or {})
        self._profile_dir = None
        if profile:  # removed by _drop_profile_dir, else when the timer is collected or Python exits
            with scratch.uninterrupted():
                self._profile_dir = tempfile.mkdtemp(prefix="dmlopt-profile-")
                self._drop_later = weakref.finalize(self, scratch.remove, self._profile_dir)
        t0 = time.perf_counter()
        try:
            self.session = runtime.session(model, target, provider_options=provider_opts or None,
                                           session_config=session_config, free_dims=free_dims,
                                           profile_dir=self._profile_dir, share_weights=True,
                                           weight_cache=weight_cache)
        except InputError as e:
            self._drop_profile_dir()
            if self.captured:
                raise InputError(f"the model cannot run {self._capture_name}: {e}") from e
            raise
        except Exception:
            self._drop_profile_dir()
            raise
        self.load_s = time.perf_counter() - t0
        self.provider = self.session.get_providers()[0]
        if self.provider != runtime.PROVIDERS[target]:
            self._drop_profile_dir()
            raise ProviderError(
                f"asked for {runtime.PROVIDERS[target]} but ONNX Runtime started {self.provider} (the provider "
                f"failed to load; providers present: {', '.join(runtime.available_providers())})")
        self.input_basis: list[str] = []
        if feeds is None:
            feeds = runtime.random_inputs(runtime.input_specs(model, shapes, dims or free_dims,
                                                              basis=self.input_basis), seed)
        wanted = {i.name: i.type for i in self.session.get_inputs()}
        self.feeds = {k: as_input_type(v, wanted[k]) for k, v in feeds.items() if k in wanted}
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.profile: dict[str, Any] | None = None
        self.io_binding = "none"
        self._binding = None
        if io_binding if io_binding is not None else target in DEVICE_TYPES:
            self._bind(int(provider_opts.get("device_id", 0)))
        if self.captured:
            try:
                self.once()  # the capture: ORT records the graph on the first run
            except Exception as e:  # noqa: BLE001 - ORT raises its own exception types
                raise InputError(f"the model cannot run {self._capture_name}: {runtime._first_line(e)}") from e

    @property
    def _capture_name(self) -> str:
        return "as a CUDA graph" if self.target == "cuda" else "under WebGPU graph capture"

    def _bind(self, device_id: int) -> None:
        """Inputs on the device once, outputs to the device: transfers of I/O are not timed."""
        rt = runtime.ort()
        device = DEVICE_TYPES.get(self.target, "cpu")
        binding = self.session.io_binding()
        try:
            self._device_inputs = [rt.OrtValue.ortvalue_from_numpy(v, device, device_id) for v in self.feeds.values()]
            for name, value in zip(self.feeds, self._device_inputs):
                binding.bind_ortvalue_input(name, value)
            where_in = device
        except Exception:  # noqa: BLE001 - e.g. an ORT build that cannot place OrtValues on this device
            binding.clear_binding_inputs()
            for name, value in self.feeds.items():
                binding.bind_cpu_input(name, value)
            where_in = "cpu"
        if self.captured:  # a graph replays fixed addresses: outputs allocated once, like the inputs
            shapes = static_output_shapes(self.session, self._capture_name)
            self._device_outputs = [
                rt.OrtValue.ortvalue_from_shape_and_type(shape, runtime.NUMPY_TYPES[o.type], device, device_id)
                for o, shape in zip(self.session.get_outputs(), shapes)]
            for name, value in zip(self.outputs, self._device_outputs):
                binding.bind_ortvalue_output(name, value)
            if where_in != device:
                raise InputError(f"the model cannot run {self._capture_name}: its inputs could not be placed on {device}")
            self._binding = binding
            self.io_binding = (f"inputs on {where_in}, outputs on {device} (allocated once, "
                               + ("CUDA graph)" if self.target == "cuda" else "graph capture; read back each run)"))
            return
        try:
            if self.target in HOST_OUTPUTS:
                raise ValueError(HOST_OUTPUTS[self.target])
            for name in self.outputs:
                binding.bind_output(name, device, device_id)
            where_out = device
        except Exception:  # noqa: BLE001
            binding.clear_binding_outputs()
            for name in self.outputs:
                binding.bind_output(name)
            where_out = "cpu"
        self._binding = binding
        self.io_binding = f"inputs on {where_in}, outputs on {where_out}"

    # Runs per sample (`alternate`'s min_sample_ms): a sub-millisecond model timed one run at a
    # time gives per-pair ratios spread over x0.4-x15; the mean of enough runs does not.
    repeats = 1

    def once(self) -> float:
        """One sample: ms per run, over `repeats` runs."""
        t0 = time.perf_counter()
        try:
            for _ in range(self.repeats):
                if self._binding is not None:
                    self.session.run_with_iobinding(self._binding)
                    self._binding.synchronize_outputs()
                    if self.captured and self.target in HOST_OUTPUTS:  # the read-back waits for the GPU
                        for value in self._device_outputs:
                            value.numpy()
                else:
                    self.session.run(self.outputs, self.feeds)
        except Exception as e:  # noqa: BLE001 - ORT raises its own exception types
            raise InputError(f"ONNX Runtime failed to run the model on {self.provider} while timing it: "
                             f"{runtime._first_line(e)}") from e
        return (time.perf_counter() - t0) * 1000.0 / self.repeats

    def run_outputs(self) -> list[np.ndarray]:
        """One run's outputs, copied to the host (through the binding when there is one)."""
        if self._binding is None:
            return self.session.run(self.outputs, self.feeds)
        self.session.run_with_iobinding(self._binding)
        return self._binding.copy_outputs_to_cpu()

    def end_profile(self) -> dict[str, Any] | None:
        """Stop profiling; copies and node placement of the last profiled run."""
        if self._profile_dir is None:
            return self.profile
        try:
            path = self.session.end_profiling()
            if path:
                with open(path, encoding="utf-8") as f:
                    self.profile = profile_summary(json.load(f))
        except (OSError, ValueError):
            self.profile = None
        finally:
            self._drop_profile_dir()
        return self.profile

    def _drop_profile_dir(self) -> None:
        if self._profile_dir is not None:
            self._drop_later()
            self._profile_dir = None

    @property
    def copies(self) -> int | None:
        return None if self.profile is None else self.profile["copies"]


def static_output_shapes(session, how: str = "as a CUDA graph") -> list[list[int]]:
    """Each output's shape, all dims known: what preallocating outputs (graph capture) needs."""
    shapes = []
    for o in session.get_outputs():
        if not all(isinstance(d, int) and d >= 0 for d in o.shape):
            raise InputError(f"the model cannot run {how}: output {o.name!r} has shape {list(o.shape)}, "
                             "not static (freeze it: dmlopt optimize --shape/--dim)")
        shapes.append(list(o.shape))
    return shapes


def _kernel_events(events: Sequence[Mapping[str, Any]], run: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    start, end = run["ts"], run["ts"] + run.get("dur", 0)
    return [e for e in events if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")
            and start <= e.get("ts", -1) <= end]


def _is_copy(event: Mapping[str, Any]) -> bool:
    return str(event.get("args", {}).get("op_name", "")).startswith("Memcpy") or str(event["name"]).startswith("Memcpy")


def profile_summary(events: Sequence[Mapping[str, Any]], *, slowest: int = SLOWEST) -> dict[str, Any] | None:
    """From an ORT profile (None: no run): copies and nodes by provider in the last ``model_run``;
    kernel time per op type and the slowest nodes, averaged over the runs after the first (warm)."""
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    if not runs:
        return None
    copy_ops: collections.Counter = collections.Counter()
    providers: collections.Counter = collections.Counter()
    cpu_ops: collections.Counter = collections.Counter()
    for e in _kernel_events(events, runs[-1]):
        args = e.get("args", {})
        op = args.get("op_name", "")
        if _is_copy(e):
            copy_ops[op or "Memcpy"] += 1
            continue
        provider = args.get("provider", "?")
        providers[provider] += 1
        if provider == "CPUExecutionProvider":
            cpu_ops[op] += 1
    warm = runs[1:] or runs
    node_us: dict[str, float] = collections.defaultdict(float)
    node_info: dict[str, tuple[str, str]] = {}
    for run in warm:
        for e in _kernel_events(events, run):
            node = str(e["name"])[: -len("_kernel_time")]
            node_us[node] += float(e.get("dur", 0)) / len(warm)
            args = e.get("args", {})
            node_info[node] = (args.get("op_name", "") or ("Memcpy" if _is_copy(e) else "?"), args.get("provider", "?"))
    by_op: dict[str, dict[str, float]] = {}
    for node, us in node_us.items():
        entry = by_op.setdefault(node_info[node][0], {"ms": 0.0, "nodes": 0})
        entry["ms"] += us / 1000.0
        entry["nodes"] += 1
    total_ms = sum(node_us.values()) / 1000.0
    ranked = sorted(node_us, key=node_us.get, reverse=True)[:slowest]
    gpu = _gpu_kernels(events, len(runs))
    return {**gpu, "copies": sum(copy_ops.values()), "copy_ops": dict(copy_ops),
            "nodes_by_provider": dict(providers), "cpu_ops": dict(cpu_ops.most_common()),
            "profiled_runs": len(warm), "kernel_ms": total_ms,
            "op_time_ms": dict(sorted(by_op.items(), key=lambda kv: kv[1]["ms"], reverse=True)),
            "slowest_nodes": [{"node": n, "op": node_info[n][0], "provider": node_info[n][1],
                               "ms": node_us[n] / 1000.0} for n in ranked]}


def _gpu_kernels(events: Sequence[Mapping[str, Any]], runs: int) -> dict[str, Any]:
    """GPU kernel times where the EP adds them to ORT's profile (the WebGPU EP's timestamp queries: ``Api``
    events named after the node and the shader program), per profiled run; empty where there are none."""
    gpu = [e for e in events if e.get("cat") == "Api" and isinstance(e.get("dur"), (int, float))]
    if not gpu:
        return {}
    by_kernel: collections.Counter = collections.Counter()
    for e in gpu:
        by_kernel[str(e.get("name", "?"))] += float(e["dur"]) / 1000.0 / max(runs, 1)
    return {"gpu_kernel_ms": sum(by_kernel.values()), "gpu_runs": runs,
            "gpu_kernels": [{"kernel": k, "ms": ms} for k, ms in by_kernel.most_common(SLOWEST)]}


def profile_table(profile: Mapping[str, Any] | None, provider: str, *, top_ops: int = 15) -> str:
    """Kernel time per op type and the slowest nodes, as text (`bench --profile`)."""
    if not profile or "op_time_ms" not in profile:
        return "profile: none taken (--profile needs --warmup >= 1)"
    profile = printable_tree(profile)  # node names come from the model file
    total = profile["kernel_ms"] or 1e-12
    rows = [("op type", "nodes", "ms", "share")]
    for op, entry in list(profile["op_time_ms"].items())[:top_ops]:
        rows.append((op, entry["nodes"], f"{entry['ms']:.3f}", f"{100 * entry['ms'] / total:.1f}%"))
    rows.append(("total", sum(e["nodes"] for e in profile["op_time_ms"].values()), f"{profile['kernel_ms']:.3f}",
                 "100%"))
    text = (f"node time by op type (ORT profile, mean of {profile['profiled_runs']} profiled run(s) after the "
            "first):\n"
            + format_table(rows))
    rows = [("node", "op", "provider", "ms")]
    for n in profile["slowest_nodes"]:
        rows.append((n["node"][:60], n["op"], n["provider"].replace("ExecutionProvider", ""), f"{n['ms']:.3f}"))
    text += "\nslowest nodes:\n" + format_table(rows)
    if provider == "DmlExecutionProvider":
        text += ("\nnote: DirectML records each node's work for the GPU's queue: these times are CPU-side "
                 "recording and submission (a compiled partition, DmlFusedNode, is one node); the run's latency "
                 "is the GPU figure")
    if provider == "CUDAExecutionProvider" and os.environ.get("CUDA_LAUNCH_BLOCKING") != "1":
        text += ("\nnote: the CUDA EP launches kernels asynchronously: these times are launches, not kernels; "
                 "run with CUDA_LAUNCH_BLOCKING=1 to have each node's time include its kernel")
    if profile.get("gpu_kernels"):
        rows = [("GPU kernel", "ms")] + [(k["kernel"][:70], f"{k['ms']:.3f}") for k in profile["gpu_kernels"]]
        text += (f"\nGPU kernel time (the EP's timestamp queries, per run of {profile['gpu_runs']}): "
                 f"{profile['gpu_kernel_ms']:.3f} ms\n" + format_table(rows))
    elif provider == "WebGpuExecutionProvider":
        text += ("\nnote: the WebGPU EP records each node into a command buffer and the GPU runs it later: the node "
                 "times above are CPU-side dispatch times (a node that waits on the GPU, e.g. for a buffer, shows the "
                 "wait), not GPU time; this ONNX Runtime and plug-in gave no GPU timestamps (seen with plug-in 0.4.0 "
                 "on an H100). Compare whole models with bench --compare for GPU cost")
    return text


# -- measurements ----------------------------------------------------------------------

def _warm(timers: Mapping[str, Timer], warmup: int, bar) -> None:
    for _ in range(warmup):
        for timer in timers.values():
            timer.once()
            bar.advance()
    for timer in timers.values():
        timer.end_profile()


def alternate(timers: Mapping[str, Timer], *, runs: int, warmup: int, baseline: str | None = None,
              progress=None, label: str = "timing", min_sample_ms: float = 0.0) -> dict[str, Any]:
    """Run the timers in alternation (A B, then B A, ...); per model its summary and its ratio to the baseline.
    `min_sample_ms`: each sample repeats the run until it takes about this long (the same count for
    every model, from the slowest after warm-up), so a fast model's ratios measure it, not the clock."""
    names = list(timers)
    baseline = baseline or names[0]
    with bar_for(progress, label, (warmup + runs) * len(names)) as bar:
        _warm(timers, warmup, bar)
        if min_sample_ms > 0:
            slowest = max(statistics.median([t.once() for _ in range(3)]) for t in timers.values())
            for t in timers.values():
                t.repeats = max(1, math.ceil(min_sample_ms / max(slowest, 1e-3)))
        times: dict[str, list[float]] = {name: [] for name in names}
        for i in range(runs):
            for name in (names if i % 2 == 0 else names[::-1]):
                times[name].append(timers[name].once())
                bar.advance()
    out: dict[str, Any] = {"provider": timers[baseline].provider, "baseline": baseline, "models": {}}
    for name in names:
        ratios = [t / b for t, b in zip(times[name], times[baseline])]
        t = timers[name]
        out["models"][name] = {"load_s": t.load_s, "latency_ms": summary(times[name]),
                               "ratio_median": float(statistics.median(ratios)), "ratio": ratio_summary(ratios),
                               "ratios": ratios, "runs_per_sample": t.repeats,
                               "copies": t.copies, "profile": t.profile, "io_binding": t.io_binding,
                               "provider_options": t.provider_options}
    return out


def time_model(model: ir.Model, target: str = "cpu", *, runs: int = 20, warmup: int = 3, progress=None,
               **kw) -> dict[str, Any]:
    """One model: ``{provider, load_s, latency_ms {min, median, p90, runs}, copies, ...}``."""
    check_counts(runs, warmup)
    timer = Timer(model, target, profile=warmup > 0, **kw)
    with bar_for(progress, f"timing on {timer.provider}", warmup + runs) as bar:
        _warm({"model": timer}, warmup, bar)
        times = []
        for _ in range(runs):
            times.append(timer.once())
            bar.advance()
    return {"provider": timer.provider, "inputs": {k: list(v.shape) for k, v in timer.feeds.items()},
            "input_basis": timer.input_basis, "load_s": timer.load_s, "latency_ms": summary(times),
            "copies": timer.copies, "profile": timer.profile, "io_binding": timer.io_binding,
            "provider_options": timer.provider_options, "warmup": warmup, **device_note(target)}


def device_note(target: str) -> dict[str, str]:
    """What a time on `target` was measured on, where that matters: WebGPU's adapter, and whether it is
    software (its times are then labelled so, never a basis for a choice: runtime.timing_refusal)."""
    if target != "webgpu":
        return {}
    refusal = runtime.timing_refusal(target)
    chosen, why = runtime.webgpu_adapter.chosen()
    note = {"adapter": chosen.line() if chosen is not None else f"unknown ({why})"}
    offered = runtime.webgpu_host.offered_how(runtime.ort())
    if offered is not None:
        note["offered"] = offered
    if refusal is not None:
        note["device_note"] = "SOFTWARE ADAPTER: " + refusal
    return note


def compare(models: Mapping[str, ir.Model], target: str = "cpu", *, runs: int = 20, warmup: int = 3,
            baseline: str | None = None, progress=None, label: str | None = None, min_sample_ms: float = 0.0,
            graph_capture: bool | str = False, **kw) -> dict[str, Any]:
    """Time several models in alternation; ratios are each model's time over the baseline's, per round
    (`min_sample_ms`: see `alternate`)."""
    check_counts(runs, warmup)
    if kw.get("feeds") is None:
        kw["feeds"], basis = same_inputs(models, kw.get("shapes"), kw.get("dims") or kw.get("free_dims"),
                                         kw.get("seed", 0))
    else:
        basis = []
    cache = runtime.WeightValues()  # the models share most weights: one host copy of each
    timers, capture_note = make_timers(models, target, graph_capture=graph_capture, profile=warmup > 0,
                                       weight_cache=cache, **kw)
    out = alternate(timers, runs=runs, warmup=warmup, baseline=baseline, progress=progress,
                    label=label or f"timing {len(timers)} models on {runtime.PROVIDERS[target]}",
                    min_sample_ms=min_sample_ms)
    if capture_note:
        out["graph_capture"] = capture_note
    out["inputs"] = {k: list(v.shape) for k, v in kw["feeds"].items()}
    out["input_basis"] = basis
    return {**out, **device_note(target)}


def make_timers(models: Mapping[str, ir.Model], target: str, *, graph_capture: bool | str = False,
                **kw) -> tuple[dict[str, Timer], str | None]:
    """A Timer per model, and what was done about graph capture (None: not asked).

    ``graph_capture="as-deployed"``: on CAPTURED_AS_DEPLOYED targets every model under capture, as the session
    file runs a ready one; if any model cannot be captured, every model without it (the comparison stays like
    for like) and the note says which and why."""
    if graph_capture == "as-deployed":
        if target not in CAPTURED_AS_DEPLOYED:
            graph_capture = False
        else:
            timers = {}
            for name, model in models.items():
                try:
                    timers[name] = Timer(model, target, graph_capture=True, **kw)
                except InputError as e:
                    timers = {name: Timer(m, target, **kw) for name, m in models.items()}
                    return timers, f"off: {name} cannot be captured ({e}), so no model was"
            return timers, "on, as the session file runs a model that is ready for it"
    timers = {name: Timer(m, target, graph_capture=bool(graph_capture), **kw) for name, m in models.items()}
    return timers, ("on" if graph_capture else None)


def same_inputs(models: Mapping[str, ir.Model], shapes=None, dims=None, seed: int = 0
                ) -> tuple[dict[str, np.ndarray], list[str]]:
    """One set of inputs that every model of a comparison accepts, and where its sizes came from.

    The static dims of every model size the others' dynamic ones (a shape-fixed output against
    its dynamic original runs the output's shapes); two models that fix one input position at
    different sizes, or that take different inputs, cannot be compared (UsageError)."""
    names = list(models)
    first = models[names[0]]
    inputs = [v.name for v in input_sizes.runtime_inputs(first)]
    fixed: dict[tuple[str, int], int] = {}
    where: dict[tuple[str, int], str] = {}
    for name, m in models.items():
        theirs = [v.name for v in input_sizes.runtime_inputs(m)]
        if sorted(theirs) != sorted(inputs):
            raise UsageError(f"{name} takes the inputs {', '.join(theirs)} and {names[0]} takes {', '.join(inputs)}: "
                             "the models cannot run the same inputs, so their times cannot be compared")
        for key, size in input_sizes.static_dims(m).items():
            if key in fixed and fixed[key] != size:
                raise UsageError(f"input '{key[0]}' dim {key[1]} is {fixed[key]} in {where[key]} and {size} in "
                                 f"{name}: the models cannot run the same inputs, so their times cannot be "
                                 "compared (give each its own bench run)")
            fixed[key], where[key] = size, name
    basis: list[str] = []
    specs = runtime.input_specs(first, shapes, dims, fixed=fixed, basis=basis)
    return runtime.random_inputs(specs, seed), basis


def tune_grid(target: str, fixed: Mapping[str, Any] | None = None) -> list[dict[str, str]]:
    """Every combination of TUNE_GRID[target], keys the user fixed left out; ORT's defaults first."""
    fixed = dict(fixed or {})
    grid = {k: v for k, v in TUNE_GRID.get(target, {}).items() if k not in fixed}
    if target == "dml" and "device_id" not in fixed and _device_id_overrides_preference():
        grid.pop("performance_preference", None)
    keys = list(grid)
    return [{**fixed, **dict(zip(keys, values))} for values in itertools.product(*(grid[k] for k in keys))]


def _device_id_overrides_preference() -> bool:
    """DirectML picks the adapter by device_id when one is given, ignoring performance_preference;
    tuning the preference means nothing while sessions are made with a device_id."""
    entry = runtime.provider_entry("dml", {"performance_preference": "high_performance"})
    return isinstance(entry, tuple) and "device_id" in entry[1]


def option_label(options: Mapping[str, Any], keys: Sequence[str] | None = None) -> str:
    keys = list(options) if keys is None else keys
    return ",".join(f"{k}={options[k]}" for k in keys) or "defaults"


def tune_ep(model: ir.Model, target: str, *, runs: int = 20, warmup: int = 3, provider_options=None,
            progress=None, **kw) -> dict[str, Any]:
    """Time the model under every provider-option combination of TUNE_GRID, in alternation."""
    check_counts(runs, warmup)
    fixed = dict(provider_options or {})
    combos = tune_grid(target, fixed)
    varied = [k for k in (combos[0] if combos else {}) if k not in fixed]
    timers: dict[str, Timer] = {}
    failed: dict[str, str] = {}
    cache = runtime.WeightValues()
    for options in combos:
        label = option_label(options, varied)
        try:
            timers[label] = Timer(model, target, provider_options=options, profile=warmup > 0, weight_cache=cache,
                                  **kw)
        except ProviderError:
            raise
        except Exception as e:  # noqa: BLE001 - a combination the provider rejects is reported, not fatal
            failed[label] = runtime._first_line(e)
    if not timers:
        raise ProviderError(f"no provider-option combination could start {runtime.PROVIDERS[target]}: "
                            + "; ".join(f"{k}: {v}" for k, v in failed.items()))
    result = alternate(timers, runs=runs, warmup=warmup, progress=progress,
                       label=f"tuning {len(timers)} option sets on {runtime.PROVIDERS[target]}")
    best = min(result["models"], key=lambda name: result["models"][name]["ratio_median"])
    best_options = result["models"][best]["provider_options"]
    result.update({"best": best, "best_options": best_options, "failed": failed, "varied": varied,
                   "flags": " ".join(f"--provider-option {k}={best_options[k]}" for k in varied)})
    return result


def check_counts(runs: int, warmup: int) -> None:
    if runs < 1 or warmup < 0:
        raise UsageError("--runs must be >= 1 and --warmup >= 0")


# -- tables ---------------------------------------------------------------------------------

def _copies(value) -> str:
    return "-" if value is None else str(value)


def verdict(result: dict[str, Any]) -> list[str]:
    """The lines `bench -q` prints: per compared model its ratio with spread (or the best options),
    else the median latency; and the inputs timed."""
    result = printable_tree(result)
    note = [result["note"]] if result.get("note") else []
    return _verdict(result) + note


def _verdict(result: dict[str, Any]) -> list[str]:
    inputs = f" on {shapes_text(result['inputs'])}" if result.get("inputs") else ""
    if "models" not in result:
        return [f"median {result['latency_ms']['median']:.3f} ms on {result['provider']}{inputs} "
                f"({result['latency_ms']['runs']} runs)"]
    if "best" in result:
        return [f"{_best_line(result)} on {result['provider']}"]
    return [f"{name}: {ratio_text(m.get('ratio') or ratio_summary(m['ratios']))} vs {result['baseline']}, "
            f"{result['provider']}{inputs}" for name, m in result["models"].items() if name != result["baseline"]]


def _best_line(result: Mapping[str, Any]) -> str:
    """`--tune-ep`'s answer: the fastest option set, or that none is measurably faster than the baseline's."""
    best = result["models"][result["best"]]
    r = best.get("ratio") or ratio_summary(best["ratios"])
    if result["best"] != result["baseline"] and r["verdict"] != "faster":
        return (f"best: no option set is measurably faster than {result['baseline']} (fastest median: "
                f"{result['best']}, {ratio_text(r)})")
    return f"best: {result['best']}" + (f"  ({result['flags']})" if result.get("flags") else "")


def to_table(result: dict[str, Any], *, profile: bool = False) -> str:
    """Readable form of `time_model`, `compare` or `tune_ep` output (`profile`: with `profile_table`).
    Every string is escaped first: ORT's failure text and the model's names may hold control codes
    or newlines that must not reach the terminal or forge a line."""
    result = printable_tree(result)
    note = ("\n" + result["note"]) if result.get("note") else ""
    return _table(result, profile) + note


def _table(result: dict[str, Any], profile: bool) -> str:
    if "models" not in result:
        lat = result["latency_ms"]
        rows = [("provider", "load s", "min ms", "median ms", "p90 ms", "runs", "copies"),
                (result["provider"], f"{result['load_s']:.3f}", f"{lat['min']:.3f}", f"{lat['median']:.3f}",
                 f"{lat['p90']:.3f}", lat["runs"], _copies(result.get("copies")))]
        text = format_table(rows)
        if result.get("inputs") is not None:
            text = "inputs: " + shapes_text(result["inputs"], result.get("input_basis")) + "\n" + text
        if result.get("adapter"):
            text += f"\nadapter: {result['adapter']}"
        if result.get("device_note"):
            text += "\n" + result["device_note"]
        if result.get("how"):
            text += "\n" + result["how"]
        cpu_ops = (result.get("profile") or {}).get("cpu_ops")
        if cpu_ops and result["provider"] != "CPUExecutionProvider":
            text += "\nnodes on CPU: " + ", ".join(f"{op} x{n}" for op, n in cpu_ops.items())
        if profile:
            text += "\n\n" + profile_table(result.get("profile"), result["provider"])
        return text
    label = "options" if "best" in result else "model"
    rows = [(label, "load s", "min ms", "median ms", "p90 ms", "copies", f"ratio vs {result['baseline']} (p10-p90)")]
    for name, m in result["models"].items():
        lat = m["latency_ms"]
        r = m.get("ratio") or ratio_summary(m["ratios"])
        rows.append((name, f"{m['load_s']:.3f}", f"{lat['min']:.3f}", f"{lat['median']:.3f}", f"{lat['p90']:.3f}",
                     _copies(m.get("copies")), f"{r['median']:.3f} ({r['p10']:.2f}-{r['p90']:.2f})"))
    verdicts = [f"{name}: {ratio_text(m.get('ratio') or ratio_summary(m['ratios']))} vs {result['baseline']}"
                for name, m in result["models"].items() if name != result["baseline"] and "best" not in result]
    text = "\n".join(verdicts + [f"provider: {result['provider']}"])
    if result.get("inputs"):
        text += "\ninputs (same for every model): " + shapes_text(result["inputs"], result.get("input_basis"))
    text += "\n" + format_table(rows)
    if result.get("adapter"):
        text += f"\nadapter: {result['adapter']}"
    if result.get("device_note"):
        text += "\n" + result["device_note"]
    if "best" in result:
        for name, reason in result.get("failed", {}).items():
            text += f"\n{name}: could not start: {reason}"
        text += "\n" + _best_line(result)
    if profile:
        for name, m in result["models"].items():
            text += f"\n\n{name}: " + profile_table(m.get("profile"), result["provider"])
    return text


# -- re-timing an optimized model ------------------------------------------------------------

RETIME_WARMUP = 2
RETIME_MAX_RUNS = 10
RETIME_MIN_RUNS = 3
# Time for the timed pairs when runs are chosen automatically (large models on the CPU EP).
RETIME_BUDGET_S = 15.0


def retime(before: ir.Model, after: ir.Model, target: str, *, shapes=None, dims=None, inputs=None,
           runs: int | None = None, warmup: int = RETIME_WARMUP, progress=None) -> dict[str, Any]:
    """Before/after on `target`, in alternation on the same inputs: the report's ``timing``.

    ``runs=None`` picks 3-10 pairs so that the timed part takes about RETIME_BUDGET_S."""
    basis: list[str] = []
    feeds = make_inputs(before, after, shapes, dims, inputs, basis=basis)
    cache = runtime.WeightValues()
    timers, capture_note = make_timers({"before": before, "after": after}, target, graph_capture="as-deployed",
                                       feeds=feeds, weight_cache=cache)
    if runs is None:
        t0 = time.perf_counter()
        for timer in timers.values():
            timer.once()
        pair_s = time.perf_counter() - t0
        runs = max(RETIME_MIN_RUNS, min(RETIME_MAX_RUNS, int(RETIME_BUDGET_S / max(pair_s, 1e-6))))
    result = alternate(timers, runs=runs, warmup=warmup, baseline="before", progress=progress,
                       label=f"timing before/after on {runtime.PROVIDERS[target]}")
    return {**before_after(result, feeds, basis, runs), **device_note(target),
            **({"graph_capture": capture_note} if capture_note else {})}


def before_after(result: Mapping[str, Any], feeds: Mapping[str, np.ndarray], basis: list[str],
                 runs: int) -> dict[str, Any]:
    """The report's ``timing`` from a comparison of models "before" and "after" (`compare`'s shape,
    made here or on the DirectML host: dmlopt.targets.dml.real_ep.retime)."""
    b, a = result["models"]["before"], result["models"]["after"]
    return {"provider": result["provider"], "before_ms": b["latency_ms"]["median"],
            "after_ms": a["latency_ms"]["median"], "speedup": 1.0 / a["ratio_median"],
            "ratio_median": a["ratio_median"], "ratio": a["ratio"], "verdict": ratio_text(a["ratio"]),
            "inputs": {k: list(np.shape(v)) for k, v in feeds.items()}, "input_basis": basis, "runs": runs,
            "before": b["latency_ms"], "after": a["latency_ms"],
            "load_s_before": b["load_s"], "load_s_after": a["load_s"],
            "copies_before": b["copies"], "copies_after": a["copies"], "io_binding": a.get("io_binding", "none")}
