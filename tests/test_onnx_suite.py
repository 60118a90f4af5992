"""ONNX's own test suite through dmlopt (tests/onnx_suite.py): every case ORT runs right keeps running
and keeps its results, for every target; and each rewriting pass's strategies at old and new opsets.

The default run takes a fixed subset (the cases issue 33 names and one of each family dmlopt
rewrites); ``pytest -m slow`` runs all of ONNX's cases, one test per kind, with the figures printed.
"""

from __future__ import annotations

import collections
import time

import pytest

import dmlopt

from tests import onnx_suite
from tests.pass_cases import CONV_TRANSPOSE_CASES, OPSETS, conv_transpose_case, pass_cases

FAST_CASES = (
    # 1. the model's opset: Gemm-6 without C, Constant-1 int64, Unsqueeze-11 and Split-11 forms
    "test_Linear_no_bias", "test_operator_permute2", "test_sequence_model5", "test_sequence_model8",
    # 2. onnxscript's folding raised on a scalar split
    "test_split_to_sequence_1",
    # 3. IR-3 models with folds
    "test_PixelShuffle", "test_operator_view", "test_operator_flatten",
    # 4. a fold exposing a latent non-conformance; Loop over an optional sequence
    "test_affine_grid_2d_expanded", "test_loop16_seq_none",
    # 5. float16 validation of a model with a Scan
    "test_linear_attention_fp16_expanded",
    # 6. ConvTranspose
    "test_convtranspose", "test_convtranspose_1d", "test_convtranspose_3d", "test_convtranspose_dilations",
    "test_convtranspose_autopad_same", "test_convtranspose_kernel_shape", "test_convtranspose_pads",
    "test_convtranspose_group_2",
    # 7. sequence and optional inputs
    "test_identity_sequence", "test_identity_opt", "test_sequence_map_add_2_sequences",
    # what the passes rewrite, and control flow around them
    "test_conv_with_strides_padding", "test_gemm_default_no_bias", "test_matmul_2d", "test_leakyrelu",
    "test_prelu_broadcast", "test_layer_normalization_2d_axis0", "test_group_normalization_example",
    "test_gridsample", "test_einsum_batch_matmul", "test_scan9_sum", "test_if", "test_reduce_max_empty_set",
    "test_cast_FLOAT_to_FLOAT16",
)


def _check(outcomes):
    failed = onnx_suite.failures(outcomes)
    assert not failed, "\n".join(failed)


# Cases still failing, with why (strict: each must fail, so a fix shows up here).
KNOWN_FAILURES: dict[str, str] = {}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=KNOWN_FAILURES[n], strict=True))
                                  if n in KNOWN_FAILURES else n for n in FAST_CASES])
def test_onnx_case(name):
    _check(onnx_suite.run_case(onnx_suite.load_case(name)))


_PASS_CASES = pass_cases()
_FAST_OPSETS = (OPSETS[0], OPSETS[-1])


@pytest.mark.parametrize("case, options", [pytest.param(c, o, id=c.name) for c, o in _PASS_CASES
                                           if int(c.name.rsplit("opset", 1)[1]) in _FAST_OPSETS])
def test_pass_case(case, options):
    _check(onnx_suite.run_case(case, ("dml", "cpu"), **options))


@pytest.mark.parametrize("name", CONV_TRANSPOSE_CASES)
def test_conv_transpose_case(name):
    """ONNX's ConvTranspose cases with constant weights: rewritten exactly or declined (README says which)."""
    case, options = conv_transpose_case(name)
    _check(onnx_suite.run_case(case, ("dml", "cpu"), **options))


@pytest.mark.slow
@pytest.mark.parametrize("case, options", [pytest.param(c, o, id=c.name) for c, o in _PASS_CASES
                                           if int(c.name.rsplit("opset", 1)[1]) not in _FAST_OPSETS])
def test_pass_case_other_opsets(case, options):
    _check(onnx_suite.run_case(case, ("dml", "cpu"), **options))


@pytest.mark.slow
@pytest.mark.parametrize("kind", onnx_suite.KINDS)
def test_every_onnx_case(kind):
    """Every case of `kind` for every target (validation once a case); figures printed (-s)."""
    start = time.perf_counter()
    counts, failed = collections.Counter(), []
    for name in onnx_suite.case_names([kind]):
        outcomes = onnx_suite.run_case(onnx_suite.load_case(name))
        lines = [f"{name}: {line}" for line in onnx_suite.failures(outcomes)]
        status = ("ort-fails" if outcomes[0].status == onnx_suite.ORT_FAILS else "passed" if not lines
                  else "known failure" if name in KNOWN_FAILURES else "failed")
        counts[status] += 1
        if status == "failed":
            print("\n".join(lines), flush=True)
            failed += lines
        elif name in KNOWN_FAILURES and status == "passed":
            failed.append(f"{name}: passes now: take it out of KNOWN_FAILURES")
        if sum(counts.values()) % 200 == 0:  # progress in CI's log (-s)
            print(f"  {kind}: {dict(counts)} after {time.perf_counter() - start:.0f} s", flush=True)
    print(f"\nONNX {kind}: {sum(counts.values())} cases, {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['known failure']} known failures, {counts['ort-fails']} skipped (ORT itself fails them) "
          f"in {time.perf_counter() - start:.0f} s")
    assert not failed, "\n".join(failed[:40])


def _each_pass():
    from dmlopt.passes import all_passes
    return list(all_passes())


@pytest.mark.parametrize("opset", [o if o in _FAST_OPSETS else pytest.param(o, marks=pytest.mark.slow) for o in OPSETS])
@pytest.mark.parametrize("pass_name", _each_pass())
def test_each_pass_alone_at_each_opset(pass_name, opset):
    """Every registered pass, alone, on every pass case of one opset (7, 11, 13, the newest): the output
    holds only what that opset has (passes/_opset.py), loads in ORT and keeps the case's results
    (float16: within float16's rounding)."""
    from dmlopt.passes._opset import model_refusals

    options = {"fp16": True} if pass_name == "fp16" else {}
    for case, case_options in _PASS_CASES:
        if not case.name.endswith(f"opset{opset}"):
            continue
        result = dmlopt.optimize(case.model, passes=[pass_name], target="dml", validate=False, retime=False,
                                 **options, **case_options)
        assert not model_refusals(result.model), (case.name, model_refusals(result.model))
        tolerance = dict(rtol=2e-2, atol=2e-2) if pass_name == "fp16" else dict(rtol=case.rtol, atol=case.atol)
        for feeds, expected in case.data_sets:
            for got, want in zip(onnx_suite.run_ort(result.model, feeds), expected):
                assert onnx_suite.matches(got, want, **tolerance), (case.name, pass_name)
