"""Every write, move, link, folder and delete of the product goes through ``photos/rootfs.py``
(docs/design.md rule 11, issue 37): a file under ``photos/``, ``actors/``, ``store/`` or
``photojobs/`` that calls a path-based ``os.link/rename/replace/unlink/remove/mkdir/makedirs/rmdir/
removedirs/symlink``, ``Path.mkdir/unlink/rename/replace/rmdir/symlink_to/hardlink_to`` or
``shutil.move/copy*/rmtree`` fails this test, unless it is on the short allow-list below.

A call acting on descriptors is not path-based: ``os.unlink(name, dir_fd=fd)``,
``os.replace(a, b, src_dir_fd=fd, dst_dir_fd=fd)`` (their descriptors come from ``photos.rootfs``).
Each file is parsed with :mod:`ast`, so a string or a comment never counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("photos", "actors", "store", "photojobs")
#: The one module that acts on paths (beneath a root's descriptor).
CONFINED_ROOT = "photos/rootfs.py"

#: os functions with one path argument, made descriptor-based by ``dir_fd``
OS_ONE = {"unlink", "remove", "rmdir", "mkdir", "symlink"}
#: os functions with two, made descriptor-based by ``src_dir_fd`` and ``dst_dir_fd``
OS_TWO = {"link", "rename", "replace"}
OS_ALWAYS = {"makedirs", "removedirs"}
PATH_METHODS = {"mkdir", "unlink", "rmdir", "symlink_to", "hardlink_to"}
PATH_ONE_ARG = {"rename", "replace"}  # str.replace takes two: only a one-argument call is a Path's
SHUTIL = {"move", "rmtree"}  # and every copy* but copyfileobj (file objects, no path)

#: (file, function): the few writes that are not a job's photo lanes, each justified.
ALLOWED: dict[tuple[str, str], str] = {
    # the state folder (database, Redis socket, logs) and the runtime folder: the operator's own, 0700
    ("photojobs/runner/state_folder.py", "make_private_dir"): "the state folder",
    ("store/engine.py", "make_engine"): "the SQLite database's folder (in the state folder)",
    ("photojobs/supervisor.py", "_open_log"): "the log folder in the state folder",
    ("photojobs/supervisor.py", "stop"): "the supervisor's own record in the runtime folder",
    ("photojobs/lifeline.py", "write_record"): "a fleet's record in the runtime folder",
    ("photojobs/lifeline.py", "stop_orphans"): "a dead fleet's record in the runtime folder",
    ("photojobs/lifeline.py", "runtime_dir"): "the runtime folder (0700, checked to be ours)",
    ("photojobs/embedded_redis.py", "_unlink"): "the embedded Redis's pid file and socket",
    ("photojobs/embedded_redis.py", "_prepare_dirs"): "the embedded Redis's folders in the state folder",
    ("photojobs/embedded_redis.py", "stop"): "the embedded Redis's socket folder",
    # this process's private 0700 folder in the temp dir: names of open descriptors, never a photo
    ("photos/containment.py", "_sweep_dead_pins"): "dead processes' pin folders in the temp dir",
    ("photos/containment.py", "_pin_folder"): "this process's pin folder in the temp dir",
    ("photos/containment.py", "__init__"): "a pin: a symlink to /proc/<pid>/fd/<n> in the pin folder",
    ("photos/containment.py", "close"): "a pin's name in the pin folder",
    # exiftool's config file, written by mkstemp into the temp dir
    ("photos/exiftool.py", "_unlink_quietly"): "an exiftool config in the temp dir (no memfd)",
    # tools for tests and the demo, never run by a job
    ("store/lockdep.py", "write"): "the lock-order checker's reports (tests)",
    ("store/lockdep.py", "clear"): "the lock-order checker's reports (tests)",
    ("photojobs/testing/samples.py", "generate_samples"): "sample photos for tests and the demo",
    ("photojobs/demo.py", "main"): "the demo's own sample, archive and state folders, made afresh",
}


def _keywords(call: ast.Call) -> set[str]:
    return {k.arg for k in call.keywords if k.arg}


def path_based(call: ast.Call) -> str | None:
    """What a call is, when it is a path-based file operation (else None)."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return None
    owner = func.value.id if isinstance(func.value, ast.Name) else None
    name, kw = func.attr, _keywords(call)
    if owner == "os":
        if name in OS_ALWAYS:
            return f"os.{name}"
        if name in OS_ONE and "dir_fd" not in kw:
            return f"os.{name}"
        if name in OS_TWO and not {"src_dir_fd", "dst_dir_fd"} <= kw:
            return f"os.{name}"
        return None
    if owner == "shutil":
        if name in SHUTIL or (name.startswith("copy") and name != "copyfileobj"):
            return f"shutil.{name}"
        return None
    if name in PATH_METHODS:
        return f"Path.{name}"
    if name in PATH_ONE_ARG and len(call.args) == 1 and not call.keywords:
        return f"Path.{name}"
    return None


