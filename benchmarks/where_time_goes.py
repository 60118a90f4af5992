"""Where SAM ViT-B's time goes on a GPU's WebGPU or DirectML EP: the model timed one prefix at a time, and the
forms of its two heavy kernels (attention, the MLP's matrix products) timed side by side.

    python benchmarks/where_time_goes.py --ep webgpu --work DIR [--runs 8] [--only segments|attention|linear]
    DMLOPT_DML_HOST=/root/dmlkit python benchmarks/where_time_goes.py --ep dml --work DIR ...

ORT's profile holds CPU-side times only there (the WebGPU plug-in's timestamp queries do not reach it; DirectML
records a compiled partition as one node), so the GPU's time is measured from outside, in one run:

- segments: the model cut where at most two tensors carry everything later nodes need (a ViT block's boundary:
  the residual sum and its normalized form), at about evenly spaced nodes; each prefix, its outputs reduced to
  scalar means, is timed in alternation with the others, and a segment's time is the difference of medians
  between its prefix and the one before.
- attention: MultiHeadAttention chains at SAM ViT-B's sizes (global: 1 x 4096 tokens x 12 heads, with the
  (1, 12, 4096, 4096) relative-position bias built in the graph as SAM builds it; windowed: 25 windows x 196
  tokens) in the forms dmlopt could write: as now, without the bias, with the present_key/present_value
  outputs named (the flash path of some ORT builds), the bias folded into Q/K (192-wide heads, V padded), the
  query rows in chunks, the windows as heads of one batch, unfused (MatMul, Add, Softmax, MatMul), and with
  WebGPU's `simple` buffer cache.
- whole model (WebGPU): dmlopt's output as written, with every MultiHeadAttention's present outputs named, with
  attention kept unfused, and the output and the unfused one under graph capture.
- linear: the MLP's two products (4096 x 768 x 3072) as Gemm, MatMul+Add (2D, 3D), Gemm with B transposed, and
  1x1 Conv.
Every form is a chain of `--repeat` copies fed from one input so a run's fixed cost (upload, read-back) is
shared; rows print ms per copy and the ratio to the group's first row, medians of per-round ratios.  float32 and
float16.  WebGPU models are timed in alternation in one process (bench.compare); DirectML models each in its own
host process, A B ... B A (real_ep.time_models).  The device is printed first: a software device's times mean
nothing about a GPU.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnx_ir as ir  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import dmlopt  # noqa: E402
from dmlopt.errors import DmlOptError  # noqa: E402
from dmlopt.io.tables import format_table  # noqa: E402
from dmlopt.runtime import bench, ort_model, sessions as runtime  # noqa: E402
from dmlopt.runtime import vulkan as adapter  # noqa: E402
from dmlopt.targets.dml import real_ep  # noqa: E402

OPSETS = {"": 17, "com.microsoft": 1}
DTYPES = {"float32": (TensorProto.FLOAT, np.float32), "float16": (TensorProto.FLOAT16, np.float16)}


class Builder:
    """A small graph written node by node, constants stored as initializers."""

    def __init__(self, dtype: str):
        self.elem, self.np = DTYPES[dtype]
        self.nodes, self.inits, self.n = [], [], 0
        self.rng = np.random.default_rng(0)

    def name(self, stem: str) -> str:
        self.n += 1
        return f"{stem}{self.n}"

    def const(self, array: np.ndarray, stem: str = "w") -> str:
        name = self.name(stem)
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def weight(self, *shape: int, scale: float = 0.05) -> str:
        return self.const((self.rng.standard_normal(shape) * scale).astype(self.np))

    def ints(self, *values: int) -> str:
        return self.const(np.array(values, np.int64), "shape")

    def op(self, op_type: str, inputs, outputs: int = 1, domain: str = "", **attrs) -> list[str]:
        outs = [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, domain=domain, **attrs))
        return outs

    def model(self, x_shape, out: str, out_shape) -> ir.Model:
        graph = helper.make_graph(self.nodes, "bench", [helper.make_tensor_value_info("x", self.elem, x_shape)],
                                  [helper.make_tensor_value_info(out, self.elem, out_shape)], self.inits)
        return ir.serde.deserialize_model(ort_model.make_model(graph, OPSETS))


def relpos_bias(b: Builder, x: str, batch: int, side: int, heads: int, head: int, windows_as_heads: bool,
                chunks: int = 1) -> list[str]:
    """SAM's decomposed relative-position bias, computed from x as SAM computes it from q:
    rel_h = q_heads @ Rh (groups, side, side, side), rel_w likewise on the transposed tokens, then
    rel_h[..., None] + rel_w[..., None, :] reshaped to (B, N, S, S) (or (1, B*N, S, S), windows as heads);
    with `chunks`, one bias per block of query rows, each added from its rows of rel_h and rel_w."""
    groups = batch * heads
    (q,) = b.op("Reshape", [x, b.ints(batch, side, side, heads, head)])
    (q,) = b.op("Transpose", [q], perm=[0, 3, 1, 2, 4])
    (q,) = b.op("Reshape", [q, b.ints(groups, side, side, head)])
    (rel_h,) = b.op("MatMul", [q, b.weight(side, head, side, scale=0.1)])  # (g, qh, qw, kh)
    (qt,) = b.op("Transpose", [q], perm=[0, 2, 1, 3])
    (rel_w,) = b.op("MatMul", [qt, b.weight(side, head, side, scale=0.1)])  # (g, qw, qh, kw)
    (rel_w,) = b.op("Transpose", [rel_w], perm=[0, 2, 1, 3])
    (rel_h,) = b.op("Unsqueeze", [rel_h, b.ints(4)])
    (rel_w,) = b.op("Unsqueeze", [rel_w, b.ints(3)])
    shape = (1, groups) if windows_as_heads else (batch, heads)
    rows = side // chunks
    out = []
    for c in range(chunks):
        h, w = rel_h, rel_w
        if chunks > 1:
            (h,) = b.op("Slice", [rel_h, b.ints(c * rows), b.ints((c + 1) * rows), b.ints(1)])
            (w,) = b.op("Slice", [rel_w, b.ints(c * rows), b.ints((c + 1) * rows), b.ints(1)])
        (s,) = b.op("Add", [h, w])
        (s,) = b.op("Reshape", [s, b.ints(*shape, rows * side, side * side)])
        out.append(s)
    return out


def attention_chain(dtype: str, form: str, *, batch: int, side: int, heads: int = 12, head: int = 64,
                    repeat: int = 4) -> ir.Model:
    """`repeat` self-attention copies on x (batch, side*side, heads*head); each copy's output is the next's input."""
    b = Builder(dtype)
    seq, hidden = side * side, heads * head
    x = "x"
    windows_as_heads = form.startswith("windows as heads")
    present = "present" in form
    with_bias = "no bias" not in form and "fold" not in form
    chunks = int(form.split("query chunks ")[1].split()[0]) if "query chunks" in form else 1
    for _ in range(repeat):
        if chunks > 1:  # one MultiHeadAttention per block of query rows, each with its rows of the bias
            biases = relpos_bias(b, x, batch, side, heads, head, False, chunks)
            rows = seq // chunks
            parts = []
            for c, bias in enumerate(biases):
                (q,) = b.op("Slice", [x, b.ints(c * rows), b.ints((c + 1) * rows), b.ints(1)])
                parts += b.op("MultiHeadAttention", [q, x, x, "", "", bias], domain="com.microsoft", num_heads=heads)
            (x,) = b.op("Concat", parts, axis=1)
            continue
        bias = relpos_bias(b, x, batch, side, heads, head, windows_as_heads)[0] if with_bias else None
        if form.startswith("unfused"):  # MatMul(q*s, k^T) + bias, Softmax, MatMul(P, v): attention=keep's ops
            (h,) = b.op("Reshape", [x, b.ints(batch, seq, heads, head)])
            (qh,) = b.op("Transpose", [h], perm=[0, 2, 1, 3])
            (kt,) = b.op("Transpose", [h], perm=[0, 2, 3, 1])
            (qs,) = b.op("Mul", [qh, b.const(np.array(1 / np.sqrt(head), b.np))])
            (scores,) = b.op("MatMul", [qs, kt])
            if bias is not None:
                (scores,) = b.op("Add", [scores, bias])
            (probs,) = b.op("Softmax", [scores], axis=-1)
            (y,) = b.op("MatMul", [probs, qh])
            (y,) = b.op("Transpose", [y], perm=[0, 2, 1, 3])
            (x,) = b.op("Reshape", [y, b.ints(batch, seq, hidden)])
            continue
        q = x
        if windows_as_heads:  # (B, S, N*H) -> (1, S, B*N*H): every (window, head) pair is one head
            (t,) = b.op("Transpose", [x], perm=[1, 0, 2])
            (q,) = b.op("Reshape", [t, b.ints(1, seq, batch * hidden)])
        if "fold" in form:  # 192-wide heads: [q, rel_h, rel_w] . [k, onehot_h, onehot_w]; V padded to 192
            (q,) = b.op("Concat", [x, b.op("Mul", [x, b.const(np.array(0.5, b.np))])[0], x], axis=-1)
        outs = 3 if present else 1
        n_heads = heads * batch if windows_as_heads else heads
        att_inputs = [q, q, q] + ([""] * 2 + [bias] if bias is not None else [])
        y, *_ = b.op("MultiHeadAttention", att_inputs, outputs=outs, domain="com.microsoft", num_heads=n_heads)
        if "fold" in form:
            (y,) = b.op("Slice", [y, b.ints(0), b.ints(hidden), b.ints(2)])
        if windows_as_heads:
            (y,) = b.op("Reshape", [y, b.ints(seq, batch, hidden)])
            (y,) = b.op("Transpose", [y], perm=[1, 0, 2])
        x = y
    return b.model([batch, seq, hidden], x, [batch, seq, hidden])


def linear_chain(dtype: str, form: str, *, tokens: int = 4096, dim: int = 768, wide: int = 3072,
                 repeat: int = 4) -> ir.Model:
    """`repeat` MLPs (dim -> wide, Gelu, wide -> dim) in one of the product forms."""
    b = Builder(dtype)
    side = int(round(tokens ** 0.5))
    x = "x"  # (tokens, dim) for every form, so that the forms run the same input
    if form == "MatMul+Add 3D":
        (x,) = b.op("Reshape", [x, b.ints(1, tokens, dim)])
    elif form == "Conv 1x1":  # channels first, once for the chain
        (x,) = b.op("Transpose", [x], perm=[1, 0])
        (x,) = b.op("Reshape", [x, b.ints(1, dim, side, side)])
    for _ in range(repeat):
        for k, n in ((dim, wide), (wide, dim)):
            w = (b.rng.standard_normal((k, n)) * (1 / np.sqrt(k))).astype(b.np)
            bias = b.const((b.rng.standard_normal(n) * 0.1).astype(b.np))
            if form == "Gemm":
                (x,) = b.op("Gemm", [x, b.const(w), bias])
            elif form == "Gemm transB":
                (x,) = b.op("Gemm", [x, b.const(np.ascontiguousarray(w.T)), bias], transB=1)
            elif form.startswith("MatMul+Add"):
                (x,) = b.op("MatMul", [x, b.const(w)])
                (x,) = b.op("Add", [x, bias])
            elif form == "Conv 1x1":
                (x,) = b.op("Conv", [x, b.const(np.ascontiguousarray(w.T).reshape(n, k, 1, 1)), bias])
            if n == wide:
                (x,) = b.op("Gelu", [x], domain="com.microsoft")
    if form == "MatMul+Add 3D":
        (x,) = b.op("Reshape", [x, b.ints(tokens, dim)])
    elif form == "Conv 1x1":
        (x,) = b.op("Reshape", [x, b.ints(dim, tokens)])
        (x,) = b.op("Transpose", [x], perm=[1, 0])
    return b.model([tokens, dim], x, [tokens, dim])


SIMPLE = " [storageBufferCacheMode=simple]"
CAPTURE = " [graph capture]"
ATTENTION_FORMS = ("as dmlopt writes it", "present outputs named", "no bias", "no bias, present outputs",
                   "relpos fold (192-wide heads), present outputs", "query chunks 8 (512 rows each)",
                   "query chunks 4 (1024 rows each)", "as dmlopt writes it" + SIMPLE, "no bias" + SIMPLE,
                   "query chunks 8 (512 rows each)" + SIMPLE, "unfused (MatMul, Add, Softmax, MatMul)",
                   "unfused, no bias")
WINDOW_FORMS = ("as dmlopt writes it", "present outputs named", "windows as heads", "windows as heads, present",
                "as dmlopt writes it" + SIMPLE, "unfused (MatMul, Add, Softmax, MatMul)")
LINEAR_FORMS = ("Gemm", "MatMul+Add 2D", "MatMul+Add 3D", "Gemm transB", "Conv 1x1")


def timed(models: dict[str, ir.Model], args, runs: int) -> dict:
    """bench.compare's {"models": {name: {latency_ms, ratio_median}}} on the chosen EP; the first model is the
    baseline.  A name ending in "[key=value]" runs with that provider option, one ending in CAPTURE under graph
    capture (WebGPU)."""
    if args.ep != "dml":
        feeds, _ = bench.same_inputs(models)
        timers = {}
        for name, model in models.items():
            capture = name.endswith(CAPTURE)
            options = (dict([name.rsplit("[", 1)[1].rstrip("]").split("=", 1)])
                       if name.endswith("]") and not capture else None)
            try:
                timers[name] = bench.Timer(model, args.ep, feeds=feeds, provider_options=options, profile=False,
                                           graph_capture=capture)
            except DmlOptError as e:  # the row is left out, saying why
                print(f"  {name}: not timed: {e}", flush=True)
        return bench.alternate(timers, runs=runs, warmup=args.warmup)
    first = next(iter(models.values()))
    feeds = runtime.random_inputs(runtime.input_specs(first, dims={"batch": 1}), 0)
    return real_ep.time_models(models, args.host, feeds, runs=runs, warmup=args.warmup)


def picked(forms, args) -> list[str]:
    """The forms --forms names (every one when it names none); the group's first form always, as its baseline."""
    if not args.forms:
        return list(forms)
    keys = args.forms.split("|")
    return [forms[0]] + [f for f in forms[1:] if any(k in f for k in keys)]


