"""``make test`` runs the mutation suite's fast subset (``fast = true`` in
tests/mutants/mutations.toml, ~2 min on 2 cores under load): each of those mutations, applied to a
scratch copy of the tree, must be killed by its tests. ``make mutants`` runs the whole list."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.mutants.run import ROOT


@pytest.mark.timeout(900)
def test_the_fast_mutations_are_each_killed_by_their_tests() -> None:
    # Given the fast mutations of the list, when the runner applies each to a scratch copy and runs
    # its tests there
    done = subprocess.run(
        [sys.executable, "-m", "tests.mutants.run", "--fast", "--no-baseline", "--timeout", "240"],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
        capture_output=True,
        text=True,
        timeout=880,
    )
    # Then every one was killed (none survived, none failed to apply)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "survived" not in done.stdout and "not located" not in done.stdout, done.stdout
