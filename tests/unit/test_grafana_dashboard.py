"""The Grafana dashboard (docs/grafana/photojobs.json) loads and has the shape Grafana reads.

That every metric it names exists in a real ``/metrics`` scrape is checked against a serve process
in tests/process/test_metrics.py.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest

from tests.metrics_support import dashboard_exprs, load_dashboard, metric_names

# The fields of a dashboard this repository uses (Grafana's dashboard JSON model, schemaVersion 39).
_TARGET = {
    "type": "object",
    "required": ["refId", "expr"],
    "properties": {
        "refId": {"type": "string", "pattern": "^[A-Z]$"},
        "expr": {"type": "string", "minLength": 1},
        "legendFormat": {"type": "string"},
        "format": {"enum": ["time_series", "table"]},
        "instant": {"type": "boolean"},
        "datasource": {"$ref": "#/$defs/datasource"},
    },
}
_PANEL = {
    "type": "object",
    "required": ["id", "type", "title", "gridPos", "targets", "datasource"],
    "properties": {
        "id": {"type": "integer", "minimum": 1},
        "type": {"enum": ["timeseries", "stat", "table", "gauge", "bargauge"]},
        "title": {"type": "string", "minLength": 1},
        "description": {"type": "string"},
        "datasource": {"$ref": "#/$defs/datasource"},
        "gridPos": {
            "type": "object",
            "required": ["h", "w", "x", "y"],
            "properties": {
                "h": {"type": "integer", "minimum": 1},
                "w": {"type": "integer", "minimum": 1, "maximum": 24},
                "x": {"type": "integer", "minimum": 0, "maximum": 23},
                "y": {"type": "integer", "minimum": 0},
            },
        },
        "targets": {"type": "array", "minItems": 1, "items": _TARGET},
        "fieldConfig": {
            "type": "object",
            "required": ["defaults"],
            "properties": {"defaults": {"type": "object"}, "overrides": {"type": "array"}},
        },
    },
}
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["title", "uid", "schemaVersion", "panels", "templating", "time"],
    "properties": {
        "title": {"type": "string", "minLength": 1},
        "uid": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"},
        "schemaVersion": {"type": "integer", "minimum": 30},
        "refresh": {"type": "string"},
        "time": {
            "type": "object",
            "required": ["from", "to"],
            "properties": {"from": {"type": "string"}, "to": {"type": "string"}},
        },
        "panels": {"type": "array", "minItems": 1, "items": _PANEL},
        "templating": {
            "type": "object",
            "required": ["list"],
            "properties": {
                "list": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "type"],
                        "properties": {
                            "name": {"type": "string", "pattern": "^[a-z_]+$"},
                            "type": {"enum": ["datasource", "query", "custom", "interval"]},
                        },
                    },
                }
            },
        },
    },
    "$defs": {
        "datasource": {
            "type": "object",
            "required": ["type", "uid"],
            "properties": {"type": {"const": "prometheus"}, "uid": {"type": "string"}},
        }
    },
}


def test_the_dashboard_loads_and_has_grafanas_shape() -> None:
    # Given the dashboard JSON in the repository
    dashboard = load_dashboard()
    # When it is checked against the schema of the fields it uses / Then it passes
    jsonschema.validate(dashboard, SCHEMA)
    # And panel ids are unique, no two panels overlap, and each uses a datasource variable it declares
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    cells = [
        (p["gridPos"]["x"] + dx, p["gridPos"]["y"] + dy)
        for p in dashboard["panels"]
        for dx in range(p["gridPos"]["w"])
        for dy in range(p["gridPos"]["h"])
    ]
    assert len(cells) == len(set(cells)), "panels overlap"
    assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in dashboard["panels"])
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "lane"} <= variables
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} == {"${datasource}"}


def test_the_dashboard_plots_what_an_operator_alerts_on() -> None:
    # Given the dashboard's expressions
    exprs = dashboard_exprs(load_dashboard())
    names = metric_names(exprs)
    # Then it plots the rate of the persisted counters per lane, the depth, the oldest age, the workers
    assert any("rate(photojobs_items_succeeded_total" in e and "by (lane)" in e for e in exprs)
    assert any("rate(photojobs_items_failed_total" in e for e in exprs)
    assert {
        "photojobs_lane_depth",
        "photojobs_oldest_queued_age_seconds",
        "photojobs_workers",
        "photojobs_lease_expiries_total",
        "photojobs_stale_commits_total",
        "photojobs_build_info",
    } <= names
    # And the duration histograms are plotted as p50 and p95 per lane (the run time, the queue wait)
    # and per store (a job's duration), aggregated with max (every web server reports the same)
    for metric in ("photojobs_item_run_seconds", "photojobs_item_queue_wait_seconds"):
        for q in ("0.5", "0.95"):
            assert any(
                f"histogram_quantile({q}, max by (lane, le) (rate({metric}_bucket" in e for e in exprs
            ), (metric, q)
    assert any(
        "histogram_quantile(0.95, max by (le) (rate(photojobs_job_duration_seconds_bucket" in e for e in exprs
    )
    # And the gauges a paused or stuck lane moves
    assert {"photojobs_oldest_pending_age_seconds", "photojobs_lane_paused"} <= names
    # And what the on-call alerts watch (issue 41): the sweeper's age, worker restarts, failure ratio
    assert {"photojobs_sweeper_last_pass_age_seconds", "photojobs_worker_restarts_total"} <= names
    assert any("clamp_min(" in e and "photojobs_items_failed_total" in e for e in exprs)
    # And every counter is read through rate()/increase(), never plotted raw (it only grows)
    for e in exprs:
        for name in metric_names([e]):
            if name.endswith("_total"):
                assert f"rate({name}" in e or f"increase({name}" in e, e
    # And no figure is summed over instances (every web server reports the same store-wide figures)
    assert not any("sum" in e for e in exprs), exprs


def test_the_schema_check_can_fail() -> None:
    # Given a dashboard whose panel lost its expression / Then the schema check refuses it
    broken = copy.deepcopy(load_dashboard())
    del broken["panels"][0]["targets"][0]["expr"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, SCHEMA)
