"""Run a model split as the DirectML placement model predicts, on the providers at hand.

Why: on Linux there is no DirectML, but the cost of a predicted placement (CPU fallbacks and
the copies between them) can still be timed.  The nodes predicted on the CPU run on ORT's
CPU EP, the rest on a GPU provider (CUDA), each part in its own session, and every value
that crosses between the two is copied by ORT between host and device memory, which is
what a DirectML Memcpy costs.  ``dmlopt bench MODEL --emulate dml-1.14`` uses this.

How the model is cut:
  1. The graph is the one the EP sees: ORT's constant folding applied (as in
     `placement.predict`), Constant nodes as initializers.
  2. Each node gets a stage: the largest stage of its producers, plus one where the device
     changes.  Nodes of one stage and device form a part, so the number of parts is the
     number of device switches on the longest path, not the number of CPU nodes.
  3. A part's inputs are the values it reads that earlier parts (or the feeds) produce,
     values captured by If/Loop/Scan bodies included; its outputs are what later parts or
     the graph outputs read.  Values stay in the memory of the part that made them (IO
     binding), so a value is only copied where a part on the other device reads it.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Mapping

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from dmlopt.runtime import bench, sessions as runtime
from dmlopt.targets.dml import placement as placement_mod
from dmlopt.errors import InputError, UsageError
from dmlopt.io.progress import bar_for

__all__ = ["EmulatedSession", "Part", "parse_emulate", "split_by_placement", "time_emulated"]


@dataclasses.dataclass
class Part:
    """A contiguous piece of the graph that runs on one device."""

    device: str  # "cpu" (predicted on the CPU) or "gpu" (predicted on DirectML)
    model: ir.Model
    inputs: list[str]
    outputs: list[str]
    nodes: list[str]
    host_outputs: set[str] = dataclasses.field(default_factory=set)  # GPU-part outputs in CPU memory (Shape)
    device_reads: set[str] = dataclasses.field(default_factory=set)  # inputs some node reads in GPU memory

    def __repr__(self) -> str:
        return f"Part({self.device}, {len(self.nodes)} nodes, in={len(self.inputs)}, out={len(self.outputs)})"


def split_by_placement(model: ir.Model, placement: placement_mod.Placement | Mapping[str, Any], *,
                       fold: bool = True) -> list[Part]:
    """Cut `model` into parts by predicted device, in an order that respects every dependency."""
    cpu_names = _cpu_names(placement)
    version = placement.ort_version if hasattr(placement, "ort_version") else placement["ort_version"]
    data = placement_mod.load_data(version)
    work = placement_mod.prepared_graph(model, fold=fold)
    opsets = dict(work.opset_imports)
    common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(work)
    graph = work.graph
    nodes = list(graph)
    names = [placement_mod.node_label(n, i) for i, n in enumerate(nodes)]
    devices = ["cpu" if name in cpu_names else "gpu" for name in names]
    producer = {id(out): k for k, n in enumerate(nodes) for out in n.outputs}
    stage = []
    for k, node in enumerate(nodes):
        s = 0
        for value in _reads(node):
            p = producer.get(id(value))
            if p is not None:
                s = max(s, stage[p] + (devices[p] != devices[k]))
        stage.append(s)
    groups: dict[tuple[int, str], list[int]] = {}
    for k in range(len(nodes)):
        groups.setdefault((stage[k], devices[k]), []).append(k)
    order = sorted(groups, key=lambda key: (key[0], key[1] != (devices[0] if nodes else "gpu")))
    proto = ir.to_proto(work)
    value_infos = _value_infos(proto)
    _type_from_ort(work, value_infos)
    initializers = {t.name: t for t in proto.graph.initializer}
    graph_outputs = [v.name for v in graph.outputs]
    read_by: dict[str, set[int]] = {}
    part_of = {}
    for index, key in enumerate(order):
        for k in groups[key]:
            part_of[k] = index
    for k, node in enumerate(nodes):
        for value in _reads(node):
            read_by.setdefault(value.name, set()).add(part_of[k])
    parts = []
    for index, key in enumerate(order):
        members = groups[key]
        produced = {out.name for k in members for out in nodes[k].outputs if out.name}
        reads = []
        for k in members:
            for value in _reads(nodes[k]):
                if value.name and value.name not in produced and value.name not in reads:
                    reads.append(value.name)
        inputs = [n for n in reads if n not in initializers]
        inits = [initializers[n] for n in reads if n in initializers]
        outputs = [n for k in members for n in (o.name for o in nodes[k].outputs)
                   if n and (n in graph_outputs or any(p > index for p in read_by.get(n, ())))]
        part_graph = onnx.helper.make_graph(
            [proto.graph.node[k] for k in members], f"part_{index}_{key[1]}",
            [_info(value_infos, n) for n in inputs], [_info(value_infos, n) for n in outputs], inits)
        part_proto = onnx.helper.make_model(part_graph, opset_imports=list(proto.opset_import),
                                            ir_version=proto.ir_version)
        part_proto.functions.extend(proto.functions)
        host_outputs, device_reads = set(), set()
        for k in members:
            if key[1] != "gpu":
                continue
            cpu_in, cpu_out = placement_mod.memory_slots(nodes[k], data, opsets)
            host_outputs.update(o.name for i, o in enumerate(nodes[k].outputs) if i in cpu_out)
            device_reads.update(v.name for i, v in enumerate(nodes[k].inputs) if v is not None and i not in cpu_in)
            device_reads.update(v.name for _, body in placement_mod.graph_attributes(nodes[k]) for v in _captured(body))
        parts.append(Part(key[1], ir.from_proto(part_proto), inputs, outputs, [names[k] for k in members],
                          host_outputs & set(outputs), device_reads & set(inputs)))
    return parts


def _cpu_names(placement) -> set[str]:
    cpu_nodes = placement.cpu_nodes if hasattr(placement, "cpu_nodes") else placement["cpu_nodes"]
    return {c["node"] for c in cpu_nodes if not c.get("graph")}


def _reads(node: ir.Node) -> list[ir.Value]:
    """The values a node reads: its inputs and what its subgraph bodies capture from outside."""
    found = [v for v in node.inputs if v is not None]
    for _, body in placement_mod.graph_attributes(node):
        found.extend(_captured(body))
    return found


def _captured(graph: ir.Graph) -> list[ir.Value]:
    defined = {id(v) for v in graph.inputs} | {id(v) for v in graph.initializers.values()}
    captured = []
    for node in graph:
        for value in _reads(node):
            if id(value) not in defined and value not in captured:
                captured.append(value)
        defined.update(id(o) for o in node.outputs)
    return captured


def _value_infos(proto: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    infos = {}
    for vi in [*proto.graph.input, *proto.graph.output, *proto.graph.value_info]:
        infos[vi.name] = vi
    return infos


def _type_from_ort(model: ir.Model, infos: dict[str, onnx.ValueInfoProto]) -> None:
    """Types onnx cannot infer (the outputs of com.microsoft ops such as the MultiHeadAttention
    dmlopt writes, and everything after them), as ONNX Runtime types them: each such value is
    made a graph output of a copy and a CPU session is created (nothing runs).  Best effort: a
    value ORT cannot type either stays unknown, and `_info` says so if a part needs it."""
    missing = [o for node in model.graph for o in node.outputs
               if o.name and not _typed(infos.get(o.name)) and not o.is_graph_output()]
    if not missing:
        return
    probe = model.clone()
    known = {o.name for o in probe.graph.outputs}
    for node in probe.graph:
        for out in node.outputs:
            if out.name in {v.name for v in missing} and out.name not in known:
                probe.graph.outputs.append(out)
                known.add(out.name)
    try:
        sess = runtime.session(probe, "cpu", optimize=False, share_weights=True)
    except (InputError, RuntimeError, ValueError):  # ORT cannot load it either: `_info` names the value
        return
    for arg in sess.get_outputs():
        if _typed(infos.get(arg.name)):
            continue
        dtype = runtime.NUMPY_TYPES.get(arg.type)
        if dtype is None:
            continue
        shape = [d if isinstance(d, int) and d >= 0 else (d if isinstance(d, str) and d else None)
                 for d in (arg.shape or [])]
        infos[arg.name] = onnx.helper.make_tensor_value_info(
            arg.name, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape if arg.shape is not None else None)


def _typed(info: onnx.ValueInfoProto | None) -> bool:
    return info is not None and info.type.HasField("tensor_type") and bool(info.type.tensor_type.elem_type)


def _info(infos: dict[str, onnx.ValueInfoProto], name: str) -> onnx.ValueInfoProto:
    info = infos.get(name)
    if info is None or not info.type.HasField("tensor_type") or not info.type.tensor_type.elem_type:
        raise ValueError(f"cannot split the model at '{name}': its type is unknown (shape inference failed there)")
    return info


class EmulatedSession:
    """ORT sessions for the parts of a predicted placement; `run(feeds)` chains them.

    `gpu_target` is the provider that stands in for DirectML ("cuda" on a GPU machine,
    "cpu" to check the split itself).
    """

    def __init__(self, model: ir.Model, placement, gpu_target: str = "cuda", *, fold: bool = True,
                 provider_options: Mapping[str, Any] | None = None):
        ort = runtime.ort()
        if gpu_target == "cuda" and hasattr(ort, "preload_dlls"):
            ort.preload_dlls()
        self.parts = split_by_placement(model, placement, fold=fold)
        self.gpu_target = gpu_target
        self.output_names = [v.name for v in model.graph.outputs]
        self._devices = {"cpu": "cpu", "gpu": "cuda" if gpu_target == "cuda" else "cpu"}
        self.sessions = []
        # Many sessions take turns: spinning intra-op threads of one would starve the next.
        quiet = {"session.intra_op.allow_spinning": "0", "session.inter_op.allow_spinning": "0"}
        for part in self.parts:
            target = "cpu" if part.device == "cpu" else gpu_target
            self.sessions.append(runtime.session(part.model, target, session_config=quiet, provider_options=(
                provider_options if target != "cpu" else None)))
        if gpu_target != "cpu":
            for part, sess in zip(self.parts, self.sessions):
                if part.device == "gpu" and sess.get_providers()[0] != runtime.PROVIDERS[gpu_target]:
                    raise RuntimeError(f"{runtime.PROVIDERS[gpu_target]} did not start for an emulated GPU part")

    @property
    def copies_per_run(self) -> int:
        """Copies between parts per run: a value read in the other memory than it lives in,
        counted once per reading part (feeds not counted, as in `placement.predict`)."""
        memory = {}
        count = 0
        for part in self.parts:
            for name in part.inputs:
                wants = "device" if part.device == "gpu" and name in part.device_reads else "host"
                if name in memory and memory[name] != wants:
                    count += 1
            for name in part.outputs:
                memory[name] = "host" if part.device == "cpu" or name in part.host_outputs else "device"
        return count

    def describe(self) -> str:
        return ", ".join(f"{p.device}:{len(p.nodes)}" for p in self.parts)

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Outputs in the model's output order, like ``InferenceSession.run(None, feeds)``."""
        ort = runtime.ort()
        env: dict[str, Any] = {name: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value))
                               for name, value in feeds.items()}
        on_host: dict[str, Any] = {}  # GPU values copied to the host once per run (a MemcpyToHost)
        for part, sess in zip(self.parts, self.sessions):
            binding = sess.io_binding()
            for name in part.inputs:
                if name not in env:
                    raise KeyError(f"no value for '{name}' (missing feed?)")
                value = env[name]
                if part.device == "cpu" and value.device_name() != "cpu":  # a CPU session cannot read GPU memory
                    if name not in on_host:
                        on_host[name] = ort.OrtValue.ortvalue_from_numpy(value.numpy())
                    value = on_host[name]
                binding.bind_ortvalue_input(name, value)
            for name in part.outputs:
                device = "cpu" if name in part.host_outputs else self._devices[part.device]
                binding.bind_output(name, device, 0)
            sess.run_with_iobinding(binding)
            env.update(zip(part.outputs, binding.get_outputs()))
        return [env[name].numpy() for name in self.output_names]


