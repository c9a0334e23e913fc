"""The suite's time budget (tests/budget.py): the check after ``make test``, the rewrite from a run,
and the slowest-first order of an xdist run."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests import budget
from tests.budget import Budget


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A repository with tests/unit/test_a.py, tests/unit/test_b.py, tests/process/test_c.py."""
    for f in ("tests/unit/test_a.py", "tests/unit/test_b.py", "tests/process/test_c.py"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
    return tmp_path


BUDGET = Budget(
    files={"tests/unit/test_a.py": 5, "tests/unit/test_b.py": 5, "tests/process/test_c.py": 60},
    tests={"tests/process/test_c.py::test_long": 40},
    folders={"tests/unit": 10, "tests/process": 60},
)
ON_BUDGET = {
    "tests/unit/test_a.py::test_one": 2.0,
    "tests/unit/test_a.py::test_two": 2.0,
    "tests/unit/test_b.py::test_three": 3.0,
    "tests/process/test_c.py::test_long": 40.0,
    "tests/process/test_c.py::test_short": 15.0,
}


def test_a_run_within_its_budget_passes_the_check(tree: Path) -> None:
    # Given a run whose files took about their budget
    # When it is checked
    over, unlisted = budget.check(BUDGET, ON_BUDGET, root=tree, slack=0)
    # Then nothing is over and every file has an entry
    assert (over, unlisted) == ([], [])


def test_a_file_over_twice_its_budget_is_named_with_its_slowest_test(tree: Path) -> None:
    # Given a run in which one unit test took 14 s more (a sleep)
    run = {**ON_BUDGET, "tests/unit/test_b.py::test_three": 17.0}
    # When it is checked
    over, _ = budget.check(BUDGET, run, root=tree, slack=0)
    # Then the file is named, with its total, its budget and the test that took the time, and so
    # is its folder (which ran whole: 21 s > 2 x 10 s)
    assert over == [
        "file tests/unit/test_b.py: 17.0 s > 2 x 5.0 s (1 tests; slowest: test_three 17.0 s)",
        "folder tests/unit: 21.0 s > 2 x 10.0 s",
    ]


def test_a_small_file_over_twice_its_budget_by_less_than_the_slack_passes(tree: Path) -> None:
    # Given a run in which a 5-s unit file took 12.5 s (its first import under load: CI, stop 44)
    # and another took 5 s + the slack + 1
    noisy = {**ON_BUDGET, "tests/unit/test_b.py::test_three": 12.5}
    dear = {**ON_BUDGET, "tests/unit/test_b.py::test_three": 5 + budget.SLACK + 1}
    # When each is checked with the default slack
    over_noisy, _ = budget.check(BUDGET, noisy, root=tree)
    over_dear, _ = budget.check(BUDGET, dear, root=tree)
    # Then the noise passes and the file that cost more than the slack over its budget is named
    assert over_noisy == []
    assert [line.split(":")[0] for line in over_dear][:1] == ["file tests/unit/test_b.py"]


def test_a_test_with_its_own_entry_fails_alone_though_its_file_keeps_its_budget(tree: Path) -> None:
    # Given a file whose long test took 90 s (> 2 x 40) while its short one shrank to nothing
    run = {**ON_BUDGET, "tests/process/test_c.py::test_long": 90.0}
    run["tests/process/test_c.py::test_short"] = 0.1
    # When it is checked
    over, _ = budget.check(BUDGET, run, root=tree, slack=0)
    # Then the test is named (the file's 90.1 s is within 2 x 60 s)
    assert over == ["test tests/process/test_c.py::test_long: 90.0 s > 2 x 40.0 s"]


def test_a_file_with_no_entry_is_named_and_held_to_the_default(tree: Path) -> None:
    # Given a new file that is not in the budget: one cheap run, one over 2 x the default
    (tree / "tests/unit/test_new.py").write_text("")
    cheap = {**ON_BUDGET, "tests/unit/test_new.py::test_x": 1.0}
    dear = {**ON_BUDGET, "tests/unit/test_new.py::test_x": 2 * budget.DEFAULT + 1}
    # When each is checked
    over_cheap, unlisted = budget.check(BUDGET, cheap, root=tree, slack=0)
    over_dear, _ = budget.check(BUDGET, dear, root=tree, slack=0)
    # Then the file is named as unlisted; it fails only when it took over twice the default
    assert unlisted == [f"tests/unit/test_new.py (1.0 s, held to the default {budget.DEFAULT:.1f} s)"]
    assert over_cheap == []
    assert over_dear[0].startswith("file tests/unit/test_new.py: 41.0 s > 2 x 20.0 s")


def test_a_folder_is_checked_only_when_the_run_covered_it_whole(tree: Path) -> None:
    # Given a run of test_b.py alone, 21 s (over its 2 x 5 s, and over 2 x the folder's 10 s, of a
    # folder that ran only in part)
    over, _ = budget.check(BUDGET, {"tests/unit/test_b.py::test_three": 21.0}, root=tree, slack=0)
    # Then the file is named, not the folder
    assert [line.split(":")[0] for line in over] == ["file tests/unit/test_b.py"]


def test_on_a_busy_machine_a_file_is_held_to_twice_the_runs_typical_slowdown() -> None:
    # Given 12 files with a budget of 10 s each, a run in which all took 3x that (a busy machine)
    # and one of them 7x
    plan = Budget(files={f"tests/process/test_{i}.py": 10 for i in range(12)})
    run = {f"tests/process/test_{i}.py::test_x": 30.0 for i in range(12)}
    busy = {**run, "tests/process/test_0.py::test_x": 70.0}
    # When each run is checked against the budget and the run's median slowdown
    slow = budget.slowdown(plan, run)
    over_run, _ = budget.check(plan, run, slow=slow, slack=0)
    over_busy, _ = budget.check(plan, busy, slow=budget.slowdown(plan, busy), slack=0)
    # Then the evenly slow run passes (3x the budget, but its typical file was 3x) and the file that
    # took more than twice the typical slowdown is named
    assert slow == 3.0 and over_run == []
    assert over_busy == [
        "file tests/process/test_0.py: 70.0 s > 2 x 3.00 x 10.0 s (1 tests; slowest: test_x 70.0 s)"
    ]


def test_a_run_of_few_files_is_held_to_the_budget_itself() -> None:
    # Given a run of 3 budgeted files, all 3x their budget
    plan = Budget(files={f"tests/process/test_{i}.py": 10 for i in range(3)})
    run = {f"tests/process/test_{i}.py::test_x": 30.0 for i in range(3)}
    # Then no median excuses them: each is over 2x its budget
    assert budget.slowdown(plan, run) == 1.0
    assert len(budget.check(plan, run, slack=0)[0]) == 3


def test_update_rewrites_the_budget_from_a_run_with_headroom_and_a_floor(tree: Path) -> None:
    # Given a run (test_c.py's long test now 20 s, its short one 2 s; test_a.py 0.2 s)
    run = {
        "tests/unit/test_a.py::test_one": 0.2,
        "tests/unit/test_b.py::test_three": 3.0,
        "tests/process/test_c.py::test_long": 20.0,
        "tests/process/test_c.py::test_short": 2.0,
    }
    # When the budget is updated from it and written
    new = budget.update(BUDGET, run, headroom=1.5, root=tree)
    budget.dump(new, tree / "budget.toml")
    again = budget.load(tree / "budget.toml")
    # Then each file gets 1.5 x its time, at least the floor; the long test its own entry; each
    # folder 1.5 x its total (both ran whole); and the file reads back the same
    assert new.files == {
        "tests/unit/test_a.py": 5.0, "tests/unit/test_b.py": 5.0, "tests/process/test_c.py": 33
    }  # fmt: skip
    assert new.tests == {"tests/process/test_c.py::test_long": 30}
    assert new.folders == {"tests/unit": 4.8, "tests/process": 33}
    assert again == new


def test_update_keeps_the_entries_of_files_the_run_did_not_cover_and_drops_deleted_files(tree: Path) -> None:
    # Given a budget naming a file that no longer exists, and a run of test_a.py only
    files = {**BUDGET.files, "tests/unit/test_gone.py": 9}
    old = Budget(files=files, tests=BUDGET.tests, folders=BUDGET.folders)
    # When it is updated
    new = budget.update(old, {"tests/unit/test_a.py::test_one": 8.0}, headroom=1.5, root=tree)
    # Then test_a.py has its new figure, the others theirs, the deleted file none; the folder that
    # ran in part keeps its figure
    assert new.files == {"tests/unit/test_a.py": 12, "tests/unit/test_b.py": 5, "tests/process/test_c.py": 60}
    assert new.tests == BUDGET.tests
    assert new.folders == BUDGET.folders


def test_chunk_sizes_are_xdist_worksteals_first_shares() -> None:
    assert budget.chunk_sizes(10, 4) == [2, 2, 3, 3]
    assert budget.chunk_sizes(3, 4) == [0, 1, 1, 1]


def _worksteal(nodeids: list[str], seconds: dict[str, float], workers: int) -> float:
    """The wall time of pytest-xdist's worksteal over ``nodeids``: worker *i* gets the *i*-th
    contiguous chunk; a worker with fewer than 2 tests pending (the running one included) takes
    half the queue of the worker with the most pending (at most all but 2), from its end."""
    queues, start = [], 0
    for size in budget.chunk_sizes(len(nodeids), workers):
        queues.append(list(nodeids[start : start + size]))
        start += size
    end = [seconds[q[0]] if q else 0.0 for q in queues]
    now = 0.0
    while any(queues):
        w = min((i for i in range(workers) if queues[i]), key=lambda i: end[i])
        now = end[w]
        queues[w].pop(0)
        if queues[w]:
            end[w] = now + seconds[queues[w][0]]
        for i in range(workers):
            if len(queues[i]) < 2:
                donor = max(range(workers), key=lambda d: len(queues[d]))
                n = min(len(queues[donor]) // 2, len(queues[donor]) - 2)
                if n > 0:
                    was_idle = not queues[i]
                    queues[i] += queues[donor][-n:]
                    del queues[donor][-n:]
                    if was_idle:
                        end[i] = now + seconds[queues[i][0]]
    return now


def test_the_order_starts_the_long_tests_at_once_on_different_workers() -> None:
    # Given a collection in file order: three long process files of two long tests each, the
    # last of them after many cheap unit tests
    cheap = [f"tests/unit/test_u{i}.py::test_{j}" for i in range(10) for j in range(10)]
    long_ = [f"tests/process/test_p{i}.py::test_run[{s}]" for i in range(3) for s in ("sqlite", "pg")]
    nodeids = long_[:4] + cheap + long_[4:]
    files = {f"tests/process/test_p{i}.py": 160 for i in range(3)}
    plan = Budget(files=files, tests=dict.fromkeys(long_, 80))
    # When it is ordered for 4 workers
    order = budget.order(nodeids, plan, 4)
    ordered = [nodeids[i] for i in order]
    # Then every test is there once, and the long tests head the shares of the workers (4 of them
    # first, the other two next on the workers with the least)
    assert sorted(order) == list(range(len(nodeids)))
    heads, at = [], 0
    for size in budget.chunk_sizes(len(nodeids), 4):
        heads.append(ordered[at : at + 2])
        at += size
    assert sorted(n for share in heads for n in share if "process" in n) == sorted(long_)
    assert all("process" in share[0] for share in heads)


def test_the_order_of_a_mixed_suite_ends_with_the_longest_test_or_the_fair_share() -> None:
    # Given a seeded suite: 3 chaos files of 2 tests of 20-85 s, 30 integration files of 8 tests
    # of 0.1-3 s, 40 process files of 6 tests of 1-25 s, 25 unit files of 15 tests of 0.01-0.3 s,
    # and a budget of exactly their times (tests of 10 s or more with an entry of their own)
    rng = random.Random(0)
    seconds: dict[str, float] = {}
    for folder, files, tests, low, high in (
        ("chaos", 3, 2, 20, 85),
        ("integration", 30, 8, 0.1, 3),
        ("process", 40, 6, 1, 25),
        ("unit", 25, 15, 0.01, 0.3),
    ):
        for f in range(files):
            for t in range(tests):
                seconds[f"tests/{folder}/test_{f}.py::test_{t}"] = rng.uniform(low, high)
    nodeids = list(seconds)
    plan = Budget(
        files={budget.file_of(n): s for n, s in budget.by_file(seconds).items()},
        tests={n: s for n, s in seconds.items() if s >= budget.TEST_ENTRY},
    )
    for workers in (3, 4, 6):
        # When it runs under worksteal in the budget's order and in the collection's
        ordered = [nodeids[i] for i in budget.order(nodeids, plan, workers)]
        fair = max(sum(seconds.values()) / workers, max(seconds.values()))
        # Then the budget's order ends within 0.5 % of the fair share, and no later than the other
        assert _worksteal(ordered, seconds, workers) <= 1.005 * fair
        assert _worksteal(ordered, seconds, workers) <= _worksteal(nodeids, seconds, workers)


def test_without_workers_the_order_is_the_collections() -> None:
    assert budget.order(["a.py::x", "b.py::y"], BUDGET, 1) == [0, 1]
