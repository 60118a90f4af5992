"""Run one generated case through one pass and state the property.

The property: ``dmlopt.optimize(model, passes=[name], **options)`` either leaves the model
as it was (the pass declined: same op counts) or returns a model that passed the pipeline's
checks (onnx checker + strict shape inference after the pass) and matches the original on
ORT's CPU EP, on the seeded inputs and on each extra feed of the case (both If branches).
"""

from __future__ import annotations

import collections
import os
from typing import Any, Callable

from hypothesis import HealthCheck, assume, settings

import dmlopt
from dmlopt.engine import tune
from dmlopt.errors import InputError
from tests.property.strategies import Case

# 300 cases per pass, the same ones on every run (derandomize), none remembered between runs.
# To hunt for new bugs: DMLOPT_PROPERTY_EXAMPLES=3000 DMLOPT_PROPERTY_RANDOM=1 pytest tests/property
PROPERTY_SETTINGS = settings(max_examples=int(os.environ.get("DMLOPT_PROPERTY_EXAMPLES", "300")), deadline=None,
                             derandomize=not os.environ.get("DMLOPT_PROPERTY_RANDOM"), database=None,
                             suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                                    HealthCheck.data_too_large])


class Outcomes(collections.Counter):
    """How the cases went: a test asserts that enough of them were really rewritten."""

    def require(self, rewrote: int, of: str = "rewrote") -> None:
        assert self[of] >= rewrote, f"only {self[of]} cases {of} (want >= {rewrote}): {dict(self)}"


def _runnable(case: Case) -> bool:
    """Whether ORT runs the original on every feed at the case's sizes."""
    try:
        for feed in case.feeds or [None]:
            dmlopt.validate(case.model, case.model, inputs=feed, shapes=case.options.get("shapes"),
                            dims=case.options.get("dims"))
        return True
    except InputError:
        return False


def run_case(case: Case, pass_name: str, outcomes: Outcomes | None = None, *,
             then: Callable[[Any], None] | None = None, **options: Any) -> str:
    """Run the pass on the case and assert the property; 'rewrote' or 'declined'.
    `then(result)` states more about the optimize result (a pass's own guarantee)."""
    kwargs = {**case.options, **options}
    if not _runnable(case):  # ORT has no CPU kernel for the original (e.g. an int PRelu): not a case
        if outcomes is not None:
            outcomes["not runnable on ORT"] += 1
        assume(False)
    result = dmlopt.optimize(case.model, passes=[pass_name], retime=False, **kwargs)
    assert result.passed, f"{pass_name} broke numerics:\n{result.report.to_table()}"
    precision = "float16" if result.report.options.get("fp16") is True else "float32"
    atol, rtol = tune.validation_tolerances(precision, None, None)
    for feed in case.feeds:
        v = dmlopt.validate(case.model, result.model, inputs=feed, shapes=kwargs.get("shapes"),
                            dims=kwargs.get("dims"), atol=atol, rtol=rtol)
        assert v.passed, f"{pass_name} broke numerics with {feed}:\n{v.to_table()}"
    entry = result.report.passes[0]
    outcome = "rewrote" if entry["modified"] else "declined"
    if not entry["modified"]:
        assert entry["op_counts_before"] == entry["op_counts_after"], entry["op_delta"]
    if then is not None:
        then(result)
    if outcomes is not None:
        outcomes[outcome] += 1
    return outcome
