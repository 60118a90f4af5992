"""What dmlopt tells about a model: the optimize run's report as JSON and a table
(optimize_report), the same report as one self-contained HTML page (html_page), and what
`dmlopt inspect` shows of a model (inspection).

May import passes, targets, runtime, io, graph and the ground modules (dmlopt.errors, target,
limits, version); never the engine or the command, which fill it.
"""
