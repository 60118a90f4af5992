"""dmlopt's graph passes, one pass a file (installed as ``dmlopt.passes``).

Each module defines one ``DmlPass`` subclass.  The registry below is explicit: a
module is listed here, its pass class is found by ``name``.  The default pipeline runs
every registered pass whose ``enabled()`` is true, in ``order``.
"""

from __future__ import annotations

import importlib

from dmlopt.passes._base import DmlPass, EngineSettings, Option, PassContext, Site, SiteRule, apply_rules
from dmlopt.passes._options import OptionStore, PassOptions, check_unique_options

# One line per module; the pass classes are looked up in them.
_MODULES = [
    "cleanup",
    "freeze_shapes",
    "op_versions",
    "prelu", "leaky_relu", "conv_transpose",
    "fp16",
    "einsum",
    "transpose",
    "attention",
    "window_layout",
    "relpos_attention",
    "pad_concat",
    "linear_gemm",
    "gemm_weights",
    "norm_fusion",
    "copies",
]


def all_passes() -> dict[str, type[DmlPass]]:
    """Every registered pass by CLI name, in pipeline order."""
    found: list[type[DmlPass]] = []
    for module_name in _MODULES:
        module = importlib.import_module(f"dmlopt.passes.{module_name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, DmlPass) and obj is not DmlPass and obj.name \
                    and obj.__module__ == module.__name__:
                found.append(obj)
    found.sort(key=lambda cls: cls.order)
    check_unique_options(found)
    return {cls.name: cls for cls in found}


__all__ = ["DmlPass", "EngineSettings", "Option", "OptionStore", "PassContext", "PassOptions", "Site", "SiteRule",
           "all_passes", "apply_rules", "check_unique_options"]
