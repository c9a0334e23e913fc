"""A seeded randomized chaos run of the photo lanes: real photos, real workers, SQLite and PostgreSQL.

Several jobs at once over one shared set of real photos (JPEGs with and without EXIF dates, PNGs,
camera raws with and without an editor's XMP sidecar, a RAW+JPEG pair):
``analysis``, ``exif`` (``exif.shift=+1h``, ``exif.keywords=...``), ``rename``, ``upload`` (local),
``archive`` and an ``archive.bundle=zip``, and ``noop`` with ``noop.fail_if`` (retried, then failed),
while the lease holders are killed and frozen (also at the step boundaries of the file effects),
Redis is flushed, sweepers come and go and jobs are cancelled, paused and resumed.

Judged three ways: the event log and the store (``checker``), the files against the model computed
from them (``photo_model``), and the run's own proof that it tested something (minimum counts of
lease expiries, stale commits, re-publications, deferrals, recovered effects and of every kind of
fault; scaled with the run's length, overridable with ``PHOTOJOBS_CHAOS_MINIMUMS=name=N,...``).

Seed ``PHOTOJOBS_CHAOS_SEED``; length ``PHOTOJOBS_CHAOS_SECONDS`` (short run: 75 s, in ``make
test``; long run: 300 s, ``make chaos``). One store: ``pytest tests/chaos -k 'photo and sqlite'``.
The short run ends its faults as soon as it has proved its minimums (checked on the live reader's
events every 2 s; the final counts, from the whole log, can only be higher), at the latest after
its length: the same bar in less time where the machine is fast enough. ``PHOTOJOBS_CHAOS_FULL=1``
runs it for its whole length (a replay that wants the schedule of a failed run).
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import Engine

from store.intents import sweep_stray_staged
from tests.chaos.checker import analyse
from tests.chaos.harness import chaos_seconds, chaos_seed
from tests.chaos.photo_harness import PhotoChaosRun, PhotoJob, minimums
from tests.chaos.photo_model import check_files, effects_recovered
from tests.support import Fleet, RedisServer, items_of

SEED = chaos_seed()
SHORT = chaos_seconds(75.0)
LONG = chaos_seconds(300.0)
MAX_ATTEMPTS = 20  # photo lanes; a photo that kills its worker 20 times is quarantined (reported)

# Violations of the file model by kind (the grouping of the report and the summary line).
FILE_KINDS = (
    ("ran on a path the photo no longer had", "item ran on a stale path (move applied, not marked)"),
    ("failed with an unexpected error", "item failed with an unexpected error"),
    ("staged/temp file left behind", "staged file left behind"),
    ("raw bytes changed", "raw file written (bytes changed)"),
    ("orphan sidecar", "orphan sidecar left behind"),
    ("sidecar missing", "raw's sidecar missing beside it"),
    ("beside it, expected only", "raw's sidecar under the wrong name"),
    ("appeared but no exif edit", "sidecar without an applied edit"),
    ("written more than once", "sidecar keyword written twice"),
    ("lost its own content", "sidecar's own content lost"),
    ("not in XMP-dc:Subject", "keywords missing from the raw's sidecar"),
    (" times: duplicate", "duplicate or resurrected file"),
    ("missing at the path the store records", "photo missing at its store path"),
    ("is none of the photos", "file with unknown pixels"),
    ("content hash", "store's content hash stale"),
    ("DateTimeOriginal", "shift not applied exactly once"),
    ("was undated", "undated photo got a date"),
    ("not visible as", "keywords not in XMP-dc:Subject/IPTC:Keywords"),
    ("orphaned intent", "orphaned intent (item stopped, intent recorded)"),
    ("leaked by item", "leaked photo lock"),
    ("applied edits", "item applied its edit more than once"),
    ("without an applied edit", "exif item succeeded without an edit"),
    ("modification time changed", "file modification time changed"),
    ("(upload)", "upload wrong"),
    ("(bundle)", "bundle wrong"),
    ("deadlock detected", "deadlock (PostgreSQL aborted a transaction)"),
    ("raised DeadlockDetected", "deadlock (PostgreSQL aborted a transaction)"),
)


def kind_of(violation: str) -> str:
    for needle, kind in FILE_KINDS:
        if needle in violation:
            return kind
    if "untouched tag" in violation:
        return "untouched tag changed: " + violation.split("untouched tag ", 1)[1].split(" ", 1)[0]
    return re.sub(r"\d+", "#", violation.split("; history:")[0])[:100]


def by_kind(violations: list[str], limit: int = 40) -> str:
    kinds = Counter(kind_of(v) for v in violations)
    head = "\n".join(f"  {n:4d} x {k}" for k, n in kinds.most_common())
    examples = {}
    for v in violations:
        examples.setdefault(kind_of(v), v)
    first = "\n".join(f"  - {v[:700]}" for v in list(examples.values())[:limit])
    return f"{len(violations)} violation(s) by kind:\n{head}\none of each kind:\n{first}"


def photo_job_outcome(engine: Engine, job: PhotoJob, state: str) -> list[str]:
    """What is wrong with how a job ended: no item twice, a cancelled job only terminal items,
    failures only the clear kind (a photo error, noop.fail_if), never a crash-retry exhausted."""
    items = items_of(engine, job.id)
    info = f"job {job.id} ({job.kind}, cancelled={job.cancelled}, state {state})"
    out = []
    stuck = [i.id for i in items if i.state not in ("succeeded", "failed", "cancelled", "skipped")]
    if stuck:
        out.append(f"{info}: items not terminal: {stuck}")
    if not job.cancelled and any(i.state == "cancelled" for i in items):
        out.append(f"{info}: cancelled items in a job nobody cancelled")
    for i in items:
        if i.state != "failed":
            continue
        error = i.error or ""
        if job.kind == "undo":
            if "changed since" not in error and not error.startswith("quarantined"):
                out.append(f"{info}: item {i.id} ({i.lane}) of an undo failed with {error[:300]!r}")
        elif job.kind == "noop":
            if "noop.fail_if matched" not in error and not error.startswith("quarantined"):
                out.append(f"{info}: item {i.id} failed with {error!r}")
        elif "file not found" in error:
            # Every job names its photos by their current paths; a photo lock is held until a move is
            # marked. An item that finds no file at the store's path ran while a move was in flight.
            out.append(f"{info}: item {i.id} ({i.lane}) ran on a path the photo no longer had: {error[:300]}")
        elif ":" in error.split(" ", 1)[0] and error.split(":", 1)[0].isidentifier():
            out.append(f"{info}: item {i.id} ({i.lane}) failed with an unexpected error: {error[:300]}")
    return out


def failure_summary(engine: Engine, jobs: list[PhotoJob]) -> Counter[str]:
    reasons: Counter[str] = Counter()
    for job in jobs:
        for i in items_of(engine, job.id):
            if i.state == "failed":
                reasons[f"{i.lane}: {(i.error or '')[:90]}"] += 1
    return reasons


def live_proof(run: PhotoChaosRun) -> Counter[str]:
    """The minimums' counts the run has reached so far: the live reader's events and the faults
    dealt (the final counts read the store's whole log: never fewer)."""
    assert run.tail is not None
    seen = list(run.tail.seen)
    have = Counter(e.type for e in seen)
    batched = [e for e in seen if e.type == "item_claimed" and (e.detail or {}).get("batch")]
    have["batched_claims"] = len(batched)
    have.update(run.fault_counts())
    have["effects_recovered"] = sum(effects_recovered(seen).values())
    have["items"] = have["item_created"]
    return have


def run_photo_chaos(
    seconds: float,
    engine: Engine,
    env: dict[str, str],
    fleet: Fleet,
    redis_server: RedisServer,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    *,
    until_proven: bool = False,
) -> None:
    seed = SEED
    tag = f"[photo chaos seed={seed} store={engine.dialect.name} seconds={seconds:g}]"
    replay = (
        f"PHOTOJOBS_CHAOS_SEED={seed} PHOTOJOBS_CHAOS_SECONDS={seconds:g} "
        f".venv/bin/python -m pytest '{request.node.nodeid}'"
    )
    print(f"\n{tag} replay: {replay}", flush=True)
    # Every process of the fleet reads this dict: attempts, quick retries, the fleet's size.
    env["PHOTOJOBS_MAX_ATTEMPTS"] = str(MAX_ATTEMPTS)
    env["PHOTOJOBS_LANE_NOOP_MAX_ATTEMPTS"] = "3"
    env["PHOTOJOBS_FLEET_PROCESSES"] = "4"
    for lane in ("NOOP", "ANALYSIS", "EXIF", "RENAME", "UPLOAD", "ARCHIVE"):
        env[f"PHOTOJOBS_LANE_{lane}_BACKOFF"] = "0.2"
        env[f"PHOTOJOBS_LANE_{lane}_BACKOFF_MAX"] = "2"
    run = PhotoChaosRun(seed, seconds, engine, env, fleet, redis_server, tmp_path / "chaos")
    try:
        # Given real photos, waves of concurrent jobs of every photo lane over them, 4 workers (one
        # with failpoints armed at file-effect boundaries) and a sweeper
        run.start()
        # When lease holders are killed and frozen, failpoints fire, Redis is flushed, sweepers come
        # and go, and jobs are cancelled, paused and resumed, for the run's length (the short run:
        # until it has seen its minimums)
        bar = minimums(seconds)
        proven = lambda: all(live_proof(run)[k] >= n for k, n in bar.items())  # noqa: E731
        run.chaos(proven=proven if until_proven else None)
        faulted = time.monotonic() - run.t0
        # And then the faults stop and every job is let finish
        run.calm_down()
        states = run.settle(timeout=240 + seconds)
        # And the watched folder's last photos are synced and analysed
        watched = run.watch_findings(timeout=120)
        # And the schedule's last runs pick up its folder's last photos and their jobs finish
        scheduled = run.schedule_findings(timeout=120)
    finally:
        run.finish()
        (tmp_path / "chaos.log").write_text("\n".join(run.log))
    # And the sweeper's stray pass runs as it would once its grace is over (no attempt is alive now
    # that could still be writing a staged file it has not recorded): what it removes is counted
    strays = sweep_stray_staged(engine, grace=0.0)
    print(f"{tag} stray staged files removed by the final sweep: {len(strays)}", flush=True)
    jobs = [j for j in run.jobs if isinstance(j, PhotoJob)]
    analysis = analyse(engine, job_ids=[j.id for j in jobs], max_attempts=None)
    files = check_files(
        engine,
        baseline=run.baseline,
        folders=[run.root, run.archive],
        uploads=run.uploads,
        records=analysis.records,
        job_ids=[j.id for j in jobs],
    )
    recovered = effects_recovered(analysis.records)
    faults = run.fault_counts()
    items = analysis.counts["item_created"]

    # Then every job settled, and each ended as its controls ask
    unsettled = [
        f"job {j} did not settle: {s}"
        for j, s in states.items()
        if s not in ("succeeded", "failed", "partial", "cancelled")
    ]
    outcomes = [p for j in jobs for p in photo_job_outcome(engine, j, states[j.id])]
    # And a live reader saw the same events as the final read
    assert run.tail is not None
    live = run.tail.compare(analysis.records)
    # And the run tested something: the minimum counts
    have = Counter(analysis.counts)
    have.update(faults)
    have["effects_recovered"] = sum(recovered.values())
    have["items"] = items
    short = [f"{k}: {have[k]} < {n}" for k, n in minimums(seconds).items() if have[k] < n]
    everything = (
        run.findings
        + run.log_findings()
        + unsettled
        + analysis.violations
        + files.violations
        + live
        + outcomes
        + watched
        + scheduled
    )
    kinds = {
        "run": len(run.findings) + len(run.log_findings()),
        "settle": len(unsettled),
        "log/store": len(analysis.violations),
        "files": len(files.violations),
        "live reader": len(live),
        "outcomes": len(outcomes),
        "watched folder": len(watched),
        "schedule": len(scheduled),
    }
    fault_line = ", ".join(f"{k}={v}" for k, v in sorted(faults.items()) if " " not in k)
    summary = (
        f"{tag} items={items} events={analysis.events} jobs={len(jobs)} waves={run.wave} "
        f"faults_for={faulted:.0f}s "
        f"lease_expired={have['lease_expired']} stale_commit_rejected={have['stale_commit_rejected']} "
        f"item_republished={have['item_republished']} item_deferred={have['item_deferred']} "
        f"batched_claims={have['batched_claims']} "
        f"dropped={len(run.dropped)} moved_by_hand={have['move_dropped']} "
        f"schedule={run.sched_counts} "
        f"effects_recovered={dict(recovered)} faults: {fault_line}; "
        f"checked: {dict(files.counts)}; violations={len(everything)} {kinds} "
        f"by kind {dict(Counter(kind_of(v) for v in everything))}"
    )
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None:  # the summary line shows under output capture too (make test)
        with capture.global_and_fixture_disabled():
            print(f"\n{summary}", flush=True)
    else:
        print(summary, flush=True)
    print(f"{tag} failpoints fired: {sorted((k, v) for k, v in faults.items() if ' ' in k)}", flush=True)
    print(f"{tag} failed items by reason: {dict(failure_summary(engine, jobs).most_common(12))}", flush=True)
    print(f"{tag} unexpected worker exits: {run.exits}", flush=True)
    print(f"{tag} minimums {minimums(seconds)}: {'all met' if not short else 'NOT MET: ' + ', '.join(short)}")
    where = f"{summary}\nreplay: {replay}\nrun log: {tmp_path / 'chaos.log'}; worker logs: {fleet.logdir}"
    if everything:
        print(by_kind(everything), flush=True)
        print(photo_evidence(engine, files.violations), flush=True)
    assert everything == [], f"{where}\n{by_kind(everything)}"
    assert short == [], f"{where}\nthe run did not prove enough (have < minimum): {short}"


def photo_evidence(engine: Engine, violations: list[str], most: int = 3) -> str:
    """The effects and item events of the photos a files violation names (the store is dropped with
    the test: what a failure needs to be understood, printed while it is there)."""
    import re

    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from store.models import Event, PhotoEffect

    ids = sorted({int(m) for v in violations for m in re.findall(r"^photo (\d+) ", v)})[:most]
    lines = []
    with Session(engine) as s:
        for pid in ids:
            lines.append(f"--- photo {pid}: effects (id job item lane kind sidecar before->after undoes)")
            effects = select(PhotoEffect).where(PhotoEffect.photo_id == pid).order_by(PhotoEffect.id)
            for e in s.scalars(effects):
                lines.append(
                    f"  {e.id} job {e.job_id} item {e.item_id} {e.lane} {e.kind} sidecar={e.sidecar} "
                    f"{(e.before_sha256 or '-')[:8]}->{(e.after_sha256 or '-')[:8]} undoes={e.undoes} "
                    f"undone_by={e.undone_by} at={e.at:.2f} {e.to_path.rsplit('/', 1)[-1]}"
                )
            lines.append(f"--- photo {pid}: its items' events")
            q = select(Event).where(Event.photo_id == pid).order_by(Event.id)
            for ev in s.scalars(q):
                lines.append(
                    f"  {ev.at:.2f} job {ev.job_id} item {ev.item_id} {ev.lane} {ev.type} "
                    f"attempt={ev.attempt} token={ev.token} {str(ev.detail or '')[:160]}"
                )
    return "\n".join(lines)


@pytest.mark.timeout(int(SHORT + 900))
def test_photo_chaos_short(
    engine: Engine,
    env: dict[str, str],
    fleet: Fleet,
    redis_server: RedisServer,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    full = os.environ.get("PHOTOJOBS_CHAOS_FULL", "") not in ("", "0")
    run_photo_chaos(SHORT, engine, env, fleet, redis_server, tmp_path, request, until_proven=not full)


@pytest.mark.slow
@pytest.mark.timeout(int(LONG + 1200))
def test_photo_chaos_long(
    engine: Engine,
    env: dict[str, str],
    fleet: Fleet,
    redis_server: RedisServer,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    run_photo_chaos(LONG, engine, env, fleet, redis_server, tmp_path, request)
