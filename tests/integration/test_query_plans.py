"""The hot paths stay index searches as the table grows: EXPLAIN at 100k (and, slow, 1M) items.

The statements explained are the very ones the dispatcher, the sweeper and a finishing item run
(``photojobs.testing.scale.hot_paths``); the table is built with set-based inserts
(``photojobs.testing.scale.seed_pending``).
"""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from photojobs.testing import scale
from store.dispatch import take_for_dispatch
from store.lanes import lane_spec

NOOP = lane_spec("noop", env={})


def _assert_flat_plans(engine: Engine, pending: int) -> None:
    # Given `pending` pending items over 4 jobs, behind a finished job of pending/10 items
    jobs = scale.seed_pending(engine, pending, jobs=4, finished=pending // 10)
    assert scale.count_items(engine) == pending + pending // 10
    # When the database plans every hot-path statement
    plans = scale.hot_path_plans(engine, job_id=jobs[1])
    # Then none reads all of items: each is a search in an index
    scans = {name: scale.full_scans(lines) for name, lines in plans.items()}
    assert {k: v for k, v in scans.items() if v} == {}, plans
    flat = "\n".join(line for lines in plans.values() for line in lines)
    assert "ix_items_dispatch" in flat and "ix_items_lease" in flat and "ix_items_job_state" in flat
    # And the dispatcher serves every job round-robin from those seeks
    picked = take_for_dispatch(engine, NOOP, bound=8)
    assert len(picked) == 8


def test_hot_path_plans_at_100k_items(engine: Engine) -> None:
    _assert_flat_plans(engine, 100_000)


@pytest.mark.slow
def test_hot_path_plans_at_1m_items(engine: Engine) -> None:
    _assert_flat_plans(engine, 1_000_000)


def test_full_scan_detection_can_fail() -> None:
    # Given plans that read the whole table, on either store / Then they are reported
    assert scale.full_scans(["SCAN items"]) == ["SCAN items"]
    assert scale.full_scans(["SCAN items USING COVERING INDEX ix_items_dispatch"])
    assert scale.full_scans(["Limit", "  ->  Seq Scan on items  (cost=0.00..1.00 rows=1 width=4)"])
    assert scale.full_scans(
        [
            "Limit",
            "  ->  Index Scan using items_pkey on items  (cost=0.42..9.00 rows=1 width=4)",
            "        Filter: x",
        ]
    )
    assert not scale.full_scans(["SEARCH items USING INDEX ix_items_lease (state=?)"])


def test_a_batch_claim_and_finish_read_only_their_items_on_a_table_never_analyzed(engine: Engine) -> None:
    # Given 20,000 pending items written without ANALYZE (a big job's first minute: autovacuum has
    # not looked at the table yet)
    scale.seed_pending(engine, 20_000, analyze=False)
    # When the database plans a batch message's claim and its plain successes
    batch = ("claim:", "finish: a batch")
    plans = {k: v for k, v in scale.hot_path_plans(engine).items() if k.startswith(batch)}
    # Then each finds its items by primary key only: no scan of the lane's or the states' index
    # ranges (the claim once read all 20,000 of the lane through ix_items_dispatch and ix_items_lease)
    flat = "\n".join(line for lines in plans.values() for line in lines)
    assert len(plans) == 2 and {k: scale.full_scans(v) for k, v in plans.items() if scale.full_scans(v)} == {}
    for index in ("ix_items_dispatch", "ix_items_lease", "ix_items_job_state"):
        assert index not in flat, plans
