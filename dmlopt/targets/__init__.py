"""One home per deployment target: what is true of an execution provider lives in its package.

``dmlopt.targets.dml`` holds DirectML's kernel tables and placement model, its emulation, its
Einsum support rules, calibration against the real EP and the host that runs it.
``dmlopt.targets.webgpu`` holds the WebGPU EP's: the kernels probed on the EP before a fusion is
written, measured (or predicted) placement, the session it recommends and validation on the EP
(its plug-in host and the adapter Dawn takes are dmlopt.runtime's webgpu_host and vulkan, since
every session uses them).  Beside them, what reads the targets: graph-capture readiness
(graph_capture) and the session configuration written for a deployment (session_config).

May import runtime, io, graph and the ground modules (dmlopt.errors, target, limits, version);
the passes, the report, the engine and the command build on it.
"""
