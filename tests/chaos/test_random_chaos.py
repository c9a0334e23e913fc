"""A seeded randomized chaos run against real workers, Redis, and SQLite / PostgreSQL.

Seed: ``PHOTOJOBS_CHAOS_SEED`` (else random, printed); length: ``PHOTOJOBS_CHAOS_SECONDS`` (the
short variant defaults to 25 s and runs in ``make test``; the ``slow`` one defaults to 300 s and is
what ``make chaos`` runs). A failure names its seed and the command that replays its schedule;
add ``--basetemp=DIR`` to keep the run log, the worker logs and (SQLite) the database for a look.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import Engine

from store.events import EventRecord
from tests.chaos.checker import analyse
from tests.chaos.harness import LEAVE_PAUSED, ChaosJob, ChaosRun, chaos_seconds, chaos_seed
from tests.support import Fleet, RedisServer, items_of

SEED = chaos_seed()  # one per session: the SQLite and the PostgreSQL run share the schedule
SHORT = chaos_seconds(25.0)
LONG = chaos_seconds(300.0)
MAX_ATTEMPTS = 100  # high enough that no item is quarantined: every failure is a finding


def grouped(violations: list[str], limit: int = 40) -> str:
    """Violations grouped by kind (numbers blanked), then the first ``limit`` in full."""
    kinds = Counter(
        re.sub(r"\d+", "#", re.sub(r"\S+:\d+:[0-9a-f]{6}", "<worker>", v.split("; history:")[0]))
        for v in violations
    )
    head = "\n".join(f"  {n:4d} x {k}" for k, n in kinds.most_common())
    full = "\n".join(f"  - {v}" for v in violations[:limit])
    more = f"\n  ... and {len(violations) - limit} more" if len(violations) > limit else ""
    return f"{len(violations)} violation(s) by kind:\n{head}\nfirst ones:\n{full}{more}"


def run_chaos(
    seconds: float,
    engine: Engine,
    env: dict[str, str],
    fleet: Fleet,
    redis_server: RedisServer,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    seed = SEED
    tag = f"[chaos seed={seed} store={engine.dialect.name} seconds={seconds:g}]"
    replay = (
        f"PHOTOJOBS_CHAOS_SEED={seed} PHOTOJOBS_CHAOS_SECONDS={seconds:g} "
        f".venv/bin/python -m pytest '{request.node.nodeid}'"
    )
    print(f"\n{tag} replay: {replay}", flush=True)
    env["PHOTOJOBS_MAX_ATTEMPTS"] = str(MAX_ATTEMPTS)  # the fleet's processes read this dict
    run = ChaosRun(seed, seconds, engine, env, fleet, redis_server, tmp_path / "chaos")
    try:
        # Given jobs of random sizes over a shared pool of photo files, 4 workers and a sweeper
        run.start()
        # When workers are killed, frozen and stopped, Redis is flushed, sweepers die, and jobs are
        # cancelled, paused, resumed, retried and pruned at random for the run's length
        run.chaos()
        # And then the faults stop, paused jobs are resumed (but those meant to stay paused)
        run.calm_down()
        states = run.settle(timeout=120 + seconds / 2)
    finally:
        run.finish()
        (tmp_path / "chaos.log").write_text("\n".join(run.log))
    jobs = {j.id: j for j in run.jobs}
    pruned = run.pruned_jobs() if run.prunes else None
    assert run.tail is not None
    analysis = analyse(
        engine, job_ids=list(jobs), max_attempts=MAX_ATTEMPTS, pruned=pruned, seen=run.tail.seen
    )
    print(f"{tag} {analysis.summary()}; actions {dict(run.actions)}", flush=True)
    print(
        f"{tag} prunes {run.actions['prune']} (jobs pruned {run.actions['pruned_jobs']}), "
        f"retries {run.actions['retry']} (refused {run.actions['retry_refused']}, of a pruned job "
        f"{run.actions['retry_of_pruned_job']})",
        flush=True,
    )
    where = f"{tag}\nreplay: {replay}\nrun log: {tmp_path / 'chaos.log'}; worker logs: {fleet.logdir}"

    # Then every job settled (terminal or paused) before the deadline
    unsettled = [
        f"job {j} ({jobs[j].role}) did not settle as succeeded/cancelled/paused: {s}"
        for j, s in states.items()
        if s not in ("succeeded", "cancelled", "paused")
    ]
    # And a reader that followed the cursor live saw the same events as the final read, without a gap
    # (but for what the run's prunes deleted)
    live = run.tail.compare(analysis.records, pruned, run.cutoff)
    if not run.tail.seen:
        live.append("the live reader saw no events at all")
    # And each job ended as its controls ask (checked for every job, reported together)
    outcomes = [
        p
        for job_id, job in jobs.items()
        if not job.pruned
        for p in job_outcome(engine, job, states[job_id], analysis.records)
    ]
    everything = unsettled + analysis.violations + live + outcomes
    report = f"{where}\n{grouped(everything)}"
    if not analysis.counts["item_claimed"]:  # the fleet never worked: show why
        report += f"\nno item was ever claimed; worker logs:\n{fleet.logs()[-6000:]}"
    assert unsettled == [], report
    # And the event log and the store satisfy every invariant of the checker
    assert analysis.violations == [], report
    assert live == [], report
    assert outcomes == [], report
    # And the run tested batch messages: items were claimed together with others of their message
    assert analysis.counts["batched_claims"] > 0, f"{where}\nno item was claimed in a batch message"
    # And prunes and retries ran among the faults (a pruned job was checked from the log: every item
    # of it had ended; PostgreSQL's lock-order checker watched every transaction of the run)
    assert run.actions["prune"] > 0 and run.actions["retry"] + run.actions["retry_refused"] > 0, where


def job_outcome(engine: Engine, job: ChaosJob, state: str, events: list[EventRecord]) -> list[str]:
    """What is wrong with how ``job`` ended, given what the run did to it (``events``: the run's
    history, which keeps what a prune deleted from the store's log)."""
    items = items_of(engine, job.id)
    item_states = Counter(i.state for i in items)
    successes = Counter(e.item for e in events if e.type == "item_succeeded" and e.job == job.id)
    info = (
        f"job {job.id} ({job.role}, cancelled={job.cancelled}, pauses={job.pauses}, resumes={job.resumes}, "
        f"state {state}, items {dict(item_states)})"
    )
    out = []
    twice = {i: n for i, n in successes.items() if n != 1}
    if twice:
        out.append(f"{info}: items succeeded more than once: {twice}")
    if job.cancelled:
        # A cancelled job holds only terminal items: succeeded before the cancel, or cancelled
        if not set(item_states) <= {"succeeded", "cancelled"} or state != "cancelled":
            out.append(f"{info}: a cancelled job must hold only succeeded and cancelled items")
    elif job.role == LEAVE_PAUSED:
        # A job left paused holds succeeded and paused items only
        if not set(item_states) <= {"succeeded", "paused"} or state not in ("paused", "succeeded"):
            out.append(f"{info}: a job left paused must hold only succeeded and paused items")
    else:
        # Every other job (paused and resumed any number of times) succeeded: every item exactly once
        if state != "succeeded" or set(item_states) != {"succeeded"}:
            out.append(f"{info}: every item must have succeeded")
        missing = sorted({i.id for i in items} - set(successes))
        if missing:
            out.append(f"{info}: items without an item_succeeded event: {missing}")
        slept = {i.id: (i.result or {}).get("slept") for i in items if i.state == "succeeded"}
        if set(slept.values()) - {job.sleep}:
            out.append(f"{info}: results that did not sleep {job.sleep}s: {slept}")
    return out


@pytest.mark.timeout(int(SHORT + 420))
def test_random_chaos_short(
    engine: Engine,
    env: dict[str, str],
    fleet: Fleet,
    redis_server: RedisServer,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    run_chaos(SHORT, engine, env, fleet, redis_server, tmp_path, request)


@pytest.mark.slow
@pytest.mark.timeout(int(LONG + 900))
def test_random_chaos_long(
    engine: Engine,
    env: dict[str, str],
    fleet: Fleet,
    redis_server: RedisServer,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    run_chaos(LONG, engine, env, fleet, redis_server, tmp_path, request)
