"""Webhooks (issue 38): a real receiver on loopback, a real sweeper (``photojobs sweep``) and worker
processes. A receiver that fails twice then answers gets the job's ``job_finished`` once, signed
with the HMAC-SHA256 of the raw body; a receiver down across a sweeper and worker restart gets it
after; the delivery's state is in the store (``webhook_state``) and the console's Workers page."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from photojobs.api import Client
from photojobs.config import Settings
from store import webhooks
from tests.support import Fleet, free_port, make_files, wait_for, wait_job_done
from tests.web_support import TIMEOUT_MS, TOKEN, browser, serving  # noqa: F401 - browser: a fixture

pytestmark = pytest.mark.timeout(240)

SECRET = "receiver-shared-secret"


class Receiver:
    """A tiny HTTP server on loopback: answers 500 to its first ``fail`` POSTs, then 204; keeps
    every request (body, headers) it got."""

    def __init__(self, port: int, fail: int = 0) -> None:
        self.port = port
        self.fail = fail
        self.requests: list[dict[str, Any]] = []
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/photojobs"

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.requests.append({"path": self.path, "raw": raw, "headers": dict(self.headers)})
                failing = len(receiver.requests) <= receiver.fail
                self.send_response(500 if failing else 204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def verified(self) -> list[dict[str, Any]]:
        """The bodies whose ``X-Photojobs-Signature`` is the HMAC-SHA256 of the raw body."""
        out = []
        for r in self.requests:
            expected = "sha256=" + hmac.new(SECRET.encode(), r["raw"], hashlib.sha256).hexdigest()
            if hmac.compare_digest(r["headers"].get("X-Photojobs-Signature", ""), expected):
                out.append(json.loads(r["raw"]))
        return out


@pytest.fixture
def receiver_port() -> int:
    return free_port()


@pytest.fixture
def hooked_env(env: dict[str, str], receiver_port: int) -> dict[str, str]:
    return {
        **env,
        "PHOTOJOBS_WEBHOOK_URL": f"http://127.0.0.1:{receiver_port}/hooks/photojobs",
        "PHOTOJOBS_WEBHOOK_SECRET": SECRET,
        "PHOTOJOBS_WEBHOOK_BACKOFF_MAX": "2",
    }


@pytest.fixture
def hooked_fleet(hooked_env: dict[str, str], tmp_path: Path) -> Iterator[Fleet]:
    logdir = tmp_path / "hook-logs"
    logdir.mkdir()
    f = Fleet(hooked_env, logdir)
    yield f
    f.stop()


def target_row(engine: Engine) -> dict[str, Any] | None:
    rows = webhooks.status(engine)
    return rows[0] if rows else None


def test_a_receiver_that_fails_twice_then_answers_gets_one_verified_delivery(
    hooked_env: dict[str, str], hooked_fleet: Fleet, engine: Engine, tmp_path: Path, receiver_port: int
) -> None:
    # Given a receiver on loopback that answers 500 twice, then 204
    receiver = Receiver(receiver_port, fail=2)
    receiver.start()
    try:
        # When a 3-photo job runs on a fleet whose sweeper delivers webhooks to it
        make_files(tmp_path / "photos", 3)
        client = Client(Settings.from_env(hooked_env))
        job = client.submit(["noop"], [tmp_path / "photos"], {}).job_id
        hooked_fleet.start_sweeper()
        hooked_fleet.start_worker(threads=2)
        wait_job_done(engine, job)
        # Then the third POST is answered, and the delivery is recorded in the store
        row = wait_for(
            lambda: (r := target_row(engine)) is not None and r["delivered"] == 1 and r,
            60,
            what=f"a recorded delivery; logs:\n{hooked_fleet.logs()}",
        )
        # And every POST carried the same body, signed with the HMAC-SHA256 of its raw bytes
        assert len(receiver.requests) == 3
        bodies = receiver.verified()
        assert len(bodies) == 3 and all(b == bodies[0] for b in bodies)
        assert bodies[0] == {
            "event": "job_finished",
            "job": job,
            "state": "succeeded",
            "counts": {"succeeded": 3},
            "cursor": row["cursor"],
        }
        assert receiver.requests[0]["path"] == "/hooks/photojobs"
        # And the state shows two failures, the last answer, nothing left to deliver
        assert (row["failures"], row["attempts"], row["last_status"], row["lag"]) == (2, 0, 204, 0)
        # And nothing more is sent (the cursor moved past the event)
        done = job
        make_files(tmp_path / "more", 1)
        job2 = client.submit(["noop"], [tmp_path / "more"], {}).job_id
        wait_job_done(engine, job2)
        wait_for(lambda: len(receiver.requests) == 4, 60, what="the second job's delivery")
        assert [b["job"] for b in receiver.verified()] == [done, done, done, job2]
    finally:
        receiver.stop()


def test_a_receiver_down_across_a_sweeper_and_worker_restart_gets_the_event_after(
    hooked_env: dict[str, str], hooked_fleet: Fleet, engine: Engine, tmp_path: Path, receiver_port: int
) -> None:
    # Given a fleet whose webhook receiver is down (nothing listens on its port)
    make_files(tmp_path / "photos", 2)
    client = Client(Settings.from_env(hooked_env))
    job = client.submit(["noop"], [tmp_path / "photos"], {}).job_id
    sweeper = hooked_fleet.start_sweeper()
    worker = hooked_fleet.start_worker(threads=2)
    wait_job_done(engine, job)
    # When its deliveries have failed (no answer) and the sweeper and the worker are killed
    failed = wait_for(
        lambda: (r := target_row(engine)) is not None and r["failures"] >= 2 and r,
        60,
        what=f"failed attempts; logs:\n{hooked_fleet.logs()}",
    )
    assert failed["delivered"] == 0 and failed["cursor"] == 0 and failed["last_status"] is None
    assert failed["last_error"].startswith("no answer")
    hooked_fleet.kill(sweeper)
    hooked_fleet.kill(worker)
    # And the receiver comes up, and a new sweeper and worker start
    receiver = Receiver(receiver_port)
    receiver.start()
    try:
        hooked_fleet.start_sweeper()
        hooked_fleet.start_worker(threads=2)
        # Then the event is delivered once the killed sweeper's lease expired, signed, and recorded
        wait_for(
            lambda: receiver.verified(), 90, what=f"the delivery after the restart:\n{hooked_fleet.logs()}"
        )
        row = wait_for(lambda: (r := target_row(engine)) is not None and r["delivered"] == 1 and r, 30)
        (body,) = receiver.verified()
        assert body["job"] == job and body["state"] == "succeeded" and body["cursor"] == row["cursor"]
        assert row["lag"] == 0 and row["attempts"] == 0 and row["last_status"] == 204
    finally:
        receiver.stop()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_console_shows_a_failing_targets_state(
    browser: Any,  # noqa: F811 - the fixture imported above
    hooked_env: dict[str, str],
    hooked_fleet: Fleet,
    engine: Engine,
    tmp_path: Path,
    receiver_port: int,
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    # Given a receiver that answers 500 to everything, and a finished job the sweeper tries to deliver
    receiver = Receiver(receiver_port, fail=10_000)
    receiver.start()
    try:
        make_files(tmp_path / "photos", 1)
        client = Client(Settings.from_env(hooked_env))
        job = client.submit(["noop"], [tmp_path / "photos"], {}).job_id
        hooked_fleet.start_sweeper()
        hooked_fleet.start_worker(threads=1)
        wait_job_done(engine, job)
        wait_for(lambda: (r := target_row(engine)) is not None and r["failures"] >= 1, 60, what="a failure")
        # When the operator opens the console's Workers page
        with serving(hooked_env, tmp_path, [tmp_path / "photos"]) as server:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(server.url + "/")
            page.fill("#token", TOKEN)
            page.click("#login-form button[type=submit]")
            page.goto(server.url + "/#/workers")
            # Then the Webhooks table shows the target's host, its lag and its last answer
            row = page.locator("#webhooks tr")
            expect(row).to_have_count(1)
            expect(row.locator("td").nth(0)).to_have_text(f"127.0.0.1:{receiver_port}")
            expect(row.locator("td").nth(2)).to_have_text("1")
            expect(row.locator("td").nth(5)).to_have_text("500 (HTTP 500)")
            assert "/hooks/photojobs" not in page.content()
            assert errors == []
    finally:
        receiver.stop()


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_two_fleets_sweepers_deliver_each_job_once_in_cursor_order(
    hooked_env: dict[str, str], hooked_fleet: Fleet, engine: Engine, tmp_path: Path, receiver_port: int
) -> None:
    # Given a receiver that answers every POST, and two sweepers (two fleets) configured with it
    receiver = Receiver(receiver_port)
    receiver.start()
    try:
        hooked_fleet.start_sweeper()
        hooked_fleet.start_sweeper()
        hooked_fleet.start_worker(threads=2)
        client = Client(Settings.from_env(hooked_env))
        # When five jobs run to their end
        jobs = []
        for i in range(5):
            make_files(tmp_path / f"photos{i}", 2)
            jobs.append(client.submit(["noop"], [tmp_path / f"photos{i}"], {}).job_id)
        for job in jobs:
            wait_job_done(engine, job)
        row = wait_for(
            lambda: (r := target_row(engine)) is not None and r["delivered"] == 5 and r,
            90,
            what=f"five deliveries; logs:\n{hooked_fleet.logs()}",
        )
        # Then the receiver got each job's finish once, signed, in cursor order
        bodies = receiver.verified()
        assert len(receiver.requests) == len(bodies) == 5
        assert sorted(b["job"] for b in bodies) == sorted(jobs)
        cursors = [b["cursor"] for b in bodies]
        assert cursors == sorted(set(cursors)) and cursors[-1] == row["cursor"]
        assert row["failures"] == 0 and row["lag"] == 0
    finally:
        receiver.stop()
