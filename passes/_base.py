"""What every dmlopt pass shares: its options, its context and its site log.

A dmlopt pass is an ``onnx_ir.passes.InPlacePass``.  On top of the onnx_ir contract it
declares ``name`` (the CLI name), ``summary`` (one line for ``dmlopt passes``) and
``options`` (each becomes ``--flag`` on ``dmlopt optimize`` and a keyword of
``dmlopt.optimize``).  While it runs it logs every site it looked at, rewritten or
declined with a reason, so the report can say what changed and why not.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, ClassVar, Iterator, Mapping, Sequence

import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript.rewriter import pattern


@dataclasses.dataclass(frozen=True)
class Option:
    """A user-facing knob of a pass (``--leaky-relu auto``, ``leaky_relu="auto"``)."""

    name: str  # python name; the CLI flag is "--" + name with "_" -> "-"
    default: Any
    help: str
    choices: Sequence[str] | None = None
    type: Callable[[str], Any] = str
    # "auto" set by the user, or any option under --tune, is measured on the target (dmlopt.tune).
    tunable: bool = False
    # What "auto" means when nothing is measured: target -> choice, or target -> {precision -> choice}
    # where the better choice depends on the precision the model is written in (float32, float16).
    auto_default: Mapping[str, Any] | None = None
    # Where those defaults come from, per target (what was measured, or the reasoning): in the report.
    auto_default_source: Mapping[str, str] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def default_for(self, target: str, precision: str = "float32") -> Any:
        """The choice "auto" stands for on `target` when nothing is measured, for a model written in `precision`."""
        default = (self.auto_default or {}).get(target)
        if isinstance(default, Mapping):
            default = default.get(precision, default.get("float32"))
        if default is not None:
            return default
        if self.default != "auto":
            return self.default
        choices = [c for c in (self.choices or ()) if c != "auto"]
        return "keep" if "keep" in choices else choices[0]

    def default_provenance(self, target: str, precision: str = "float32") -> str:
        """Says which default applied and why: per target and, where it differs, per precision."""
        per_precision = isinstance((self.auto_default or {}).get(target), Mapping)
        where = f"--target {target}" + (f" in {precision}" if per_precision else "")
        if self.auto_default is None or target not in self.auto_default:
            return "the option's default"
        source = (self.auto_default_source or {}).get(target)
        return f"the documented default for {where}" + (f" ({source})" if source else "")


def precision_of(options: Mapping[str, Any]) -> str:
    """The precision a pipeline with these options writes: float16 when the fp16 pass runs."""
    return "float16" if options.get("fp16") is True else "float32"


@dataclasses.dataclass
class PassContext:
    """What a pass may know about the job: the target and the user's settings."""

    target: str = "dml"  # dml | cuda | cpu
    ort_version: str | None = None  # the ONNX Runtime version deployed on the target
    shapes: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    dims: dict[str, int] = dataclasses.field(default_factory=dict)
    options: dict[str, Any] = dataclasses.field(default_factory=dict)


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

    def __init__(self, context: PassContext | None = None):
        super().__init__()
        self.context = context or PassContext()
        self.sites: list[Site] = []
        self.notes: list[str] = []
        self._seen: set[tuple[str, str, str]] = set()

    # -- settings -----------------------------------------------------------
    def option(self, name: str) -> Any:
        for opt in self.options:
            if opt.name == name:
                return self.context.options.get(name, opt.default)
        raise KeyError(f"{self.name} has no option {name!r}")

    def resolved_option(self, name: str) -> Any:
        """The option's value, with an 'auto' left unresolved (the pass run outside the pipeline,
        which resolves it through dmlopt.tune) replaced by the target's documented default."""
        value = self.option(name)
        if value != "auto":
            return value
        opt = next(o for o in self.options if o.name == name)
        precision = precision_of(self.context.options)
        value = opt.default_for(self.context.target, precision)
        self.note(f"{name}=auto without tuning: {opt.default_provenance(self.context.target, precision)}, {value}")
        return value

    def enabled(self) -> bool:
        """Whether the pass has anything to do under this context (fp16 only when asked)."""
        return True

    def changes_interface_types(self) -> bool:
        """Whether this run may change the element types of the graph's inputs and outputs
        (fp16 without keep_io_types, on request); names and order never change."""
        return False

    # -- the site log ---------------------------------------------------------
    def rewrote(self, node: ir.Node | str, detail: str, **extra: Any) -> None:
        self._log(node, "rewrote", detail, extra)

    def declined(self, node: ir.Node | str, reason: str, **extra: Any) -> None:
        self._log(node, "declined", reason, extra)

    def kept(self, node: ir.Node | str, reason: str, **extra: Any) -> None:
        self._log(node, "kept", reason, extra)

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
    """Apply rewrite rules to the model (main graph, subgraphs, functions); count rewrites."""
    rule_set = pattern.RewriteRuleSet(list(rules))
    with empty_inputs_kept(model):  # a rule with remove_nodes=False makes it end with RemoveUnusedNodesPass
        return rule_set.apply_to_model(model)


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


def restore(model: ir.Model, backup: ir.Model) -> None:
    """Put `backup`'s graph and functions back into `model` (undo an in-place attempt)."""
    model.graph = backup.graph  # the opset imports live on the graph
    functions = dict(backup.functions)
    model.functions.clear()
    model.functions.update(functions)
