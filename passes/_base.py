"""What every dmlopt pass shares: its options, its context and its site log.

A dmlopt pass is an ``onnx_ir.passes.InPlacePass``.  On top of the onnx_ir contract it
declares ``name`` (the CLI name), ``summary`` (one line for ``dmlopt passes``) and
``options`` (each becomes ``--flag`` on ``dmlopt optimize`` and a keyword of
``dmlopt.optimize``).  While it runs it logs every site it looked at, rewritten or
declined with a reason, so the report can say what changed and why not.

Its ``call`` is a template, so every pass runs the same prologue in the same order:
find the sites (none: the model is left as it is), the steps the pass declares (node
names, one shape-inference route, fresh names), the pass's own ``rewrite``, and, where
the pass measures something, undo-if-worse.  onnx_ir's ``requires``/``ensures`` hooks
run around it as they do for any onnx_ir pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, ClassVar, Iterator, Mapping, Sequence

import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript.rewriter import pattern

from dmlopt.graph import shape_inference
from dmlopt.passes import _opset
from dmlopt.passes._options import Option, OptionStore, PassOptions
from dmlopt.target import DEFAULT_TARGET, Target


PRECISIONS = ("float32", "float16")  # what a pipeline may write the model in


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    """The pipeline's own settings, kept apart from the pass options (a pass never declares them)."""

    tune: bool = False  # --tune: measure every tunable option left unset, not only those set to "auto"
    # Asks the target's EP whether it computes a fused node right at a site's shapes: (op type, site
    # description) -> a decline reason or None.  The engine gives one where the EP runs here (WebGPU:
    # dmlopt.targets.webgpu.kernels.check), so a pass declines a fusion the EP computes wrongly
    # without running ONNX Runtime itself.
    kernel_check: Callable[[str, Mapping[str, Any]], str | None] | None = None
    # Times tuning's candidates where the target's provider is not in this process: a DirectML host
    # whose device is a GPU (dmlopt.targets.dml.real_ep.timer), called as bench.compare is.
    timer: Callable[..., dict[str, Any]] | None = None


@dataclasses.dataclass
class PassContext:
    """What a pass may know about the job: the resolved target, the precision written, the options.

    `target` is a `dmlopt.target.Target`, resolved once by `dmlopt.optimize`.  With no
    arguments (a pass run alone) it is DEFAULT_TARGET: DirectML on the newest DirectML table.
    A test may give ``target="cuda", ort_version="1.18"`` instead: they are resolved here.
    `precision`: the element type the pipeline writes the model in ("float16" when the fp16 pass
    converts it), decided by the engine, so a pass whose best form depends on it need not look
    at another pass's option.  `options`: an `OptionStore` (the user's settings and the engine's
    choices, by pass name); a pass reads its own through `DmlPass.option`.  A mapping of values by
    option name stands for a store for a pass run alone.  `engine`: the pipeline's own settings.
    """

    target: Target | str = DEFAULT_TARGET
    ort_version: dataclasses.InitVar[str | None] = None  # with a str target only
    shapes: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    dims: dict[str, int] = dataclasses.field(default_factory=dict)
    options: OptionStore | Mapping[str, Any] = dataclasses.field(default_factory=OptionStore)
    engine: EngineSettings = EngineSettings()
    precision: str = "float32"

    def __post_init__(self, ort_version: str | None) -> None:
        if isinstance(self.target, str):
            self.target = Target.resolve(self.target, ort_version)
        elif ort_version is not None and ort_version != self.target.asked:
            raise ValueError("PassContext: ort_version goes with a str target; a Target carries its own")
        if not isinstance(self.options, OptionStore):
            self.options = OptionStore.of_names(self.options)
        if self.precision not in PRECISIONS:
            raise ValueError(f"PassContext: precision {self.precision!r} is not one of {', '.join(PRECISIONS)}")


