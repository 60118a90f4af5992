"""Which Einsum equations ONNX Runtime's DirectML EP runs on the GPU, per ORT version.

Why a module of its own: the einsum pass decides with it which Einsum nodes to lower, and
the placement model (dmlopt/targets/dml/placement.py) predicts with it which ones fall back to the CPU;
both must agree.  The facts are in shared/dml-facts.md section 2 (DirectML EP
OperatorHelper.cpp ``EinSumHelper::DetermineRecognizedOperatorType`` and
DmlOperatorEinSum.cpp):

1. ORT <= 1.18: a fixed table of recognized forms.  Letters are renumbered by first
   appearance, so only the equation's structure counts: identity, transposes and full
   reductions of one input, ``ij->i`` / ``ij->j``; elementwise products with identical
   label lists; MatMul forms of rank 2-4 plain, transposed-A or transposed-B;
   ``i,i->``; the NHCW forms ``aibj,ajbk->aibk`` (and their transposed variants) from ORT
   1.14.  No ellipsis, at most two inputs.  The outer product ``i,j->ij`` appears only in
   later versions of the table; it is treated as unsupported (lowering it is harmless,
   trusting it wrongly sends the node to the CPU).
2. ORT >= 1.19 (PR #21114, "DML EP EinSum make more generic"): any one- or two-input
   equation without ellipsis and with at most 8 distinct labels.
3. No version given (``einsum_supported(..., None)``): nothing is assumed supported.  The pipeline
   always passes the resolved version (dmlopt.target: the newest DirectML table when none is asked).
"""

from __future__ import annotations

import dataclasses
import string

from dmlopt.target import parse_version

GENERIC_SINCE = (1, 19)
NHCW_SINCE = (1, 14)
MAX_GENERIC_LABELS = 8

# (labels renumbered by first appearance across inputs and output, ranks per component)
_TABLE_BASE = {
    ((0, 1, 1, 2, 0, 2), (2, 2, 2)),  # ij,jk->ik
    ((0, 1, 2, 0, 2, 3, 0, 1, 3), (3, 3, 3)),  # bij,bjk->bik
    ((0, 1, 2, 3, 0, 1, 3, 4, 0, 1, 2, 4), (4, 4, 4)),  # abij,abjk->abik
    ((0, 1, 0, 2, 1, 2), (2, 2, 2)),  # ji,jk->ik
    ((0, 1, 2, 0, 1, 3, 0, 2, 3), (3, 3, 3)),  # bji,bjk->bik
    ((0, 1, 2, 3, 0, 1, 2, 4, 0, 1, 3, 4), (4, 4, 4)),  # abji,abjk->abik
    ((0, 1, 2, 1, 0, 2), (2, 2, 2)),  # ij,kj->ik
    ((0, 1, 2, 0, 3, 2, 0, 1, 3), (3, 3, 3)),  # bij,bkj->bik
    ((0, 1, 2, 3, 0, 1, 4, 3, 0, 1, 2, 4), (4, 4, 4)),  # abij,abkj->abik
    ((0, 0), (1, 1, 0)),  # i,i->
    ((0, 1, 0), (2, 1)),  # ij->i
    ((0, 1, 1), (2, 1)),  # ij->j
}
_TABLE_NHCW = {
    ((0, 1, 2, 3, 0, 3, 2, 4, 0, 1, 2, 4), (4, 4, 4)),  # aibj,ajbk->aibk
    ((0, 1, 2, 3, 0, 1, 2, 4, 0, 3, 2, 4), (4, 4, 4)),  # ajbi,ajbk->aibk
    ((0, 1, 2, 3, 0, 4, 2, 3, 0, 1, 2, 4), (4, 4, 4)),  # aibj,akbj->aibk
}

ELLIPSIS = "..."


class EquationError(ValueError):
    """The equation is not a valid Einsum equation."""


