"""einsum: lower Einsum into Reshape/Transpose/MatMul/ReduceSum where the target cannot run it.

SAM's relative-position terms are ``bhwc,hkc->bhwk`` and ``bhwc,wkc->bhwk``; before ORT
1.19 DirectML ran Einsum only for a fixed table of forms, so these fell back to the CPU with a
pair of large copies each.  MatMul runs everywhere, and the lowering is exact (the same
products, summed by a GEMM).

Rewrites:
  1. ``Einsum(a; "ij->ji")``            -> ``Transpose(a)``  (one operand, a permutation)
  2. ``Einsum(a; "ijk->ki")``           -> ``Transpose(ReduceSum(a, j))``  (one operand, sums)
  3. ``Einsum(a, b)``                   -> ``Transpose?(Reshape?(MatMul(Reshape?(Transpose?(ReduceSum?(a))),
                                           Reshape?(Transpose?(ReduceSum?(b))))))``
     Labels are classed per pair: batch (both operands and the output), contracted (both,
     not the output), free (one operand and the output), summed (one operand only: reduced
     first).  A free label may also ride in MatMul's batch region, broadcast against a 1 in
     the other operand; that is how ``bhwc,hkc->bhwk`` becomes ``MatMul(a, hck-weight)``
     with no Transpose at all.  Among the layouts the one with the fewest Transposes of
     non-constant tensors wins (option ``einsum_layout=fewest-transposes``), or the one whose
     MatMul is a real matrix product rather than a batch of vector products
     (``largest-matmul``; e.g. ``bhwc,wkc->bhwk`` is then two Transposes around a GEMM), or
     per contraction by the size of its result (``by-size``: up to ``SMALL_CONTRACTION``
     elements, fewest Transposes; above, the GEMM).
     A layout whose MatMul is a batch of 1x1 dot products is taken only when no other is
     possible.  Transposes and sums of constant operands are folded into new initializers.
  4. Three or more operands are contracted left to right, two at a time.
  5. Size-1 broadcasting (a label of size 1 in one operand): the label is dropped from that
     operand, and summed in the other when it is contracted, as numpy does.
  6. Ellipsis: expanded into one label per dimension, right-aligned, when ranks are known.
  7. Symbolic dims: Reshape targets are constants when static, else 0 / -1 entries, else
     built at run time from Shape (rare: two merged symbolic dims).

Declined with a reason: repeated labels inside one operand (diagonals), an ellipsis of
unknown rank, element types MatMul does not take; kept: equations the target runs itself
(DirectML ORT <= 1.18: the pattern table of dmlopt.einsum_support, e.g. ``bij,bjk->bik``).

Targets (option ``einsum``: lower | keep | auto; measured by benchmarks/attention.py on SAM
ViT-B's rel-pos shapes, figures in benchmarks/README.md):
  - DirectML: ``lower``.  Before ORT 1.19 what is not in DirectML's table would run on the
    CPU; from 1.19 (and with no version given) every form MatMul expresses is lowered too.
  - CPU: ``lower``: a block's two rel-pos Einsums ran faster lowered than through ORT's CPU
    Einsum in global blocks and as fast in windowed ones.
  - CUDA: ``keep``: ORT's CUDA Einsum beat every MatMul form on an H200.
  ``keep`` leaves every Einsum (the report says which ones the target runs on the CPU).
  Layout default ``largest-matmul`` (CUDA, CPU): on the H200 the transpose-free batch of
  vector products ran several times slower than Transposes around a GEMM (on the CPU the two
  were within noise).  DirectML: ``by-size``, vector products only for contractions of at most
  ``SMALL_CONTRACTION`` elements, where ops, not bytes, cost (each Transpose is a copy in
  DirectML's compiled graph); ``--tune`` measures all three on the target.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
from typing import Sequence, Union

import numpy as np
import onnx_ir as ir

from onnxscript.rewriter import pattern

from dmlopt.targets.dml.einsum_support import GENERIC_SINCE, EquationError, einsum_supported, parse_equation
from dmlopt.passes._base import DmlPass, Option, SiteRule, apply_rules, remove_unused_nodes
from dmlopt.passes._shared import Decline, constant_array
from dmlopt.target import DEFAULT_TARGET

Dim = Union[int, str, None]  # static size, symbolic name, unknown

MATMUL_TYPES = {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE, ir.DataType.BFLOAT16,
                ir.DataType.INT32, ir.DataType.INT64, ir.DataType.UINT32, ir.DataType.UINT64}
# Constant operands folded (transposed/summed) into a new initializer up to this size when
# something else also reads the original (otherwise always: the original goes away).
SHARED_FOLD_LIMIT = 1 << 20
# Beyond this many batch-region labels, only the three natural orders are tried.
MAX_PERMUTED_BATCH = 5
LAYOUTS = ("fewest-transposes", "largest-matmul", "by-size")
# by-size: a lowered contraction whose result has at most this many elements takes the
# fewest-transposes layout (there the cost is the number of ops, and a Transpose is one),
# larger ones the GEMM.  Measured on an H200, whole SAM encoders with attention fused and
# window layout kept (benchmarks/attention.py --ep cuda): rel-pos results of 1.5K elements
# (64 px SAM) ran 3% faster as vector products, 18K-25K (256 px) 6% slower, 300K-400K
# (ViT-B at 512 px) 42% slower, 0.8M-3M (ViT-B at 1024 px) 47% slower.
SMALL_CONTRACTION = 1 << 12


# ** the plan: which labels go where **

@dataclasses.dataclass
class Operand:
    """One Einsum operand (or an intermediate) as labels over axes."""

    labels: list[str]
    const: np.ndarray | None = None  # its value when constant
    value: ir.Value | None = None


@dataclasses.dataclass
class PairLayout:
    """How one two-operand step maps onto MatMul(left, right)."""

    left: int  # index (0 or 1) of the operand that goes left
    batch: list[str]  # MatMul's batch region, outermost first
    m: list[str]
    k: list[str]
    n: list[str]
    cost: tuple


def label_sizes(labels_per_input: Sequence[Sequence[str]], shapes: Sequence[Sequence[Dim]]) -> dict[str, Dim]:
    """Size of each label over all operands (case 5: a size-1 axis broadcasts against the others)."""
    sizes: dict[str, Dim] = {}
    for labels, shape in zip(labels_per_input, shapes):
        for label, dim in zip(labels, shape):
            sizes[label] = _merge_dim(label, sizes[label], dim) if label in sizes else dim
    return sizes


def _merge_dim(label: str, old: Dim, new: Dim) -> Dim:
    if old == new:
        return old
    if isinstance(old, int) and isinstance(new, int):
        if 1 in (old, new):
            return max(old, new)  # a 1 broadcasts
        raise Decline(f"label {label!r} has sizes {old} and {new}")
    if isinstance(old, int) or isinstance(new, int):
        static, other = (old, new) if isinstance(old, int) else (new, old)
        return static if static != 1 else other  # a static size wins, unless it is a broadcast 1
    return old if old is not None else new  # symbolic names: assumed equal


def expand_ellipsis(terms: Sequence[str], output: str,
                    ranks: Sequence[int | None]) -> tuple[list[list[str]], list[str]]:
    """Replace '.' by fresh labels, one per dimension, right-aligned across operands."""
    used = {c for t in terms for c in t if c != "."}
    widths = []
    for term, rank in zip(terms, ranks):
        if "." not in term:
            if rank is not None and rank != len(term):
                raise Decline(f"operand of rank {rank} for term {term!r}")
            widths.append(0)
            continue
        if rank is None:
            raise Decline("ellipsis over an operand of unknown rank")
        widths.append(rank - (len(term) - 1))
        if widths[-1] < 0:
            raise Decline(f"operand of rank {rank} for term {term!r}")
    width = max(widths, default=0)
    fresh = [f"...{i}" for i in range(width)]
    assert not used & set(fresh)

    def expand(term: str, w: int) -> list[str]:
        out = []
        for c in term:
            out.extend(fresh[width - w:] if c == "." else [c])
        return out

    return [expand(t, w) for t, w in zip(terms, widths)], expand(output, width)


def drop_broadcast_labels(labels: list[list[str]], shapes: list[list[Dim]], sizes: dict[str, Dim]) -> list[list[int]]:
    """Axes of size 1 whose label is larger elsewhere: removed from that operand (case 5)."""
    dropped = []
    for lab, shape in zip(labels, shapes):
        dropped.append([i for i, (l, d) in enumerate(zip(lab, shape)) if d == 1 and sizes[l] != 1])
    return dropped


def choose_pair_layout(a: Operand, b: Operand, out: Sequence[str], sizes: dict[str, Dim], layout: str) -> PairLayout:
    """Pick batch/M/K/N regions and their orders for MatMul(left, right) (case 3)."""
    if layout == "by-size":
        elements = _product(sizes, out)
        layout = LAYOUTS[0] if elements is not None and elements <= SMALL_CONTRACTION else LAYOUTS[1]
    best = None
    out_set = set(out)
    for left in (0, 1):
        lhs, rhs = (a, b) if left == 0 else (b, a)
        ls, rs = set(lhs.labels), set(rhs.labels)
        batch = [x for x in out if x in ls and x in rs]
        contract = [x for x in lhs.labels if x in rs and x not in out_set]
        free_l = [x for x in out if x in ls and x not in rs]
        free_r = [x for x in out if x in rs and x not in ls]
        for moved_l in _subsets(free_l):
            for moved_r in _subsets(free_r):
                region = set(batch) | set(moved_l) | set(moved_r)
                m_set = [x for x in free_l if x not in moved_l]
                n_set = [x for x in free_r if x not in moved_r]
                for order in _batch_orders(region, lhs.labels, rhs.labels, out):
                    for m in _orders(m_set, lhs.labels, out):
                        for n in _orders(n_set, rhs.labels, out):
                            for k in _orders(contract, lhs.labels, rhs.labels):
                                cost = _cost(lhs, rhs, out, order, m, k, n, sizes, layout, moved_l + moved_r)
                                if best is None or cost < best.cost:
                                    best = PairLayout(left, order, m, k, n, cost)
    assert best is not None
    return best


def _subsets(items: Sequence[str]):
    for r in range(len(items) + 1):
        yield from (list(c) for c in itertools.combinations(items, r))


def _restricted(order: Sequence[str], keep) -> list[str]:
    return [x for x in order if x in keep]


def _orders(labels: Sequence[str], *sources: Sequence[str]):
    """Orders of `labels` worth trying: as they appear in each source."""
    seen = set()
    for src in sources:
        order = tuple(_restricted(src, set(labels)))
        if len(order) == len(labels) and order not in seen:
            seen.add(order)
            yield list(order)


def _batch_orders(region: set[str], left: Sequence[str], right: Sequence[str], out: Sequence[str]):
    if len(region) <= MAX_PERMUTED_BATCH:
        yield from (list(p) for p in itertools.permutations(sorted(region, key=list(out).index)))
        return
    yield from _orders(list(region), out)
    for first, second in ((left, right), (right, left)):
        order = _restricted(first, region)
        order += [x for x in _restricted(second, region) if x not in order]
        order += [x for x in out if x in region and x not in order]
        yield order


def _cost(lhs: Operand, rhs: Operand, out, batch, m, k, n, sizes, layout, moved) -> tuple:
    """Sort key of a layout: Transposes of non-constant tensors, vector products, node count."""
    l_target = _restricted(batch, set(lhs.labels)) + m + k
    r_target = _restricted(batch, set(rhs.labels)) + k + n
    transposes = 0
    const_transposes = 0
    for operand, target in ((lhs, l_target), (rhs, r_target)):
        if operand.labels != target:
            if operand.const is not None:
                const_transposes += 1
            else:
                transposes += 1
    if batch + m + n != list(out):
        transposes += 1
    rows, cols = _product(sizes, m), _product(sizes, n)
    vector_product = rows == 1 or cols == 1
    dot_products = rows == 1 and cols == 1  # a batch of 1x1 results: never worth a saved Transpose
    l_groups, r_groups, mm_groups = matmul_groups(batch, m, k, n, l_target, r_target, sizes)
    reshapes = sum(_needs_reshape(g) for g in (l_groups, r_groups, mm_groups))
    rank = len(mm_groups)
    if layout == "largest-matmul":
        return (dot_products, vector_product, transposes, reshapes, len(moved), rank, const_transposes)
    return (dot_products, transposes, vector_product, reshapes, len(moved), rank, const_transposes)


def matmul_groups(batch, m, k, n, left: Sequence[str], right: Sequence[str], sizes):
    """Axes (as label groups) of MatMul's two inputs and its output for a layout.

    Batch groups an operand lacks become 1s, except leading ones: MatMul broadcasts
    right-aligned, so those need no Reshape.
    """
    groups = _batch_groups(batch, left, right, sizes)

    def side(labels, tail):
        own = [[x for x in g if x in labels] for g in groups]
        while own and not own[0]:
            own.pop(0)
        return own + tail

    return side(set(left), [list(m), list(k)]), side(set(right), [list(k), list(n)]), groups + [list(m), list(n)]


def _needs_reshape(groups: Sequence[Sequence[str]]) -> bool:
    return not all(len(g) == 1 for g in groups)


def _product(sizes: dict[str, Dim], labels: Sequence[str]) -> int | None:
    """Product of static sizes; None when one is not static (assumed large)."""
    total = 1
    for x in labels:
        if not isinstance(sizes[x], int):
            return None
        total *= sizes[x]
    return total


def _batch_groups(batch: Sequence[str], left: Sequence[str], right: Sequence[str], sizes) -> list[list[str]]:
    """Consecutive batch labels with the same presence (both/left/right) and static sizes merge."""
    groups: list[list[str]] = []
    key_prev = None
    for x in batch:
        key = (x in left, x in right)
        static = isinstance(sizes[x], int)
        if groups and key == key_prev and static and all(isinstance(sizes[y], int) for y in groups[-1]):
            groups[-1].append(x)
        else:
            groups.append([x])
        key_prev = key
    return groups


# ** emitting nodes **

class Emitter:
    """Builds the lowered nodes with the rewriter's op builder; folds constant operands."""

    def __init__(self, op, opset: int, sizes: dict[str, Dim], dim_sources: dict[str, tuple[ir.Value, int]],
                 graph: ir.Graph, name: str):
        self.op = op
        self.opset = opset
        self.sizes = sizes
        self.dim_sources = dim_sources
        self.graph = graph
        self.name = name
        self._taken: set[str] = set()

    def ints(self, values: Sequence[int]) -> ir.Value:
        """A 1-D int64 Constant (shape vectors, axes); empty for a scalar's shape."""
        return self.op.Constant(value=ir.tensor(np.asarray(values, dtype=np.int64)))

    def materialize(self, x: Operand) -> ir.Value:
        """The operand as a graph value: a new initializer when it is a folded constant."""
        if x.value is None:
            assert x.const is not None
            name = unique_initializer_name(self.graph, f"{self.name}_folded", self._taken)
            x.value = self.op.initializer(ir.tensor(np.array(x.const, order="C")), name=name)
        return x.value

    def reduce_sum(self, x: Operand, labels: Sequence[str]) -> Operand:
        axes = [i for i, l in enumerate(x.labels) if l in labels]
        if not axes:
            return x
        rest = [l for l in x.labels if l not in labels]
        if x.const is not None:
            return Operand(rest, np.asarray(np.sum(x.const, axis=tuple(axes)), dtype=x.const.dtype))
        if self.opset >= 13:
            value = self.op.ReduceSum(x.value, self.ints(axes), keepdims=0)
        else:
            value = self.op.ReduceSum(x.value, axes=axes, keepdims=0)
        return Operand(rest, value=value)

    def squeeze(self, x: Operand, axes: Sequence[int]) -> Operand:
        if not axes:
            return x
        rest = [l for i, l in enumerate(x.labels) if i not in axes]
        if x.const is not None:
            return Operand(rest, np.squeeze(x.const, axis=tuple(axes)))
        if self.opset >= 13:
            value = self.op.Squeeze(x.value, self.ints(list(axes)))
        else:
            value = self.op.Squeeze(x.value, axes=list(axes))
        return Operand(rest, value=value)

    def transpose(self, x: Operand, target: Sequence[str]) -> Operand:
        if list(target) == x.labels:
            return x
        perm = [x.labels.index(l) for l in target]
        if x.const is not None:
            return Operand(list(target), np.transpose(x.const, perm))
        return Operand(list(target), value=self.op.Transpose(x.value, perm=perm))

    def reshape(self, x: Operand, groups: Sequence[Sequence[str]]) -> ir.Value:
        """Reshape `x` so that each group of labels (in order) becomes one axis (empty: size 1)."""
        flat = [l for g in groups for l in g]
        assert flat == x.labels, (flat, x.labels)
        if not _needs_reshape(groups):
            return self.materialize(x)
        if x.const is not None:
            shape = [math.prod(x.const.shape[x.labels.index(l)] for l in g) for g in groups]
            return self.materialize(Operand(x.labels, x.const.reshape(shape)))
        return self.op.Reshape(self.materialize(x), self.shape_vector(groups, x.labels))

    def shape_vector(self, groups: Sequence[Sequence[str]], current: Sequence[str]) -> ir.Value:
        """A Reshape target: constant if static, else with 0/-1, else built from Shape (case 7)."""
        entries: list[int | None] = []
        for i, g in enumerate(groups):
            size = _product(self.sizes, g)
            entries.append(size)
        unknown = [i for i, e in enumerate(entries) if e is None]
        # 0 copies the input's dim at the same index: valid where the group is that one label.
        for i in list(unknown):
            if len(groups[i]) == 1 and i < len(current) and current[i] == groups[i][0]:
                entries[i] = 0
                unknown.remove(i)
        if len(unknown) == 1:
            entries[unknown[0]] = -1
            unknown = []
        if not unknown:
            return self.ints([int(e) for e in entries])
        parts = []
        for g, e in zip(groups, entries):
            if e is not None:
                parts.append(self.ints([int(e)]))
            else:
                parts.append(self.runtime_size(g))
        return self.op.Concat(*parts, axis=0)

    def runtime_size(self, labels: Sequence[str]) -> ir.Value:
        """[prod of the labels' sizes] as a 1-element int64 tensor, read from the operands' shapes."""
        pieces = []
        static = 1
        for l in labels:
            size = self.sizes[l]
            if isinstance(size, int):
                static *= size
                continue
            source, axis = self.dim_sources[l]
            if self.opset >= 15:
                pieces.append(self.op.Shape(source, start=axis, end=axis + 1))
            else:
                pieces.append(self.op.Gather(self.op.Shape(source), self.ints([axis]), axis=0))
        if static != 1:
            pieces.append(self.ints([static]))
        total = pieces[0]
        for p in pieces[1:]:
            total = self.op.Mul(total, p)
        return total