@dataclasses.dataclass
class Site:
    """One place in the graph a pass looked at."""

    pass_name: str
    node: str
    op: str
    action: str  # "rewrote" | "declined" | "kept"
    detail: str
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = {"node": self.node, "op": self.op, "action": self.action, "detail": self.detail}
        d.update(self.extra)
        return d


class DmlPass(ir.passes.InPlacePass):
    """Base class of dmlopt passes (in place: the pipeline clones the input once)."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    options: ClassVar[tuple[Option, ...]] = ()
    # Position in the default pipeline (lower runs first).
    order: ClassVar[float] = 50.0
    # The prologue steps `call` runs before `rewrite` (see `prepare`):
    # which nodes must have names for the site log: "none", "sites" (when a site has none) or "all";
    needs_names: ClassVar[str] = "none"
    # one shape-inference route: "none"; "types" (dmlopt.graph.shape_inference.infer_shapes, data propagation on);
    # "onnx" (onnx_ir's ShapeInferencePass, non-strict) or "onnx-strict" (strict mode);
    needs_shapes: ClassVar[str] = "none"
    # and `self.fresh`, a source of names unused in the model, for the values a rewrite adds.
    needs_fresh_names: ClassVar[bool] = False

    def __init__(self, context: PassContext | None = None):
        super().__init__()
        self.context = context or PassContext()
        self.sites: list[Site] = []
        self.notes: list[str] = []
        self._seen: set[tuple[str, str, str]] = set()
        self.own_options: PassOptions = self.context.options.of(type(self))  # its own, no other pass's

    # -- settings -----------------------------------------------------------
    def option(self, name: str) -> Any:
        return self.own_options[name]

    def option_values(self) -> dict[str, Any]:
        """This pass's own options and their values (defaults where unset); no other pass's."""
        return self.own_options.values()

    def resolved_option(self, name: str) -> Any:
        """The option's value, with an 'auto' left unresolved (the pass run outside the pipeline,
        which resolves it through dmlopt.engine.tune) replaced by the target's documented default."""
        value = self.option(name)
        if value != "auto":
            return value
        opt = self.own_options.option(name)
        ep, precision = self.context.target.ep, self.context.precision
        value = opt.default_for(ep, precision)
        self.note(f"{name}=auto without tuning: {opt.default_provenance(ep, precision)}, {value}")
        return value

    def enabled(self) -> bool:
        """Whether the pass has anything to do under this context (fp16 only when asked)."""
        return True

    def changes_interface_types(self) -> bool:
        """Whether this run may change the element types of the graph's inputs and outputs
        (fp16 without keep_io_types, on request); names and order never change."""
        return False

    # -- the template -----------------------------------------------------------
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        """Sites? -> skip? -> prologue -> rewrite -> undo if worse (onnx_ir runs requires/ensures around it)."""
        sites = self.find_sites(model)
        if sites is not None and not sites:
            return ir.passes.PassResult(model, False)
        if self.skip(model, sites):
            return ir.passes.PassResult(model, False)
        self.prepare(model, sites)
        before = self.measure(model)
        nodes_before = {node for node, _ in _opset.nodes_with_opsets(model)}  # held: no id is reused
        opsets_before = dict(model.opset_imports)
        backup = model.clone()
        modified = self.rewrite(model)
        if modified and self._writes_what_opset_lacks(model, backup, nodes_before, opsets_before):
            restore(model, backup)
            return ir.passes.PassResult(model, False)
        if modified:
            initializers_as_inputs_before_ir4(model)
        if modified and before is not None:
            after = self.measure(model)
            why = self.worse(before, after)
            if why:
                restore(model, backup)
                self.sites = [s for s in self.sites if s.action != "rewrote"]
                self.note(f"undone: {why}")
                return ir.passes.PassResult(model, False)
            if self.measured:
                self.note(f"{self.measured}: {before} -> {after}")
        return ir.passes.PassResult(model, bool(modified))

    def _writes_what_opset_lacks(self, model: ir.Model, backup: ir.Model, nodes_before: set[ir.Node],
                                 opsets_before: Mapping[str, int]) -> bool:
        """Whether the rewrite left a node the model's opset does not have in that form (passes/_opset.py)
        that the input did not have: then each such node is a declined site and the pass is undone.
        Only new nodes are checked, every node where the pass changed the opset imports."""
        every = dict(model.opset_imports) != dict(opsets_before)
        wrong = [(node, reason) for node, opsets in _opset.nodes_with_opsets(model)
                 if (every or node not in nodes_before) and (reason := _opset.form_refusal(node, opsets))]
        if wrong:
            known = set(_opset.model_refusals(backup).values())  # forms the input itself has are not the pass's
            wrong = [(node, reason) for node, reason in wrong if reason not in known]
        if not wrong:
            return False
        self.sites = [s for s in self.sites if s.action != "rewrote"]
        for node, reason in wrong:
            self.declined(node, f"not written: {reason}")
        self.note(f"undone: the rewrite writes what the model's opset does not have ({wrong[0][1]})")
        return True

    def find_sites(self, model: ir.Model) -> Sequence[ir.Node] | None:
        """The nodes this pass may rewrite (none: `call` leaves the model as it is), or None: the whole graph."""
        return None

    def skip(self, model: ir.Model, sites: Sequence[ir.Node] | None) -> bool:
        """Whether to leave the model as it is although it has sites (an option says keep; logs its own why)."""
        return False

    def prepare(self, model: ir.Model, sites: Sequence[ir.Node] | None) -> None:
        """The declared prologue: node names, one shape-inference route, fresh names."""
        if self.needs_names == "all" and any(not n.name for n in _every_node(model)) \
                or self.needs_names == "sites" and any(not n.name for n in sites or ()):
            common_passes.NameFixPass()(model)  # the site log is by node name
        if self.needs_shapes != "none" and self.shapes_missing(sites):
            if self.needs_shapes == "types":
                shape_inference.infer_shapes(model)
            else:
                shape_inference.onnx_shape_inference(model, strict=self.needs_shapes == "onnx-strict")
        if self.needs_fresh_names:
            self.fresh = fresh_names(model)

    def shapes_missing(self, sites: Sequence[ir.Node] | None) -> bool:
        """Whether the declared shape inference is needed (a pass that needs only its sites' shapes narrows it)."""
        return True

    def rewrite(self, model: ir.Model) -> bool:
        """The pass's own work, in place; whether it modified the model."""
        raise NotImplementedError

    # Undo-if-worse: a pass that returns a number from `measure` is measured before and after `rewrite`;
    # when `worse` gives a reason, the model is put back, its "rewrote" sites dropped, and the reason noted.
    measured: ClassVar[str] = ""  # what `measure` counts, for the note "<measured>: before -> after"

    def measure(self, model: ir.Model) -> Any:
        return None

    def worse(self, before: Any, after: Any) -> str | None:
        return None

    # -- the site log ---------------------------------------------------------
    def rewrote(self, node: ir.Node | str, detail: str, **extra: Any) -> None:
        self._log(node, "rewrote", detail, extra)

    def declined(self, node: ir.Node | str, reason: str, **extra: Any) -> None:
        self._log(node, "declined", reason, extra)

    def kept(self, node: ir.Node | str, reason: str, **extra: Any) -> None:
        self._log(node, "kept", reason, extra)

    def withdraw(self, count: int) -> None:
        """Forget the "rewrote" entries logged after the first `count` sites (a rewrite not written after all)."""
        for site in self.sites[count:]:
            self._seen.discard((site.node, site.action, site.detail))
        self.sites[count:] = [s for s in self.sites[count:] if s.action != "rewrote"]

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def _log(self, node: ir.Node | str, action: str, detail: str, extra: dict[str, Any]) -> None:
        if isinstance(node, ir.Node):
            name, op = node.name or f"<{node.op_type}>", node.op_type
        else:
            name, op = str(node), ""
        key = (name, action, detail)
        if key in self._seen:
            return
        self._seen.add(key)
        self.sites.append(Site(self.name, name, op, action, detail, dict(extra)))


