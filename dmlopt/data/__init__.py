"""Package data: the bundled demo models and the DirectML placement tables."""
