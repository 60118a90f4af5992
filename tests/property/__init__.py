"""Property-based tests: for every pass, generated graphs either stay as they are or come out
checker-valid and numerically the same on ORT's CPU EP (strategies.py builds them)."""