def time_group(title: str, models: dict[str, ir.Model], args, per: int) -> None:
    t0 = time.perf_counter()
    result = timed(models, args, args.runs)
    models = {name: m for name, m in models.items() if name in result["models"]}
    rows = [("form", "ms per copy", "min-p90 ms (whole run)", f"x {next(iter(models))}")]
    for name in models:
        m = result["models"][name]
        lat = m["latency_ms"]
        rows.append((name, f"{lat['median'] / per:.2f}", f"{lat['min']:.1f}-{lat['p90']:.1f}",
                     f"{1.0 / m['ratio_median']:.3f}"))
    print(f"\n{title} ({per} copies a run, {args.runs} rounds, {time.perf_counter() - t0:.0f} s)")
    print(format_table(rows), flush=True)


def cuts(proto: onnx.ModelProto, max_live: int = 2) -> list[tuple[int, tuple[str, ...]]]:
    """(node index, tensors) where the tensors (at most `max_live`) are all the non-constant values that nodes
    from the index on read from earlier nodes: the prefix up to the index is a model with those outputs (a
    ViT block's boundary carries two: the residual sum and its normalized form, SkipLayerNormalization's
    outputs)."""
    g = proto.graph
    const = {i.name for i in g.initializer}
    last_use = collections.defaultdict(lambda: -1)
    for i, node in enumerate(g.node):
        if node.op_type == "Constant" or (node.input and all(x in const or x == "" for x in node.input)):
            const.update(node.output)
        for x in node.input:
            last_use[x] = i
    outputs = {o.name for o in g.output}
    found, live = [], {i.name for i in g.input} - const
    for i, node in enumerate(g.node):
        live = {t for t in live if last_use[t] >= i or t in outputs}
        if 0 < len(live) <= max_live and i > 0 and not live & outputs and not live & {x.name for x in g.input}:
            found.append((i, tuple(sorted(live))))
        live |= {y for y in node.output if y and y not in const}
    return found


