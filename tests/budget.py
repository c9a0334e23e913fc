"""The suite's time budget: what each test file may cost in ``make test`` (``tests/budget.toml``).

A run of the suite writes every test's time (setup + call + teardown, seconds) to a JSON file
(``tests/budget_plugin.py``; ``.test-durations.json`` unless ``--durations-json`` names another).
After pytest, ``make test`` runs the check: every file whose tests took more than ``FACTOR`` times
its budget fails it, named with its slowest tests, and so does every test with an entry of its own
and every folder (``tests/unit``, ...) that ran whole; files with no entry are named and held to
the default. A file is not failed for less than ``SLACK`` seconds over its budget (one import, one database
set-up under load). A run of at least ``SPREAD`` budgeted files whose typical file took longer than its
budget (a busy machine: the median ratio) holds each to ``FACTOR`` x that median instead. Not a
timing assertion inside a test: the tests pass or fail on what they prove, the budget says which
of them pays for how much of the run.

    python -m tests.budget check [DURATIONS] [--budget FILE] [--factor F]
    python -m tests.budget update [DURATIONS] [--budget FILE] [--headroom H]
    python -m tests.budget show [DURATIONS]

``update`` rewrites the budget from a run's times (each time ``--headroom`` over the measured
one, at least ``FLOOR``; tests that took ``TEST_ENTRY`` seconds or more get an entry of their own;
a file or folder the run did not cover keeps its entry). The figures are worker-seconds of a
``make test`` run (4 xdist workers on 2 cores): update from such a run on a quiet machine.

The budget also orders the run (``order``): under pytest-xdist the slowest files start first,
spread over the workers, so no worker is left with a long test at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tomllib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGET = ROOT / "tests" / "budget.toml"
DURATIONS = ROOT / ".test-durations.json"
FACTOR = 2.0  # a file (test, folder) fails the check above this many times its budget
DEFAULT = 20.0  # seconds: the budget of a file with no entry
FLOOR = 5.0  # no file's budget below this: scheduling noise must not fail a file of unit tests
SLACK = 30.0 # worker-seconds a file or test may run over its budget before the factor counts:
# a small file's first import or PostgreSQL set-up under load doubles it by 10-25 s (CI, stop 44:
# a 5-s file of four unit asserts took 12.5 s), noise in a run of ~6,500 worker-seconds
HEADROOM = 1.5  # ``update``: budget = measured x HEADROOM
TEST_ENTRY = 10.0  # ``update``: a test that took this long gets an entry of its own
SLOWEST = 20  # the slowest tests the run and ``show`` print
SPREAD = 10  # files with a measured budget a run needs for its median to excuse a busy machine


@dataclass
class Budget:
    """Seconds per test file, per test (the long ones) and per folder, as ``make test`` spends them."""

    files: dict[str, float] = field(default_factory=dict)
    tests: dict[str, float] = field(default_factory=dict)
    folders: dict[str, float] = field(default_factory=dict)
    default: float = DEFAULT

    def file(self, path: str) -> float:
        return self.files.get(path, self.default)


def file_of(nodeid: str) -> str:
    """``tests/process/test_undo.py`` of ``tests/process/test_undo.py::test_x[sqlite]``."""
    return nodeid.split("::", 1)[0]


def folder_of(path: str) -> str:
    """The folder a file counts in: ``tests/unit`` for ``tests/unit/photos/test_x.py`` too."""
    parts = path.split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else (parts[0] if len(parts) > 1 else ".")


def load(path: Path = BUDGET) -> Budget:
    """The budget file (an empty budget when there is none)."""
    if not path.exists():
        return Budget()
    data = tomllib.loads(path.read_text())
    return Budget(
        files={k: float(v) for k, v in data.get("files", {}).items()},
        tests={k: float(v) for k, v in data.get("tests", {}).items()},
        folders={k: float(v) for k, v in data.get("folders", {}).items()},
        default=float(data.get("default", DEFAULT)),
    )


def _key(name: str) -> str:
    return json.dumps(name)  # a TOML basic string: quotes, backslashes and controls escaped


def dump(budget: Budget, path: Path = BUDGET, note: str = "") -> None:
    """Write the budget file (sorted, one entry a line: diffs show what changed)."""
    lines = [
        "# The suite's time budget (tests/budget.py): seconds each test file, long test and folder may",
        "# take in `make test` (worker-seconds: setup + call + teardown, 4 xdist workers on 2 cores).",
        f"# `make test` fails a file, test or folder that takes more than {FACTOR:g}x its figure; a file",
        "# with no entry is named and held to `default`. The figures also order the run (slowest first).",
        "# Rewrite from a run: python -m tests.budget update .test-durations.json",
    ]
    if note:
        lines.append(f"# {note}")
    lines += ["", f"default = {budget.default:g}", "", "[folders]"]
    lines += [f"{_key(k)} = {v:g}" for k, v in sorted(budget.folders.items())]
    lines += ["", "[files]"]
    lines += [f"{_key(k)} = {v:g}" for k, v in sorted(budget.files.items())]
    lines += ["", "[tests]"]
    lines += [f"{_key(k)} = {v:g}" for k, v in sorted(budget.tests.items())]
    path.write_text("\n".join(lines) + "\n")


def read_durations(path: Path = DURATIONS) -> tuple[dict[str, float], dict[str, object]]:
    """A run's ``{node id: seconds}`` and what it says about itself (workers, load, wall time)."""
    data = json.loads(path.read_text())
    tests = {k: float(v["seconds"]) for k, v in data["tests"].items()}
    return tests, {k: v for k, v in data.items() if k != "tests"}


