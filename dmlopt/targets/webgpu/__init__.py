"""WebGPU: ORT's WebGpuExecutionProvider (Dawn on D3D12 on Windows, on Vulkan on Linux), the EP
Microsoft points DirectML users to.  What is true of it lives here:

- the host, how dmlopt runs a model on it (the ``onnxruntime-ep-webgpu`` plug-in registered into the
  installed onnxruntime; on a machine whose ORT device discovery finds no GPU, the plug-in's own
  software-adapter switch), lives a floor below in ``dmlopt.runtime.webgpu_host``, since every
  session needs it; which adapter Dawn gets, in ``dmlopt.runtime.vulkan``.
- ``kernels``: what its kernels compute, measured on the adapter: a fused site is probed on the EP
  against the CPU EP before a pass writes it (its MultiHeadAttention is wrong from 32 tokens on
  under lavapipe).
- ``placement``: where ORT puts each node and which copies it adds, read from the EP's own log
  (measured), and graph-capture readiness from that answer.
- ``session``: the provider options dmlopt recommends for deployment (layout, graph capture,
  buffer cache modes, validation mode, device) and the fp16 capability check (``shader-f16``).

The passes' per-target defaults for ``webgpu`` are declared with each pass's option (with the
measurement or the ORT source behind each) and listed in ``DEFAULTS`` of ``session`` for the report.
"""
