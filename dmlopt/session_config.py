"""The old path of dmlopt.targets.session_config, kept because the README named it
(``dmlopt.session_config.cpu_stand_in``): it re-exports that module's public names.  New code imports
dmlopt.targets.session_config."""

from dmlopt.targets.session_config import FORMAT, config_path, cpu_stand_in, recommend, snippet, write

__all__ = ["FORMAT", "config_path", "cpu_stand_in", "recommend", "snippet", "write"]
