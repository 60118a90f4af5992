"""dmlopt's modules import only downwards, without cycles, and only at module top; passes share
helpers through passes/_base, _shared and _layout, never by importing another pass.

The layers are dmlopt's folders (one stage or one floor each), lowest first: the ground modules
at dmlopt/'s top, graph/, io/, runtime/, targets/, passes/ (installed as dmlopt.passes), report/,
engine/, cli/, then the API (dmlopt/__init__.py).  A module gets its layer from its folder, so a
new module in a folder is placed already; a new module at dmlopt/'s top must be placed in LAYERS
(the test fails until it is).  An import of a module in a higher layer, a cycle (within a layer
too) or an import of dmlopt inside a function fails: such an import hides a cycle that the
module structure should resolve.  The checks read the source with `ast`, nothing is imported.
"""

from __future__ import annotations

import ast
import pathlib

import networkx as nx
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Lowest first: a module may import its own layer and those below it.  A folder (a package) stands
# for every module in it.
LAYERS = {
    "ground": ["dmlopt.errors", "dmlopt.target", "dmlopt.limits", "dmlopt.version", "dmlopt.data"],
    "graph": ["dmlopt.graph"],
    "io": ["dmlopt.io"],
    "runtime": ["dmlopt.runtime"],
    "targets": ["dmlopt.targets"],
    "passes": ["dmlopt.passes"],
    "report": ["dmlopt.report"],
    "engine": ["dmlopt.engine"],
    "cli": ["dmlopt.cli"],
    # The API, and the old module paths the README named, kept as aliases of their new homes.
    "api": ["dmlopt", "dmlopt.__main__", "dmlopt.session_config", "dmlopt.graph_capture"],
}
# Imports of dmlopt inside a function that are allowed, as (module, imported module): the API's
# functions on first use and the entry point's commands, so that `import dmlopt`, `dmlopt --help`
# and `dmlopt passes` start without the ONNX stack (issue 22; tests/test_startup.py).
FUNCTION_IMPORTS_ALLOWED: set[tuple[str, str]] = {
    ("dmlopt", "dmlopt.report.inspection"), ("dmlopt", "dmlopt.io.model"), ("dmlopt", "dmlopt.engine.pipeline"),
    ("dmlopt", "dmlopt.runtime.validate"), ("dmlopt.cli.launch", "dmlopt.cli.commands")}


def modules() -> dict[str, pathlib.Path]:
    """Module name -> file, for dmlopt/ and passes/ (installed as dmlopt.passes); tests left out."""
    found = {}
    for folder, package in (("dmlopt", "dmlopt"), ("passes", "dmlopt.passes")):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name.endswith("_test.py"):
                continue
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package,) + parts)] = path
    return found


MODULES = modules()


def layer_of(module: str) -> int:
    """The index in LAYERS of `module`; every module of dmlopt.passes is in the passes layer."""
    for index, names in enumerate(LAYERS.values()):
        if module in names or any(module.startswith(n + ".") for n in names if n != "dmlopt"):
            return index
    raise KeyError(module)


def imports(module: str, path: pathlib.Path, source: str | None = None) -> list[tuple[str, int, bool]]:
    """(imported dmlopt module, line, inside a function) for each import in `module`'s source."""
    tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"))
    package = module if path.stem == "__init__" else module.rpartition(".")[0]
    found = []

    def known(name: str) -> str:
        while name not in MODULES and "." in name:
            name = name.rpartition(".")[0]
        return name

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            names = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in child.names]
            for name in names:
                if name == "dmlopt" or name.startswith("dmlopt."):
                    found.append((known(name), child.lineno, in_function))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return [(name, line, inner) for name, line, inner in found if name != module]


def import_graph(sources: dict[str, str] | None = None) -> nx.DiGraph:
    """Module -> imported module, each edge with the lines of its imports."""
    graph = nx.DiGraph()
    for module, path in MODULES.items():
        graph.add_node(module)
        for name, line, inner in imports(module, path, (sources or {}).get(module)):
            graph.add_edge(module, name)
            graph.edges[module, name].setdefault("at", []).append((line, inner))
    return graph


