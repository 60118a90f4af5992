"""The `dmlopt` command: its entry point (launch: --help, --version and `passes` without the ONNX
stack), the parser and every command (commands), the supervised worker process (supervisor), the
demo (demo) and the command line's option types (arg_types).

The top floor: may import every folder below it (engine, report, passes, targets, runtime, io,
graph) and the ground modules (dmlopt.errors, target, limits, version).  Kept empty so that
`dmlopt --help` loads nothing but launch.
"""
