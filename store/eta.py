"""A job's ETA from the work it has left (issue 41), not from the lanes' recent rates.

For each lane of the job with items left:

* ``per_item`` — the lane's measured busy time per item: the mean run time (claim -> finish) of the
  job's own newest attempts in the lane (``SAMPLE`` of them, from the finish events' ``claimed_at``),
  or, before the job has ``MIN_OWN`` of its own (its first), the store-wide run-time histogram's mean
  (``store.histograms.RUN``, at least ``MIN_HISTOGRAM`` observations);
* ``concurrency`` — the threads the fleet gives the lane: for every live worker serving it (the
  registry, ``store.workers``; live as the Workers view says), its threads, at most the lane's
  per-process ``threads``;
* ``cost = remaining × per_item ÷ concurrency`` — or ÷ the items of the lane running now when
  that is more (a thread holding a batch message: each item's run time includes its wait in the
  batch, so by Little's law the lane finishes ``running ÷ per_item`` items a second).

``estimate`` sums the costs along the pipeline's dependencies (``store.pipeline.NEEDS``): a lane
ends no sooner than its own cost, nor before the lanes it needs have ended plus one of its own items;
and the job ends no sooner than all its remaining work divided by the threads of every worker serving
one of its lanes (lanes sharing a worker's threads take turns, so a lane counted at its own cost
beside a busy one is not counted twice as fast). The ETA is shown once ``SHOWN_FROM`` of the job's
items are settled and every lane left has a measure and a live worker; else None ("measuring").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from .counters import read as read_counters
from .engine import reader
from .histograms import RUN, RUN_EVENTS, SUM
from .lanes import LaneSpec
from .models import Event, Worker
from .pipeline import needs
from .waiting import STALE_BEATS, STALE_MIN

SHOWN_FROM = 0.10  # the ETA is shown once this share of the job's items is settled
SAMPLE = 200  # the job's newest attempts per lane its per-item time is measured on
MIN_OWN = 1  # ... at least this many, else the store-wide histogram's mean
MIN_HISTOGRAM = 10  # the histogram's mean counts from this many observations


@dataclass(frozen=True)
class LaneWork:
    """One lane's part of a job's ETA."""

    remaining: int
    per_item: float | None  # seconds of busy time per item, claim -> finish (None: not measured yet)
    concurrency: int  # threads the live fleet gives the lane
    held: int = 0  # the job's items of the lane running now (a batch message claims several at once)

    @property
    def at_once(self) -> int:
        """Items the lane runs at once: its threads, or more while a thread holds a batch (its
        items' run times then include their wait in the batch: Little's law evens it out)."""
        return max(self.concurrency, self.held) if self.concurrency > 0 else 0

    @property
    def cost(self) -> float | None:
        """Seconds the lane needs for what it has left, at its concurrency."""
        if self.per_item is None or self.at_once <= 0:
            return None
        return self.remaining * self.per_item / self.at_once

    @property
    def work(self) -> float | None:
        """Thread-seconds of work left (what the lane takes of the threads it shares)."""
        cost = self.cost
        return None if cost is None else cost * self.concurrency


def estimate(lanes: Mapping[str, LaneWork], order: Sequence[str], fleet_threads: int) -> float | None:
    """Seconds until every lane's remaining items are done (None: a lane left is not measured or has
    no thread). ``order``: the job's lanes in pipeline order; ``fleet_threads``: the threads of the
    live workers serving at least one of the job's lanes."""
    ends: dict[str, float] = {}
    total = 0.0
    for i, lane in enumerate(order):
        lw = lanes.get(lane)
        if lw is None or lw.remaining <= 0:
            continue
        cost = lw.cost
        if cost is None or lw.work is None or lw.per_item is None:
            return None
        total += lw.work
        before = [ends[d] for d in needs(lane, list(order[:i])) if d in ends]
        ends[lane] = max([cost, *(end + lw.per_item for end in before)])
    if not ends:
        return 0.0
    shared = total / fleet_threads if fleet_threads > 0 else 0.0
    return max(max(ends.values()), shared)


