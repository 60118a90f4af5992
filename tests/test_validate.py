"""Numerics comparison: metrics, tolerances by dtype, NaNs, shapes, user inputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import dmlopt
from dmlopt.errors import InputError, UsageError
from dmlopt.validate import compare, tolerances
from tests.conftest import conv_leaky_model


def test_identical_and_different_models():
    same = dmlopt.validate(conv_leaky_model(), conv_leaky_model())
    assert same.passed and same.outputs[0].max_abs == 0 and same.outputs[0].cosine == pytest.approx(1.0)
    assert same.inputs == {"x": [1, 3, 8, 8]}  # the dynamic batch became 1
    other = dmlopt.validate(conv_leaky_model(), conv_leaky_model(seed=3))
    assert not other.passed and other.outputs[0].max_rel > 0.1


def test_shapes_choose_the_input_shape():
    v = dmlopt.validate(conv_leaky_model(), conv_leaky_model(), shapes={"x": [2, 3, 8, 8]})
    assert v.inputs == {"x": [2, 3, 8, 8]} and v.outputs[0].shape == [2, 4, 8, 8]


def test_user_inputs_npz(tmp_path):
    x = np.ones((1, 3, 8, 8), np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    v = dmlopt.validate(conv_leaky_model(), conv_leaky_model(), inputs=tmp_path / "in.npz")
    assert v.passed and v.seed is None
    np.savez(tmp_path / "bad.npz", nope=x)
    with pytest.raises(UsageError, match="nope"):
        dmlopt.validate(conv_leaky_model(), conv_leaky_model(), inputs=tmp_path / "bad.npz")
    with pytest.raises(InputError):
        dmlopt.validate(conv_leaky_model(), conv_leaky_model(), inputs=tmp_path / "missing.npz")


def test_tolerance_scales_with_magnitude():
    ref = np.array([1000.0, -1000.0, 1.0], np.float32)
    assert compare("y", ref, ref + np.float32(0.05)).passed  # 5e-5 of the magnitude
    assert not compare("y", ref, ref * np.float32(1.01)).passed  # 1% off
    assert tolerances(np.float16, None, None) == (1e-2, 1e-2)
    assert tolerances(np.int64, None, None) == (0.0, 0.0)
    assert not compare("i", np.array([1, 2]), np.array([1, 3])).passed


def test_nans_shapes_and_missing_outputs():
    nan = np.array([np.nan, 1.0], np.float32)
    assert compare("y", nan, nan.copy()).passed
    assert not compare("y", nan, np.array([0.0, 1.0], np.float32)).passed
    assert not compare("y", np.zeros(3), np.zeros(4)).passed
    missing = compare("y", np.zeros(3), None)
    assert not missing.passed and missing.reason == "output missing"
