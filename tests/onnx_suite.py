"""ONNX's own backend test cases, made at test time from the installed onnx, run through dmlopt.

Why: the operators and opsets dmlopt's own models never reach (opset-6 exports, sequences, Loop over
optionals, IR-3 PyTorch models) must keep loading and keep their results.  Nothing is vendored:
`onnx.backend.test.loader` generates the node cases (`onnx.backend.test.case`) and reads the
`simple`, `pytorch-converted` and `pytorch-operator` models shipped in the onnx package.

One case, in `run_case`: ONNX Runtime runs the model as given on each of its data sets (a case ORT
itself fails or gets wrong is `ORT_FAILS`, not dmlopt's to keep); then `dmlopt.optimize` rewrites it
for each target and the output runs on ORT against the case's expected outputs, with the case's
tolerances.  Validation runs once a case (its own inputs fed), for the first target.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import os
import traceback
import warnings
from typing import Any, Sequence

import numpy as np
import onnx
import onnx.numpy_helper as numpy_helper
import onnx_ir as ir
import onnxruntime as ort

import dmlopt
from dmlopt.errors import DmlOptError

KINDS = ("node", "simple", "pytorch-converted", "pytorch-operator")
TARGETS = ("dml", "cuda", "cpu", "webgpu")

# Outcomes.  Only OK and ORT_FAILS pass; REFUSED passes only where the refusal is one dmlopt
# documents for such a model (`ALLOWED_REFUSALS`), never "a pass produced an invalid model".
OK, ORT_FAILS, REFUSED, CRASH, VALIDATION_FAILED, OUTPUT_FAILS, WRONG = (
    "ok", "ort-fails", "refused", "crash", "validation-failed", "output-fails", "wrong")
ALLOWED_REFUSALS = ("validation feeds tensors only; optimize without it with --no-validate",
                    # outputs with nothing finite (all -inf: ReduceMax over an empty axis) never pass
                    # validation, by design (dmlopt.runtime.validate.compare), and no pass is blamed
                    "no pass blamed: no finite values to compare")


@dataclasses.dataclass
class Case:
    name: str
    model: onnx.ModelProto
    data_sets: list[tuple[dict[str, Any], list[Any]]]
    rtol: float = 1e-3
    atol: float = 1e-7


@dataclasses.dataclass
class Outcome:
    status: str
    detail: str = ""
    target: str = ""

    @property
    def passed(self) -> bool:
        return self.status in (OK, ORT_FAILS) or (
            self.status == REFUSED and any(text in self.detail for text in ALLOWED_REFUSALS))


@functools.lru_cache(maxsize=None)
def _tests(kind: str):
    from onnx.backend.test import loader
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return {t.name: t for t in loader.load_model_tests(kind=kind)}


def case_names(kinds: Sequence[str] = KINDS) -> list[str]:
    return [name for kind in kinds for name in _tests(kind)]


def load_case(name: str) -> Case:
    for kind in KINDS:
        test = _tests(kind).get(name)
        if test is not None:
            break
    else:
        raise KeyError(name)
    if test.model is not None:
        model = test.model
        names = _feed_names(model)
        sets = [(dict(zip(names, (_array(x) for x in inputs))), list(outputs)) for inputs, outputs in test.data_sets]
    else:
        model = onnx.load(os.path.join(test.model_dir, "model.onnx"))
        sets = _read_data_sets(model, test.model_dir)
    return Case(name, model, sets, test.rtol, test.atol)


def _array(x):
    return np.asarray(x) if isinstance(x, np.generic) else x


def _feed_names(model: onnx.ModelProto) -> list[str]:
    initialized = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in initialized]


def _read_data_sets(model: onnx.ModelProto, folder: str):
    inputs = {i.name: i for i in model.graph.input}
    names = _feed_names(model)
    sets = []
    for data in sorted(glob.glob(os.path.join(folder, "test_data_set_*"))):
        count_in = len(glob.glob(os.path.join(data, "input_*.pb")))
        count_out = len(glob.glob(os.path.join(data, "output_*.pb")))
        feeds = {names[i]: _read_value(os.path.join(data, f"input_{i}.pb"), inputs[names[i]].type)
                 for i in range(count_in)}
        expected = [_read_value(os.path.join(data, f"output_{i}.pb"), model.graph.output[i].type)
                    for i in range(count_out)]
        sets.append((feeds, expected))
    return sets


def _read_value(path: str, type_proto: onnx.TypeProto):
    with open(path, "rb") as f:
        data = f.read()
    which = type_proto.WhichOneof("value")
    proto = {"sequence_type": onnx.SequenceProto, "optional_type": onnx.OptionalProto}.get(which, onnx.TensorProto)()
    proto.ParseFromString(data)
    if which == "sequence_type":
        return numpy_helper.to_list(proto)
    if which == "optional_type":
        return numpy_helper.to_optional(proto)
    return numpy_helper.to_array(proto)


def matches(got, expected, rtol: float, atol: float) -> bool:
    """onnx's backend comparison: allclose for floats (NaN equal to NaN), equality otherwise; lists item by item."""
    if isinstance(expected, list):
        return isinstance(got, list) and len(got) == len(expected) and all(
            matches(g, e, rtol, atol) for g, e in zip(got, expected))
    if expected is None:
        return got is None
    got, expected = np.asarray(got), np.asarray(expected)
    if got.shape != expected.shape:
        return False
    if expected.dtype.kind in "fc":
        return bool(np.allclose(got, expected, rtol=rtol, atol=atol, equal_nan=True))
    return bool(np.array_equal(got, expected))