@dataclasses.dataclass(frozen=True)
class Equation:
    """A parsed equation: one label string per input and the output's, ellipsis kept as '.'."""

    inputs: tuple[str, ...]
    output: str
    explicit: bool  # whether the equation had "->"

    @property
    def has_ellipsis(self) -> bool:
        return any("." in term for term in (*self.inputs, self.output))

    @property
    def labels(self) -> set[str]:
        return {c for term in self.inputs for c in term if c != "."}


def parse_equation(equation: str) -> Equation:
    """Split ``"bhwc,hkc->bhwk"`` into terms; an implicit output follows numpy's rule.

    Ellipsis is kept as a single '.' per term (at most one per term).  Implicit output:
    the ellipsis first, then every label that occurs exactly once, in alphabetical order.
    """
    text = equation.replace(" ", "")
    if text.count("->") > 1:
        raise EquationError(f"{equation!r}: more than one '->'")
    explicit = "->" in text
    lhs, rhs = text.split("->") if explicit else (text, None)
    inputs = tuple(_term(t, equation) for t in lhs.split(","))
    if rhs is None:
        counts: dict[str, int] = {}
        for term in inputs:
            for c in term:
                if c != ".":
                    counts[c] = counts.get(c, 0) + 1
        once = sorted(c for c, n in counts.items() if n == 1)  # ASCII order: 'Z' < 'a', as numpy
        output = ("." if any("." in t for t in inputs) else "") + "".join(once)
    else:
        output = _term(rhs, equation)
    known = {c for t in inputs for c in t}
    for c in output:
        if c != "." and c not in known:
            raise EquationError(f"{equation!r}: output label {c!r} is in no input")
        if c != "." and output.count(c) > 1:
            raise EquationError(f"{equation!r}: output label {c!r} repeated")
    if "." in output and not any("." in t for t in inputs):
        raise EquationError(f"{equation!r}: ellipsis in the output only")
    return Equation(inputs, output, explicit)


def _term(term: str, equation: str) -> str:
    if term.count(ELLIPSIS) > 1:
        raise EquationError(f"{equation!r}: more than one ellipsis in a term")
    term = term.replace(ELLIPSIS, ".")
    bad = [c for c in term if c != "." and c not in string.ascii_letters]
    if bad:
        raise EquationError(f"{equation!r}: {bad[0]!r} is not a label (labels are letters)")
    return term


def einsum_supported(equation: str, n_inputs: int, ort_version: str | None) -> bool:
    """Whether the DirectML EP of ORT `ort_version` runs this Einsum itself (not on the CPU).

    ``ort_version=None`` answers False: with no version known nothing is assumed, and the
    einsum pass lowers every equation it can express.
    """
    version = parse_version(ort_version)
    if version is None:
        return False
    try:
        eq = parse_equation(equation)
    except EquationError:
        return False
    if len(eq.inputs) != n_inputs or n_inputs > 2 or eq.has_ellipsis:
        return False
    if version >= GENERIC_SINCE:
        return len(eq.labels) <= MAX_GENERIC_LABELS
    return _in_pattern_table(eq, version)


def _in_pattern_table(eq: Equation, version: tuple[int, ...]) -> bool:
    """The <= 1.18 recognizer: structure after renumbering labels by first appearance."""
    terms = (*eq.inputs, eq.output)
    if len(eq.inputs) == 1:
        (a,), out = eq.inputs, eq.output
        if len(a) == len(out) and sorted(a) == sorted(out) and len(set(a)) == len(a):
            return True  # identity or transpose
        if out == "" and len(set(a)) == len(a):
            return True  # full reduction
    if len(eq.inputs) == 2:
        a, b = eq.inputs
        if a == b == eq.output and len(set(a)) == len(a):
            return True  # elementwise product
    numbering: dict[str, int] = {}
    indices = []
    for term in terms:
        for c in term:
            indices.append(numbering.setdefault(c, len(numbering)))
    key = (tuple(indices), tuple(len(t) for t in terms))
    table = _TABLE_BASE | (_TABLE_NHCW if version >= NHCW_SINCE else set())
    return key in table
