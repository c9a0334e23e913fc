"""The pytest side of the time budget (``tests/budget.py``), loaded by ``tests/conftest.py``.

- Every run (serial, or the xdist controller, which receives every worker's reports) adds up each
  test's setup, call and teardown, prints the 20 slowest tests and each folder's total at the end,
  and writes them to ``--durations-json`` (default ``.test-durations.json``) for
  ``python -m tests.budget check``, which ``make test`` runs after pytest.
- Under pytest-xdist each worker orders its collection by the budget (``budget.order``: the
  slowest files first, spread over the workers); every worker computes the same order.
  ``PHOTOJOBS_TEST_ORDER=collection`` keeps pytest's own order.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests import budget


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--durations-json",
        default=str(budget.DURATIONS),
        help="where to write each test's seconds for `python -m tests.budget check` "
        "(default: .test-durations.json at the repository's root; empty: nowhere)",
    )


class _Timer:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.tests: dict[str, dict[str, Any]] = {}
        self.started = time.time()
        self.load_at_start = os.getloadavg()

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.tests.setdefault(
            report.nodeid, {"seconds": 0.0, "outcome": "passed", "start": report.start, "stop": report.stop}
        )
        entry["seconds"] += report.duration
        entry["start"] = min(entry["start"], report.start)
        entry["stop"] = max(entry["stop"], report.stop)
        if report.failed:
            entry["outcome"] = "failed"
        elif report.skipped and report.when != "teardown":
            entry["outcome"] = "skipped"
        node = getattr(report, "node", None)  # xdist: the worker that ran it
        if node is not None:
            entry["worker"] = node.gateway.id

    def meta(self) -> dict[str, Any]:
        workers = getattr(self.config.option, "numprocesses", None)
        return {
            "wall": round(time.time() - self.started, 1),
            "workers": workers or 1,
            "dist": getattr(self.config.option, "dist", "no"),
            "load": [round(x, 2) for x in (*self.load_at_start[:1], os.getloadavg()[0])],
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
        }

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.tests:
            return
        seconds = {k: round(v["seconds"], 3) for k, v in self.tests.items()}
        meta = self.meta()
        terminalreporter.write_sep("=", "time budget (tests/budget.toml)")
        terminalreporter.write_line(budget.table(seconds, budget.load(), meta))
        target = self.config.getoption("durations_json")
        if target:
            path = Path(target)
            for entry in self.tests.values():
                entry["seconds"] = round(entry["seconds"], 3)
            path.write_text(json.dumps({**meta, "tests": self.tests}, indent=1, sort_keys=True) + "\n")
            terminalreporter.write_line(f"durations written to {path}; python -m tests.budget check {path}")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # serial, or the xdist controller
        config.pluginmanager.register(_Timer(config), "photojobs-budget-timer")


@pytest.hookimpl(trylast=True)  # after -m / -k deselected what this run leaves out
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or os.environ.get("PHOTOJOBS_TEST_ORDER") == "collection":
        return
    nodeids = [item.nodeid for item in items]
    items[:] = [items[i] for i in budget.order(nodeids, budget.load(), int(workerinput["workercount"]))]