def run_ort(model: onnx.ModelProto | ir.Model, feeds: dict[str, Any]) -> list[Any]:
    if isinstance(model, ir.Model):
        model = ir.serde.serialize_model(model)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def gives_expected(model, case: Case) -> bool:
    return all(matches(got, want, case.rtol, case.atol)
               for feeds, expected in case.data_sets for got, want in zip(run_ort(model, feeds), expected))


def ort_runs(case: Case) -> str | None:
    """Why ORT itself does not run the case right (then it is not dmlopt's to keep), or None."""
    try:
        return None if gives_expected(case.model, case) else "ORT's own result differs from onnx's expected one"
    except Exception as e:  # noqa: BLE001 - ORT's own refusal or failure
        return f"ORT fails it: {str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__}"


def optimize_case(case: Case, target: str, validate: bool, **options) -> Outcome:
    """One optimize of the case for `target` and the output checked on ORT; validation feeds the case's inputs."""
    inputs = case.data_sets[0][0] if validate and case.data_sets else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = dmlopt.optimize(case.model, target=target, validate=validate, retime=False, inputs=inputs,
                                     **options)
    except DmlOptError as e:
        return Outcome(REFUSED, str(e), target)
    except Exception:  # noqa: BLE001 - what the suite exists to catch
        return Outcome(CRASH, traceback.format_exc(limit=-6), target)
    reasons = {o.get("reason", "") for o in (result.report.validation or {}).get("outputs", []) if not o["passed"]}
    if not result.passed and result.report.broken_by is None and reasons \
            and all(r.startswith("no finite values to compare") for r in reasons):
        return Outcome(REFUSED, "no pass blamed: no finite values to compare", target)
    if not result.passed:
        return Outcome(VALIDATION_FAILED, f"blamed: {result.report.broken_by}; {result.report.validation}"[:600],
                       target)
    try:
        right = gives_expected(result.model, case)
    except Exception as e:  # noqa: BLE001
        return Outcome(OUTPUT_FAILS, str(e).strip()[:300], target)
    return Outcome(OK if right else WRONG, "" if right else "output differs from onnx's expected", target)


def run_case(case: Case, targets: Sequence[str] = TARGETS, *, validate_target: str | None = "dml",
             **options) -> list[Outcome]:
    """The case through every target without validation, and once with it (on `validate_target`)."""
    why = ort_runs(case)
    if why is not None:
        return [Outcome(ORT_FAILS, why)]
    outcomes = [optimize_case(case, target, validate=False, **options) for target in targets]
    if validate_target is not None:
        outcomes.append(optimize_case(case, validate_target, validate=True, **options))
    return outcomes


def failures(outcomes: Sequence[Outcome]) -> list[str]:
    return [f"{o.target}: {o.status}: {o.detail}" for o in outcomes if not o.passed]


def model_case(name: str, model: onnx.ModelProto, feeds: dict[str, np.ndarray], rtol=1e-4, atol=1e-5) -> Case:
    """A case of dmlopt's own (a rewriting pass's sites), its expected outputs from ORT on the model as made."""
    onnx.checker.check_model(model)
    return Case(name, model, [(feeds, run_ort(model, feeds))], rtol, atol)


