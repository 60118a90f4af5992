"""What dmlopt reads and writes: models loaded and saved through onnx_ir (model, proto_stream),
--inputs files (inputs_file), the files of one run put in place together (outputs), scratch
folders an interrupt cannot leave behind (scratch), and text for parsers and people: JSON
(jsontext), plain-text tables (tables), progress on the terminal (progress).

May import graph and the ground modules (dmlopt.errors, target, limits, version).
"""