class SiteRule(pattern.RewriteRuleClassBase):
    """An onnxscript rewrite rule that reports each declined site to its pass.

    ``check`` implementations call ``self.decline(context, node, reason)`` which logs
    the site and returns the failed MatchResult, so the reason reaches the report.
    """

    def __init__(self, owner: DmlPass | None = None, name: str | None = None):
        super().__init__(name)
        self.owner = owner

    def decline(self, node: ir.Node | None, reason: str) -> pattern.MatchResult:
        if self.owner is not None and node is not None:
            self.owner.declined(node, reason)
        return pattern.MatchResult().fail(reason)

    def accepted(self, node: ir.Node | None, detail: str, **extra: Any) -> None:
        if self.owner is not None and node is not None:
            self.owner.rewrote(node, detail, **extra)


def apply_rules(model: ir.Model, rules: Sequence[pattern.RewriteRule]) -> int:
    """Apply rewrite rules to the model (main graph, subgraphs, functions); count rewrites.
    A replacement the model's opset does not have is not written (`OpsetGate`)."""
    rule_set = pattern.RewriteRuleSet([OpsetGate(rule, _owner_of(rule)) for rule in rules])
    with empty_inputs_kept(model):  # a rule with remove_nodes=False makes it end with RemoveUnusedNodesPass
        return rule_set.apply_to_model(model)


