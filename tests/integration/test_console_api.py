"""The console's API on SQLite and PostgreSQL (the app in-process, a real store and Redis): jobs paged
to the last one by state and search, the state filter's plan reads indexes only, a failure group
retried or discarded alone, one item retried, "show all" of a group, the lanes' throughput from the
event log, and bounded parameters answered with 400, never 500."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, or_, text, update
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.testing import scale
from photojobs.web import create_app
from store import console
from store.events import emit
from store.models import Item
from tests.console_seed import seed_jobs
from tests.support import make_files
from tests.web_support import TOKEN


@pytest.fixture
def roots(tmp_path: Path) -> Path:
    root = tmp_path / "photos"
    make_files(root / "album", 4)
    make_files(root / "needle", 1, prefix="needle")
    return root


@pytest.fixture
def http(engine: Engine, redis_url: str, roots: Path) -> Iterator[TestClient]:
    env = {"PHOTOJOBS_DATABASE_URL": str(engine.url), "PHOTOJOBS_REDIS_URL": redis_url}
    client = Client(Settings.from_env(env), engine, migrate=False)
    app = create_app(client, token=TOKEN, photo_roots=[roots], env=env)
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c


def _submit(http: TestClient, paths: list[str], params: dict[str, Any] | None = None) -> int:
    r = http.post("/api/jobs", json={"lanes": ["noop"], "paths": paths, "params": params or {}})
    assert r.status_code == 201, r.text
    return int(r.json()["job"])


def _fail(engine: Engine, job: int, errors: dict[str, str]) -> dict[str, int]:
    """Items of ``job`` whose path ends with a key fail with that error (a worker's outcome, set
    directly); the others succeed. Returns path suffix -> item id."""
    ids: dict[str, int] = {}
    with Session(engine) as s, s.begin():
        rows = s.execute(
            text("SELECT i.id, p.path FROM items i JOIN photos p ON p.id = i.photo_id WHERE i.job_id = :j"),
            {"j": job},
        ).all()
        for item_id, path in rows:
            suffix = next((k for k in errors if path.endswith(k)), None)
            values: dict[str, Any] = {"state": "succeeded", "attempt": 1}
            if suffix:
                ids[suffix] = item_id
                values = {"state": "failed", "attempt": 3, "error": errors[suffix].format(path=path)}
            s.execute(update(Item).where(Item.id == item_id).values(**values))
            emit(s, "item_failed" if suffix else "item_succeeded", job_id=job, item_id=item_id, lane="noop")
    return ids


def test_every_job_reachable_by_paging_state_and_search(http: TestClient, engine: Engine) -> None:
    # Given 45 jobs, the first over the folder "needle", and a failed item in job 7
    first = _submit(http, ["needle"])
    jobs = [first] + [_submit(http, ["album"]) for _ in range(44)]
    _fail(engine, jobs[6], {"f00000.txt": "RuntimeError: boom at {path}"})
    # When the list is followed page by page (20 a page)
    seen: list[int] = []
    after: int | None = None
    while True:
        r = http.get("/api/jobs", params={"limit": 20, **({"after": after} if after else {})}).json()
        seen += [j["job"] for j in r["jobs"]]
        if r["next"] is None:
            break
        after = r["next"]
    # Then every job is reached once: the moving ones first (items queued), newest first, then the
    # finished one (the README's "running jobs first")
    moving = sorted(set(jobs) - {jobs[6]}, reverse=True)
    assert seen == [*moving, jobs[6]]
    # and a page that ends with the last moving job leads on to the finished ones
    page = http.get("/api/jobs", params={"limit": len(moving)}).json()
    assert [j["job"] for j in page["jobs"]] == moving and page["next"] is not None
    rest = http.get("/api/jobs", params={"limit": 20, "after": page["next"]}).json()
    assert [j["job"] for j in rest["jobs"]] == [jobs[6]] and rest["next"] is None
    # And a search by the photo folder, by id, by parameter finds it
    assert [j["job"] for j in http.get("/api/jobs", params={"q": "needle"}).json()["jobs"]] == [first]
    assert first in [j["job"] for j in http.get("/api/jobs", params={"q": f"#{first}"}).json()["jobs"]]
    # And the state filter finds the partial job only, and pages through the running ones
    partial = http.get("/api/jobs", params={"state": "partial"}).json()
    assert [j["job"] for j in partial["jobs"]] == [jobs[6]] and partial["next"] is None
    running: list[int] = []
    after = None
    while True:
        r = http.get(
            "/api/jobs", params={"state": "running", "limit": 7, **({"after": after} if after else {})}
        )
        body = r.json()
        running += [j["job"] for j in body["jobs"]]
        if body["next"] is None:
            break
        after = body["next"]
    assert running == sorted(set(jobs) - {jobs[6]}, reverse=True)


def test_state_filter_plans_read_indexes_not_items(engine: Engine) -> None:
    # Given 2,000 finished jobs of 20 items, every 500th one partial
    seed_jobs(engine, 2000, 20)
    # When the database plans the state filter's candidate query for each state
    plans = {
        state: scale.plan(engine, console.job_ids_query(state, None)) for state in console.CONSOLE_JOB_STATES
    }
    # Then no plan reads all of items: job ids come from index ranges (reading the whole partial
    # index is reading the settled items only, which is what "succeeded" asks about)
    scans = {
        state: [line for line in scale.full_scans(lines) if "ix_items_settled_job" not in line]
        for state, lines in plans.items()
    }
    assert {k: v for k, v in scans.items() if v} == {}, plans
    assert "ix_items_settled_job" in "\n".join(plans["partial"] + plans["failed"] + plans["paused"])
    # And the filter confirms the derived state: exactly the 4 partial jobs
    found, nxt = console.find_jobs(engine, state="partial", limit=20)
    assert [st.state for st in found] == ["partial"] * 4 and nxt is None


def test_retry_and_discard_one_failure_group_or_one_item(http: TestClient, engine: Engine) -> None:
    # Given a job with two failure groups of the same lane (two reason classes) and a success
    job = _submit(http, ["album"])
    ids = _fail(
        engine,
        job,
        {
            "f00000.txt": "RuntimeError: boom at {path}",
            "f00001.txt": "RuntimeError: boom at {path}",
            "f00002.txt": "OSError: disk full",
        },
    )
    groups = {g["reason"]: g for g in http.get(f"/api/jobs/{job}").json()["failures"]}
    assert {g["count"] for g in groups.values()} == {2, 1}
    boom = next(r for r in groups if r.startswith("RuntimeError"))
    # When "show all" of the first group is asked for
    shown = http.get(f"/api/jobs/{job}/failures", params={"lane": "noop", "reason": boom}).json()
    # Then both its items come back
    assert shown["total"] == 2 and sorted(i["id"] for i in shown["items"]) == sorted(
        [ids["f00000.txt"], ids["f00001.txt"]]
    )
    # When only that group is retried
    r = http.post(f"/api/jobs/{job}/retry", params={"lane": "noop", "reason": boom})
    # Then its two items are pending again and the other group stays failed
    assert r.status_code == 200 and r.json()["changed"] == 2, r.text
    states = {i["id"]: i["state"] for i in http.get(f"/api/jobs/{job}/items").json()["items"]}
    assert states[ids["f00000.txt"]] == states[ids["f00001.txt"]] == "pending"
    assert states[ids["f00002.txt"]] == "failed"
    # When the other group is discarded
    disk = next(r for r in groups if r.startswith("OSError"))
    r = http.post(f"/api/jobs/{job}/discard", params={"lane": "noop", "reason": disk})
    assert r.status_code == 200 and r.json()["changed"] == 1, r.text
    # Then its item is skipped (error kept), and a retry of the whole job does not take it back
    item = next(i for i in http.get(f"/api/jobs/{job}/items").json()["items"] if i["id"] == ids["f00002.txt"])
    assert item["state"] == "skipped" and item["error"] == "OSError: disk full"
    assert http.post(f"/api/jobs/{job}/retry").status_code == 409
    assert http.post(f"/api/jobs/{job}/discard", params={"item": ids["f00002.txt"]}).status_code == 409
    # And one item can be retried alone
    _fail(engine, job, {"f00000.txt": "RuntimeError: boom at {path}", "f00003.txt": "RuntimeError: x"})
    r = http.post(f"/api/jobs/{job}/retry", params={"item": ids["f00000.txt"]})
    assert r.status_code == 200 and r.json()["changed"] == 1
    events = http.get("/api/events", params={"job": job}).json()["events"]
    assert {e["item"] for e in events if e["type"] == "item_retried"} == {
        ids["f00000.txt"],
        ids["f00001.txt"],
    }
    assert [e["item"] for e in events if e["type"] == "item_discarded"] == [ids["f00002.txt"]]


def test_job_times_and_lane_throughput(http: TestClient, engine: Engine) -> None:
    # Given a job whose items were claimed and finished (events in the log)
    job = _submit(http, ["album"])
    with Session(engine) as s, s.begin():
        emit(s, "item_claimed", job_id=job, lane="noop")
    _fail(engine, job, {"f00003.txt": "RuntimeError: x"})
    # When its page and the lanes are read
    st = http.get(f"/api/jobs/{job}").json()
    lanes = {entry["lane"]: entry for entry in http.get("/api/console/lanes").json()["lanes"]}
    # Then it has a start, a finish and durations, and the noop lane finished 4 items this hour
    times = st["times"]
    assert times["started_at"] is not None and times["finished_at"] is not None and times["took"] >= 0
    assert lanes["noop"]["finished_total"] == 4 and sum(lanes["noop"]["finished"]) == 4
    assert len(lanes["noop"]["finished"]) == 60 and lanes["noop"]["depth"]["pending"] == 0
    assert "paused" in lanes["noop"] and lanes["exif"]["finished_total"] == 0


@pytest.mark.parametrize(
    ("method", "url", "params"),
    [
        ("GET", "/api/jobs", {"state": "bogus"}),
        ("GET", "/api/jobs", {"q": "x" * 201}),
        ("GET", "/api/jobs", {"limit": 0}),
        ("GET", "/api/jobs/1/failures", {"lane": "noop"}),
        ("GET", "/api/jobs/1/failures", {"lane": "noop", "reason": "r", "state": "nope"}),
        ("GET", "/api/jobs/1/failures", {"lane": "noop", "reason": "r" * 301}),
        ("POST", "/api/jobs/1/retry", {"reason": "r"}),
        ("POST", "/api/jobs/1/retry", {"item": 0}),
        ("POST", "/api/jobs/1/retry", {"item": 2, "lane": "noop", "reason": "r"}),
        ("POST", "/api/jobs/1/discard", {"reason": "r"}),
        ("GET", "/api/console/lanes", {"window": 86400, "bucket": 10}),
        ("GET", "/api/console/lanes", {"bucket": 1}),
    ],
)
def test_bounded_parameters_are_400(http: TestClient, method: str, url: str, params: dict[str, Any]) -> None:
    # Given a job / When a request names an out-of-bounds or contradictory parameter
    _submit(http, ["album"])
    r = http.request(method, url, params=params)
    # Then it is a 400 (or 422 from the schema check) in the JSON error shape, never a 500
    assert r.status_code in (400, 422), r.text
    assert {"error", "message"} <= set(r.json())


def test_unknown_job_is_404(http: TestClient) -> None:
    # Given no job / When a group is asked for, retried or discarded / Then 404
    for method, url in (
        ("GET", "/api/jobs/9/failures?lane=noop&reason=r"),
        ("POST", "/api/jobs/9/retry?lane=noop&reason=r"),
        ("POST", "/api/jobs/9/discard?item=3"),
        ("POST", f"/api/jobs/{2**31 + 5}/discard"),
    ):
        assert http.request(method, url).status_code == 404, url


def test_a_search_is_bounded_in_time_and_in_number(
    http: TestClient, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a job over the folder "needle" and a 0.5 s bound on a search
    job = _submit(http, ["needle"])
    http.app.state.photojobs.client.settings.env["PHOTOJOBS_SEARCH_TIMEOUT"] = "0.5"
    # Then a photo-path search needs three characters, and finds the job with them
    assert [j["job"] for j in http.get("/api/jobs", params={"q": "nee"}).json()["jobs"]] == [job]
    assert http.get("/api/jobs", params={"q": "ne"}).json()["jobs"] == []
    # When a search's statement runs past the bound (a condition that takes seconds)
    slow = (
        text("pg_sleep(5) IS NOT NULL")
        if engine.dialect.name == "postgresql"
        else text(
            "(WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000000) "
            "SELECT count(*) FROM c) > 0"
        )
    )
    hint = console.search_hint
    monkeypatch.setattr(console, "search_hint", lambda query: or_(hint(query), slow))
    stopped = http.get("/api/jobs", params={"q": "zzz-nothing"})
    # Then it is stopped: 400 search_too_costly, and the store's connections are clean afterwards
    assert stopped.status_code == 400 and stopped.json()["error"] == "search_too_costly", stopped.text
    monkeypatch.setattr(console, "search_hint", hint)
    assert [j["job"] for j in http.get("/api/jobs", params={"q": "needle"}).json()["jobs"]] == [job]
    # When every search slot of the process is taken
    for _ in range(console.SEARCH_SLOTS):
        assert console._search_slots.acquire(timeout=5)
    try:
        busy = http.get("/api/jobs", params={"q": "needle"})
        plain = http.get("/api/jobs")
    finally:
        for _ in range(console.SEARCH_SLOTS):
            console._search_slots.release()
    # Then another search waits its bound and gets 429 with Retry-After; the plain list answers
    assert busy.status_code == 429 and busy.json()["error"] == "search_busy" and busy.headers["Retry-After"]
    assert plain.status_code == 200 and [j["job"] for j in plain.json()["jobs"]] == [job]


def test_a_search_matches_what_a_job_was_given_not_the_roots_the_server_added(
    engine: Engine, redis_url: str, tmp_path: Path
) -> None:
    # Given a server with two photo roots, "photos" and "elsewhere", and a job over each (the server
    # records both roots with every job it confines: job.allowed_roots)
    photos, elsewhere = tmp_path / "photos", tmp_path / "elsewhere"
    make_files(photos / "album", 2)
    make_files(elsewhere / "trip", 2)
    env = {
        "PHOTOJOBS_DATABASE_URL": str(engine.url),
        "PHOTOJOBS_REDIS_URL": redis_url,
        "PHOTOJOBS_DIAGNOSTICS": "1",  # the noop lane's parameters
    }
    client = Client(Settings.from_env(env), engine, migrate=False)
    app = create_app(client, token=TOKEN, photo_roots=[photos, elsewhere], env=env)
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        here = _submit(http, [str(photos / "album")])
        there = _submit(http, [str(elsewhere / "trip")], {"noop.fail_if": "zzz"})

        def found(q: str) -> list[int]:
            return [j["job"] for j in http.get("/api/jobs", params={"q": q}).json()["jobs"]]

        # When the operator searches for the second root's folder name, and for a parameter
        # Then only the job over it matches: the roots the server added are not what a job was given
        assert found("elsewhere") == [there]
        assert found("photos") == [here]
        assert found("noop.fail_if=zzz") == [there] and found("zzz") == [there]
        # and what the server added is still recorded with the job
        with Session(engine) as s:
            params = s.execute(text("SELECT params FROM jobs WHERE id = :j"), {"j": here}).scalar_one()
        assert "elsewhere" in str(params)
