"""The worker registry with real worker processes, on SQLite and PostgreSQL: idle workers are listed
with host, pid, lanes and a heartbeat; a killed one turns stale; a cleanly stopped one is marked
stopped; a busy one shows the items it holds."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path
from typing import Any

from photojobs.api import Client
from photojobs.config import Settings
from tests.support import Fleet, make_files, wait_for


def _by_lanes(client: Client) -> dict[tuple[str, ...], dict[str, Any]]:
    return {tuple(w["lanes"]): w for w in client.workers()}


def test_idle_workers_are_listed_then_stale_when_killed_and_stopped_when_stopped(
    env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given two idle workers: one serving noop, one serving exif and rename; nothing submitted
    client = Client(Settings.from_env(env))
    noop = fleet.start_worker(["noop"])
    pair = fleet.start_worker(["exif", "rename"])
    # When the registry is read
    both = wait_for(
        lambda: (
            (ws := _by_lanes(client)).keys() >= {("noop",), ("exif", "rename")}
            and all(w["state"] == "live" for w in ws.values())
            and ws
        ),
        90,
        0.2,
        what="two idle live workers\n" + fleet.logs(),
    )
    # Then each is listed live with its host, pid, lanes, no items and a fresh heartbeat
    for w in both.values():
        assert (
            w["host"] == socket.gethostname()
            and w["pid"] > 0
            and w["id"].startswith(f"{w['host']}:{w['pid']}:")
        )
        assert w["held"] == 0 and w["items"] == [] and w["registered"] is True and w["stopped_at"] is None
        assert (
            w["heartbeat_age"] is not None
            and w["heartbeat_age"] < 60
            and w["started_at"] <= w["last_heartbeat"]
        )
        assert w["heartbeat_interval"] == 0.5
    # And an idle worker keeps beating: its last heartbeat moves on
    first = both[("noop",)]["last_heartbeat"]
    wait_for(lambda: _by_lanes(client)[("noop",)]["last_heartbeat"] > first, 60, 0.2, what="a later beat")

    # When a slow job runs on the noop worker
    photos = tmp_path / "photos"
    make_files(photos, 2)
    job = client.submit(["noop"], [photos], {"noop.sleep": 3}).job_id
    # Then the noop worker shows the items it holds (from its leases) and the same identity
    fleet.start_sweeper()
    busy = wait_for(
        lambda: (w := _by_lanes(client)[("noop",)])["held"] >= 1 and w,
        90,
        0.2,
        what="the noop worker holding an item\n" + fleet.logs(),
    )
    assert busy["id"] == both[("noop",)]["id"] and busy["jobs"] == [job] and busy["state"] == "live"

    # When the noop worker's process group is SIGKILLed
    os.killpg(noop.pid, signal.SIGKILL)
    noop.wait(timeout=30)
    # Then it is listed stale (its beats stopped), not live and not stopped
    wait_for(
        lambda: _by_lanes(client)[("noop",)]["state"] == "stale", 60, 0.2, what="the killed worker stale"
    )
    killed = _by_lanes(client)[("noop",)]
    assert killed["stopped_at"] is None and killed["heartbeat_age"] > 1.0

    # When the other worker is stopped cleanly (SIGTERM to dramatiq's main process)
    pair.send_signal(signal.SIGTERM)
    assert pair.wait(timeout=60) == 0, fleet.logs()
    # Then it is marked stopped, with the time it stopped
    stopped = wait_for(
        lambda: (w := _by_lanes(client)[("exif", "rename")])["state"] == "stopped" and w,
        30,
        0.2,
        what="the stopped worker marked stopped\n" + fleet.logs(),
    )
    assert stopped["stopped_at"] is not None and stopped["stopped_at"] >= stopped["started_at"]
    # And nothing is live any more: stale before stopped
    assert [w["state"] for w in client.workers()] == ["stale", "stopped"]
