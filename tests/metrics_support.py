"""Helpers for the metrics tests: a scrape as a dict, and the metric names the Grafana dashboard plots."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "photojobs.json"
_METRIC = re.compile(r"\bphotojobs_[a-z0-9_]+\b")

Sample = tuple[str, tuple[tuple[str, str], ...]]  # (sample name, sorted labels)


def parse_scrape(text: str) -> dict[Sample, float]:
    """Every sample of a Prometheus text exposition: (name, sorted labels) -> value."""
    out: dict[Sample, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def counters_of(scrape: dict[Sample, float]) -> dict[Sample, float]:
    """The counter samples (``_total``) of a scrape."""
    return {k: v for k, v in scrape.items() if k[0].endswith("_total")}


def sample(scrape: dict[Sample, float], name: str, **labels: str) -> float:
    """One sample's value (KeyError when the scrape does not have it)."""
    return scrape[(name, tuple(sorted(labels.items())))]


def load_dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard: its panels' targets and its query variables."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var["query"]
            exprs.append(q["query"] if isinstance(q, dict) else q)
    return exprs


def metric_names(exprs: list[str]) -> set[str]:
    """The photojobs metric names the expressions read."""
    return {m for e in exprs for m in _METRIC.findall(e)}
