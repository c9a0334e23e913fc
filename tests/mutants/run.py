"""The mutation suite (``make mutants``): each curated mutation of a protocol invariant, applied to a
scratch copy of the tree, must be killed by the tests it names.

The list is ``tests/mutants/mutations.toml`` (how to add one: its header and the README's
"Proofs and mutations"). For every mutation the runner copies the working tree (tracked and
untracked, not ignored, files: the code as it is now, committed or not; the working tree itself is
never written) into a temporary folder, finds the named function (or class, ``Class.method``, or
module-level assignment) with ``ast``, applies the regular expression inside that function's source
only, and runs the listed tests there (``pytest -x``, unit and integration tests: seconds each),
several mutations at once (``--jobs``), each under a deadline (``--timeout``). It prints one line a
mutation — killed (by which test), survived, not located (the function or the pattern is gone: the
code moved, update the mutation), timeout or broken (the tests could not run) — with its time, and
exits 0 only when every mutation was killed.

    python -m tests.mutants.run [--fast] [--only ID ...] [--jobs N] [--timeout S] [--no-baseline]

``--fast``: the mutations marked ``fast = true`` (``make test`` runs them,
tests/integration/test_mutants.py). Before the mutations, a baseline run of all their tests on the
unmutated copy must pass (``--no-baseline`` skips it): a test failing anyway kills nothing.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIST = Path(__file__).with_name("mutations.toml")
KILLED, SURVIVED, NOT_LOCATED, TIMEOUT, BROKEN = "killed", "survived", "not located", "timeout", "broken"
# Variables a child pytest must not inherit from a pytest that runs the suite (its lock-order
# folder, its xdist worker name): the child sets up its own.
_PARENT_VARS = ("PHOTOJOBS_LOCKDEP", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_ADDOPTS")


@dataclass(frozen=True)
class Mutation:
    id: str
    promise: str
    what: str
    file: str
    function: str | tuple[str, ...]  # a definition, or several (the pattern applied in each)
    find: str
    replace: str
    tests: tuple[str, ...]
    count: int = 1
    fast: bool = False


@dataclass
class Outcome:
    mutation: Mutation
    status: str
    seconds: float = 0.0
    detail: str = ""
    output: str = field(default="", repr=False)


def load(path: Path = LIST) -> list[Mutation]:
    """The mutations of the list, checked for shape (unique ids, the fields each needs)."""
    data = tomllib.loads(path.read_text())
    found: list[Mutation] = []
    for raw in data.get("mutation", []):
        unknown = set(raw) - set(Mutation.__dataclass_fields__)
        if unknown:
            raise ValueError(f"mutation {raw.get('id')!r}: unknown fields {sorted(unknown)}")
        function = raw["function"] if isinstance(raw["function"], str) else tuple(raw["function"])
        found.append(Mutation(**{**raw, "tests": tuple(raw["tests"]), "function": function}))
    ids = [m.id for m in found]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"duplicate mutation ids: {dupes}")
    for m in found:
        if not m.tests:
            raise ValueError(f"mutation {m.id!r} names no test that must kill it")
    return found


def _span(source: str, name: str) -> tuple[int, int] | None:
    """(first, last) line (1-based) of the definition ``name`` (``f``, ``Class``, ``Class.method``,
    or a module-level assignment), None when there is none or more than one."""
    tree = ast.parse(source)
    parts = name.split(".")
    scopes: list[list[ast.stmt]] = [tree.body]
    node: ast.AST | None = None
    for depth, part in enumerate(parts):
        hits: list[ast.AST] = []
        for body in scopes:
            for stmt in body:
                if (
                    isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                    and stmt.name == part
                ):
                    hits.append(stmt)
                elif depth == len(parts) - 1 and isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                    if any(isinstance(t, ast.Name) and t.id == part for t in targets):
                        hits.append(stmt)
        if len(hits) != 1:
            return None
        node = hits[0]
        scopes = [node.body] if isinstance(node, ast.ClassDef) else []
    if node is None:
        return None
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    return first, node.end_lineno or node.lineno


def apply(m: Mutation, source: str) -> tuple[str | None, str]:
    """``source`` with the mutation applied (in each of its functions, when it names several), or
    (None, why it could not be located)."""
    for name in (m.function,) if isinstance(m.function, str) else m.function:
        mutated, why = _apply_in(m, name, source)
        if mutated is None:
            return None, why
        source = mutated
    return source, ""


def _apply_in(m: Mutation, name: str, source: str) -> tuple[str | None, str]:
    span = _span(source, name)
    if span is None:
        return None, f"{m.file}: no single definition {name!r}"
    lines = source.splitlines(keepends=True)
    before, body, after = (
        "".join(lines[: span[0] - 1]),
        "".join(lines[span[0] - 1 : span[1]]),
        "".join(lines[span[1] :]),
    )
    mutated, n = re.subn(m.find, m.replace, body, flags=re.MULTILINE)
    if n != m.count:
        return None, f"{m.file}:{name}: pattern matched {n} time(s), expected {m.count}: {m.find!r}"
    if mutated == body:
        return None, f"{m.file}:{name}: the replacement changes nothing"
    result = before + mutated + after
    try:
        ast.parse(result)
    except SyntaxError as exc:
        return None, f"{m.file}:{name}: the mutated code does not parse: {exc}"
    return result, ""


def locate(m: Mutation, root: Path = ROOT) -> str:
    """Why the mutation cannot be applied to the tree at ``root`` (empty: it can)."""
    path = root / m.file
    if not path.is_file():
        return f"{m.file}: no such file"
    return apply(m, path.read_text())[1]


def _tree_files(root: Path) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return [f for f in listed.split("\0") if f and (root / f).is_file()]


def scratch_copy(root: Path, files: list[str]) -> Path:
    """A copy of ``files`` of the tree in a new temporary folder (real copies: nothing links back)."""
    dest = Path(tempfile.mkdtemp(prefix="pj-mutant-"))
    for f in files:
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / f, target)
    return dest


def _env(copy: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _PARENT_VARS}
    env["PYTHONPATH"] = str(copy)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _pytest(copy: Path, tests: list[str], timeout: float, workers: int) -> tuple[int | None, str, float]:
    """Run ``tests`` in ``copy``: (exit code, None on timeout; output; seconds)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-rfE", "-p", "no:cacheprovider", "--no-header"]
    cmd += ["-n", str(workers)] if workers > 0 else ["-n", "0"]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd + tests,
        cwd=copy,
        env=_env(copy),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the pytest and whatever it started (its own session)
        out, _ = proc.communicate()
        code = None
    return code, out, time.monotonic() - start


