"""``/metrics``: Prometheus figures: persisted counters (the folded event log) and scrape-time gauges."""

from __future__ import annotations

import platform
from collections.abc import Iterator, Mapping
from typing import Any

import dramatiq
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.registry import Collector

import photojobs
from store import histograms, listing, sweeper_passes, webhooks
from store.models import ALL_STATES, QUEUED, TERMINAL
from store.workers import RESTART_EVENTS

# Counters by lane: (metric name without _total, event type folded into it, help).
LANE_COUNTERS = (
    ("photojobs_items_succeeded", "item_succeeded", "Items that succeeded"),
    ("photojobs_items_failed", "item_failed", "Items that failed for good (no attempt left)"),
    ("photojobs_items_cancelled", "item_cancelled", "Items cancelled (their job was cancelled)"),
    ("photojobs_items_retried", "item_retried", "Ended items sent back to work by an operator's retry"),
    (
        "photojobs_items_retry_scheduled",
        "item_retry_scheduled",
        "Attempts that failed with attempts left (the item runs again after a delay)",
    ),
    ("photojobs_claims", "item_claimed", "Items claimed by a worker (a lease taken)"),
    ("photojobs_lease_expiries", "lease_expired", "Leases revoked by the sweeper (worker died or froze)"),
    ("photojobs_stale_commits", "stale_commit_rejected", "Commits refused by the fence (a stale lease)"),
    ("photojobs_messages_rejected", "message_rejected", "Broker messages rejected (malformed or unknown)"),
)


def _gauge(name: str, help_: str, labels: list[str], samples: Mapping[Any, float]) -> GaugeMetricFamily:
    """A gauge of one sample per key of ``samples`` (its label values: a string, or a tuple of
    them in the order of ``labels``), in key order."""
    gauge = GaugeMetricFamily(name, help_, labels=labels)
    for key, value in sorted(samples.items()):
        gauge.add_metric(list(key) if isinstance(key, tuple) else [key], value)
    return gauge


