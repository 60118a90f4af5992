"""dmlopt: prepare exported ONNX models for fast DirectML deployment.

Python API (usable from an export script)::

    import dmlopt
    result = dmlopt.optimize("sam_encoder.onnx", shapes={"input": [1, 3, 1024, 1024]})
    print(result.report.to_table())
    dmlopt.save(result.model, "sam_encoder.dml.onnx")
"""

from __future__ import annotations

from dmlopt.errors import CheckFailed, DmlOptError, InputError, OutputError, UsageError
from dmlopt.inspection import inspect
from dmlopt.model import load, save
from dmlopt.pipeline import Result, optimize
from dmlopt.validate import validate
from dmlopt.version import __version__

__all__ = [
    "CheckFailed",
    "DmlOptError",
    "InputError",
    "OutputError",
    "Result",
    "UsageError",
    "__version__",
    "inspect",
    "load",
    "optimize",
    "save",
    "validate",
]
