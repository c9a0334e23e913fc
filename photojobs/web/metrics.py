"""``/metrics``: Prometheus figures read from the store at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from store import listing
from store.models import ALL_STATES, QUEUED, TERMINAL


class StoreCollector(Collector):
    def __init__(self, client: Any) -> None:
        self.client = client

    def collect(self) -> Iterator[Any]:
        snap = listing.metrics(self.client.engine)
        lanes = sorted({lane for lane, _ in snap.items} | set(snap.throughput))
        items = GaugeMetricFamily(
            "photojobs_items", "Items in the store by lane and state", labels=["lane", "state"]
        )
        for lane in lanes:
            for state in ALL_STATES:
                items.add_metric([lane, state], snap.items.get((lane, state), 0))
        yield items
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
        for lane in sorted(set(lanes) | set(self.client.specs)):
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
        for name, type_, help_ in (
            (
                "photojobs_lease_expiries",
                "lease_expired",
                "Leases revoked by the sweeper (since the last prune)",
            ),
            (
                "photojobs_stale_commits",
                "stale_commit_rejected",
                "Commits refused by the fence (since the last prune)",
            ),
            ("photojobs_items_succeeded", "item_succeeded", "Items that succeeded (since the last prune)"),
            ("photojobs_items_failed", "item_failed", "Items that failed for good (since the last prune)"),
            (
                "photojobs_messages_rejected",
                "message_rejected",
                "Broker messages rejected (since the last prune)",
            ),
        ):
            counter = CounterMetricFamily(name, help_)
            counter.add_metric([], snap.events.get(type_, 0))
            yield counter
        jobs = GaugeMetricFamily(
            "photojobs_jobs_active", "Jobs with unfinished items, by state", labels=["state"]
        )
        for state, n in sorted(snap.jobs.items()):
            jobs.add_metric([state], n)
        yield jobs


def render(client: Any) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(client))
    return generate_latest(registry)
