"""window-layout: keep tokens in window layout between consecutive windowed-attention blocks.

Why: windowed attention (SAM's image encoder and other ViTDet-style backbones) cuts its
(B, H, W, C) tokens into windows before each windowed block and merges them back after it.  Between two such
blocks only per-token ops run (residual Add, LayerNorm, MLP), so the merge and the next
partition undo each other: two full-tensor Transposes (copies on DirectML), a Slice and a Pad
per pair of blocks, for nothing.

Rewrites (P: partition, ``Reshape(Transpose(Reshape(Pad?(x))))`` in any spelling; U: merge,
``Slice?(Reshape(Transpose(Reshape(y))))``; ``x_w``: x's tokens in window order):
  1. ``U(y)`` -> ``y``: the merged value is used in window layout.
  2. ``P(f(x))`` -> ``Where(mask, f(x_w), 0)`` for per-token f: Pad's zeros, exactly.
  3. ``f(U(y), x)`` -> ``f(y, P(x))`` and ``g(f(...))`` -> ``g(U(f_w(...)))``: where the
     windowed region meets a natural-layout value, one new P or U converts it.

Cases:
  1. Sites: a Transpose whose chain of views (Reshape, Squeeze, Unsqueeze, Flatten, Identity;
     passes/_layout.py's view algebra, so any spelling of the same element order matches)
     takes a (B, Hp, Wp, C) tensor to windows of (wh, ww) tokens, ``(B, nh, wh, nw, ww, C) ->
     (B, nh, nw, wh, ww, C)``, with a zero Pad at the bottom/right before it (P), or the inverse
     with a crop at the top-left corner after it (U).  Sites are grouped by their geometry
     (B, H, W, Hp, Wp, wh, ww); each group is solved alone.
  2. Per-token ops compute each token from that token alone: elementwise ops whose other
     inputs broadcast over the channel axis only, LayerNormalization/Softmax/reductions over
     the last axis, MatMul by a 2-D right operand.  Their values may live in either layout.
  3. Which values go to window layout is a minimum s-t cut (networkx) over the per-token
     values: an existing P or U costs one conversion unless its natural side is windowed; a
     natural value read by a windowed op, or a windowed value read by a natural op, costs one
     new conversion (once per value).  The smallest windowed region of least cost is taken,
     and only when it costs fewer conversions than the P and U sites it removes.
  4. Exactness: every op in the region computes each token alone, so valid tokens get the
     values they had.  Padded tokens carry values computed from padding; they reach no valid
     token (nothing in the region mixes tokens), Where puts Pad's zeros back before a
     partition's reader sees them, and U crops them.
  5. Graph outputs, values of other shapes and subgraph (If/Loop) bodies stay as they are.

Cost: the per-token ops of a merged stretch also run on the padded tokens ((Hp*Wp)/(H*W) - 1
more work there: 20% for SAM at 1024 px, 64 -> 70 tokens a side).  Option ``window_layout``:
merge | keep | auto (timed on the target with --tune; untimed: merge for DirectML and CUDA,
keep for the CPU: on an H200's CUDA EP SAM ran faster merged at every size, on 2 CPU cores a
256 px SAM, whose padding adds much MLP work, ran slower; benchmarks/attention.py, figures in
benchmarks/README.md).
"""

from __future__ import annotations

import dataclasses
import math

import networkx as nx
import numpy as np
import onnx_ir as ir
import onnxscript.rewriter.rules.common as onnxscript_rules

from dmlopt.graph import shape_inference
from dmlopt.passes._base import DmlPass, Option, apply_rules, remove_unused_nodes
from dmlopt.passes._layout import (BINARY, REDUCE, SOFTMAX, UNARY, CollapseLayoutChain, NotAView, View, const_ints,
                                   inverse, merge_contiguous, reduce_axes, static_shape, trace, transpose_count)

VIEW_OPS = ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity")
ELEMENTWISE = frozenset(UNARY + BINARY + ("Where", "PRelu", "Gelu", "Clip"))
PARTITION_PERM = [0, 1, 3, 2, 4, 5]


# ** geometry **

