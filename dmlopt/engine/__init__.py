"""Optimizing a model: the pipeline that runs the passes in order with a check after each
(pipeline), choosing among the variants the passes offer by timing on the target (tune), repairing
a float16 model that fails validation (fp16_repair), and what `dmlopt --help` and `dmlopt passes`
show of the passes without importing them (pass_catalog).

May import report, passes, targets, runtime, io, graph and the ground modules (dmlopt.errors,
target, limits, version); imported by the API (dmlopt/__init__.py) and the command (dmlopt.cli).
"""