def _owner_of(rule) -> "DmlPass | None":
    """The pass a rule logs its sites to: a `SiteRule`'s owner (`SiteRule.rule(owner)` keeps the
    instance only as the bound methods of the RewriteRule it makes)."""
    instance = getattr(getattr(rule, "graph_pre_visitor", None), "__self__", rule)
    owner = getattr(instance, "owner", None)
    return owner if isinstance(owner, DmlPass) else None


class OpsetGate:
    """A rewrite rule whose replacement is written only when every new node exists in that form at
    the opset it is read at (passes/_opset.py); otherwise the site is declined with the reason, in
    `owner`'s site log (its "rewrote" entry for the site, if the rule logged one, withdrawn)."""

    def __init__(self, rule, owner: "DmlPass | None"):
        self._rule, self._owner = rule, owner

    def __getattr__(self, name):
        return getattr(self._rule, name)

    def commute(self):
        return [OpsetGate(r, self._owner) for r in self._rule.commute()]

    def try_rewrite(self, model, graph_or_function, node, **kw):
        logged = len(self._owner.sites) if self._owner is not None else 0
        opsets = {**model.opset_imports, **graph_or_function.opset_imports}
        delta = self._rule.try_rewrite(model, graph_or_function, node, **kw)
        if delta is None:
            return None
        reason = _opset.first_refusal(delta.new_nodes, opsets)
        if reason is None:
            return delta
        if self._owner is not None:
            self._owner.withdraw(logged)
            self._owner.declined(node, f"replacement not written: {reason}")
        return None


class _IdentityElimination(common_passes.IdentityEliminationPass):
    """onnx_ir's IdentityEliminationPass, keeping an Identity that makes a graph's output from a value
    of another graph (an If/Loop branch returning an outer value): onnx_ir 1.1 removed it, leaving
    the branch's output made outside it ("Graph output ... is not an output of any node in graph":
    ONNX's expanded AffineGrid) or, with two branches, raised ("already an output of a different graph")."""

    def _try_eliminate_identity_node(self, node: ir.Node) -> bool:
        source = node.inputs[0] if len(node.inputs) == 1 else None
        if node.op_type == "Identity" and node.domain == "" and source is not None and len(node.outputs) == 1 \
                and node.outputs[0].is_graph_output() \
                and (source.producer() is None or source.producer().graph is not node.graph) \
                and not (source.is_graph_input() or source.is_initializer()):
            return False  # an outer value: the Identity is what makes it this graph's output
        return super()._try_eliminate_identity_node(node)