_FAILED = re.compile(r"^(FAILED|ERROR) (.+?)(?: - .*)?$", re.MULTILINE)


def run_one(m: Mutation, root: Path, files: list[str], timeout: float) -> Outcome:
    """Apply ``m`` to a scratch copy and run its tests there."""
    start = time.monotonic()
    source = (root / m.file).read_text() if (root / m.file).is_file() else None
    mutated, why = apply(m, source) if source is not None else (None, f"{m.file}: no such file")
    if mutated is None:
        return Outcome(m, NOT_LOCATED, time.monotonic() - start, why)
    copy = scratch_copy(root, files)
    try:
        target = copy / m.file
        target.write_text(mutated)
        code, out, _ = _pytest(copy, list(m.tests), timeout, 0)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    seconds = time.monotonic() - start
    if code is None:
        return Outcome(m, TIMEOUT, seconds, f"its tests ran past {timeout:.0f} s", out)
    if code == 0:
        return Outcome(m, SURVIVED, seconds, "every listed test passed", out)
    failed = _FAILED.findall(out)
    if code == 1 and failed:
        kind, test = failed[0]
        return Outcome(m, KILLED, seconds, test + (" (teardown error)" if kind == "ERROR" else ""), out)
    last = [line for line in out.strip().splitlines() if line.strip()][-3:]
    return Outcome(m, BROKEN, seconds, f"pytest exit {code}: {' | '.join(last)}", out)


def baseline(
    mutations: list[Mutation], root: Path, files: list[str], timeout: float
) -> tuple[bool, str, float]:
    """Every listed test passes on the unmutated copy."""
    tests = sorted({t for m in mutations for t in m.tests})
    copy = scratch_copy(root, files)
    try:
        code, out, seconds = _pytest(copy, tests, timeout, 2)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    return code == 0, out, seconds


def readme_table(mutations: list[Mutation]) -> str:
    """The README's "Proofs and mutations" table: each mutation, the bug, the test that kills it."""
    rows = ["| mutation | the bug | killed by | fast |", "|---|---|---|---|"]
    for m in mutations:
        where = f"`{m.file}` `{m.function if isinstance(m.function, str) else ', '.join(m.function)}`"
        kill = ", ".join(f"`{t}`" for t in m.tests)
        rows.append(f"| `{m.id}` | {m.what} ({where}) | {kill} | {'yes' if m.fast else ''} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutants.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast", action="store_true", help="only the mutations marked fast (make test)")
    parser.add_argument("--only", nargs="+", metavar="ID", help="only these mutations")
    parser.add_argument("--jobs", type=int, default=2, help="mutations run at once (default 2)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a mutation's tests may take")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the tests")
    parser.add_argument("--table", action="store_true", help="print the README table; run nothing")
    parser.add_argument(
        "--verbose", action="store_true", help="print the output of every mutation not killed"
    )
    args = parser.parse_args(argv)
    mutations = load()
    if args.table:
        print(readme_table(mutations))
        return 0
    if args.fast:
        mutations = [m for m in mutations if m.fast]
    if args.only:
        unknown = set(args.only) - {m.id for m in mutations}
        if unknown:
            parser.error(f"unknown mutation ids: {sorted(unknown)}")
        mutations = [m for m in mutations if m.id in args.only]
    started = time.monotonic()
    files = _tree_files(ROOT)
    print(f"mutation suite: {len(mutations)} mutations, {args.jobs} at a time, tree {ROOT}", flush=True)
    if not args.no_baseline:
        ok, out, seconds = baseline(mutations, ROOT, files, args.timeout * 2)
        print(f"baseline (every listed test, unmutated): {'passed' if ok else 'FAILED'} in {seconds:.0f} s")
        if not ok:
            print(out[-4000:])
            return 2
    outcomes: list[Outcome] = []
    width = max(len(m.id) for m in mutations) if mutations else 10
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for outcome in pool.map(lambda m: run_one(m, ROOT, files, args.timeout), mutations):
            outcomes.append(outcome)
            m = outcome.mutation
            print(
                f"{outcome.status:>11}  {m.id:<{width}}  {outcome.seconds:6.1f} s  {outcome.detail}",
                flush=True,
            )
            if outcome.status != KILLED and (args.verbose or outcome.status == BROKEN):
                print(outcome.output[-3000:])
    total = time.monotonic() - started
    counts = {
        s: sum(1 for o in outcomes if o.status == s) for s in (KILLED, SURVIVED, NOT_LOCATED, TIMEOUT, BROKEN)
    }
    print(
        f"total: {len(outcomes)} mutations, "
        + ", ".join(f"{n} {s}" for s, n in counts.items() if n or s == KILLED)
        + f" in {total:.0f} s ({total / 60:.1f} min)"
    )
    return 0 if outcomes and counts[KILLED] == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