class StoreCollector(Collector):
    def __init__(self, client: Any) -> None:
        self.client = client

    def collect(self) -> Iterator[Any]:
        known = sorted(self.client.specs)
        snap = listing.metrics(self.client.engine, known)
        yield from self._counters(snap, known)
        yield from self._items(snap)
        yield from self._lanes(snap, known)
        yield from self._fleet(snap)
        yield from self._alerts(snap)
        yield from _webhooks(self.client.engine)

    def _counters(self, snap: listing.MetricsSnapshot, known: list[str]) -> Iterator[Any]:
        folded = snap.counters
        for name, type_, help_ in LANE_COUNTERS:
            counter = CounterMetricFamily(name, help_ + " (persisted: never goes back)", labels=["lane"])
            by_lane = dict.fromkeys(known, 0) | folded.by_lane(type_)
            for lane, n in sorted(by_lane.items()):
                counter.add_metric([lane], n)
            yield counter
        submitted = CounterMetricFamily("photojobs_jobs_submitted", "Jobs whose submission completed")
        submitted.add_metric([], folded.get("job_submitted"))
        yield submitted
        events = CounterMetricFamily(
            "photojobs_events", "Events folded from the event log by type and lane", labels=["type", "lane"]
        )
        for (type_, lane), n in sorted(folded.values.items()):
            events.add_metric([type_, lane], n)
        yield events
        cursor = GaugeMetricFamily(
            "photojobs_counters_cursor", "The event cursor (events.seq) the counters are folded through"
        )
        cursor.add_metric([], folded.cursor)
        yield cursor

    def _items(self, snap: listing.MetricsSnapshot) -> Iterator[Any]:
        lanes = sorted({lane for lane, _ in snap.items} | set(snap.throughput))
        items = GaugeMetricFamily(
            "photojobs_items", "Items in the store by lane and state", labels=["lane", "state"]
        )
        for lane in lanes:
            for state in ALL_STATES:
                items.add_metric([lane, state], snap.items.get((lane, state), 0))
        yield items
        yield _gauge("photojobs_jobs_active", "Jobs with unfinished items, by state", ["state"], snap.jobs)

    def _lanes(self, snap: listing.MetricsSnapshot, known: list[str]) -> Iterator[Any]:
        lanes = sorted({lane for lane, _ in snap.items} | set(snap.throughput) | set(known))
        depth = GaugeMetricFamily(
            "photojobs_queue_depth",
            "Items dispatched to the broker and not yet claimed (state queued in the store) per lane",
            labels=["lane"],
        )
        backlog = GaugeMetricFamily(
            "photojobs_backlog",
            "Unfinished items per lane (submission refuses past the bound)",
            labels=["lane"],
        )
        bound = GaugeMetricFamily("photojobs_backlog_bound", "The lane's backlog bound", labels=["lane"])
        throughput = GaugeMetricFamily(
            "photojobs_throughput_items_per_second",
            "Items finished (succeeded or failed) per second over the last minute",
            labels=["lane"],
        )
        for lane in lanes:
            depth.add_metric([lane], snap.items.get((lane, QUEUED), 0))
            backlog.add_metric(
                [lane], sum(n for (ln, st), n in snap.items.items() if ln == lane and st not in TERMINAL)
            )
            if lane in self.client.specs:
                bound.add_metric([lane], self.client.specs[lane].backlog)
            throughput.add_metric([lane], snap.throughput.get(lane, 0.0))
        yield depth
        yield backlog
        yield bound
        yield throughput
        yield _gauge(
            "photojobs_lane_depth",
            "A lane's items waiting for dispatch (pending), in the broker (queued) and leased (running)",
            ["lane", "state"],
            snap.depth,
        )
        yield _gauge(
            "photojobs_oldest_queued_age_seconds",
            "Seconds since the lane's oldest queued item was queued (0: none queued)",
            ["lane"],
            snap.oldest_queued_age,
        )
        yield _gauge(
            "photojobs_oldest_pending_age_seconds",
            "Seconds the lane's longest-waiting ready item (pending or queued) has waited to be claimed "
            "(0: none waits); grows while the lane is paused or no worker takes its work",
            ["lane"],
            {lane: snap.oldest_pending_age.get(lane, 0.0) for lane in lanes},
        )
        yield _gauge(
            "photojobs_lane_paused",
            "1 while the lane is paused across all jobs (photojobs lane pause), else 0",
            ["lane"],
            {lane: snap.paused.get(lane, 0.0) for lane in lanes},
        )
        yield from self._histograms(snap, lanes)

    def _histograms(self, snap: listing.MetricsSnapshot, lanes: list[str]) -> Iterator[Any]:
        """The duration histograms folded from the event log (``store.histograms``): persisted, so
        they never go back and read the same from every web server."""
        folded = histograms.read_histograms(snap.counters.histograms, lanes)
        for h in histograms.HISTOGRAMS:
            family = HistogramMetricFamily(
                h.metric, h.help + " (persisted)", labels=["lane"] if h.by_lane else []
            )
            for lane, values in sorted(folded[h.metric].items()):
                family.add_metric([lane] if h.by_lane else [], values.buckets, values.sum)
            yield family

    def _fleet(self, snap: listing.MetricsSnapshot) -> Iterator[Any]:
        yield _gauge(
            "photojobs_workers",
            "Registered worker processes: live (beating), stale (beats stopped), stopped (clean shutdown)",
            ["state"],
            snap.workers,
        )
        yield _gauge(
            "photojobs_lane_workers", "Live worker processes serving the lane", ["lane"], snap.lane_workers
        )
        info = InfoMetricFamily("photojobs_build", "The serving process's versions")
        info.add_metric(
            [],
            {
                "version": photojobs.__version__,
                "dramatiq": dramatiq.__version__,
                "python": platform.python_version(),
            },
        )
        yield info

    def _alerts(self, snap: listing.MetricsSnapshot) -> Iterator[Any]:
        """What an on-call person alerts on: each sweeper duty's age, worker restarts by reason."""
        ages = sweeper_passes.pass_ages(self.client.engine)
        yield _gauge(
            "photojobs_sweeper_last_pass_age_seconds",
            "Seconds since the sweeper duty last ran without an error (any sweeper; recorded at most "
            "every 5 s); grows while no sweeper runs or the duty keeps failing",
            ["duty"],
            {duty: age for duty, (age, _) in ages.items()},
        )
        yield _gauge(
            "photojobs_sweeper_duty_interval_seconds",
            "The sweeper duty's own interval (0: every pass), to compare its age with",
            ["duty"],
            {duty: every for duty, (_, every) in ages.items()},
        )
        restarts = CounterMetricFamily(
            "photojobs_worker_restarts",
            "Supervised worker processes that ended unexpectedly and were restarted, by reason: crashed "
            "(a non-zero exit), killed (a signal: OOM killer, SIGKILL), recycled (a clean exit nobody "
            "asked for) (persisted: never goes back)",
            labels=["reason"],
        )
        for reason, type_ in sorted(RESTART_EVENTS.items()):
            restarts.add_metric([reason], snap.counters.get(type_))
        yield restarts


def _webhooks(engine: Any) -> Iterator[Any]:
    """Each webhook target's deliveries and failed attempts (persisted in ``webhook_state``) and
    its lag: the ``job_finished`` events not delivered yet (``store.webhooks``)."""
    rows = webhooks.status(engine)
    labels = ["host", "target"]
    families = (
        (CounterMetricFamily, "photojobs_webhook_deliveries", "job_finished delivered (2xx)", "delivered"),
        (CounterMetricFamily, "photojobs_webhook_failures", "Webhook attempts that failed", "failures"),
        (GaugeMetricFamily, "photojobs_webhook_lag_events", "job_finished events not delivered yet", "lag"),
    )
    for kind, name, help_, key in families:
        family = kind(name, help_, labels=labels)
        for r in rows:
            family.add_metric([r["host"], r["target"][:12]], r[key])
        yield family


def render(client: Any) -> bytes:
    """The Prometheus text exposition of the store's figures (folds the event log first)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(client))
    return generate_latest(registry)