def prefix(proto: onnx.ModelProto, end: int, tensors) -> ir.Model:
    """Nodes [0, end) that the tensors need, each tensor reduced to its mean: every prefix reads back scalars, so
    prefixes differ only by the work of their nodes."""
    g = proto.graph
    needed, nodes = set(tensors), []
    for node in reversed(g.node[:end]):
        if needed & set(node.output):
            nodes.append(node)
            needed |= set(node.input)
    nodes.reverse()
    outs = []
    for t in tensors:  # each output a float32 scalar whatever the tensor's type
        outs.append(f"{t}__mean")
        nodes.append(helper.make_node("ReduceMean", [t], [f"{t}__mean16"], keepdims=0))
        nodes.append(helper.make_node("Cast", [f"{t}__mean16"], [outs[-1]], to=TensorProto.FLOAT))
    graph = helper.make_graph(nodes, "prefix", list(g.input),
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, []) for o in outs],
                              [i for i in g.initializer if i.name in needed])
    m = helper.make_model(graph, opset_imports=list(proto.opset_import), ir_version=proto.ir_version)
    return ir.serde.deserialize_model(m)


def segments(model: ir.Model, args, label: str) -> None:
    proto = ir.serde.serialize_model(model)
    found = cuts(proto)
    total = len(proto.graph.node)
    # the cut nearest each of max_cuts evenly spaced node positions: segments of about equal node counts
    chosen = sorted({min(found, key=lambda c: abs(c[0] - total * j / (args.max_cuts + 1)))
                     for j in range(1, args.max_cuts + 1)}) if found else []
    ends = [i for i, _ in chosen] + [len(proto.graph.node)]
    models = {f"nodes 0-{i - 1}": prefix(proto, i, t) for i, t in chosen}
    models["whole"] = prefix(proto, len(proto.graph.node), [o.name for o in proto.graph.output])
    print(f"\n{label}: {len(found)} cuts, timing {len(chosen)} prefixes and the whole model (outputs reduced to "
          f"scalars), {args.segment_runs} rounds", flush=True)
    result = timed(models, args, args.segment_runs)
    rows = [("segment", "ms", "cumulative ms", "ops in the segment")]
    before, start = 0.0, 0
    for m, end in zip(result["models"].values(), ends):
        med = m["latency_ms"]["median"]
        ops = collections.Counter(n.op_type for n in proto.graph.node[start:end]
                                  if n.op_type not in ("Constant", "Reshape", "Unsqueeze", "Squeeze"))
        rows.append((f"nodes {start}-{end - 1}", f"{med - before:.2f}", f"{med:.2f}",
                     ", ".join(f"{k} {v}" for k, v in ops.most_common(6))))
        before, start = med, end
    print(format_table(rows), flush=True)


