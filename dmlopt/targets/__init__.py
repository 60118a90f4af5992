"""One home per deployment target: what is true of an execution provider lives in its package.

``dmlopt.targets.dml`` holds DirectML's kernel tables and placement model, its emulation, its
Einsum support rules, calibration against the real EP and the host that runs it.
``dmlopt.targets.webgpu`` holds the WebGPU EP's: the plug-in host and the adapter Dawn takes, the
kernels probed on the EP before a fusion is written, measured (or predicted) placement, the
session it recommends and validation on the EP.
"""
