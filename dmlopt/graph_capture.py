"""The old path of dmlopt.targets.graph_capture, kept because the README named it
(``dmlopt.graph_capture.graph_capture_readiness``): it re-exports that module's public names.  New code imports
dmlopt.targets.graph_capture."""

from dmlopt.targets.graph_capture import Readiness, graph_capture_readiness, DML_CAPTURE_SINCE

__all__ = ["Readiness", "graph_capture_readiness", "DML_CAPTURE_SINCE"]
