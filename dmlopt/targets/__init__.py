"""One home per deployment target: what is true of an execution provider lives in its package.

``dmlopt.targets.dml`` holds DirectML's kernel tables and placement model, its emulation, its
Einsum support rules, calibration against the real EP and the host that runs it.
"""
