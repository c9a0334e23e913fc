"""The floors import downwards only (docs/design.md "Layout"): photojobs -> actors -> middleware -> store,
photos.

Every ``.py`` file of a package is parsed with :mod:`ast`; every import counts, including those inside
functions (a lazy import is still a dependency) and relative ones (resolved to their package).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# package -> the packages it must never import
FORBIDDEN: dict[str, set[str]] = {
    "photos": {"store", "middleware", "actors", "photojobs"},
    "store": {"middleware", "actors", "photojobs"},
    "middleware": {"actors", "photojobs", "photos"},
    "actors": {"photojobs"},
}

# The one upward import allowed: ``dramatiq actors`` imports the package ``actors``, whose
# ``__init__`` is the worker process's entry point and builds its broker from the command's
# configuration before the lane modules declare their actors (docs/design.md: "actors/ the broker setup
# `dramatiq actors` imports"). The lane modules themselves import nothing from photojobs.
ENTRY_POINTS: dict[str, set[str]] = {"actors/__init__.py": {"photojobs.runtime"}}


def _module_of(path: Path, root: Path) -> list[str]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Every module ``path`` imports, anywhere in the file, relative imports made absolute."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _module_of(path, root)
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module)
            # ``from photojobs import cli`` imports the module photojobs.cli
            found.update(f"{module}.{alias.name}" for alias in node.names if alias.name != "*")
    return found


def violations(package: str, forbidden: set[str], root: Path = ROOT) -> list[str]:
    out: list[str] = []
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        allowed = ENTRY_POINTS.get(rel, set()) if root == ROOT else set()
        for module in sorted(imported_modules(path, root)):
            top = module.split(".")[0]
            if top in forbidden and not any(module == a or module.startswith(a + ".") for a in allowed):
                out.append(f"{rel} imports {module}")
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_floor_imports_no_floor_above_it(package: str) -> None:
    # Given every Python file of the package
    files = list((ROOT / package).rglob("*.py"))
    assert files, f"no Python files under {package}/"
    # When their imports are read, including those inside functions
    found = violations(package, FORBIDDEN[package])
    # Then none names a package the layering forbids
    assert found == [], f"{package}/ must not import {sorted(FORBIDDEN[package])}:\n" + "\n".join(found)


def test_the_scan_sees_lazy_relative_and_from_package_imports(tmp_path: Path) -> None:
    # Given a package whose upward imports hide inside a function, behind "from pkg import mod",
    # and behind a relative import that climbs out of the package
    pkg = tmp_path / "middleware" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "middleware" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "m.py").write_text(
        "import os\n"
        "from .sibling import x\n"
        "def f():\n"
        "    from photojobs import cli\n"
        "    import photos.errors\n"
        "from ...actors import lane\n"
    )
    # When the scan reads it
    found = violations("middleware", FORBIDDEN["middleware"], root=tmp_path)
    # Then each forbidden import is reported, and the allowed ones are not
    assert found == [
        "middleware/sub/m.py imports actors",
        "middleware/sub/m.py imports actors.lane",
        "middleware/sub/m.py imports photojobs",
        "middleware/sub/m.py imports photojobs.cli",
        "middleware/sub/m.py imports photos.errors",
    ]
