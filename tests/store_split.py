"""Which store a process test runs on in ``make test`` (the other one runs in ``make chaos``).

A test of ``tests/process`` parametrized over both stores (the ``db_url`` or ``shared_fleet``
fixture's ``sqlite``/``postgresql``) starts a fleet of real processes for each: the second store
doubles the test's cost (about a third of the suite's time). Where the store is not what the test
is about, ``make test`` runs one of the two — chosen by a stable hash of the test's id without its
store, so a file's tests spread over both stores — and marks the other ``slow`` and ``other_store``:
``make chaos`` (``-m slow tests/chaos tests/process``) runs it, so every test still runs in one of
the two. The files in :data:`BOTH_STORES` test what the stores do differently (locks, leases, a
frozen lock holder, the undo races, the submission's chunks) and run on both in ``make test``.
``PHOTOJOBS_BOTH_STORES=1`` runs every process test on both stores in any run."""

from __future__ import annotations

import os
import zlib

import pytest

STORES = ("sqlite", "postgresql")
STORE_FIXTURES = ("db_url", "shared_fleet")
#: Process test files whose every test runs on both stores in ``make test``.
BOTH_STORES = frozenset(
    {
        "tests/process/test_lanes_and_locks.py",
        "tests/process/test_recovery.py",
        "tests/process/test_leases_at_scale.py",
        "tests/process/test_frozen_lock_holder.py",
        "tests/process/test_undo_round_two.py",
        "tests/process/test_cancel_pause.py",
        "tests/process/test_submitting_cli.py",
        "tests/process/test_confinement_races.py",
        "tests/process/test_xdist_isolation.py",
    }
)


def store_of(item: pytest.Item) -> str | None:
    params = getattr(getattr(item, "callspec", None), "params", {})
    for name in STORE_FIXTURES:
        if params.get(name) in STORES:
            return str(params[name])
    return None


def kept_store(nodeid: str, store: str) -> str:
    """The store ``make test`` runs this test on: by a stable hash of its id without the store."""
    head, _, params = nodeid.partition("[")
    rest = "-".join(p for p in params.rstrip("]").split("-") if p != store)
    return STORES[zlib.crc32(f"{head}[{rest}]".encode()) % 2]


def split(items: list[pytest.Item]) -> int:
    """Mark the other store's variant of each process test ``slow`` (and ``other_store``); the
    number marked."""
    if os.environ.get("PHOTOJOBS_BOTH_STORES", "") not in ("", "0"):
        return 0
    marked = 0
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if not path.startswith("tests/process/") or path in BOTH_STORES:
            continue
        store = store_of(item)
        if store is None or kept_store(item.nodeid, store) == store:
            continue
        item.add_marker(pytest.mark.slow)
        item.add_marker(pytest.mark.other_store)
        marked += 1
    return marked
