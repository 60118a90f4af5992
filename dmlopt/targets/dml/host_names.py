"""Names the DirectML host sees: every name of a model replaced by a safe, unique one for the host
run, and mapped back in what comes out of it.

Why: names a model chose reach two other parsers on the host.  JavaScript: an input or output
named ``__proto__`` (or ``constructor``) is object machinery, not a key, in the runner and in
onnxruntime-node itself (an output so named vanished: two identical models failed validation).
ORT's log: ORT prints node and value names raw, one placement per line, so a node name holding
newlines and ORT-like lines forged the "actual placement".  The host therefore runs a copy whose
values, nodes and functions are named ``<prefix>v<k>_``, ``<prefix>n<k>_``, ``<prefix>f<k>_``
(a prefix no name of the model starts with), and outputs, placements and copies are read with
those names and translated back.
"""

from __future__ import annotations

import re
import secrets

import onnx_ir as ir

__all__ = ["SafeNames"]


class SafeNames:
    """A renamed copy of `model` (`model`), with the way back (`original`, `restore`)."""

    def __init__(self, model: ir.Model):
        taken = _all_names(model)
        while True:
            prefix = "h" + secrets.token_hex(4) + "_"
            if not any(name.startswith(prefix) for name in taken):
                break
        self.prefix = prefix
        self._token = re.compile(re.escape(prefix) + r"[vnf]\d+_")
        self.back: dict[str, str] = {}
        self.model = model.clone()
        before_in = [v.name for v in self.model.graph.inputs]
        before_out = [v.name for v in self.model.graph.outputs]
        self._rename(self.model)
        self.inputs = {o: v.name for o, v in zip(before_in, self.model.graph.inputs)}  # original -> safe
        self.outputs = {v.name: o for o, v in zip(before_out, self.model.graph.outputs)}  # safe -> original

    def _new(self, kind: str, original: str | None) -> str:
        name = f"{self.prefix}{kind}{len(self.back)}_"
        self.back[name] = original or ""
        return name

    def _rename(self, model: ir.Model) -> None:
        done: set[int] = set()

        def value(v: ir.Value | None) -> None:
            # an unnamed output is an optional one left out: named, it would exist (and change what
            # ORT can place: SkipLayerNormalization's statistics moved it to the CPU)
            if v is not None and v.name and id(v) not in done:
                done.add(id(v))
                v.name = self._new("v", v.name)

        functions = {}
        for key, function in list(model.functions.items()):
            functions[key] = self._new("f", function.name)
        def nodes(body) -> None:
            for node in body:
                for out in node.outputs:
                    value(out)
                node.name = self._new("n", node.name)
                if node.op_identifier() in functions:
                    node.op_type = functions[node.op_identifier()]

        for graph in model.graphs():
            for v in list(graph.inputs) + list(graph.initializers.values()):
                value(v)
            nodes(graph)
            for v in graph.outputs:
                value(v)
        for key, function in list(model.functions.items()):
            for v in function.inputs:
                value(v)
            nodes(function)
            function.name = functions[key]
        if functions:  # the dict is keyed by (domain, name, overload): rebuild it under the new names
            renamed = {f.identifier(): f for f in model.functions.values()}
            model.functions.clear()
            model.functions.update(renamed)

    def original(self, name: str) -> str:
        """The model's own name for `name` as the host (or ORT's log) wrote it: exact, or each
        safe name inside a name ORT derived from one put back; any other text kept."""
        if name in self.back:
            return self.back[name]
        return self._token.sub(lambda m: self.back.get(m.group(0), m.group(0)), name)


def _all_names(model: ir.Model) -> set[str]:
    names = set()
    for graph in model.graphs():
        names.update(v.name or "" for v in graph.inputs)
        names.update(graph.initializers)
        for node in graph:
            names.add(node.name or "")
            names.update(v.name or "" for v in node.outputs)
    for function in model.functions.values():
        names.add(function.name)
        for node in function:
            names.add(node.name or "")
            names.update(v.name or "" for v in node.outputs)
    return names