def lower_pair(em: Emitter, a: Operand, b: Operand, out: Sequence[str], layout: str) -> Operand:
    """MatMul form of a two-operand contraction whose result has labels `out` (case 3)."""
    keep = set(out)
    a = em.reduce_sum(a, [l for l in a.labels if l not in keep and l not in b.labels])
    b = em.reduce_sum(b, [l for l in b.labels if l not in keep and l not in a.labels])
    plan = choose_pair_layout(a, b, out, em.sizes, layout)
    lhs, rhs = (a, b) if plan.left == 0 else (b, a)
    lhs = em.transpose(lhs, _restricted(plan.batch, set(lhs.labels)) + plan.m + plan.k)
    rhs = em.transpose(rhs, _restricted(plan.batch, set(rhs.labels)) + plan.k + plan.n)
    l_groups, r_groups, mm_groups = matmul_groups(plan.batch, plan.m, plan.k, plan.n, lhs.labels, rhs.labels,
                                                  em.sizes)
    product = em.op.MatMul(em.reshape(lhs, l_groups), em.reshape(rhs, r_groups))
    produced = plan.batch + plan.m + plan.n
    result = Operand(produced, value=product)
    if _needs_reshape(mm_groups):
        out_groups = [[x] for x in produced]
        result = Operand(produced, value=em.op.Reshape(product, em.shape_vector(out_groups, _flat_axes(mm_groups))))
    return em.transpose(result, list(out))


