"""The console's API of issue 33 on SQLite and PostgreSQL (the app in-process, a real store): unknown
query parameters are a 400 everywhere; a lane's rate is measured over the time it was busy;
failures of an earlier lane fold the skips they caused; an item's attempts with their errors and
traceback; the event feed filtered by type and item; a bulk retry of exactly the jobs a filter
matches, refused when the match changed since the operator confirmed it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, insert, select
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.web import create_app
from store import console
from store import items as store_items
from store import jobs as store_jobs
from store.clock import db_now
from store.errors import bounded_trace
from store.fencing import fenced
from store.lanes import all_lanes
from store.leases import Lease
from store.models import Event, Item
from tests.support import make_files
from tests.web_support import TOKEN

SPECS = all_lanes({})


@pytest.fixture
def roots(tmp_path: Path) -> Path:
    root = tmp_path / "photos"
    make_files(root / "album", 3)
    return root


@pytest.fixture
def http(engine: Engine, redis_url: str, roots: Path) -> Iterator[TestClient]:
    env = {"PHOTOJOBS_DATABASE_URL": str(engine.url), "PHOTOJOBS_REDIS_URL": redis_url}
    client = Client(Settings.from_env(env), engine, migrate=False)
    app = create_app(client, token=TOKEN, photo_roots=[roots], env=env)
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c


def _submit(engine: Engine, tmp: Path, n: int, lanes: tuple[str, ...] = ("noop",), tag: str = "p") -> int:
    photos = [store_jobs.PhotoInput(str(tmp / f"{tag}{i}.jpg")) for i in range(n)]
    return store_jobs.submit(engine, [SPECS[lane] for lane in lanes], photos).job_id


def _run(
    engine: Engine, item: Item, error: str | None = None, *, retry: bool = False, trace: str | None = None
) -> None:
    """One attempt of ``item`` through the store's claim and finish: success, or ``error``."""
    spec = SPECS[item.lane]
    lease = store_items.claim(engine, spec, item.id, item.fencing_token, "host:1:w").lease
    assert lease is not None
    with fenced(engine, item.id, lease.token) as s:
        if error is None:
            store_items.succeed(s, lease, None, "host:1:w")
        else:
            store_items.fail(s, spec, lease, error, "host:1:w", retry=retry, trace=trace)


def _items(engine: Engine, job: int, lane: str | None = None) -> list[Item]:
    q = select(Item).where(Item.job_id == job).order_by(Item.id)
    if lane:
        q = q.where(Item.lane == lane)
    with Session(engine) as s:
        return list(s.execute(q).scalars())


@pytest.mark.parametrize(
    "url",
    [
        "/api/events?photo=345",
        "/api/jobs?stat=failed",
        "/api/jobs/1?verbose=1",
        "/api/workers?all=1",
        "/api/lanes?x=1",
        "/api/console/lanes?windows=60",
        "/api/bulk?state=failed&query=x",
        "/metrics?format=json",
    ],
)
def test_an_unknown_query_parameter_is_a_400_naming_it(http: TestClient, url: str) -> None:
    # Given the API / When a request names a parameter its endpoint does not have
    r = http.get(url)
    # Then it is refused with a 400 that names it and what the endpoint takes
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["error"] == "invalid_request"
    assert body["detail"]["unknown"] and body["detail"]["unknown"][0] in body["message"]


def test_a_lane_rate_is_over_its_busy_time_not_the_whole_window(engine: Engine, tmp_path: Path) -> None:
    # Given a noop lane that worked 10 minutes ago (a burst), was idle, and for the last 30 s has
    # finished 60 items (2 a second), still busy; and an exif lane with 4 items finished
    job = _submit(engine, tmp_path, 1)
    with Session(engine) as s, s.begin():
        now = s.execute(select(db_now())).scalar_one()
        rows = [
            {"type": "item_succeeded", "lane": "noop", "job_id": job, "at": now - 560 + i} for i in range(20)
        ]
        rows += [{"type": "item_claimed", "lane": "noop", "job_id": job, "at": now - 30.0}]
        rows += [
            {"type": "item_succeeded", "lane": "noop", "job_id": job, "at": now - 30 + 0.5 * i}
            for i in range(1, 61)
        ]
        rows += [
            {"type": "item_succeeded", "lane": "exif", "job_id": job, "at": now - 3 + i * 0.5}
            for i in range(4)
        ]
        s.execute(insert(Event), rows)
    # When the rates are measured
    rates = console.lane_rates(engine, ["noop", "exif", "rename"], busy_now=["noop"])
    # Then noop's is its 60 items over its 30 busy seconds, not 80 over 600
    with Session(engine) as s:
        later = s.execute(select(db_now())).scalar_one()
    assert rates["noop"].finished == 60 and abs(rates["noop"].since - (now - 30.0)) < 0.01
    assert 30.0 <= rates["noop"].busy <= later - (now - 30.0)  # since its claim, to now (still busy)
    assert rates["noop"].per_second == 60 / rates["noop"].busy and rates["noop"].stable
    # And too few items or too short a time is not stable yet (no ETA shown); an idle lane has none
    assert rates["exif"].finished == 4 and not rates["exif"].stable
    assert rates["rename"].finished == 0 and not rates["rename"].stable