def by_file(durations: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for nodeid, seconds in durations.items():
        out[file_of(nodeid)] += seconds
    return dict(out)


def by_folder(durations: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for path, seconds in by_file(durations).items():
        out[folder_of(path)] += seconds
    return dict(out)


def _existing(paths: Iterable[str], root: Path) -> set[str]:
    return {p for p in paths if (root / p).exists()}


def whole_folders(budget: Budget, durations: dict[str, float], root: Path = ROOT) -> set[str]:
    """The folders the run covered whole: every budgeted file of it that still exists ran."""
    ran = set(by_file(durations))
    out = set()
    for folder in {folder_of(f) for f in ran}:
        listed = _existing((f for f in budget.files if folder_of(f) == folder), root)
        if listed <= ran:
            out.add(folder)
    return out


def _s(seconds: float) -> str:
    return f"{seconds:.1f} s"


def slowdown(budget: Budget, durations: dict[str, float]) -> float:
    """How much slower than its budget this run's typical file was, when the run had at least
    ``SPREAD`` files with a measured budget (above the floor): the median of their ratios, at least
    1. A busy machine slows every file; a file that got dearer stands out from the median."""
    ratios = sorted(
        seconds / budget.files[path]
        for path, seconds in by_file(durations).items()
        if budget.files.get(path, 0) > FLOOR
    )
    if len(ratios) < SPREAD:
        return 1.0
    return max(1.0, ratios[len(ratios) // 2])


def check(
    budget: Budget,
    durations: dict[str, float],
    factor: float = FACTOR,
    root: Path = ROOT,
    slow: float = 1.0,
    slack: float = SLACK,
) -> tuple[list[str], list[str]]:
    """What took more than ``factor`` x ``slow`` x its budget and more than ``slack`` seconds over
    it (files with their slowest tests, tests with an entry, folders that ran whole), and the files
    with no entry (held to the default)."""
    over: list[str] = []

    def dear(seconds: float, allowed: float) -> bool:
        return seconds > factor * slow * allowed and seconds - slow * allowed > slack

    files = by_file(durations)
    times = f"{factor:g} x {slow:.2f} x" if slow > 1 else f"{factor:g} x"
    tests_of: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for nodeid, seconds in durations.items():
        tests_of[file_of(nodeid)].append((seconds, nodeid))
    for path, seconds in sorted(files.items(), key=lambda kv: -kv[1]):
        allowed = budget.file(path)
        if dear(seconds, allowed):
            slowest = sorted(tests_of[path], reverse=True)[:3]
            named = "; ".join(f"{n.split('::', 1)[-1]} {_s(s)}" for s, n in slowest)
            over.append(
                f"file {path}: {_s(seconds)} > {times} {_s(allowed)} "
                f"({len(tests_of[path])} tests; slowest: {named})"
            )
    for nodeid, seconds in sorted(durations.items(), key=lambda kv: -kv[1]):
        allowed_test = budget.tests.get(nodeid)
        if allowed_test is not None and dear(seconds, allowed_test):
            over.append(f"test {nodeid}: {_s(seconds)} > {times} {_s(allowed_test)}")
    folders = by_folder(durations)
    for folder in sorted(whole_folders(budget, durations, root)):
        allowed_folder = budget.folders.get(folder)
        if allowed_folder is not None and dear(folders[folder], allowed_folder):
            over.append(f"folder {folder}: {_s(folders[folder])} > {times} {_s(allowed_folder)}")
    unlisted = [
        f"{path} ({_s(seconds)}, held to the default {_s(budget.default)})"
        for path, seconds in sorted(files.items())
        if path not in budget.files
    ]
    return over, unlisted


def update(
    budget: Budget,
    durations: dict[str, float],
    headroom: float = HEADROOM,
    root: Path = ROOT,
) -> Budget:
    """The budget rewritten from a run: each file, long test and whole folder it covered gets
    ``headroom`` x its time (files at least ``FLOOR``); files that no longer exist are dropped."""
    files = dict(budget.files)
    for path, seconds in by_file(durations).items():
        files[path] = max(FLOOR, _round_up(seconds * headroom))
    covered = set(by_file(durations))
    tests = {k: v for k, v in budget.tests.items() if file_of(k) not in covered}
    for nodeid, seconds in durations.items():
        if seconds >= TEST_ENTRY:
            tests[nodeid] = _round_up(seconds * headroom)
    folders = dict(budget.folders)
    measured = by_folder(durations)
    for folder in whole_folders(Budget(files=files), durations, root):
        folders[folder] = _round_up(measured[folder] * headroom)
    return Budget(
        files={k: v for k, v in files.items() if (root / k).exists()},
        tests={k: v for k, v in tests.items() if (root / file_of(k)).exists()},
        folders=folders,
        default=budget.default,
    )


def _round_up(seconds: float) -> float:
    """Whole seconds, tenths below 10 s (stable figures: a re-run changes few lines)."""
    return math.ceil(round(seconds, 6)) if seconds >= 10 else math.ceil(round(seconds * 10, 6)) / 10


def weights(nodeids: Sequence[str], budget: Budget) -> list[float]:
    """Each collected test's expected seconds: its own entry, else an equal share of what its file's
    budget leaves after the tests with entries."""
    count: dict[str, int] = defaultdict(int)
    named: dict[str, float] = defaultdict(float)
    for n in nodeids:
        if n in budget.tests:
            named[file_of(n)] += budget.tests[n]
        else:
            count[file_of(n)] += 1
    out = []
    for n in nodeids:
        f = file_of(n)
        own = budget.tests.get(n)
        out.append(own if own is not None else max(0.01, budget.file(f) - named[f]) / count[f])
    return out


def chunk_sizes(total: int, workers: int) -> list[int]:
    """How many tests pytest-xdist's ``worksteal`` first hands each worker (in order): the
    collection cut into ``workers`` contiguous pieces, each ``remaining // workers_left``."""
    sizes = []
    for i in range(workers):
        sizes.append(total // (workers - i))
        total -= sizes[-1]
    return sizes


def order(nodeids: Sequence[str], budget: Budget, workers: int) -> list[int]:
    """The order to run ``nodeids`` on ``workers`` xdist workers (indices into ``nodeids``).

    ``worksteal`` hands worker *i* the *i*-th of ``workers`` equal contiguous pieces of the
    collection and later moves the tail of the longest queue to an idle worker, but never a
    worker's next test. So: the files (and, alone, the tests with an entry of their own), the most
    expensive first, go to the piece with the least expected time that still has room for them (a
    file larger than any room left is split); each piece runs its most expensive ones first. The
    long tests start at once on different workers, the cheap ones fill the ends (they are what is
    stolen), and the other tests of a file stay together (its module-scoped fixtures set up once)."""
    if workers <= 1 or len(nodeids) <= workers:
        return list(range(len(nodeids)))
    w = weights(nodeids, budget)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, n in enumerate(nodeids):  # a test with an entry of its own goes alone
        groups[n if n in budget.tests else file_of(n)].append(i)
    sizes = chunk_sizes(len(nodeids), workers)
    room = list(sizes)
    load_ = [0.0] * workers
    pieces: list[list[tuple[float, list[int]]]] = [[] for _ in range(workers)]
    for members in sorted(groups.values(), key=lambda m: (-sum(w[i] for i in m), m[0])):
        rest = list(members)
        while rest:
            fits = [b for b in range(workers) if room[b] >= len(rest)]
            b = min(fits or [b for b in range(workers) if room[b] > 0], key=lambda b: (load_[b], b))
            part, rest = rest[: room[b]], rest[room[b] :]
            room[b] -= len(part)
            cost = sum(w[i] for i in part)
            load_[b] += cost
            pieces[b].append((cost, part))
    out: list[int] = []
    for b in range(workers):
        for _cost, part in sorted(pieces[b], key=lambda p: (-p[0], p[1][0])):
            out.extend(part)
    return out


def table(durations: dict[str, float], budget: Budget, meta: dict[str, object] | None = None) -> str:
    """The slowest tests and each folder's total against its budget (what the run prints)."""
    lines = [f"the {SLOWEST} slowest tests (setup + call + teardown):"]
    for nodeid, seconds in sorted(durations.items(), key=lambda kv: -kv[1])[:SLOWEST]:
        lines.append(f"  {seconds:7.1f} s  {nodeid}")
    folders = by_folder(durations)
    count: dict[str, int] = defaultdict(int)
    for nodeid in durations:
        count[folder_of(file_of(nodeid))] += 1
    lines.append("time by folder (worker-seconds):")
    for folder, seconds in sorted(folders.items(), key=lambda kv: -kv[1]):
        allowed = budget.folders.get(folder)
        against = f"  budget {allowed:g} s" if allowed is not None else ""
        lines.append(f"  {seconds:8.1f} s  {folder} ({count[folder]} tests){against}")
    lines.append(f"  {sum(folders.values()):8.1f} s  all ({len(durations)} tests)")
    if meta:
        wall, workers, load = meta.get("wall"), meta.get("workers"), meta.get("load")
        lines.append(f"wall {wall} s on {workers} worker(s); load average at start / end: {load}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.budget", description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["check", "update", "show"])
    p.add_argument("durations", nargs="?", type=Path, default=DURATIONS, help="a run's JSON")
    p.add_argument("--budget", type=Path, default=BUDGET)
    p.add_argument("--factor", type=float, default=float(os.environ.get("PHOTOJOBS_BUDGET_FACTOR", FACTOR)))
    p.add_argument("--headroom", type=float, default=HEADROOM)
    args = p.parse_args(argv)
    if not args.durations.exists():
        print(f"tests.budget: no durations at {args.durations} (a pytest run of the suite writes them)")
        return 2
    durations, meta = read_durations(args.durations)
    budget = load(args.budget)
    if args.command == "show":
        print(table(durations, budget, meta))
        return 0
    if args.command == "update":
        new = update(budget, durations, args.headroom)
        note = f"last update: {len(durations)} tests, headroom {args.headroom:g}; {meta}"
        dump(new, args.budget, note=note)
        print(f"tests.budget: {args.budget} rewritten from {len(durations)} tests of {args.durations}")
        return 0
    slow = slowdown(budget, durations)
    over, unlisted = check(budget, durations, args.factor, slow=slow)
    total, allowed = sum(durations.values()), sum(budget.file(f) for f in by_file(durations))
    print(
        f"tests.budget: {len(durations)} tests in {len(by_file(durations))} files took {_s(total)} "
        f"of a budget of {_s(allowed)} ({total / max(allowed, 1e-9):.2f}x; {args.budget.name}, "
        f"fails above {args.factor:g}x; load average {meta.get('load')})"
    )
    if slow > 1:
        print(
            f"tests.budget: this run's typical file took {slow:.2f}x its budget (a busy machine?): each "
            f"is held to {args.factor:g} x {slow:.2f} x its budget"
        )
    if unlisted:
        print(f"tests.budget: {len(unlisted)} file(s) with no budget entry (add them: "
              f"python -m tests.budget update {args.durations}):")  # fmt: skip
        for line in unlisted:
            print(f"  {line}")
    if over:
        print(f"tests.budget: FAILED: {len(over)} over {args.factor:g}x their budget:")
        for line in over:
            print(f"  {line}")
        print(
            "  Make them cheaper (fewer processes, waits on events, not sleeps), or, when the cost is "
            f"deliberate, raise the entry (python -m tests.budget update {args.durations})."
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
