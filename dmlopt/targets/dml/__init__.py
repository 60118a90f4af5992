"""DirectML: what ORT's DmlExecutionProvider registers per version, where it places nodes, how it
is emulated and calibrated, and the host that runs the real EP (in-process on Windows, under Wine
elsewhere)."""