def test_skips_fold_under_their_cause_and_an_item_lists_its_attempts(
    http: TestClient, engine: Engine, tmp_path: Path
) -> None:
    # Given a job of 3 photos through exif then rename (which needs exif: store.pipeline.NEEDS); each
    # photo's exif attempt fails once with an unexpected exception (a retry) and then for good, so
    # rename skips all three
    job = _submit(engine, tmp_path, 3, ("exif", "rename"))
    try:
        raise RuntimeError("decoder exploded at offset 12")
    except RuntimeError as exc:
        trace = bounded_trace(exc)
    for item in _items(engine, job, "exif"):
        _run(engine, item, f"RuntimeError: decoder exploded at offset {item.id}", retry=True, trace=trace)
        again = next(i for i in _items(engine, job, "exif") if i.id == item.id)
        with Session(engine) as s, s.begin():
            s.get(Item, item.id).not_before = 0.0  # type: ignore[union-attr]
        _run(engine, again, f"RuntimeError: decoder exploded at offset {item.id}", retry=False, trace=trace)
    # When the job is read
    st = http.get(f"/api/jobs/{job}").json()
    # Then there is one group: the exif failure, with its 3 rename skips folded under it
    assert [(g["lane"], g["state"], g["count"]) for g in st["failures"]] == [("exif", "failed", 3)]
    assert st["failures"][0]["cascade"] == {"rename": 3} and st["failures"][0]["cascade_total"] == 3
    # When one failed item's page is read
    item = st["failures"][0]["examples"][0]["item"]
    page = http.get(f"/api/jobs/{job}/items/{item}").json()
    # Then it lists both attempts: the first retried, the second failed, each with its error and
    # the bounded traceback of the unexpected exception
    assert [a["outcome"] for a in page["attempts"]] == ["retry_scheduled", "failed"]
    assert all("decoder exploded" in a["error"] for a in page["attempts"])
    assert all(a["traceback"].startswith("Traceback") for a in page["attempts"])
    assert all(a["ran"] is not None and a["worker"] == "host:1:w" for a in page["attempts"])
    assert page["item"]["state"] == "failed" and {e["type"] for e in page["events"]} >= {"item_claimed"}
    # And another job's item, or none, is a 404
    assert http.get(f"/api/jobs/{job}/items/999999").status_code == 404
    # And the feed filters by type and by item
    failed = http.get("/api/events", params={"type": "item_failed", "tail": 50}).json()["events"]
    assert len(failed) == 3 and {e["type"] for e in failed} == {"item_failed"}
    mine = http.get("/api/events", params={"item": item, "tail": 50}).json()["events"]
    assert mine and {e["item"] for e in mine} == {item}
    assert http.get("/api/events", params={"type": "Bad Type"}).status_code == 400


def test_a_bounded_traceback_keeps_the_innermost_frames_and_no_more_than_its_bound() -> None:
    # Given an exception deep in a recursion whose message quotes a megabyte of what it read
    def deep(n: int) -> None:
        if n == 0:
            raise ValueError("bad bytes: " + "\xff" * 1_000_000)
        deep(n - 1)

    try:
        deep(200)
    except ValueError as exc:
        text = bounded_trace(exc)
    # Then it keeps the innermost 30 frames, ends with the exception's type and a cut message, and
    # has the raise line
    assert len(text) <= 4000 and text.count('  File "') == 30
    assert text.splitlines()[-1].startswith("ValueError: bad bytes: ") and len(text.splitlines()[-1]) < 400
    assert 'raise ValueError("bad bytes: "' in text
    # And with every frame kept it is still at most 4,000 characters, its innermost end
    import store.errors

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(store.errors, "TRACE_FRAMES", 10_000)
        try:
            deep(200)
        except ValueError as exc:
            whole = bounded_trace(exc)
    assert len(whole) == 4000 and whole.startswith("…") and whole.endswith(text.splitlines()[-1])


def _partial(engine: Engine, tmp: Path, tag: str) -> int:
    """A job of two noop items: one succeeded, one failed for good (partial)."""
    job = _submit(engine, tmp, 2, tag=tag)
    first, second = _items(engine, job)
    _run(engine, first)
    _run(engine, second, "RuntimeError: nope", retry=False)
    return job