def _flat_axes(groups: Sequence[Sequence[str]]) -> list[str]:
    """Axis labels of a grouped tensor for the 0-copy test: a group's label only if it is alone."""
    return [g[0] if len(g) == 1 else "" for g in groups]


def lower(em: Emitter, operands: list[Operand], out: list[str], layout: str) -> ir.Value:
    """Lower an expanded equation over `operands` to nodes; return the output value."""
    if len(operands) == 1:
        (x,) = operands
        x = em.reduce_sum(x, [l for l in x.labels if l not in out])
        x = em.transpose(x, out)
        if x is operands[0]:
            return em.op.Identity(em.materialize(x))  # "ij->ij"
        return em.materialize(x)
    acc = operands[0]
    for i in range(1, len(operands)):
        later = {l for o in operands[i + 1:] for l in o.labels} | set(out)
        if i == len(operands) - 1:
            target = list(out)
        else:
            target = [l for l in dict.fromkeys(acc.labels + operands[i].labels) if l in later]
        acc = lower_pair(em, acc, operands[i], target, layout)
    return em.materialize(acc)


# ** the rule and the pass **

def _dims(value: ir.Value) -> list[Dim] | None:
    if value.shape is None:
        return None
    dims: list[Dim] = []
    for d in value.shape.dims:
        if isinstance(d, int):
            dims.append(d)
        else:
            dims.append(d.value if getattr(d, "value", None) else None)
    return dims