def own_run_times(engine: Engine, job_id: int, lanes: Sequence[str]) -> dict[str, list[float]]:
    """The run times (claim -> finish, seconds) of the job's newest attempts, per lane, newest first
    (at most ``SAMPLE`` a lane): one read of the job's finish events through ``ix_events_job_seq``."""
    out: dict[str, list[float]] = {lane: [] for lane in lanes}
    if not lanes:
        return out
    with Session(reader(engine)) as s:
        rows = s.execute(
            select(Event.lane, Event.at, Event.detail)
            .where(Event.job_id == job_id, Event.type.in_(RUN_EVENTS), Event.lane.in_(tuple(lanes)))
            .order_by(Event.seq.desc())
            .limit(SAMPLE * len(lanes))
        ).all()
    for lane, at, detail in rows:
        claimed = detail.get("claimed_at") if isinstance(detail, dict) else None
        if lane in out and len(out[lane]) < SAMPLE and isinstance(claimed, int | float):
            out[lane].append(max(0.0, float(at) - float(claimed)))
    return out


def histogram_means(engine: Engine, lanes: Sequence[str]) -> dict[str, float]:
    """The store-wide mean run time per lane (``RUN``), for lanes with ``MIN_HISTOGRAM`` observations."""
    values = read_counters(engine).histograms
    out: dict[str, float] = {}
    for lane in lanes:
        count = values.get((RUN.counter("inf"), lane), 0)
        if count >= MIN_HISTOGRAM:
            out[lane] = values.get((RUN.counter(SUM), lane), 0) / 1000.0 / count
    return out


def fleet_threads(engine: Engine, specs: Mapping[str, LaneSpec], now: float) -> tuple[dict[str, int], int]:
    """(lane -> threads the live fleet gives it, threads of the live workers serving any of them)."""
    per_lane = dict.fromkeys(specs, 0)
    total = 0
    with Session(reader(engine)) as s:
        rows = s.execute(
            select(Worker.lanes, Worker.threads, Worker.interval, Worker.last_beat).where(
                Worker.stopped_at.is_(None)
            )
        ).all()
    for served, threads, interval, last_beat in rows:
        if now - float(last_beat) > max(STALE_BEATS * float(interval or 0.0), STALE_MIN):
            continue
        mine = [lane for lane in served or [] if lane in specs]
        if not mine:
            continue
        given = [min(int(threads), specs[lane].threads) if threads else specs[lane].threads for lane in mine]
        for lane, n in zip(mine, given, strict=True):
            per_lane[lane] += n
        total += int(threads) if threads else max(given)
    return per_lane, total


def job_eta(
    engine: Engine,
    job_id: int,
    remaining: Mapping[str, int],
    order: Sequence[str],
    specs: Mapping[str, LaneSpec],
    *,
    settled: int,
    total: int,
    now: float,
    held: Mapping[str, int] | None = None,
) -> tuple[float | None, dict[str, LaneWork]]:
    """The job's ETA in seconds (None: measuring) and each remaining lane's part."""
    left = [lane for lane in order if remaining.get(lane, 0) > 0]
    if not left:
        return 0.0, {}
    own = own_run_times(engine, job_id, left)
    fallback = histogram_means(engine, [lane for lane in left if len(own[lane]) < MIN_OWN])
    threads, fleet = fleet_threads(engine, {lane: specs[lane] for lane in left if lane in specs}, now)
    parts: dict[str, LaneWork] = {}
    for lane in left:
        times = own[lane]
        per_item = sum(times) / len(times) if len(times) >= MIN_OWN else fallback.get(lane)
        parts[lane] = LaneWork(remaining[lane], per_item, threads.get(lane, 0), (held or {}).get(lane, 0))
    if total <= 0 or settled < SHOWN_FROM * total:
        return None, parts
    return estimate(parts, order, fleet), parts
