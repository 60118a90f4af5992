"""JSON that every parser reads: the one rule for --json, JSON reports and the files dmlopt writes.

Python's json writes NaN and Infinity, which are not JSON; a measured error can be NaN (two
outputs whose NaNs differ), so non-finite numbers become null.  numpy scalars and arrays become
plain numbers and lists.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np


def json_text(obj: Any) -> str:
    """`obj` as indented JSON with non-finite numbers as null (see the module docstring)."""
    return json.dumps(_finite(obj), indent=2, default=str, allow_nan=False)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, (np.generic, np.ndarray)):
        return _finite(obj.tolist())
    return obj