@dataclasses.dataclass(frozen=True)
class Window:
    """Tokens (B, H, W, .) padded to (Hp, Wp) and cut into windows of wh x ww."""

    batch: int
    height: int
    width: int
    padded_h: int
    padded_w: int
    wh: int
    ww: int

    @property
    def windows(self) -> int:
        return self.batch * (self.padded_h // self.wh) * (self.padded_w // self.ww)

    @property
    def padded(self) -> bool:
        return (self.padded_h, self.padded_w) != (self.height, self.width)

    def natural(self, channels: int) -> list[int]:
        return [self.batch, self.height, self.width, channels]

    def windowed(self, channels: int) -> list[int]:
        return [self.windows, self.wh, self.ww, channels]

    def split(self, channels: int) -> list[int]:
        """(B, nh, wh, nw, ww, C): the padded grid with window rows and columns apart."""
        return [self.batch, self.padded_h // self.wh, self.wh, self.padded_w // self.ww, self.ww, channels]

    def grouped(self, channels: int) -> list[int]:
        """(B, nh, nw, wh, ww, C): windows outermost."""
        s = self.split(channels)
        return [s[i] for i in PARTITION_PERM]

    def order(self, channels: int) -> list:
        """Element order of the windowed tokens over the padded natural tensor (row-major)."""
        return merge_contiguous(View.contiguous(self.split(channels)).transpose(PARTITION_PERM).subdims())

    def merge_order(self, channels: int) -> list:
        """Element order of the padded natural tokens over the windowed tensor."""
        view = View.contiguous(self.grouped(channels)).transpose(inverse(PARTITION_PERM))
        return merge_contiguous(view.subdims())

    def mask(self) -> np.ndarray:
        """True on real tokens, False on padding, in window layout (windows, wh, ww, 1)."""
        rows = np.arange(self.padded_h) < self.height
        cols = np.arange(self.padded_w) < self.width
        grid = np.broadcast_to((rows[:, None] & cols[None, :])[None, :, :, None],
                               (self.batch, self.padded_h, self.padded_w, 1))
        return np.ascontiguousarray(grid.reshape(self.split(1)).transpose(PARTITION_PERM)).reshape(self.windowed(1))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _windows_over(natural: list[int], grid: list[int]):
    """Every window geometry over the padded (B, Hp, Wp, C) grid whose partition moves data
    (not one window row or column: that partition is a plain Reshape)."""
    batch, height, width, channels = natural
    for wh in _divisors(grid[1]):
        for ww in _divisors(grid[2]):
            window = Window(batch, height, width, grid[1], grid[2], wh, ww)
            if len(window.order(channels)) > 1:
                yield window


def _in_order(view: View, order: list, numel: int) -> bool:
    """The view reads all `numel` elements of its base in `order`."""
    return view.offset == 0 and view.base_numel == numel and merge_contiguous(view.subdims()) == order


# ** sites **

@dataclasses.dataclass
class Partition:
    """P: ``end`` holds ``source``'s tokens in window order (zero-padded)."""

    source: ir.Value
    end: ir.Value
    window: Window
    transpose: ir.Node
    reader: ir.Node  # the chain's first node, the one that reads `source` (Pad or a view op)


@dataclasses.dataclass
class Merge:
    """U: ``end`` holds the natural tokens of ``base``, which is in window order."""

    base: ir.Value
    end: ir.Value
    window: Window
    transpose: ir.Node


def _walk_up(value: ir.Value, reader: ir.Node) -> tuple[ir.Value, ir.Node]:
    """Up through view ops whose outputs only feed the chain; (top value, the node reading it)."""
    while True:
        node = value.producer()
        if node is None or node.op_type not in VIEW_OPS or node.domain not in ("", "ai.onnx") \
                or static_shape(node.inputs[0]) is None or len(value.uses()) != 1 or value.is_graph_output():
            return value, reader
        value, reader = node.inputs[0], node


def _walk_down(value: ir.Value) -> ir.Value:
    """Down through single-use view ops and one crop Slice (at the end)."""
    while len(value.uses()) == 1 and not value.is_graph_output():
        node = value.uses()[0].node
        if node.domain not in ("", "ai.onnx") or node.op_type not in VIEW_OPS + ("Slice",) \
                or static_shape(node.outputs[0]) is None:
            return value
        value = node.outputs[0]
        if node.op_type == "Slice":
            return value
    return value


def _zero_pad_bottom_right(node: ir.Node) -> bool:
    """A constant-mode Pad of zeros at the end of axes 1 and 2 only (rank 4)."""
    if node.attributes.get_string("mode", "constant") != "constant" or len(node.inputs) < 2:
        return False
    pads = const_ints(node.inputs[1])
    if pads is None or len(pads) != 8 or any(pads[:4]) or pads[4] or pads[7] or min(pads) < 0:
        return False
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        fill = node.inputs[2].const_value
        if fill is None or np.any(fill.numpy() != 0):
            return False
    return len(node.inputs) < 4 or node.inputs[3] is None


def _crop_top_left(node: ir.Node) -> bool:
    """A Slice that keeps [0, n) on axes 1 and 2 with step 1 (what window_unpartition does)."""
    starts = const_ints(node.inputs[1])
    axes = const_ints(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
    steps = const_ints(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else None
    if starts is None or (len(node.inputs) > 3 and node.inputs[3] is not None and axes is None) \
            or (len(node.inputs) > 4 and node.inputs[4] is not None and steps is None):
        return False
    axes = [a % 4 for a in axes] if axes is not None else list(range(len(starts)))
    in_shape, out_shape = static_shape(node.inputs[0]), static_shape(node.outputs[0])
    if in_shape is None or out_shape is None:
        return False
    return all(s == 0 for s in starts) and all(s == 1 for s in steps or []) \
        and out_shape[0] == in_shape[0] and out_shape[3] == in_shape[3]


def find_sites(graph: ir.Graph, opset: int) -> tuple[list[Partition], list[Merge]]:
    """Case 1: every window partition and merge in the graph (not in subgraphs)."""
    partitions, merges = [], []
    for node in graph:
        if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
            continue
        (top, reader), bottom = _walk_up(node.inputs[0], node), _walk_down(node.outputs[0])
        site = _as_partition(node, top, reader, bottom, opset) or _as_merge(node, top, bottom, opset)
        if isinstance(site, Partition):
            partitions.append(site)
        elif isinstance(site, Merge):
            merges.append(site)
    return partitions, merges


def _as_partition(transpose: ir.Node, top: ir.Value, reader: ir.Node, bottom: ir.Value,
                  opset: int) -> Partition | None:
    padded, source = top, top
    pad = top.producer()
    if pad is not None and pad.op_type == "Pad" and pad.domain in ("", "ai.onnx"):
        if not _zero_pad_bottom_right(pad) or len(top.uses()) != 1:
            return None
        source, reader = pad.inputs[0], pad
    natural, grid = static_shape(source), static_shape(padded)
    if natural is None or grid is None or len(natural) != 4 or len(grid) != 4 or bottom.producer() is None \
            or bottom.producer().op_type == "Slice" or bottom.is_graph_output():
        return None
    window = _geometry(bottom, padded, natural, grid, Window.order, opset)
    return Partition(source, bottom, window, transpose, reader) if window is not None else None


def _as_merge(transpose: ir.Node, top: ir.Value, bottom: ir.Value, opset: int) -> Merge | None:
    crop = bottom.producer()
    cropped = crop is not None and crop.op_type == "Slice"
    if cropped and not _crop_top_left(crop):
        return None
    grid = static_shape(crop.inputs[0]) if cropped else static_shape(bottom)
    natural = static_shape(bottom)
    if grid is None or natural is None or len(grid) != 4 or len(natural) != 4 or static_shape(top) is None:
        return None
    uncropped = crop.inputs[0] if cropped else bottom
    window = _geometry(uncropped, top, natural, grid, Window.merge_order, opset)
    return Merge(top, bottom, window, transpose) if window is not None else None


def _geometry(value: ir.Value, base: ir.Value, natural: list[int], grid: list[int], order_of, opset: int
              ) -> Window | None:
    """The window geometry in whose `order_of(window, channels)` `value` reads `base`, if any."""
    try:
        _, view, _ = trace(value, stop=lambda v: v is base, opset=opset)
    except NotAView:
        return None
    numel, channels = math.prod(grid), natural[3]
    return next((w for w in _windows_over(natural, grid) if _in_order(view, order_of(w, channels), numel)), None)


# ** per-token ops (case 2) **

def _channel_only(value: ir.Value | None) -> bool:
    """Broadcasts the same against natural and windowed tokens: rank <= 4, leading dims 1."""
    if value is None:
        return True
    shape = static_shape(value)
    return shape is not None and len(shape) <= 4 and all(d == 1 for d in shape[:-1])


def token_inputs(node: ir.Node, window: Window, opset: int) -> list[int] | None:
    """Indices of the inputs that are natural tokens, if `node` is per-token for `window`."""
    if node.domain not in ("", "ai.onnx") or any(a.type == ir.AttributeType.GRAPH for a in node.attributes.values()):
        return None
    out = static_shape(node.outputs[0]) if node.outputs else None
    if out is None or out[:3] != window.natural(0)[:3] or len(out) != 4 \
            or any(o.uses() or o.is_graph_output() for o in node.outputs[1:]):
        return None
    tokens = [i for i, v in enumerate(node.inputs)
              if v is not None and (s := static_shape(v)) is not None and len(s) == 4 and s[:3] == out[:3]]
    others = [v for i, v in enumerate(node.inputs) if i not in tokens]
    op = node.op_type
    if not tokens:
        return None
    if op in ELEMENTWISE:
        return tokens if all(_channel_only(v) for v in others) else None
    if op == "MatMul":
        right = static_shape(node.inputs[1])
        return tokens if tokens == [0] and right is not None and len(right) == 2 else None
    last = {-1, 3}
    if op == "LayerNormalization":
        ok = node.attributes.get_int("axis", -1) in last and tokens == [0]
        return tokens if ok and all(_channel_only(v) for v in others) else None
    if op in SOFTMAX:
        return tokens if node.attributes.get_int("axis", -1 if opset >= 13 else 1) in last else None
    if op in REDUCE:
        keeps = node.attributes.get_int("keepdims", 1) == 1
        return tokens if keeps and tokens == [0] and reduce_axes(node, opset) == [3] else None
    return None


# ** the cut (case 3) **

@dataclasses.dataclass
class Plan:
    """One geometry's cut: which values move to window layout, and at how many conversions."""

    window: Window
    windowed: set[ir.Value]  # natural-shaped values that move to window layout
    partitions: list[Partition]
    merges: list[Merge]
    per_token: dict[ir.Node, list[int]]
    cost: int  # conversions after
    sites: int  # conversions before (the P and U sites)


def plan_group(graph: ir.Graph, window: Window, partitions: list[Partition], merges: list[Merge],
               opset: int) -> Plan:
    """Label the per-token values natural or windowed at the fewest conversions."""
    per_token = {}
    for node in graph:
        found = token_inputs(node, window, opset)
        if found is not None:
            per_token[node] = found
    part_by_source = {}
    for p in partitions:
        part_by_source.setdefault(p.source, []).append(p)
    merge_ends = {m.end for m in merges}
    g = nx.DiGraph()
    values: set[ir.Value] = set()
    for node, idx in per_token.items():
        out = node.outputs[0]
        values.add(out)
        for i in idx:
            value = node.inputs[i]
            values.add(value)
            g.add_edge(("a", value), ("v", out))  # no capacity: infinite
            g.add_edge(("v", out), ("b", value))
    values |= set(part_by_source) | merge_ends
    for value in values:
        g.add_edge(("v", value), ("a", value), capacity=1)  # a U of this value
        g.add_edge(("b", value), ("v", value), capacity=1)  # a P of this value
        producer = value.producer()
        if value in merge_ends:
            g.add_edge("s", ("v", value), capacity=1)  # the existing U, kept while natural
        elif producer not in per_token:
            g.add_edge(("v", value), "t")  # made natural: graph input, constant, other op
        if value.is_graph_output():
            g.add_edge(("v", value), "t")
        readers = {p.reader for p in part_by_source.get(value, [])}
        if readers:
            g.add_edge("s", ("b", value))  # the existing P: free once the value is windowed
        for use in value.uses():
            if not (use.node in per_token and use.idx in per_token[use.node]) and use.node not in readers:
                g.add_edge(("a", value), "t")  # read in natural layout elsewhere
    sites = len(merge_ends) + len(part_by_source)
    if "s" not in g or "t" not in g:
        return Plan(window, set(), partitions, merges, per_token, sites, sites)
    residual = nx.algorithms.flow.edmonds_karp(g, "s", "t")
    # The smallest source side: what the source still reaches in the residual graph.
    reach, stack = {"s"}, ["s"]
    while stack:
        u = stack.pop()
        for v, attr in residual[u].items():
            if v not in reach and attr["capacity"] - attr["flow"] > 0:
                reach.add(v)
                stack.append(v)
    windowed = {key[1] for key in reach if isinstance(key, tuple) and key[0] == "v"}
    return Plan(window, windowed, partitions, merges, per_token, residual.graph["flow_value"], sites)


# ** the rewrite **

class _Builder:
    """Makes the new nodes (typed and shaped, for the passes after); `flush` adds them to the
    graph, whose `sort()` puts each before its readers."""

    def __init__(self, graph: ir.Graph):
        self.graph = graph
        self.nodes: list[ir.Node] = []

    def node(self, op_type: str, inputs, attributes=None, shape=None, dtype=None) -> ir.Value:
        node = ir.node(op_type, inputs, attributes or {})
        self.nodes.append(node)
        out = node.outputs[0]
        if shape is not None:
            out.shape = ir.Shape(shape)
        out.dtype = dtype
        return out

    def ints(self, values) -> ir.Value:
        return self.node("Constant", [], {"value": ir.tensor(np.asarray(list(values), dtype=np.int64))},
                         shape=[len(values)], dtype=ir.DataType.INT64)

    def tensor(self, array: np.ndarray) -> ir.Value:
        return self.node("Constant", [], {"value": ir.tensor(array)}, shape=list(array.shape),
                         dtype=ir.tensor(array).dtype)

    def reshape(self, value: ir.Value, shape: list[int]) -> ir.Value:
        if static_shape(value) == shape:
            return value
        return self.node("Reshape", [value, self.ints(shape)], shape=shape, dtype=value.dtype)

    def partition(self, value: ir.Value, window: Window) -> ir.Value:
        channels = static_shape(value)[3]
        x = value
        if window.padded:
            pads = [0, 0, 0, 0, 0, window.padded_h - window.height, window.padded_w - window.width, 0]
            x = self.node("Pad", [x, self.ints(pads)], {"mode": "constant"},
                          shape=[window.batch, window.padded_h, window.padded_w, channels], dtype=value.dtype)
        x = self.reshape(x, window.split(channels))
        x = self.node("Transpose", [x], {"perm": PARTITION_PERM}, shape=window.grouped(channels), dtype=value.dtype)
        return self.reshape(x, window.windowed(channels))

    def merge(self, value: ir.Value, window: Window) -> ir.Value:
        channels = static_shape(value)[3]
        x = self.reshape(value, window.grouped(channels))
        x = self.node("Transpose", [x], {"perm": inverse(PARTITION_PERM)}, shape=window.split(channels),
                      dtype=value.dtype)
        x = self.reshape(x, [window.batch, window.padded_h, window.padded_w, channels])
        if window.padded:
            x = self.node("Slice", [x, self.ints([0, 0]), self.ints([window.height, window.width]),
                                    self.ints([1, 2])], shape=window.natural(channels), dtype=value.dtype)
        return x

    def flush(self) -> None:
        if self.nodes:
            self.graph.extend(self.nodes)
            self.nodes = []
        self.graph.sort()


def apply_plan(graph: ir.Graph, plan: Plan) -> None:
    """Case 3: windowed values computed in window layout, conversions where regions meet."""
    window, windowed = plan.window, plan.windowed
    build = _Builder(graph)
    # Who reads each windowed value in natural layout, fixed before any input is replaced.
    natural_uses = {}
    partitions: dict[ir.Value, list[Partition]] = {}
    for p in plan.partitions:
        if p.source in windowed:
            partitions.setdefault(p.source, []).append(p)
    for value in windowed:
        readers = {p.reader for p in partitions.get(value, [])}
        natural_uses[value] = [u for u in value.uses()
                               if not (u.node in plan.per_token and u.node.outputs[0] in windowed
                                       and u.idx in plan.per_token[u.node])
                               and u.node not in readers]
    merge_of = {m.end: m for m in plan.merges}
    window_form: dict[ir.Value, ir.Value] = {}
    converted: dict[ir.Value, ir.Value] = {}
    mask = None

    def windowed_form(value: ir.Value) -> ir.Value:
        if value in window_form:
            return window_form[value]
        if value not in converted:  # a natural value read by a windowed op: one new P
            existing = next((p for p in plan.partitions if p.source is value), None)
            converted[value] = (build.reshape(existing.end, window.windowed(static_shape(value)[3]))
                                if existing is not None else build.partition(value, window))
        return converted[value]

    for value in windowed:
        if value in merge_of:  # case 1: U(y) -> y
            window_form[value] = build.reshape(merge_of[value].base, window.windowed(static_shape(value)[3]))
    for node in list(graph):  # topological: inputs are settled before their readers
        out = node.outputs[0] if node.outputs else None
        if node not in plan.per_token or out not in windowed:
            continue
        for i in plan.per_token[node]:
            node.replace_input_with(i, windowed_form(node.inputs[i]))
        out.shape = ir.Shape(window.windowed(static_shape(out)[3]))
        window_form[out] = out
    for value in windowed:
        form = window_form[value]
        if value in partitions:  # case 2: P(x) -> Where(mask, x_w, 0)
            masked = form
            if window.padded:
                if mask is None:
                    mask = build.tensor(window.mask())
                zero = build.tensor(np.zeros((), dtype=value.dtype.numpy()))
                masked = build.node("Where", [mask, form, zero], shape=list(form.shape.dims), dtype=value.dtype)
            for p in partitions[value]:  # every window reader of this value (two attentions may share it)
                replacement = build.reshape(masked, static_shape(p.end))
                for use in list(p.end.uses()):
                    use.node.replace_input_with(use.idx, replacement)
        uses = natural_uses[value]
        if uses and value not in merge_of:  # case 3: a natural reader gets one new U
            natural = build.merge(form, window)
            for use in uses:
                use.node.replace_input_with(use.idx, natural)
    build.flush()


# ** the pass **

class WindowLayoutPass(DmlPass):
    """Keep tokens in window layout between windowed-attention blocks (fewer Transposes, Pads, Slices)."""

    name = "window-layout"
    summary = "keep tokens in window layout between windowed-attention blocks (SAM): no merge/partition pairs"
    order = 62.0
    options = (
        Option("window_layout", "auto", "keep tokens in window layout between windowed-attention blocks "
               "(merge), leave the export's merge/partition pairs (keep), or auto (time both on the target; "
               "default without the target: merge for dml and for cuda in float32, keep for cpu and for cuda "
               "in float16)",
               choices=("auto", "merge", "keep"), tunable=True,
               auto_default={"dml": "merge", "cuda": {"float32": "merge", "float16": "keep"}, "cpu": "keep"},
               auto_default_source={
                   "cuda": "measured on an H200, onnxruntime-gpu 1.31, SAM ViT-B 1024: merged is faster in "
                           "float32, and slower in float16, where the padded tokens' extra MLP work outweighs "
                           "the Transposes saved",
                   "cpu": "the padded tokens' extra MLP work outweighs the Transposes saved"}),
    )

    needs_shapes = "onnx"
    measured = "Transposes"

    def skip(self, model: ir.Model, sites) -> bool:
        return self.resolved_option("window_layout") == "keep"

    def measure(self, model: ir.Model) -> int:
        return transpose_count(model)

    def worse(self, before: int, after: int) -> str | None:
        return f"{after} Transposes where there were {before}" if after >= before else None

    def rewrite(self, model: ir.Model) -> bool:
        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 17))
        changed, done = False, set()
        while True:  # one geometry at a time; sites are found again after each rewrite
            partitions, merges = find_sites(model.graph, opset)
            pending = sorted({s.window for s in partitions + merges} - done, key=dataclasses.astuple)
            if not pending:
                break
            window = pending[0]
            done.add(window)
            changed |= self._merge(model, window, [p for p in partitions if p.window == window],
                                   [m for m in merges if m.window == window], opset)
        if not changed:
            return False
        remove_unused_nodes(model)
        tidy = [CollapseLayoutChain.rule(None, "Transpose"), CollapseLayoutChain.rule(None, "Reshape"),
                onnxscript_rules.reshape_reshape_rule]
        shape_inference.onnx_shape_inference(model)
        apply_rules(model, tidy)
        remove_unused_nodes(model)
        return True

    def _merge(self, model: ir.Model, window: Window, partitions: list[Partition], merges: list[Merge],
               opset: int) -> bool:
        """Plan and apply one geometry's cut (case 3); report its sites."""
        plan = plan_group(model.graph, window, partitions, merges, opset)
        where = f"windows {window.wh}x{window.ww} over {window.height}x{window.width} tokens"
        if plan.cost >= plan.sites or not plan.windowed:
            for site in partitions + merges:
                self.kept(site.transpose, f"{where}: merging would not save a conversion ({plan.sites} -> {plan.cost})")
            return False
        merged = [s for s in partitions if s.source in plan.windowed] + [s for s in merges if s.end in plan.windowed]
        apply_plan(model.graph, plan)
        for site in merged:
            kind = "partition" if isinstance(site, Partition) else "merge"
            self.rewrote(site.transpose, f"{where}: {kind} absorbed ({plan.sites} conversions -> {plan.cost})")
        padded = window.padded_h * window.padded_w - window.height * window.width
        self.note(f"{where}: {len(plan.windowed)} values kept in window layout, conversions {plan.sites} -> "
                  f"{plan.cost}" + (f"; per-token ops there also run on {padded} padded tokens" if padded else ""))
        return True