def test_a_bulk_retry_acts_on_exactly_the_jobs_the_filter_matched(
    http: TestClient, engine: Engine, tmp_path: Path
) -> None:
    # Given three partial jobs, two of them over "album" photos, and a succeeded one
    a = _partial(engine, tmp_path / "album", "a")
    b = _partial(engine, tmp_path / "album", "b")
    other = _partial(engine, tmp_path / "elsewhere", "c")
    done = _submit(engine, tmp_path / "album", 1, tag="d")
    _run(engine, _items(engine, done)[0])
    # When the operator previews a bulk action over partial jobs searched by "album"
    preview = http.get("/api/bulk", params={"state": "partial", "q": "album"}).json()
    # Then it names the two
    assert preview["count"] == 2 and sorted(preview["jobs"]) == sorted([a, b])
    # When the confirmation is sent with a stale count
    stale = http.post("/api/bulk", json={"action": "retry", "state": "partial", "q": "album", "expected": 3})
    # Then it is refused and nothing changed
    assert stale.status_code == 409 and stale.json()["detail"]["matched"] == 2
    assert all(i.state != "pending" for j in (a, b) for i in _items(engine, j))
    # When it is sent with the count shown
    r = http.post("/api/bulk", json={"action": "retry", "state": "partial", "q": "album", "expected": 2})
    # Then both jobs' failed items are back to work, and only theirs
    assert r.status_code == 200 and r.json() == {
        "action": "retry",
        "matched": 2,
        "jobs": 2,
        "items": 2,
        "skipped": 0,
    }
    assert [i.state for j in (a, b) for i in _items(engine, j)] == ["succeeded", "pending"] * 2
    assert [i.state for i in _items(engine, other)] == ["succeeded", "failed"]
    assert [i.state for i in _items(engine, done)] == ["succeeded"]
    # And a bad action or filter is a 4xx
    assert http.post("/api/bulk", json={"action": "explode", "expected": 0}).status_code in (400, 422)
    assert http.get("/api/bulk", params={"state": "bogus"}).status_code == 400


def test_workers_name_what_each_thread_runs_count_per_lane_and_fade_out(
    http: TestClient, engine: Engine, tmp_path: Path
) -> None:
    from sqlalchemy import update

    from store import workers as store_workers
    from store.models import Worker

    # Given a worker of 2 threads holding 3 noop items (a batch): thread A runs one for 4 s, B idle
    job = _submit(engine, tmp_path, 3)
    held = _items(engine, job)
    for item in held:
        assert store_items.claim(engine, SPECS["noop"], item.id, 0, "host:7:n").lease is not None
    store_workers.beat(
        engine,
        "host:7:n",
        lanes=["noop", "exif"],
        interval=0.5,
        held=3,
        threads=2,
        running=[{"thread": "Thread-1", "item": held[1].id, "age": 4.0}],
    )
    # And a worker stopped 10 minutes ago, and one stopped just now
    for wid in ("old:1:a", "new:2:b"):
        store_workers.beat(engine, wid, lanes=["noop"], interval=0.5, held=0, threads=1, running=[])
        store_workers.mark_stopped(engine, wid)
    with Session(engine) as s, s.begin():
        s.execute(update(Worker).where(Worker.id == "old:1:a").values(stopped_at=db_now() - 600))
    # When the workers and the lanes are read
    workers = {w["id"]: w for w in http.get("/api/workers").json()["workers"]}
    lanes = {entry["lane"]: entry for entry in http.get("/api/console/lanes").json()["lanes"]}
    # Then the busy thread is named with its job, item, lane, photo and since (its beat minus its age)
    w = workers["host:7:n"]
    assert w["threads"] == 2 and w["held"] == 3 and w["held_by_lane"] == {"noop": 3}
    [run] = w["running"]
    assert (run["thread"], run["job"], run["item"], run["lane"]) == ("Thread-1", job, held[1].id, "noop")
    assert run["photo"] == held[1].photo_id and run["path"].endswith("p1.jpg")
    assert abs(run["since"] - (w["last_heartbeat"] - 4.0)) < 0.01
    # And the lanes count per lane: noop holds 3 with 1 running now; exif, served too, holds none
    noop = next(x for x in lanes["noop"]["workers"] if x["id"] == "host:7:n")
    exif = next(x for x in lanes["exif"]["workers"] if x["id"] == "host:7:n")
    assert (noop["held"], noop["running"], exif["held"], exif["running"]) == (3, 1, 0, 0)
    assert lanes["noop"]["running_now"] == 1 and lanes["exif"]["running_now"] == 0
    # And the worker stopped 10 minutes ago has faded out; the one stopped just now is listed
    assert "old:1:a" not in workers and workers["new:2:b"]["state"] == "stopped"
    # When the thread's item finishes (through the fence, as its worker would) before the next beat
    with Session(engine) as s:
        token = s.get(Item, held[1].id).fencing_token  # type: ignore[union-attr]
    done = Lease(held[1].id, token, job, "noop", 0, held[1].photo_id, (), 1, None, {}, [], None)
    with fenced(engine, held[1].id, token) as s:
        store_items.succeed(s, done, None, "host:7:n")
    # Then the thread is shown on another item the worker holds (its next one), not as idle
    [run] = http.get("/api/workers").json()["workers"][0]["running"]
    assert run["thread"] == "Thread-1" and run["item"] in {held[0].id, held[2].id}
