"""Builders for dmlopt's test and demo models and export recipes for the full-size real ones.

Not part of the installed package (dmlopt never imports this folder): run from a checkout,
e.g. ``python -m models.build_bundled`` or ``python -m models.sam_encoder --help``.
"""