class LowerEinsum(SiteRule):
    """``Einsum(...)`` -> ``Reshape/Transpose/MatMul/ReduceSum`` (cases 1-7 of the module)."""

    def __init__(self, owner: EinsumPass | None = None):
        super().__init__(owner, name="LowerEinsum")
        self._job = None

    def pattern(self, op, x):
        return op.Einsum(x, _allow_other_inputs=True, _outputs=["out"])

    def check(self, context, x, out, **_):
        node = out.producer()
        equation = node.attributes.get_string("equation", "")
        owner = self.owner
        resolved = owner.context.target if owner else DEFAULT_TARGET
        target, ort_version = resolved.ep, resolved.ort_version
        inputs = list(node.inputs)
        if target == "dml" and resolved.older_than(GENERIC_SINCE) \
                and einsum_supported(equation, len(inputs), ort_version):
            if owner:
                owner.kept(node, f"{equation!r} is in DirectML's Einsum table for ORT {ort_version}")
            return self.decline(None, "supported by the target")
        if owner and owner.resolved_option("einsum") == "keep":
            owner.kept(node, f"{equation!r}: --einsum keep" + (
                "" if _runs_it(target, equation, len(inputs), ort_version) else
                " (the target runs this form on the CPU)"))
            return self.decline(None, "kept")
        try:
            self._job = self._plan(node, equation, inputs)
        except (Decline, EquationError) as e:
            return self.decline(node, f"{equation!r}: {e}")
        # The model's opset: a subgraph (If/Loop body) usually declares none of its own.
        self._opset = context.model.opset_imports.get("", 17)
        return pattern.MatchResult()

    def _plan(self, node: ir.Node, equation: str, inputs: list[ir.Value]):
        if any(v is None for v in inputs):
            raise Decline("missing operand")
        dtype = inputs[0].dtype
        if dtype not in MATMUL_TYPES:
            raise Decline(f"element type {dtype} is not one MatMul takes")
        eq = parse_equation(equation)
        if len(eq.inputs) != len(inputs):
            raise Decline(f"{len(eq.inputs)} terms for {len(inputs)} operands")
        shapes = [_dims(v) for v in inputs]
        ranks = [len(s) if s is not None else None for s in shapes]
        labels, out = expand_ellipsis(eq.inputs, eq.output, ranks)
        for term in labels:
            repeated = sorted({l for l in term if term.count(l) > 1})
            if repeated:
                raise Decline(f"label {repeated[0]!r} repeats within one operand (a diagonal)")
        shapes = [s if s is not None else [None] * len(l) for s, l in zip(shapes, labels)]
        sizes = label_sizes(labels, shapes)
        dropped = drop_broadcast_labels(labels, shapes, sizes)
        sources: dict[str, tuple[ir.Value, int]] = {}
        for value, lab, shape, drop in zip(inputs, labels, shapes, dropped):
            for axis, (l, d) in enumerate(zip(lab, shape)):
                if axis not in drop and l not in sources:
                    sources[l] = (value, axis)
        return labels, out, sizes, dropped, sources

    def rewrite(self, op, x, out, **_):
        node = out.producer()
        labels, out_labels, sizes, dropped, sources = self._job
        _correct_output_shape(out, [sizes[l] for l in out_labels])
        opset = self._opset
        layout = self.owner.resolved_option("einsum_layout") if self.owner else LAYOUTS[1]
        em = Emitter(op, opset, sizes, sources, node.graph, node.name or "einsum")
        operands = []
        for value, lab, drop in zip(node.inputs, labels, dropped):
            const = constant_array(value)
            if const is not None and len(value.uses()) > 1 and const.size > SHARED_FOLD_LIMIT:
                const = None  # shared and large: a copy would grow the model
            operands.append(em.squeeze(Operand(list(lab), const=const, value=value), drop))
        result = lower(em, operands, out_labels, layout)
        emitted = collections.Counter(n.op_type for n in op.nodes if n.op_type != "Constant")
        equation = node.attributes.get_string("equation", "")
        self.accepted(node, f"{equation!r} -> " + ", ".join(
            f"{t}" + (f" x{c}" if c > 1 else "") for t, c in sorted(emitted.items())) + f" ({layout})")
        return result