# -- timing as emulated DirectML (`dmlopt bench --emulate`) -------------------------------

def time_emulated(model: ir.Model, emulate: str, *, runs: int = 20, warmup: int = 3, shapes=None, dims=None,
                  gpu_target: str | None = None, seed: int = 0, progress=None) -> dict[str, Any]:
    """Time `model` as DirectML of an ORT version would place it (``dml-1.14``): the nodes the
    placement model puts on the CPU run on the CPU EP, the rest on a GPU provider here."""
    ort_version = parse_emulate(emulate)
    bench.check_counts(runs, warmup)
    gpu_target = gpu_target or ("cuda" if runtime.has_target("cuda") else "cpu")
    predicted = placement_mod.predict(model, ort_version=ort_version)
    t0 = time.perf_counter()
    session = EmulatedSession(model, predicted, gpu_target)
    load_s = time.perf_counter() - t0
    feeds = runtime.random_inputs(runtime.input_specs(model, shapes, dims), seed)
    run = _emulated_runner(session, feeds)
    with bar_for(progress, f"timing emulated DirectML {ort_version}", warmup + runs) as bar:
        for _ in range(warmup):
            run()
            bar.advance()
        times = []
        for _ in range(runs):
            times.append(run())
            bar.advance()
    return {"provider": f"emulated-dml-{predicted.ort_version} (GPU parts on {runtime.PROVIDERS[gpu_target]})",
            "how": f"nodes the ORT {predicted.ort_version} DirectML placement model puts on the CPU ran on "
                   f"CPUExecutionProvider, the rest on {runtime.PROVIDERS[gpu_target]}; values crossing between "
                   f"them were copied" + ("" if gpu_target != "cpu" else
                                          " (no GPU here: this times the split and its copies, not a GPU)"),
            "load_s": load_s, "latency_ms": bench.summary(times), "copies": session.copies_per_run,
            "predicted_copies": predicted.copy_count, "predicted_cpu_nodes": predicted.cpu_count,
            "parts": session.describe(), "emulate": emulate, "gpu_target": gpu_target, "warmup": warmup}


def _emulated_runner(session, feeds) -> Callable[[], float]:
    def run() -> float:
        t0 = time.perf_counter()
        try:
            session.run(feeds)
        except Exception as e:  # noqa: BLE001 - ORT raises its own exception types
            raise InputError(f"ONNX Runtime failed to run the emulated model while timing it: "
                             f"{runtime._first_line(e)}") from e
        return (time.perf_counter() - t0) * 1000.0
    return run


def parse_emulate(text: str) -> str:
    """``dml-1.14`` -> ``1.14``."""
    prefix, _, version = text.partition("-")
    parts = version.split(".")
    if prefix != "dml" or len(parts) < 2 or not all(p.isdigit() for p in parts):
        raise UsageError(f"--emulate {text!r}: expected dml-MAJOR.MINOR, e.g. dml-1.14")
    return version