def eliminate_identities(model: ir.Model) -> bool:
    """Identity nodes removed (onnx_ir's pass), each graph's outputs still made in that graph."""
    return _IdentityElimination()(model).modified


def remove_unused_nodes(model: ir.Model) -> bool:
    """onnx_ir's RemoveUnusedNodesPass without its trimming of empty inputs (`empty_inputs_kept`)."""
    with empty_inputs_kept(model):
        return common_passes.RemoveUnusedNodesPass()(model).modified


@contextlib.contextmanager
def empty_inputs_kept(model: ir.Model) -> Iterator[None]:
    """Give back the empty trailing inputs that onnx_ir's dead-code removal cuts off the nodes it keeps.

    RemoveUnusedNodesPass (onnx_ir 1.1; the onnxscript rewriter runs it after a rule set in which
    a rule has ``remove_nodes=False``) drops each kept node's trailing None inputs, in every graph.
    For most ops that is only a respelling, but where optional inputs come before a variadic one
    the checker counts them: ``Loop(M, "")`` without loop-carried values becomes ``Loop(M)``,
    which it rejects.  Only cut-off inputs that were all None are put back, so nothing the code
    inside changed on purpose is undone.
    """
    before = [(node, tuple(node.inputs)) for node in _every_node(model)]
    try:
        yield
    finally:
        for node, inputs in before:
            kept = len(node.inputs)
            if kept < len(inputs) and tuple(node.inputs) == inputs[:kept] \
                    and all(v is None for v in inputs[kept:]):
                node.resize_inputs(len(inputs))


def _every_node(model: ir.Model) -> Iterator[ir.Node]:
    yield from ir.traversal.RecursiveGraphIterator(model.graph)
    for function in model.functions.values():
        yield from ir.traversal.RecursiveGraphIterator(function)


def fresh_names(model: ir.Model):
    """A function returning names not yet used anywhere in `model` (initializer names must be unique).

    The passes' one source of new names (`DmlPass.fresh`, declared by ``needs_fresh_names``).  One
    counter across every base, from 1 (``x``, ``x_1``, then ``y_2``): a name the model does not hold
    yet is given unchanged.  Names a pass sets outside it after `prepare` are not seen.
    """
    used: set[str] = set()
    for graph in model.graphs():
        used.update(v.name for v in graph.inputs if v.name)
        used.update(graph.initializers)
        for node in graph:
            used.update(v.name for v in node.outputs if v.name)
            if node.name:
                used.add(node.name)  # node names too: ORT refuses two nodes of one name
    counter = [0]

    def fresh(base: str) -> str:
        name = base
        while name in used:
            counter[0] += 1
            name = f"{base}_{counter[0]}"
        used.add(name)
        return name

    return fresh


# IR version 4 made initializers that are not graph inputs legal; before it, every one must be.
IR_INITIALIZERS_WITHOUT_INPUTS = 4


def initializers_as_inputs_before_ir4(model: ir.Model) -> None:
    """An IR-3 model's new initializers listed as graph inputs too, as IR 3 requires ("in initializer
    but not in graph input" otherwise); every pass's folding and new weights go through it."""
    if model.ir_version >= IR_INITIALIZERS_WITHOUT_INPUTS:
        return
    listed = set(model.graph.inputs)
    for value in model.graph.initializers.values():
        if value not in listed:
            model.graph.inputs.append(value)


def restore(model: ir.Model, backup: ir.Model) -> None:
    """Put `backup`'s graph and functions back into `model` (undo an in-place attempt)."""
    model.graph = backup.graph  # the opset imports live on the graph
    functions = dict(backup.functions)
    model.functions.clear()
    model.functions.update(functions)