def imported_names(tree: ast.Module) -> list[str]:
    """``from os import unlink`` / ``from shutil import rmtree``: a bare name escapes the check."""
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("os", "shutil"):
            for alias in node.names:
                probe = ast.Call(
                    func=ast.Attribute(value=ast.Name(id=node.module), attr=alias.name), args=[], keywords=[]
                )
                if path_based(probe):
                    bad.append(f"from {node.module} import {alias.name}")
    return bad


def violations_in(path: Path, rel: str) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
    found = [f"{rel}: {what}" for what in imported_names(tree)]

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            here = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if isinstance(child, ast.Call):
                what = path_based(child)
                if what and (rel, here) not in ALLOWED:
                    found.append(f"{rel}:{child.lineno} {here}(): {what}")
            visit(child, here)

    visit(tree, "<module>")
    return found


def all_violations(root: Path = ROOT) -> list[str]:
    out: list[str] = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel != CONFINED_ROOT:
                out += violations_in(path, rel)
    return out


def test_every_write_move_link_and_delete_goes_through_the_confined_root() -> None:
    # Given every module of the product but the confined-root module
    # When its calls are read
    found = all_violations()
    # Then none is a path-based write, move, link, folder or delete outside the allow-list
    assert found == [], "path-based file operations outside photos/rootfs.py:\n" + "\n".join(found)


def test_the_allow_list_names_only_functions_that_still_need_it() -> None:
    # Given the allow-list / Then each entry still covers a path-based call (no stale exception)
    used = set()
    for rel, function in ALLOWED:
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == function:
                if any(isinstance(c, ast.Call) and path_based(c) for c in ast.walk(node)):
                    used.add((rel, function))
    assert sorted(set(ALLOWED) - used) == []


def test_the_lint_catches_each_kind_of_path_based_call(tmp_path: Path) -> None:
    # Given a module with one call of each kind, and the descriptor-based forms beside them
    source = '''
import os, shutil
from pathlib import Path
from os import makedirs
def f(p: Path, fd: int) -> None:
    os.link("a", "b")
    os.rename("a", "b")
    os.replace("a", "b")
    os.unlink("a")
    os.mkdir("a")
    os.makedirs("a")
    p.mkdir(parents=True)
    p.unlink(missing_ok=True)
    p.rename("b")
    p.replace("b")
    p.symlink_to("b")
    shutil.move("a", "b")
    shutil.copy2("a", "b")
    shutil.rmtree("a")
    os.unlink("a", dir_fd=fd)
    os.replace("a", "b", src_dir_fd=fd, dst_dir_fd=fd)
    os.link("a", "b", src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
    "x".replace("a", "b")
    shutil.copyfileobj(None, None)
'''
    module = tmp_path / "m.py"
    module.write_text(source)
    # When it is linted / Then each path-based call is named and no descriptor-based one
    found = violations_in(module, "photos/m.py")
    kinds = [v.rsplit(" ", 1)[-1] for v in found]
    assert kinds == [
        "makedirs", "os.link", "os.rename", "os.replace", "os.unlink", "os.mkdir", "os.makedirs",
        "Path.mkdir", "Path.unlink", "Path.rename", "Path.replace", "Path.symlink_to", "shutil.move",
        "shutil.copy2", "shutil.rmtree",
    ], found  # fmt: skip
