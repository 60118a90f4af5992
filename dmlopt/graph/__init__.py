"""Shapes and checks over an onnx_ir model, without ONNX Runtime: static shapes from the user
(shapes), ONNX shape inference without copying the weights (shape_inference), sizes for dynamic
inputs (input_sizes), values for inputs the graph uses as sizes (input_values), the check after
each pass and the op counts (check), and fresh value names (names).

May import only the ground modules (dmlopt.errors, target, limits, version).
"""
