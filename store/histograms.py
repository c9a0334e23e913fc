"""Persisted duration histograms, folded from the event log with the counters (``store.counters``).

Three histograms, each a set of cumulative bucket counters in table ``counters`` (names ``h:KEY:LE``,
``h:KEY:sum_ms``), so they only grow, survive a prune of the events and read the same from every
web server (a store-wide figure: aggregate with ``max``, never ``sum``, across web servers):

* ``run`` per lane — an attempt's run time, claim -> finish: an ``item_succeeded``,
  ``item_failed`` or ``item_retry_scheduled`` event's time minus its claim's ``claimed_at``
  (carried in the event's detail since revision 0013; both database clock);
* ``wait`` per lane — an attempt's queue wait, ready -> claim: the ``waited`` of its
  ``item_claimed`` event (``store.queries.claim_sql``: the claim time minus the later of the
  item's last change before it: queuing and a deferral keep it, a retry's backoff counts);
* ``job`` — a job's duration, created -> its last item settled: observed by the fold that folds
  the job's last settling event while nothing of the job is left to run (a retried job that
  settles again is observed again).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.utils import floatToGoString
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from .models import PENDING, QUEUED, RUNNING, WAITING, Event, Item, Job

PREFIX = "h:"
SUM = "sum_ms"  # the sum of the observations, in milliseconds


@dataclass(frozen=True)
class Histogram:
    key: str
    metric: str
    help: str
    buckets: tuple[float, ...]  # upper bounds, ascending (+Inf implied)
    by_lane: bool = True

    def counter(self, le: float | str) -> str:
        """The counters row name of one bucket (``inf`` for +Inf) or of the sum (``SUM``)."""
        return f"{PREFIX}{self.key}:{le if isinstance(le, str) else format(le, 'g')}"


RUN = Histogram(
    "run",
    "photojobs_item_run_seconds",
    "An attempt's run time, claim to finish (succeeded, failed, or failed with a retry scheduled)",
    (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800),
)
WAIT = Histogram(
    "wait",
    "photojobs_item_queue_wait_seconds",
    "An attempt's queue wait, ready (pending) to claim, including a retry's backoff",
    (0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800, 3600, 21600),
)
JOB = Histogram(
    "job",
    "photojobs_job_duration_seconds",
    "A job's duration, submitted to its last item settled",
    (1, 10, 60, 300, 900, 3600, 14400, 43200, 86400),
    by_lane=False,
)
HISTOGRAMS = (RUN, WAIT, JOB)
RUN_EVENTS = ("item_succeeded", "item_failed", "item_retry_scheduled")
WAIT_EVENTS = ("item_claimed",)
TIMED_EVENTS = RUN_EVENTS + WAIT_EVENTS
# Events that may leave a job with nothing to run (its last item settling).
SETTLING_EVENTS = ("item_succeeded", "item_failed", "item_cancelled", "item_skipped", "item_discarded")
ACTIVE = (WAITING, PENDING, QUEUED, RUNNING)
CHUNK = 500


class Tally:
    """Bucket increments of one fold: per (histogram, lane), how many observations fell in each
    bucket (not cumulative) and their sum; ``values`` turns them into the counters rows."""

    def __init__(self) -> None:
        self._counts: dict[tuple[Histogram, str], list[int]] = {}
        self._sums: dict[tuple[Histogram, str], float] = {}

    def observe(self, h: Histogram, lane: str, seconds: float) -> None:
        if not math.isfinite(seconds):
            return
        seconds = max(0.0, seconds)
        key = (h, lane if h.by_lane else "")
        counts = self._counts.get(key)
        if counts is None:
            counts = self._counts[key] = [0] * (len(h.buckets) + 1)
            self._sums[key] = 0.0
        counts[bisect_left(h.buckets, seconds)] += 1  # the first bucket whose bound is >= seconds
        self._sums[key] += seconds

    @property
    def values(self) -> dict[tuple[str, str], int]:
        """(counter name, lane) -> increment: each bucket cumulative, ``inf`` the count, the sum in ms."""
        out: dict[tuple[str, str], int] = {}
        for (h, lane), counts in self._counts.items():
            running = 0
            for le, n in zip(h.buckets, counts, strict=False):
                running += n
                if running:
                    out[(h.counter(le), lane)] = running
            out[(h.counter("inf"), lane)] = running + counts[-1]
            out[(h.counter(SUM), lane)] = int(round(self._sums[(h, lane)] * 1000))
        return out


def _seconds(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def observe_batch(s: Session, batch: Any, through: int) -> dict[tuple[str, str], int]:
    """The histogram increments of the events of ``batch`` (a subquery of the fold's events with
    ``seq``, ``type``, ``lane``, ``at``, ``job_id``, ``detail``), folded through cursor ``through``."""
    tally = Tally()
    rows = s.execute(
        select(batch.c.type, batch.c.lane, batch.c.at, batch.c.detail).where(batch.c.type.in_(TIMED_EVENTS))
    ).all()
    for type_, lane, at, detail in rows:
        if not isinstance(detail, dict):
            continue
        if type_ in WAIT_EVENTS:
            waited = _seconds(detail.get("waited"))
            if waited is not None:
                tally.observe(WAIT, lane or "", waited)
        else:
            claimed = _seconds(detail.get("claimed_at"))
            if claimed is not None:
                tally.observe(RUN, lane or "", float(at) - claimed)
    settled = s.execute(
        select(batch.c.job_id, func.max(batch.c.at))
        .where(batch.c.type.in_(SETTLING_EVENTS), batch.c.job_id.is_not(None))
        .group_by(batch.c.job_id)
    ).all()
    for _job, seconds in _jobs_done(s, {int(j): float(at) for j, at in settled}, through):
        tally.observe(JOB, "", seconds)
    return tally.values


def _jobs_done(s: Session, last: dict[int, float], through: int) -> Iterable[tuple[int, float]]:
    """Of the jobs whose settling events the fold saw (``last``: job -> its latest one's time), those
    with nothing left to run, no later settling event numbered and not being submitted: (job,
    duration)."""
    ids = sorted(last)
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start : start + CHUNK]
        later = set(
            s.execute(
                select(Event.job_id)
                .where(Event.job_id.in_(chunk), Event.seq > through, Event.type.in_(SETTLING_EVENTS))
                .group_by(Event.job_id)
            ).scalars()
        )
        busy = set(
            s.execute(
                select(Item.job_id)
                .where(Item.job_id.in_(chunk), Item.state.in_(ACTIVE))
                .group_by(Item.job_id)
            ).scalars()
        )
        for job_id, created, submitting in s.execute(
            select(Job.id, Job.created_at, Job.submitting).where(Job.id.in_(chunk))
        ):
            if job_id in later or job_id in busy or submitting:
                continue
            yield job_id, last[job_id] - float(created)


@dataclass(frozen=True)
class HistogramValues:
    """One histogram's folded values for one lane: cumulative bucket counts, count and sum."""

    buckets: list[tuple[str, int]]  # (le as Prometheus writes it, cumulative count), +Inf last
    count: int
    sum: float


def read_histograms(
    values: dict[tuple[str, str], int], lanes: Sequence[str]
) -> dict[str, dict[str, HistogramValues]]:
    """metric -> lane ("" for ``JOB``) -> values, from the counters rows (``Counters.histograms``);
    every lane of ``lanes`` is listed (zeros before its first observation)."""
    out: dict[str, dict[str, HistogramValues]] = {}
    for h in HISTOGRAMS:
        keys = sorted({lane for (_, lane) in values} | set(lanes)) if h.by_lane else [""]
        per: dict[str, HistogramValues] = {}
        for lane in keys:
            count = values.get((h.counter("inf"), lane), 0)
            if h.by_lane and not lane:
                continue
            buckets = [(floatToGoString(le), values.get((h.counter(le), lane), 0)) for le in h.buckets]
            buckets.append(("+Inf", count))
            per[lane] = HistogramValues(buckets, count, values.get((h.counter(SUM), lane), 0) / 1000.0)
        out[h.metric] = per
    return out


def quantile(h: HistogramValues, q: float) -> float | None:
    """The ``q``-quantile of one lane's histogram as Prometheus's ``histogram_quantile`` estimates
    it: the bucket the ``q * count``-th observation falls in, linearly interpolated within it (from
    0 for the first bucket); the highest finite bound when it falls in ``+Inf``; None with no
    observation. Shown by the console's Lanes page (p50, p95 of run time and queue wait)."""
    if h.count <= 0:
        return None
    rank = q * h.count
    lower, below = 0.0, 0
    for le, n in h.buckets:
        if le == "+Inf":
            return lower
        upper = float(le)
        if n >= rank:
            return upper if n == below else lower + (upper - lower) * (rank - below) / (n - below)
        lower, below = upper, n
    return lower


def lane_quantiles(values: dict[tuple[str, str], int], lanes: Sequence[str]) -> dict[str, dict[str, Any]]:
    """lane -> ``{"run": {"p50", "p95", "count"}, "wait": {...}}`` (seconds, None before the first
    observation), from the counters' histogram rows (``Counters.histograms``)."""
    folded = read_histograms(values, lanes)
    out: dict[str, dict[str, Any]] = {}
    for lane in lanes:
        out[lane] = {}
        for h, name in ((RUN, "run"), (WAIT, "wait")):
            v = folded[h.metric].get(lane) or HistogramValues([], 0, 0.0)
            out[lane][name] = {"p50": quantile(v, 0.5), "p95": quantile(v, 0.95), "count": v.count}
    return out
