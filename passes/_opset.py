"""The one opset check of every pass: a node a pass writes must exist, in that form, at the model's opset.

Why: a model keeps one opset per domain, and a replacement written from a newer operator set than
the model's (a two-input Gemm into an opset-10 model, an int64 Constant into an opset-8 one, an
Unsqueeze with an axes input into an opset-12 one) is a model ONNX Runtime refuses to load.  onnx's
checker does not see every such form, so each written node is compared with onnx's own schema
registry at the model's version of its domain (``onnx.defs.get_schema(op, opset, domain)``):

  * the operator exists at that opset;
  * its inputs count within the schema's bounds, and no required input is empty;
  * its attributes are the schema's, the required ones present;
  * its known tensor types are among the schema's type constraints (a Constant's, from its value);
  * it is not one of the legacy-broadcast forms (a schema with a ``broadcast`` attribute: Add/Mul/
    Gemm before opset 7), which broadcast only on request and for which ONNX Runtime has no kernel.

Two places use it, so every pass is covered: `apply_rules` (and cleanup's rule list) declines a
rule's site whose replacement fails it, with the reason; `DmlPass.call` undoes a pass whose other
writes (nodes built directly, folding) leave a node that fails it.
"""

from __future__ import annotations

import functools
from typing import Iterable, Mapping

import onnx
import onnx_ir as ir

ONNX_DOMAINS = ("", "ai.onnx")


@functools.lru_cache(maxsize=4096)
def _schema(op_type: str, domain: str, opset: int):
    try:
        return onnx.defs.get_schema(op_type, opset, "" if domain in ONNX_DOMAINS else domain)
    except onnx.defs.SchemaError:
        return None


@functools.lru_cache(maxsize=4096)
def _known(op_type: str, domain: str) -> bool:
    return onnx.defs.has(op_type, domain)


@functools.lru_cache(maxsize=4096)
def _facts(op_type: str, domain: str, opset: int):
    """What the check reads of a schema, read once per (op, domain, opset): onnx builds the
    Python lists of a schema's inputs, attributes and constraints anew on every access."""
    schema = _schema(op_type, domain, opset)
    if schema is None:
        return None
    optional = onnx.defs.OpSchema.FormalParameterOption.Optional
    return dict(
        since=schema.since_version, broadcast="broadcast" in schema.attributes,
        min_input=schema.min_input, max_input=schema.max_input,
        inputs=[(f.name, f.type_str, f.option == optional) for f in schema.inputs],
        outputs=[(f.name, f.type_str, f.option == optional) for f in schema.outputs],
        attributes=frozenset(schema.attributes),
        required=sorted(name for name, a in schema.attributes.items() if a.required),
        allowed={c.type_param_str: frozenset(c.allowed_type_strs) for c in schema.type_constraints})


def _type_string(value: ir.Value | None, fallback: ir.TypeProtocol | None = None) -> str | None:
    kind = value.type if value is not None and value.type is not None else fallback
    if isinstance(kind, ir.TensorType):
        return f"tensor({kind.dtype.name.lower()})"
    return None


def opset_of(node: ir.Node, opsets: Mapping[str, int]) -> int | None:
    """The opset version `node` is read at: its domain's import (ai.onnx and "" are one)."""
    if node.domain in ONNX_DOMAINS:
        return opsets.get("", opsets.get("ai.onnx"))
    return opsets.get(node.domain)


def form_refusal(node: ir.Node, opsets: Mapping[str, int]) -> str | None:
    """Why `node` does not exist in this form at the model's opset (`opsets`: domain -> version), or None.

    Domains onnx has no schemas for (com.microsoft, custom ones) and domains the model does not
    import are not judged here."""
    opset = opset_of(node, opsets)
    domain = "" if node.domain in ONNX_DOMAINS else node.domain
    if opset is None or not _known(node.op_type, domain):
        return None
    where = f"{node.op_type} at {'ai.onnx' if not domain else domain} opset {opset}"
    facts = _facts(node.op_type, domain, opset)
    if facts is None:
        first = min(s.since_version for s in onnx.defs.get_all_schemas_with_history()
                    if s.name == node.op_type and s.domain == domain)
        return f"{node.op_type} does not exist at {'ai.onnx' if not domain else domain} opset {opset} (from opset {first})"
    versioned = f"{where} ({node.op_type}-{facts['since']})"
    if facts["broadcast"]:
        return f"{where} is {node.op_type}-{facts['since']}, which broadcasts only with its legacy 'broadcast' " \
               "attribute and which ONNX Runtime has no kernel for (needs opset 7)"
    inputs = list(node.inputs)
    while inputs and inputs[-1] is None:
        inputs.pop()
    if not facts["min_input"] <= len(inputs) <= facts["max_input"]:
        return f"{versioned} takes {facts['min_input']}-{facts['max_input']} inputs, not {len(inputs)}"
    formals = facts["inputs"]
    for index, value in enumerate(inputs):
        if value is None and formals and not formals[min(index, len(formals) - 1)][2]:
            return f"{versioned} needs input '{formals[min(index, len(formals) - 1)][0]}'"
    unknown = sorted(set(node.attributes) - facts["attributes"])
    if unknown:
        return f"{versioned} has no attribute {', '.join(unknown)}"
    missing = [name for name in facts["required"] if name not in node.attributes]
    if missing:
        return f"{versioned} needs attribute {', '.join(missing)}"
    allowed = facts["allowed"]
    for formals_, values, fallback in ((facts["inputs"], inputs, None),
                                       (facts["outputs"], list(node.outputs), _constant_type(node))):
        for index, value in enumerate(values):
            if not formals_:
                break
            name, type_str, _ = formals_[min(index, len(formals_) - 1)]
            found = _type_string(value, fallback)
            if found is not None and type_str in allowed and found not in allowed[type_str]:
                return f"{versioned} takes no {found} for '{name}'"
    return None


def _constant_type(node: ir.Node) -> ir.TypeProtocol | None:
    """A Constant's output type, from its value (the rewriter leaves the output untyped)."""
    if node.op_type != "Constant" or "value" not in node.attributes:
        return None
    tensor = node.attributes["value"].value
    return ir.TensorType(tensor.dtype) if getattr(tensor, "dtype", None) is not None else None


def first_refusal(nodes: Iterable[ir.Node], opsets: Mapping[str, int]) -> str | None:
    """The reason of the first node of `nodes` that fails `form_refusal`, or None."""
    for node in nodes:
        reason = form_refusal(node, opsets)
        if reason:
            return reason
    return None


def model_refusals(model: ir.Model) -> dict[int, str]:
    """id(node) -> reason for every node of the model (subgraphs and functions too) that fails the check."""
    found = {}
    for node, opsets in nodes_with_opsets(model):
        reason = form_refusal(node, opsets)
        if reason:
            found[id(node)] = reason
    return found


def nodes_with_opsets(model: ir.Model):
    """Every node (subgraphs, then functions) with the opset imports it is read at."""
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        yield node, model.opset_imports
    for function in model.functions.values():
        for node in ir.traversal.RecursiveGraphIterator(function):
            yield node, function.opset_imports or model.opset_imports