def unique_initializer_name(graph: ir.Graph, base: str, taken: set[str]) -> str:
    """A name no initializer of `graph` (nor one made in this rewrite) has: the rewriter would
    otherwise replace the existing initializer of that name."""
    for i in itertools.count():
        name = f"{base}{i}"
        if name not in graph.initializers and name not in taken:
            taken.add(name)
            return name
    raise AssertionError("unreachable")


def _correct_output_shape(out: ir.Value, dims: list[Dim]) -> None:
    """ONNX's Einsum shape inference sizes a broadcast label from the first operand (a 1);
    the replacement inherits the old output's shape, so a wrong static size is fixed here."""
    if out.shape is None or len(out.shape) != len(dims):
        return
    if any(isinstance(old, int) and old != new and (isinstance(new, int) or old == 1)
           for old, new in zip(out.shape.dims, dims)):
        out.shape = ir.Shape([d if isinstance(d, int) else ir.SymbolicDim(d) for d in dims])


def _runs_it(target: str, equation: str, n_inputs: int, ort_version: str | None) -> bool:
    """Whether the target's EP runs this Einsum on the device (CPU and CUDA run every form)."""
    if target != "dml":
        return True
    return einsum_supported(equation, n_inputs, ort_version)


class EinsumPass(DmlPass):
    """Lower Einsum to MatMul form where the target cannot run it (all expressible by default)."""

    name = "einsum"
    summary = "lower Einsum to Reshape/Transpose/MatMul/ReduceSum (DirectML before ORT 1.19 ran few forms)"
    order = 40.0
    options = (
        Option("einsum", "auto", "lower the Einsums MatMul can express (for DirectML before ORT 1.19: those "
               "outside its table), or keep them all",
               choices=("auto", "lower", "keep"), tunable=True,
               # webgpu: its Einsum is one generic per-element loop shader with no GEMM path (math/einsum.cc)
               auto_default={"dml": "lower", "cuda": "keep", "cpu": "lower", "webgpu": "lower"}),
        Option("einsum_layout", "auto", "layout of lowered Einsums: a real GEMM with Transposes around it, "
               "no Transpose and a batch of vector products, or by-size (vector products for small ones)",
               choices=("auto", *LAYOUTS), tunable=True,
               # webgpu: its MatMul is a tiled GEMM shader; vector products would not use it
               auto_default={"dml": "by-size", "cuda": "largest-matmul", "cpu": "largest-matmul",
                             "webgpu": "largest-matmul"}),
    )

    needs_shapes = "onnx"

    def find_sites(self, model: ir.Model) -> list[ir.Node]:
        return [n for n in ir.traversal.RecursiveGraphIterator(model.graph)
                if n.op_type == "Einsum" and n.domain in ("", "ai.onnx")]

    def rewrite(self, model: ir.Model) -> bool:
        count = apply_rules(model, [LowerEinsum.rule(self)])
        if count:
            remove_unused_nodes(model)
        return count > 0
