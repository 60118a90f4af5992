"""dmlopt: prepare exported ONNX models for fast DirectML deployment.

Python API (usable from an export script)::

    import dmlopt
    result = dmlopt.optimize("sam_encoder.onnx", shapes={"input": [1, 3, 1024, 1024]})
    print(result.report.to_table())
    dmlopt.save(result.model, "sam_encoder.dml.onnx")
"""

from __future__ import annotations

from typing import Any

from dmlopt.errors import CheckFailed, DmlOptError, InputError, OutputError, UsageError
from dmlopt.version import __version__


def __getattr__(name: str) -> Any:
    """The API's functions, imported on first use: `import dmlopt` (and the `dmlopt` command's
    help) does not load the ONNX stack until a function that needs it is asked for."""
    if name == "inspect":
        from dmlopt.report.inspection import inspect
        return inspect
    if name in ("load", "save"):
        from dmlopt.io import model
        return getattr(model, name)
    if name in ("Result", "optimize"):
        from dmlopt.engine import pipeline
        return getattr(pipeline, name)
    if name == "validate":
        from dmlopt.runtime.validate import validate
        return validate
    raise AttributeError(f"module 'dmlopt' has no attribute '{name}'")


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
