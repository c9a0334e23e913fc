"""The photos package has an order (issue 40): what a file is -> its clocks -> its pixels -> what
we write. Each module imports only from its own layer or one below, at the top of the module (an
import inside a function hides a circle), and the import graph has no circle.

The graph is read from the source with ``ast`` (nothing is imported), so a new circle fails here
before it can fail at import time."""

from __future__ import annotations

import ast
from pathlib import Path

import photos

PACKAGE = Path(photos.__file__).resolve().parent

#: The declared order, lowest first. A module imports only from its own layer or a lower one.
LAYERS: dict[str, tuple[str, ...]] = {
    "basics": (
        "__init__", "errors", "image_open", "orientation", "exiftool", "exiftool_messages", "memory",
        "containment", "rootfs", "process_exit",
    ),
    "what a file is": ("formats", "raw", "raw_clocks", "companions", "iptc"),
    "its clocks": ("clocks", "capture_time"),
    "its pixels": ("analyze", "verify"),
    "what we write": (
        "keywords", "exif", "sidecar", "fileops", "history", "recovery", "rename", "archive", "upload",
        "params", "versions",
    ),
}  # fmt: skip
LAYER_OF = {module: rank for rank, modules in enumerate(LAYERS.values()) for module in modules}


def photos_imports(tree: ast.AST) -> list[tuple[str, ast.stmt]]:
    """The photos modules a parsed module imports, with the statement that imports each."""
    found: list[tuple[str, ast.stmt]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level <= 1:
            # ``from . import x`` / ``from .x import y`` inside the package read as ``photos.x``
            module = f"photos.{node.module}" if node.level and node.module else node.module or "photos"
            if module == "photos":
                found += [(alias.name, node) for alias in node.names]
            elif module.startswith("photos."):
                found.append((module.split(".")[1], node))
        elif isinstance(node, ast.Import):
            found += [(a.name.split(".")[1], node) for a in node.names if a.name.startswith("photos.")]
    return found


def import_graph(folder: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the photos modules it imports (anywhere in it)."""
    return {
        path.stem: {name for name, _ in photos_imports(ast.parse(path.read_text(encoding="utf-8")))}
        for path in sorted(folder.glob("*.py"))
    }


def nested_imports(folder: Path = PACKAGE) -> list[str]:
    """``module:line`` of each photos import that is not at a module's top level."""
    out = []
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = {id(stmt) for stmt in tree.body}
        top |= {id(s) for stmt in tree.body if isinstance(stmt, ast.If) for s in stmt.body}  # TYPE_CHECKING
        out += [f"{path.stem}:{stmt.lineno}" for _, stmt in photos_imports(tree) if id(stmt) not in top]
    return sorted(set(out))


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph (``[a, b, ..., a]``), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep) :] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_photos_package_has_no_import_circle() -> None:
    # Given the photos package's import graph, read from its source
    graph = import_graph()
    # When it is searched for a circle / Then there is none
    assert find_cycle(graph) is None, f"photos/ imports in a circle: {' -> '.join(find_cycle(graph) or [])}"


def test_no_photos_module_imports_another_inside_a_function() -> None:
    # Given every photos module / When its photos imports are listed / Then each is at the top
    assert nested_imports() == [], "an import inside a function hides a circle; import at the top"


def test_every_photos_module_imports_only_its_own_layer_or_lower() -> None:
    # Given the declared order and the graph
    graph = import_graph()
    unplaced = sorted(set(graph) - set(LAYER_OF))
    assert unplaced == [], f"place each new photos module in LAYERS: {unplaced}"
    # When each import is compared with the order / Then none reaches up
    upward = sorted(
        f"{module} ({_name(module)}) imports {dep} ({_name(dep)})"
        for module, deps in graph.items()
        for dep in deps
        if dep in LAYER_OF and LAYER_OF[dep] > LAYER_OF[module]
    )
    assert upward == []


def _name(module: str) -> str:
    return list(LAYERS)[LAYER_OF[module]]


def test_the_check_finds_a_circle_and_a_nested_import(tmp_path: Path) -> None:
    # Given a package where a imports b at the top and b imports a inside a function
    (tmp_path / "a.py").write_text("from photos.b import f\n")
    (tmp_path / "b.py").write_text("def f():\n    from . import a\n    return a\n")
    # When the checks read it / Then both the circle and the nested import are found
    assert find_cycle(import_graph(tmp_path)) == ["a", "b", "a"]
    assert nested_imports(tmp_path) == ["b:2"]
