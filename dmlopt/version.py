"""dmlopt's version, in the ground layer so that any module (the report, the CLI) can name it
without importing the package and everything its ``__init__`` pulls in."""

__version__ = "0.1.0"