def with_present(model: ir.Model) -> ir.Model:
    """The model with every MultiHeadAttention's present_key/present_value outputs named (read by nothing)."""
    proto = ir.serde.serialize_model(model)
    for node in proto.graph.node:
        if node.op_type == "MultiHeadAttention" and len(node.output) == 1:
            node.output.extend([f"{node.output[0]}__present_key", f"{node.output[0]}__present_value"])
    return ir.serde.deserialize_model(proto)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default=str(ROOT / ".sam_gpu"))
    parser.add_argument("--ep", choices=("webgpu", "dml", "cpu"), default="webgpu",
                        help="cpu: a smoke test of the script, not a measure of anything the issue asks")
    parser.add_argument("--ort-version", default="1.31.1", help="the DirectML host's ORT (--ep dml)")
    parser.add_argument("--dml-host", help="host folder (default: $DMLOPT_DML_HOST)")
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--segment-runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--max-cuts", type=int, default=24)
    parser.add_argument("--dtypes", default="float32,float16")
    parser.add_argument("--no-segments", action="store_true", help="with segments: only the whole-model rows")
    parser.add_argument("--forms", help="only the forms whose names contain one of these |-separated texts")
    parser.add_argument("--only", action="append", choices=("segments", "attention", "linear"))
    args = parser.parse_args(argv)
    if args.ep == "webgpu":
        runtime.resolve_ep("webgpu")
        chosen, why = adapter.chosen()
        print(f"WebGPU EP: onnxruntime {runtime.ort().__version__}, plug-in {runtime.webgpu_host.plugin_version()}, "
              f"adapter {chosen.line() if chosen else 'unknown (' + why + ')'}", flush=True)
        refusal = runtime.timing_refusal("webgpu")
        if refusal:
            print(f"SOFTWARE ADAPTER: {refusal}. Times below are CPU emulation.")
    elif args.ep == "dml":
        args.host = real_ep.resolve(args.dml_host, args.ort_version, required=True, what="this benchmark")
        print(real_ep.host_line(args.host.describe()), flush=True)
        if args.host.software:
            print("SOFTWARE DEVICE: real_ep.time_models refuses to time it")
            return 2
    only = set(args.only or ("segments", "attention", "linear"))
    dtypes = args.dtypes.split(",")
    for dtype in dtypes:
        if "attention" in only:
            models = {f: attention_chain(dtype, f.split(" [")[0], batch=1, side=64, repeat=args.repeat)
                      for f in picked(ATTENTION_FORMS, args)}
            time_group(f"global attention {dtype} (1 x 4096 tokens, 12 heads of 64)", models, args, args.repeat)
            models = {f: attention_chain(dtype, f.split(" [")[0], batch=25, side=14, repeat=2 * args.repeat)
                      for f in picked(WINDOW_FORMS, args)}
            time_group(f"windowed attention {dtype} (25 windows x 196 tokens)", models, args, 2 * args.repeat)
        if "linear" in only:
            models = {f: linear_chain(dtype, f, repeat=args.repeat) for f in picked(LINEAR_FORMS, args)}
            time_group(f"MLP products {dtype} (4096 x 768 -> 3072 -> 768)", models, args, args.repeat)
    if "segments" in only:
        work = pathlib.Path(args.work)
        work.mkdir(parents=True, exist_ok=True)
        if args.ep == "webgpu":
            from benchmarks.sam_gpu import export_vit_b

            export, extra = dmlopt.load(str(export_vit_b(work))), {}
        else:  # the dynamic-batch legacy export dml_gpu.py times
            from benchmarks.dml_host import export_vit_b

            export, extra = dmlopt.load(str(export_vit_b(work, 1024))), {"ort_version": args.host.version,
                                                                         "dims": {"batch": 1}}
        for dtype in dtypes:
            fp16 = dtype == "float16"
            t0 = time.perf_counter()
            out = dmlopt.optimize(export, target=args.ep, retime=False, validate=False, fp16=fp16,
                                  **({"fp16_repair": False} if fp16 else {}), **extra).model
            print(f"dmlopt --target {args.ep} {dtype} built in {time.perf_counter() - t0:.0f} s", flush=True)
            if args.ep == "webgpu":
                keep = dmlopt.optimize(export, target="webgpu", retime=False, validate=False, fp16=fp16,
                                       attention="keep", **({"fp16_repair": False} if fp16 else {})).model
                time_group(f"SAM ViT-B 1024 --target webgpu {dtype}, whole model",
                           {"as written": out, "present outputs named": with_present(out),
                            "as written" + SIMPLE: out, "--attention keep": keep, "as written" + CAPTURE: out,
                            "--attention keep" + CAPTURE: keep}, args, 1)
            if args.no_segments:
                continue
            segments(out, args, f"SAM ViT-B 1024, --target {args.ep} {dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
