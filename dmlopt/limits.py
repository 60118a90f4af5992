"""Sizes dmlopt allows before it allocates or reads: one place, so that every reader checks the
same bound (random inputs, --inputs files, model files)."""

from __future__ import annotations

# All inputs of one run together (random or read from --inputs): a declared dim can be anything
# up to 2**63, and a 389 KB .npz can declare 400 MB.
INPUT_BYTES = 2**31
# Protobuf cannot parse a message over 2 GiB: a larger .onnx file is refused before it is read.
PROTOBUF_BYTES = 2**31 - 1