def upward_imports(graph: nx.DiGraph) -> list[str]:
    return [f"{a} ({list(LAYERS)[layer_of(a)]}) imports {b} ({list(LAYERS)[layer_of(b)]}) at line "
            f"{graph.edges[a, b]['at'][0][0]}" for a, b in graph.edges if layer_of(b) > layer_of(a)]


def function_imports(graph: nx.DiGraph) -> list[str]:
    return [f"{a} imports {b} inside a function at line {line}" for a, b in graph.edges
            for line, inner in graph.edges[a, b]["at"] if inner and (a, b) not in FUNCTION_IMPORTS_ALLOWED]


def cycles(graph: nx.DiGraph) -> list[str]:
    return [" -> ".join(c + [c[0]]) for c in nx.simple_cycles(graph)]


def test_every_module_has_a_layer():
    missing = []
    for module in MODULES:
        try:
            layer_of(module)
        except KeyError:
            missing.append(module)
    assert not missing, f"place these modules in LAYERS: {missing}"


def test_imports_point_downwards():
    assert upward_imports(import_graph()) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_no_dmlopt_import_inside_a_function():
    assert function_imports(import_graph()) == []


def sibling_pass_imports(graph: nx.DiGraph) -> list[str]:
    """A pass importing another pass's module: shared helpers belong in passes/_base, _shared, _layout."""
    def is_pass(module: str) -> bool:
        return module.startswith("dmlopt.passes.") and not module.rpartition(".")[2].startswith("_")
    return [f"{a} imports {b}" for a, b in graph.edges if a.startswith("dmlopt.passes.") and is_pass(b)]


def test_passes_import_no_sibling_pass():
    assert sibling_pass_imports(import_graph()) == []


# The checks must be able to fail: each is shown a module with the fault added to its real source.
@pytest.mark.parametrize("module, line, check", [
    ("dmlopt.runtime.bench", "from dmlopt.targets.dml import placement\n", upward_imports),
    ("dmlopt.graph.check", "from dmlopt.io.model import save\n", upward_imports),
    ("dmlopt.runtime.sessions", "from dmlopt.targets.webgpu import registry\n", upward_imports),
    ("dmlopt.io.tables", "from dmlopt.report import optimize_report\n", upward_imports),
    ("dmlopt.report.optimize_report", "from dmlopt.engine.pipeline import optimize\n", upward_imports),
    ("dmlopt.runtime.sessions", "from dmlopt.runtime import validate\n", cycles),  # validate imports sessions
    ("dmlopt.runtime.validate", "def later():\n    from dmlopt.graph import shapes\n", function_imports),
    ("dmlopt.passes.prelu", "from dmlopt.passes.leaky_relu import LeakyReluPass\n", sibling_pass_imports),
])
def test_checks_catch_a_fault(module, line, check):
    source = MODULES[module].read_text(encoding="utf-8") + "\n" + line
    assert check(import_graph({module: source})), f"{check.__name__} missed: {line!r} in {module}"


def test_a_module_takes_its_folders_layer():
    """A new module in a folder is placed by its folder; a new module at dmlopt/'s top is not."""
    assert layer_of("dmlopt.runtime.anything_new") == layer_of("dmlopt.runtime.sessions")
    assert layer_of("dmlopt.report.anything_new") > layer_of("dmlopt.passes.anything_new") \
        > layer_of("dmlopt.targets.anything_new")
    with pytest.raises(KeyError):
        layer_of("dmlopt.anything_new")


def test_every_folder_says_what_it_holds():
    """Each folder's __init__.py opens with its docstring: what lives there, what it may import."""
    silent = [m for m, path in MODULES.items() if path.name == "__init__.py" and path.parent != ROOT / "dmlopt"
              and not ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))]
    assert not silent, f"say in a docstring what these folders hold: {silent}"


def test_imports_within_a_layer_are_allowed():
    source = MODULES["dmlopt.io.tables"].read_text(encoding="utf-8") + "\nimport dmlopt.io.progress\n"
    graph = import_graph({"dmlopt.io.tables": source})
    assert graph.has_edge("dmlopt.io.tables", "dmlopt.io.progress") and not upward_imports(graph) and not cycles(graph)
