"""Measure what the DirectML EP of one ONNX Runtime version registers, and write dmlopt's table for it.

    python -m models.dml_probe --kit /tmp/dmlkit --version 1.24.3 --out dmlopt/data/dml_ort_1.24.json

Why: the placement tables were transcribed from ORT's sources; the real EP disagreed (1.17.3 runs
MultiHeadAttention on DirectML, 1.19.2 SAM's Einsums).  This probes the real EP, under Wine with
the dml-wine kit (/work/shared/dml-wine/run.sh), one process per batch: every probe is one node
on graph inputs (its data) and small initializers (the inputs the EP reads in CPU memory), not
connected to the others, so no node's placement depends on another's.  One batch per opset holds
the ops whose since-version is that opset, each in every element type ONNX allows among
`TYPES`.  A node the log lists on the CPU EP has no DirectML kernel for its (since-version,
type); a DML node listed under its own name (not inside a DmlFusedNode) cannot join a DML graph.
Probes of ops neither EP implements break the session: they are named in ORT's error, dropped
and recorded as not on DirectML, and the batch runs again.

Ops not probed keep the rows of the transcribed table the new one is based on (marked
``derived``); rules are measured where a probe decides them (Einsum equations, Einsum output
shapes, device types, the highest opset the version loads).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from dmlopt.runtime import ort_model
from dmlopt.targets.dml import ort_log
from models.dml_real import KIT_SCRIPT, PROBE_NAMES

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "dmlopt" / "data"

# The element types smoke.js can feed (it makes random inputs for these only).
TYPES = ["float", "float16", "double", "int32", "int64", "bool"]
ONNX_TYPE = {"float": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "double": TensorProto.DOUBLE,
             "int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "int32": TensorProto.INT32,
             "int64": TensorProto.INT64, "bool": TensorProto.BOOL}
X = [2, 3, 4, 5]


@dataclasses.dataclass
class Spec:
    """One probe node: inputs are ('T', shape) for the probed type, (dtype, shape) for a graph input of
    a fixed type, or a numpy array (an initializer); None for an absent optional input."""

    inputs: list
    attrs: dict = dataclasses.field(default_factory=dict)
    outputs: int = 1


def _i64(*values) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _has_input(schema, name: str) -> bool:
    return any(f.name == name for f in schema.inputs)


def _reduce(schema, t):
    if _has_input(schema, "axes"):
        return Spec([("T", X), _i64(1)], {"keepdims": 1})
    return Spec([("T", X)], {"axes": [1], "keepdims": 1})


def _squeeze_like(schema, t, op):
    shape = [2, 1, 4, 5] if op == "Squeeze" else X
    if _has_input(schema, "axes"):
        return Spec([("T", shape), _i64(1)])
    return Spec([("T", shape)], {"axes": [1]})


def _split(schema, t):
    if _has_input(schema, "split"):
        return Spec([("T", X), _i64(1, 1)], {"axis": 0}, outputs=2)
    return Spec([("T", X)], {"axis": 0, "split": [1, 1]}, outputs=2)


def _slice(schema, t):
    if _has_input(schema, "starts"):
        return Spec([("T", X), _i64(0), _i64(1), _i64(0), _i64(1)])
    return Spec([("T", X)], {"starts": [0], "ends": [1], "axes": [0]})


def _pad(schema, t):
    if _has_input(schema, "pads"):
        return Spec([("T", X), _i64(0, 0, 1, 1, 0, 0, 1, 1)])
    return Spec([("T", X)], {"pads": [0, 0, 1, 1, 0, 0, 1, 1]})


def _clip(schema, t):
    if _has_input(schema, "min"):
        return Spec([("T", X)])
    return Spec([("T", X)], {"min": 0.0, "max": 1.0})


def _resize(schema, t):
    if schema.since_version < 11:
        return Spec([("T", [1, 1, 4, 4]), np.array([1, 1, 2, 2], np.float32)], {"mode": "nearest"})
    return Spec([("T", [1, 1, 4, 4]), np.array([], np.float32), np.array([1, 1, 2, 2], np.float32)],
                {"mode": "linear"})


def _mod(schema, t):
    return Spec([("T", X), ("T", X)], {"fmod": 1} if t in ("float", "float16", "double") else {})


def _cast(schema, t):
    return Spec([("T", X)], {"to": int(TensorProto.FLOAT)})


def _dropout(schema, t):
    return Spec([("T", X)])


UNARY = ["Abs", "Neg", "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil", "Erf", "Sin",
         "Cos", "Softplus", "Softsign", "Elu", "Selu", "LeakyRelu", "HardSigmoid", "HardSwish", "Identity", "IsNaN",
         "Sign", "Round", "Not", "Mish", "Gelu", "Celu", "ThresholdedRelu", "Softmax", "LogSoftmax", "Hardmax",
         "Flatten", "Shape", "Size", "NonZero", "IsInf", "Trilu", "GlobalAveragePool", "GlobalMaxPool", "Transpose",
         "BitwiseNot"]
BINARY = ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Equal", "Less", "Greater", "LessOrEqual",
          "GreaterOrEqual", "And", "Or", "Xor", "PRelu", "BitwiseAnd", "BitwiseOr", "BitwiseXor"]

SPECIAL: dict[str, Callable] = {
    "ReduceMean": _reduce, "ReduceSum": _reduce, "ReduceMax": _reduce, "ReduceMin": _reduce, "ReduceProd": _reduce,
    "ReduceL2": _reduce, "ReduceSumSquare": _reduce, "ReduceL1": _reduce, "ReduceLogSumExp": _reduce,
    "ArgMax": lambda s, t: Spec([("T", X)], {"axis": 1}), "ArgMin": lambda s, t: Spec([("T", X)], {"axis": 1}),
    "Squeeze": lambda s, t: _squeeze_like(s, t, "Squeeze"), "Unsqueeze": lambda s, t: _squeeze_like(s, t, "Unsqueeze"),
    "Split": _split, "Slice": _slice, "Pad": _pad, "Clip": _clip, "Resize": _resize, "Mod": _mod, "Cast": _cast,
    "Dropout": _dropout,
    "Reshape": lambda s, t: Spec([("T", X), _i64(6, 20)]),
    "Concat": lambda s, t: Spec([("T", X), ("T", X)], {"axis": 1}),
    "Gather": lambda s, t: Spec([("T", X), _i64(1, 0)], {"axis": 0}),
    "GatherElements": lambda s, t: Spec([("T", X), np.zeros(X, np.int64)], {"axis": 1}),
    "GatherND": lambda s, t: Spec([("T", X), np.zeros([2, 1], np.int64)]),
    "ScatterND": lambda s, t: Spec([("T", X), np.zeros([1, 1], np.int64), ("T", [1, 3, 4, 5])]),
    "ScatterElements": lambda s, t: Spec([("T", X), np.zeros(X, np.int64), ("T", X)], {"axis": 1}),
    "Expand": lambda s, t: Spec([("T", [1, 3, 1, 5]), _i64(*X)]),
    "Tile": lambda s, t: Spec([("T", X), _i64(1, 2, 1, 1)]),
    "ConstantOfShape": lambda s, t: Spec([_i64(2, 3)], {"value": helper.make_tensor("v", ONNX_TYPE[t], [1], [1])}),
    "Range": lambda s, t: Spec([("T", []), ("T", []), ("T", [])]),
    "CastLike": lambda s, t: Spec([("float", X), ("T", [1])]),
    "CumSum": lambda s, t: Spec([("T", X), _i64(1)]),
    "TopK": lambda s, t: (Spec([("T", X), _i64(2)], outputs=2) if _has_input(s, "K") else
                          Spec([("T", X)], {"k": 2}, outputs=2)),
    "Where": lambda s, t: Spec([("bool", X), ("T", X), ("T", X)]),
    "DepthToSpace": lambda s, t: Spec([("T", [1, 4, 2, 2])], {"blocksize": 2}),
    "SpaceToDepth": lambda s, t: Spec([("T", [1, 1, 4, 4])], {"blocksize": 2}),
    "MatMul": lambda s, t: Spec([("T", [2, 3, 4]), ("T", [2, 4, 5])]),
    "Gemm": lambda s, t: Spec([("T", [3, 4]), ("T", [4, 5]), ("T", [5])]),
    "Conv": lambda s, t: Spec([("T", [1, 3, 8, 8]), ("T", [4, 3, 3, 3]), ("T", [4])], {"pads": [1, 1, 1, 1]}),
    "ConvTranspose": lambda s, t: Spec([("T", [1, 3, 8, 8]), ("T", [3, 4, 4, 4]), ("T", [4])],
                                       {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "AveragePool": lambda s, t: Spec([("T", [1, 3, 8, 8])], {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "MaxPool": lambda s, t: Spec([("T", [1, 3, 8, 8])], {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "BatchNormalization": lambda s, t: Spec([("T", [1, 3, 4, 4]), ("T", [3]), ("T", [3]), ("T", [3]), ("T", [3])]),
    "InstanceNormalization": lambda s, t: Spec([("T", [1, 3, 4, 4]), ("T", [3]), ("T", [3])]),
    "LayerNormalization": lambda s, t: Spec([("T", [2, 3, 8]), ("T", [8]), ("T", [8])], {"axis": -1}),
    "GroupNormalization": lambda s, t: Spec([("T", [1, 4, 3, 3]), ("T", [4] if s.since_version >= 21 else [2]),
                                             ("T", [4] if s.since_version >= 21 else [2])], {"num_groups": 2}),
    "GridSample": lambda s, t: Spec([("T", [1, 1, 4, 4]), ("float", [1, 3, 3, 2])]),
    "Einsum": lambda s, t: Spec([("T", [2, 3, 4]), ("T", [2, 4, 5])], {"equation": "bij,bjk->bik"}),
}
SPECIAL.update({op: (lambda s, t: Spec([("T", X)])) for op in UNARY})
SPECIAL["Transpose"] = lambda s, t: Spec([("T", X)], {"perm": [0, 2, 1, 3]})
SPECIAL["Softmax"] = lambda s, t: Spec([("T", X)], {"axis": -1})
SPECIAL.update({op: (lambda s, t: Spec([("T", X), ("T", X)])) for op in BINARY})
SPECIAL["PRelu"] = lambda s, t: Spec([("T", X), ("T", [5])])

# com.microsoft contrib ops (since 1); probed in float and float16.
CONTRIB: dict[str, Callable[[str], Spec]] = {
    "MultiHeadAttention": lambda t: Spec([("T", [1, 6, 8]), ("T", [1, 6, 8]), ("T", [1, 6, 8])], {"num_heads": 2}),
    "SkipLayerNormalization": lambda t: Spec([("T", [1, 6, 8]), ("T", [1, 6, 8]), ("T", [8]), ("T", [8])]),
    "Gelu": lambda t: Spec([("T", X)]),
    "FastGelu": lambda t: Spec([("T", [2, 8])]),
    "QuickGelu": lambda t: Spec([("T", X)]),
    "BiasGelu": lambda t: Spec([("T", [2, 8]), ("T", [8])]),
    "FusedMatMul": lambda t: Spec([("T", [2, 3, 4]), ("T", [2, 4, 5])], {"alpha": 1.0}),
    "BiasAdd": lambda t: Spec([("T", [1, 4, 8]), ("T", [8]), ("T", [1, 4, 8])]),
}

# Einsum equations whose placement decides the table's Einsum rule.
EINSUM_EQUATIONS = ["bhwc,hkc->bhwk", "bhwc,wkc->bhwk", "bqc,bchw->bqhw", "ij,jk->ik", "bij,bjk->bik",
                    "...ij,...jk->...ik", "abcdefghi,i->a"]


@dataclasses.dataclass
class Probe:
    name: str
    op: str
    domain: str
    since: int
    opset: int
    dtype: str
    param: str
    spec: Spec
    extra: dict = dataclasses.field(default_factory=dict)  # what else the probe decides


def _schema(op: str, opset: int, domain: str = ""):
    try:
        return onnx.defs.get_schema(op, opset, domain)
    except Exception:  # noqa: BLE001 - not defined at that opset
        return None


def _since_versions(op: str, max_opset: int) -> list[int]:
    found = set()
    for opset in range(7, max_opset + 1):
        schema = _schema(op, opset)
        if schema is not None and not schema.deprecated:
            found.add((schema.since_version, opset))
    # each since-version probed at the lowest opset >= LIST_OPSET that selects it (the run can list every node
    # there), else the lowest that does
    chosen: dict[int, int] = {}
    for since, opset in sorted(found, key=lambda p: p[1]):
        if since not in chosen or (chosen[since] < LIST_OPSET <= opset):
            chosen[since] = opset
    return sorted(chosen.items())


# run.sh --list-nodes appends a StringNormalizer (opset 10+); below it, "All nodes placed on DML" lists none.
LIST_OPSET = 10


def _allowed(schema, param: str) -> list[str]:
    for c in schema.type_constraints:
        if c.type_param_str == param:
            names = {s[len("tensor("):-1] for s in c.allowed_type_strs if s.startswith("tensor(")}
            return [t for t in TYPES if t in names]
    return []


def _probed_param(schema, spec: Spec) -> str | None:
    for formal, given in zip(schema.inputs, spec.inputs):
        if isinstance(given, tuple) and given[0] == "T":
            return formal.type_str
    return None


def make_probes(max_opset: int) -> list[Probe]:
    """Every (op, since-version, type) probe up to `max_opset`, plus the rule probes."""
    probes: list[Probe] = []
    for op, build in sorted(SPECIAL.items()):
        for since, opset in _since_versions(op, max_opset):
            schema = _schema(op, opset)
            sample = build(schema, "float")
            param = _probed_param(schema, sample)
            if param is None:  # ConstantOfShape: the probed type is the output's
                param = schema.outputs[0].type_str
                types = _allowed(schema, param)
            else:
                types = _allowed(schema, param)
            for t in types:
                probes.append(Probe(f"p{len(probes)}", op, "", since, opset, t, param, build(schema, t)))
    for op, build in sorted(CONTRIB.items()):
        for t in ("float", "float16"):
            probes.append(Probe(f"p{len(probes)}", op, "com.microsoft", 1, 17, t, "T", build(t)))
    for eq in EINSUM_EQUATIONS:
        n_in = len(eq.split("->")[0].split(","))
        letters = eq.split("->")[0].split(",")
        sizes = {"b": 2, "h": 3, "w": 4, "c": 5, "k": 6, "q": 7, "i": 2, "j": 3}
        shapes = []
        for term in letters:
            if term.startswith("..."):
                shapes.append([2] + [sizes.get(c, 2) for c in term[3:]])
            else:
                shapes.append([sizes.get(c, 2) for c in term])
        spec = Spec([("T", s) for s in shapes[:n_in]], {"equation": eq})
        probes.append(Probe(f"p{len(probes)}", "Einsum", "", 12, 17, "float", "T", spec, {"equation": eq}))
    # Einsum -> Relu: a Relu standalone (not fused) means ORT does not know the Einsum's output dims.
    probes.append(Probe(f"p{len(probes)}", "Einsum", "", 12, 17, "float", "T",
                        Spec([("T", [2, 3]), ("T", [3, 4])], {"equation": "ij,jk->ik"}), {"chain": "Relu"}))
    return probes


def _value_info(name: str, dtype: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, ONNX_TYPE[dtype], shape)


def probe_nodes(probe: Probe):
    """(nodes, graph inputs, initializers, graph outputs) of one probe."""
    nodes, inputs, inits, outputs = [], [], [], []
    names = []
    for k, given in enumerate(probe.spec.inputs):
        name = f"{probe.name}_i{k}"
        if given is None:
            names.append("")
        elif isinstance(given, np.ndarray):
            inits.append(numpy_helper.from_array(given, name))
            names.append(name)
        else:
            dtype = probe.dtype if given[0] == "T" else given[0]
            inputs.append(_value_info(name, dtype, given[1]))
            names.append(name)
    while names and names[-1] == "":
        names.pop()
    outs = [f"{probe.name}_o{k}" for k in range(probe.spec.outputs)]
    nodes.append(helper.make_node(probe.op, names, outs, name=probe.name, domain=probe.domain, **probe.spec.attrs))
    final = outs
    if probe.extra.get("chain"):
        nodes.append(helper.make_node(probe.extra["chain"], outs, [f"{probe.name}_c"], name=f"{probe.name}_c"))
        final = [f"{probe.name}_c"]
    outputs.extend(helper.make_value_info(o, onnx.TypeProto()) for o in final)
    return nodes, inputs, inits, outputs


def batch_model(probes: list[Probe], opset: int) -> onnx.ModelProto:
    nodes, inputs, inits, outputs = [], [], [], []
    for p in probes:
        n, i, z, o = probe_nodes(p)
        nodes += n
        inputs += i
        inits += z
        outputs += o
    graph = helper.make_graph(nodes, "dml_probe", inputs, outputs, inits)
    model = ort_model.make_model(graph, {"": opset, "com.microsoft": 1})
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    known = {v.name: v for v in (*inferred.graph.value_info, *inferred.graph.output)}
    for out in model.graph.output:  # declared output types (onnx-inferred) so no runtime needs to guess
        if out.name in known and known[out.name].type.HasField("tensor_type"):
            out.type.CopyFrom(known[out.name].type)
    return model


def valid(probe: Probe) -> bool:
    """Whether ONNX accepts the probe on its own (strict shape inference)."""
    if probe.domain:
        return True
    try:
        model = batch_model([probe], probe.opset)
        onnx.checker.check_model(model)
        onnx.shape_inference.infer_shapes(model, strict_mode=True)
        return all(o.type.HasField("tensor_type") for o in model.graph.output)
    except Exception:  # noqa: BLE001
        return False


@dataclasses.dataclass
class Observed:
    cpu: set
    dml_named: set
    fused: int
    unnamed: int
    error: str | None
    log: str




def run_batch(kit: str, version: str, path: pathlib.Path, log: pathlib.Path, opset: int = LIST_OPSET) -> Observed:
    env = dict(os.environ, LOG=str(log), DMLKIT_TIMEOUT="300")
    listing = ["--list-nodes"] if opset >= LIST_OPSET else []
    if not (log.exists() and "SMOKE" in log.read_text(errors="replace")):
        subprocess.run(["bash", KIT_SCRIPT, kit, version, str(path), *listing, "--no-cpu-check", "--opt-level",
                        "disabled"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    text = log.read_text(errors="replace") if log.exists() else ""
    text = text.split("SMOKE =====")[0]
    cpu, dml, fused, unnamed = set(), set(), 0, 0
    placed = ort_log.parse_placements(text)  # dmlopt's own reader of ORT's placement lines
    all_dml = placed.get("DmlExecutionProvider", {}).get("all", False)
    all_cpu = placed.get("CPUExecutionProvider", {}).get("all", False)  # listed by name only when split
    for ep, entry in placed.items():
        for node in entry["nodes"]:
            op, name = node["op"], node["name"]
            if name in PROBE_NAMES:  # the CPU-only node run.sh --list-nodes adds
                continue
            if name == "":
                unnamed += 1
            elif ep == "CPUExecutionProvider":
                cpu.add(name)
            elif op.startswith(ort_log.FUSED_PREFIXES):
                fused += 1
            else:
                dml.add(name)
    error = None
    if all_cpu:
        cpu.add("*")
    if not cpu and not dml and not fused and not all_dml:
        errs = [ln for ln in text.splitlines() if "FAIL" in ln or "[E:onnxruntime" in ln or "Error" in ln]
        error = " | ".join(e.split("] ", 1)[-1] for e in errs)[:2000] if errs else "no placement in the log"
    return Observed(cpu, dml, fused, unnamed, error, text)



def measure(kit: str, version: str, probes: list[Probe], work: pathlib.Path, say=print) -> dict[str, str]:
    """name -> 'dml' | 'dml-standalone' | 'cpu' | 'none' (no EP has a kernel) for every probe."""
    result: dict[str, str] = {}
    by_opset: dict[int, list[Probe]] = {}
    for p in probes:
        by_opset.setdefault(p.opset, []).append(p)
    for opset, group in sorted(by_opset.items()):
        pending = list(group)
        attempt = 0
        while pending:
            attempt += 1
            model = batch_model(pending, opset).SerializeToString()
            stem = f"probe-{version}-op{opset}-{hashlib.sha1(model).hexdigest()[:16]}"  # a rerun reuses its log
            (work / f"{stem}.onnx").write_bytes(model)
            seen = run_batch(kit, version, work / f"{stem}.onnx", work / f"{stem}.log", opset)
            if seen.error is None:
                for p in pending:
                    if p.name in seen.cpu or "*" in seen.cpu:
                        result[p.name] = "cpu"
                    elif p.name in seen.dml_named:
                        result[p.name] = "dml-standalone"
                    else:
                        result[p.name] = "dml"
                    chain = f"{p.name}_c"
                    if p.extra.get("chain"):
                        result[chain] = "dml-standalone" if chain in seen.dml_named else (
                            "cpu" if chain in seen.cpu else "dml")
                say(f"  opset {opset}: {len(pending)} probes, {sum(1 for p in pending if result[p.name] == 'cpu')} "
                    f"on CPU, {seen.fused} fused partitions")
                break
            named = set(re.findall(r"\b(p\d+)\b", seen.error))
            culprits = [p for p in pending if p.name in named]
            if not culprits:
                if len(pending) == 1:
                    # DirectML took it and failed to create its kernel (the session fails), or no EP has one
                    result[pending[0].name] = "dml-fails" if "DmlExecutionProvider" in seen.error else "none"
                    say(f"  opset {opset}: {pending[0].op} {pending[0].dtype} failed alone: {seen.error[:200]}")
                    break
                half = len(pending) // 2  # bisect: run the halves as batches of their own
                say(f"  opset {opset}: batch failed without naming a probe ({seen.error[:160]}): bisecting")
                result.update(measure(kit, version, pending[:half], work, say))
                result.update(measure(kit, version, pending[half:], work, say))
                break
            for p in culprits:
                result[p.name] = "none"
                say(f"  opset {opset}: {p.op}-{p.since} {p.dtype}: no kernel on any EP ({seen.error[:160]})")
            pending = [p for p in pending if p.name not in named]
    return result


def _has_function_body(probe: Probe) -> bool:
    schema = _schema(probe.op, probe.opset, probe.domain)
    return bool(schema is not None and (schema.has_function or schema.has_context_dependent_function))


def verify_functions(kit: str, version: str, probes: list[Probe], result: dict[str, str], work: pathlib.Path,
                     say=print) -> None:
    """Re-run alone each probe of an op with an ONNX function body that no log line put on the CPU.

    When no EP has a kernel for such a node, ORT replaces it by its function body (unnamed nodes, the
    probe's name gone): in a batch that looks like a node inside a DML partition.  Alone, a DirectML
    kernel shows as one partition or one named node; an expansion as unnamed nodes ('expanded')."""
    todo = [p for p in probes if not p.extra and result.get(p.name) == "dml" and _has_function_body(p)]
    by_opset: dict[int, list[Probe]] = {}
    for p in todo:
        by_opset.setdefault(p.opset, []).append(p)
    for opset, group in sorted(by_opset.items()):
        for start in range(0, len(group), VERIFY_GROUP):
            chunk = group[start:start + VERIFY_GROUP]
            seen = _run_alone(kit, version, chunk, opset, work)
            if seen.error is None and not seen.unnamed and seen.fused + len(seen.dml_named) + len(seen.cpu) == len(chunk):
                continue  # one DML unit per probe, nothing unnamed: their DirectML placement stands
            for p in chunk if len(chunk) > 1 else ():
                alone = _run_alone(kit, version, [p], opset, work)
                if alone.error is None and (alone.unnamed or alone.fused + len(alone.dml_named) + len(alone.cpu) > 1):
                    result[p.name] = "expanded"
                    say(f"  {p.op}-{p.since} {p.dtype}: no kernel, ORT expands its function body")
            if len(chunk) == 1 and seen.error is None and (seen.unnamed or seen.fused + len(seen.dml_named)
                                                           + len(seen.cpu) > 1):
                result[chunk[0].name] = "expanded"
                say(f"  {chunk[0].op}-{chunk[0].since} {chunk[0].dtype}: no kernel, ORT expands its function body")


# Probes verified together first; only a group that shows an expansion is re-run one by one.
VERIFY_GROUP = 12


def _run_alone(kit: str, version: str, chunk: list[Probe], opset: int, work: pathlib.Path) -> Observed:
    model = batch_model(chunk, opset).SerializeToString()
    stem = f"alone-{version}-op{opset}-{hashlib.sha1(model).hexdigest()[:16]}"
    (work / f"{stem}.onnx").write_bytes(model)
    return run_batch(kit, version, work / f"{stem}.onnx", work / f"{stem}.log", opset)


def max_opset(kit: str, version: str, work: pathlib.Path, say=print) -> int:
    """The highest ai.onnx opset the version loads (a Relu model at each opset, newest first)."""
    for opset in range(onnx.defs.onnx_opset_version(), 12, -1):
        model = ort_model.make_model(helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"], name="r")], "g", [_value_info("x", "float", [2])],
            [_value_info("y", "float", [2])]), {"": opset})
        path = work / f"opset-{version}-{opset}.onnx"
        onnx.save(model, path)
        seen = run_batch(kit, version, path, work / f"opset-{version}-{opset}.log", opset)
        if seen.error is None:
            return opset
    raise SystemExit(f"ORT {version} loads no opset above 12")


def kit_facts(kit: str, version: str) -> dict:
    root = pathlib.Path(kit) / f"ort-{version}" / "node_modules" / "onnxruntime-node"
    dlls = sorted(root.rglob("DirectML.dll"))
    facts = {"kit": "dml-wine (/work/shared/dml-wine/run.sh): onnxruntime-node " + version +
             " under Wine 8 + vkd3d + lavapipe", "onnxruntime_node": version,
             "device": "vkd3d on Mesa lavapipe (software Vulkan), shader model 6.0, no metacommands"}
    if dlls:
        facts["directml_dll_bytes"] = dlls[0].stat().st_size
        facts["directml_dll"] = str(dlls[0].relative_to(pathlib.Path(kit)))
        version = dll_file_version(dlls[0].read_bytes())
        if version:
            facts["directml_version"] = version
    return facts


def dll_file_version(data: bytes) -> str | None:
    """The FileVersion string of a Windows DLL's version resource (UTF-16), e.g. '1.15.4+241025-1615.1.dml-1.15.fac7597'."""
    key = "FileVersion".encode("utf-16-le")
    at = data.find(key)
    if at < 0:
        return None
    at += len(key)
    while data[at:at + 2] == b"\0\0":  # padding to a 32-bit boundary
        at += 2
    end = at
    while end + 1 < len(data) and data[end:end + 2] != b"\0\0":
        end += 2
    text = data[at:end].decode("utf-16-le", errors="replace").strip()
    return text or None


def type_rows(probes: list[Probe], result: dict[str, str]):
    """{(domain, op): {since: {"param": P, "dml": [types], "cpu": [types], "standalone": bool}}}"""
    table: dict = {}
    for p in probes:
        if p.extra:
            continue
        where = result.get(p.name)
        entry = table.setdefault((p.domain, p.op), {}).setdefault(p.since, {"param": p.param, "dml": [], "cpu": [],
                                                                            "standalone": []})
        if where in ("dml", "dml-standalone"):
            entry["dml"].append(p.dtype)
            entry["standalone"].append(where == "dml-standalone")
        else:
            entry["cpu"].append(p.dtype)
    return table


def write_table(version: str, probes: list[Probe], result: dict[str, str], base: dict, facts: dict,
                opset: int) -> dict:
    short = ".".join(version.split(".")[:2])
    out = json.loads(json.dumps(base))
    out["ort_version"] = short
    out["derived_from"] = f"dml_ort_{base['ort_version']}.json (rows of ops not probed)"
    out["measured"] = {**facts, "date": datetime.date.today().isoformat(), "ort_version_full": version,
                       "command": f"python -m models.dml_probe --kit KIT --version {version}",
                       "probes": len(probes), "types_probed": TYPES}
    out["directml_version"] = facts.get("directml_version") or facts.get("directml_version_string") or \
        base.get("directml_version")
    out["notes"] = [
        f"Measured on the real DirectML EP of onnxruntime-node {version} (models/dml_probe.py): one node per "
        "(op, since-version, element type) on graph inputs; rows with source 'measured' list the types "
        "DirectML took; the other rows are derived from the transcribed table.",
        *base.get("notes", [])[1:]]
    _measured_rules(out, probes, result, version, opset)  # first: the Einsum rows read einsum_output_shape
    rows = type_rows(probes, result)
    for (domain, op), versions in rows.items():
        key = f"{domain}::{op}" if domain else op
        old = base["ops"].get(key, [])
        new = []
        groups: dict[tuple, list[int]] = {}
        standalone_by: dict[tuple, bool] = {}
        for since, entry in sorted(versions.items()):
            if not entry["dml"]:
                continue
            # rows are split where the transcribed table has different rows (CPU-memory inputs, queries)
            sig = (entry["param"], "+".join(t for t in TYPES if t in entry["dml"]), _template_index(old, since))
            groups.setdefault(sig, []).append(since)
            standalone_by[sig] = standalone_by.get(sig, False) or all(entry["standalone"])
        for (param, types, index), sinces in groups.items():
            template = old[index] if index is not None else {}
            row = {k: v for k, v in template.items() if k not in ("since", "source")}
            row["since"] = sorted(sinces)
            row.setdefault("types", {})
            row["types"] = {**row["types"], param: types}
            if op == "Einsum" and out["rules"].get("einsum_output_shape", {}).get("value") == "rank_only":
                pass  # standalone because ORT does not know its output dims, not because of the registration
            elif standalone_by[(param, types, index)]:
                row["graph"] = False
            elif "graph" in row and not row["graph"]:
                row["graph"] = True
            cpu_types = sorted({t for s in sinces for t in versions[s]["cpu"]}, key=TYPES.index)
            row["source"] = (f"measured: DirectML took {op} since {', '.join(map(str, sorted(sinces)))} in {types}"
                             + (f"; CPU EP for {', '.join(cpu_types)}" if cpu_types else "")
                             + f" (onnxruntime-node {version}, models/dml_probe.py)")
            new.append(row)
        for row in old:  # since-versions no probe covered (ORT's own ONNX-domain contrib rows, older opsets)
            rest = [v for v in row["since"] if v not in versions]
            if rest:
                new.append({**row, "since": rest, "source": "derived (not probed): " + row["source"]})
        if new:
            out["ops"][key] = sorted(new, key=lambda r: r["since"][0])
        else:
            out["ops"].pop(key, None)
            out.setdefault("measured_absent", []).append(
                f"{key}: no probed since-version/type ran on DirectML (versions {sorted(versions)})")
    for key, rows_ in out["ops"].items():
        for row in rows_:
            if not row["source"].startswith(("measured", "derived")):
                row["source"] = "derived (not probed): " + row["source"]
    return out


def _template_index(old: list[dict], since: int) -> int | None:
    """The transcribed row for `since`: the one listing it, else the newest older one, else the first."""
    for i, row in enumerate(old):
        if since in row["since"]:
            return i
    older = [(max(v for v in row["since"] if v < since), i) for i, row in enumerate(old)
             if any(v < since for v in row["since"])]
    return max(older)[1] if older else (0 if old else None)


def _measured_rules(out: dict, probes: list[Probe], result: dict[str, str], version: str, opset: int) -> None:
    rules = out["rules"]
    where = f"(onnxruntime-node {version}, models/dml_probe.py)"
    rules["max_onnx_opset"] = {"value": opset, "source": f"measured: the highest ai.onnx opset that loads {where}"}
    eq_on = {p.extra["equation"]: result.get(p.name) in ("dml", "dml-standalone")
             for p in probes if p.extra.get("equation")}
    if eq_on:
        generic = eq_on.get("bhwc,hkc->bhwk", False)
        rules["einsum"] = {**rules.get("einsum", {}), "mode": "generic" if generic else "pattern_table",
                           "source": "measured: Einsum equations on DirectML " + json.dumps(eq_on) + " " + where}
    chain = next((p for p in probes if p.extra.get("chain")), None)
    if chain is not None:
        rank_only = result.get(f"{chain.name}_c") == "dml-standalone"
        rules["einsum_output_shape"] = {
            "value": "rank_only" if rank_only else "full",
            "source": ("measured: a Relu fed by an Einsum ran as a standalone DML kernel, ORT knew no output dims "
                       "(ONNX < 1.17 infers Einsum's rank only) " if rank_only else
                       "measured: a Relu fed by an Einsum joined a DML graph (ORT knows the Einsum's output dims) ")
            + where}
    double_dml = [p.op for p in probes if p.dtype == "double" and result.get(p.name, "").startswith("dml")]
    device = rules["device"]
    if not double_dml and "double" not in device["unsupported"]:
        device["unsupported"].append("double")
    if double_dml:
        device["unsupported"] = [t for t in device["unsupported"] if t != "double"]
        device["supports"] = sorted(set(device["supports"]) | {"double"})
    device["source"] = (f"measured: double ran on DirectML for {', '.join(sorted(set(double_dml))) or 'no op'} "
                        f"{where}; " + device["source"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kit", default="/tmp/dmlkit")
    ap.add_argument("--version", required=True, help="onnxruntime-node version set up in the kit, e.g. 1.24.3")
    ap.add_argument("--base", help="transcribed table the new one extends (default: nearest in dmlopt/data)")
    ap.add_argument("--out", help="table to write (default dmlopt/data/dml_ort_<major.minor>.json)")
    ap.add_argument("--work", help="folder for probe models and logs (default: a temp folder)")
    ap.add_argument("--raw", help="also write the raw per-probe results (JSON)")
    args = ap.parse_args(argv)
    short = ".".join(args.version.split(".")[:2])
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="dml-probe-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"probing onnxruntime-node {args.version} (work folder {work})")
    opset = max_opset(args.kit, args.version, work)
    print(f"  highest opset: {opset}")
    probes = [p for p in make_probes(opset) if valid(p)]
    print(f"  {len(probes)} probes")
    result = measure(args.kit, args.version, probes, work)
    verify_functions(args.kit, args.version, probes, result, work)
    base_path = pathlib.Path(args.base) if args.base else DATA / f"dml_ort_{_base_version(short)}.json"
    base = json.loads(base_path.read_text())
    table = write_table(args.version, probes, result, base, kit_facts(args.kit, args.version), opset)
    out = pathlib.Path(args.out or DATA / f"dml_ort_{short}.json")
    out.write_text(json.dumps(table, indent=1) + "\n")
    if args.raw:
        pathlib.Path(args.raw).write_text(json.dumps(
            [{"op": p.op, "domain": p.domain, "since": p.since, "opset": p.opset, "type": p.dtype, **p.extra,
              "where": result.get(p.name)} for p in probes], indent=0) + "\n")
    print(f"wrote {out}")
    return 0


# Transcribed tables the measured ones extend: the source era each was read from.
BASES = {"1.17": "1.18", "1.19": "1.23", "1.24": "1.23", "1.31": "1.23"}


def _base_version(short: str) -> str:
    return BASES.get(short, "1.23")


if __name__ == "__main__":
    sys.exit(main())
