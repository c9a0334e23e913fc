"""The HTTP API against a real ``photojobs serve`` process and real workers, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from store.events import read_events
from tests.support import Fleet, make_files, photojobs, wait_for
from tests.web_support import TOKEN, SseMessage, WebServer, sse_messages, wait_job


@pytest.fixture
def server(env: dict[str, str], tmp_path: Path, photos: Path) -> Iterator[WebServer]:
    logdir = tmp_path / "web-logs"
    logdir.mkdir()
    srv = WebServer(
        env,
        logdir,
        roots=[photos],
        extra={"PHOTOJOBS_LANE_EXIF_BACKLOG": "2", "PHOTOJOBS_API_MAX_BODY": "4096"},
    )
    srv.start()
    yield srv
    srv.stop()


def test_every_status_code_of_the_api(server: WebServer, fleet: Fleet, photos: Path) -> None:
    # Given a serve process with photo roots, a noop worker that fails one attempt and no retries
    fleet.start_worker(["noop"], env={"PHOTOJOBS_LANE_NOOP_MAX_ATTEMPTS": "1"})
    fleet.start_sweeper()
    make_files(photos / "good", 3)
    make_files(photos / "bad", 2, prefix="broken")
    (photos / "good" / ".hidden").write_bytes(b"not walked")
    http = server.client()
    # When a job is submitted
    created = http.post(
        "/api/jobs",
        json={
            "lanes": ["noop"],
            "paths": ["good", str(photos / "bad")],
            "params": {"noop.fail_if": "broken"},
        },
    )
    # Then it is 201 with the CLI's shape (what the folder scan left out, by reason), and the job ends
    # partial with failures grouped by reason class
    assert created.status_code == 201, created.text
    job = created.json()
    hidden = {"path": str(photos / "good" / ".hidden"), "reason": "hidden file"}
    assert job == {"job": job["job"], "items": 5, "skipped": {"hidden file": 1}, "left_out": [hidden]}
    st = wait_job(http, job["job"])
    assert st["state"] == "partial" and st["lanes"] == {"noop": {"succeeded": 3, "failed": 2}}
    assert st["skipped"] == {"hidden file": 1}  # recorded with the job, for the dashboard
    assert st["failures"][0]["reason"] == "RuntimeError: noop.fail_if matched <path>"
    assert st["failures"][0]["count"] == 2 and len(st["failures"][0]["examples"]) == 2
    # And listing jobs and items pages by cursor
    page = http.get("/api/jobs", params={"limit": 1}).json()
    assert [j["job"] for j in page["jobs"]] == [job["job"]] and page["next"] is None
    assert page["jobs"][0]["lanes"] == st["lanes"]
    failed = http.get(f"/api/jobs/{job['job']}/items", params={"state": "failed", "limit": 1}).json()
    assert len(failed["items"]) == 1 and failed["next"] == failed["items"][0]["id"]
    rest = http.get(
        f"/api/jobs/{job['job']}/items", params={"state": "failed", "after": failed["next"]}
    ).json()
    assert len(rest["items"]) == 1 and rest["next"] is None
    assert {i["path"].rsplit("/", 1)[1] for i in failed["items"] + rest["items"]} == {
        "broken00000.txt",
        "broken00001.txt",
    }
    # When the failed items are retried: 200, they run again (and fail again: fail_if still matches)
    retried = http.post(f"/api/jobs/{job['job']}/retry", params={"lane": "noop"})
    assert retried.status_code == 200 and retried.json()["changed"] == 2
    wait_for(
        lambda: (
            http.get(f"/api/jobs/{job['job']}").json()["lanes"]["noop"] == {"succeeded": 3, "failed": 2}
            and len(_events(http, job["job"], "item_failed")) == 4
        ),
        60,
        what="retried items to fail again",
    )
    # Then every other status code
    assert http.post(f"/api/jobs/{job['job']}/resume").status_code == 409  # finished, not paused
    assert http.post(f"/api/jobs/{job['job']}/pause").status_code == 409
    assert http.post(f"/api/jobs/{job['job']}/cancel").status_code == 409
    none_to_retry = httpx.post(
        f"{server.url}/api/jobs/{job['job']}/retry?lane=exif", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert none_to_retry.status_code == 409 and none_to_retry.json()["error"] == "not_applicable"
    for path in ("/api/jobs/999999", "/api/jobs/999999/items"):
        r = http.get(path)
        assert r.status_code == 404 and r.json()["error"] == "unknown_job", r.text
    assert http.post("/api/jobs/999999/pause").status_code == 404
    unknown_lane = http.post("/api/jobs", json={"lanes": ["resize"], "paths": ["good"]})
    bad_param = http.post(
        "/api/jobs", json={"lanes": ["exif"], "paths": ["good"], "params": {"exif.rating": 9}}
    )
    no_paths = http.post("/api/jobs", json={"lanes": ["noop"]})
    missing = http.post("/api/jobs", json={"lanes": ["noop"], "paths": ["nowhere"]})
    for r in (unknown_lane, bad_param, no_paths, missing):
        assert r.status_code == 400, r.text
        assert set(r.json()) == {"error", "message", "detail"}
    assert "unknown lane(s) resize" in unknown_lane.json()["message"]
    assert "exif.rating=9" in bad_param.json()["message"] and "0-5" in bad_param.json()["message"]
    assert "nowhere: no such file or folder" in missing.json()["message"]
    outside = http.post("/api/jobs", json={"lanes": ["noop"], "paths": ["/etc"]})
    assert outside.status_code == 403 and outside.json()["error"] == "outside_roots"
    for i in range(3):
        (photos / "jpegs").mkdir(exist_ok=True)
        (photos / "jpegs" / f"p{i}.jpg").write_bytes(b"not checked at submission")
    full = http.post("/api/jobs", json={"lanes": ["exif"], "paths": ["jpegs"]})  # exif backlog bound 2 < 3
    assert full.status_code == 429 and full.json()["error"] == "backlog_full"
    assert int(full.headers["Retry-After"]) > 0 and full.json()["detail"]["lane"] == "exif"
    big = http.post("/api/jobs", json={"lanes": ["noop"], "paths": ["x" * 5000]})
    assert big.status_code == 413 and big.json()["error"] == "body_too_large"
    assert httpx.get(f"{server.url}/api/jobs").status_code == 401
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    assert httpx.get(f"{server.url}/openapi.json").json()["paths"]["/api/jobs"]["post"]
    assert http.get("/no/such/page").json()["error"] == "not_found"
    assert http.get("/api/jobs", params={"state": "done"}).status_code == 400
    assert http.get("/api/jobs", params={"limit": 0}).status_code == 400
    assert http.get("/api/jobs", params={"state": "partial"}).json()["jobs"][0]["job"] == job["job"]
    assert http.get("/api/jobs", params={"state": "running"}).json() == {"jobs": [], "next": None}
    assert http.get(f"/api/jobs/{job['job']}/items", params={"state": "done"}).status_code == 400
    assert http.delete("/api/jobs").json()["error"] == "method_not_allowed"
    # And nothing was submitted by the refused requests
    assert [j["job"] for j in http.get("/api/jobs").json()["jobs"]] == [job["job"]]
    # And the metrics count the items by lane and state
    metrics = http.get("/metrics")
    assert metrics.status_code == 200
    assert 'photojobs_items{lane="noop",state="succeeded"} 3.0' in metrics.text
    assert 'photojobs_items{lane="noop",state="failed"} 2.0' in metrics.text
    assert "photojobs_lease_expiries_total" in metrics.text and "photojobs_queue_depth" in metrics.text


def _events(http: httpx.Client, job: int, type_: str | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after = 0
    while True:
        page = http.get("/api/events", params={"job": job, "after": after, "limit": 500}).json()
        out += page["events"]
        if not page["events"]:
            return [e for e in out if type_ is None or e["type"] == type_]
        after = page["next"]


def test_control_and_workers_while_a_job_runs(server: WebServer, fleet: Fleet, photos: Path) -> None:
    # Given a slow job with a worker holding items
    fleet.start_worker(["noop"], threads=2)
    fleet.start_sweeper()
    make_files(photos, 6)
    http = server.client()
    job = http.post(
        "/api/jobs", json={"lanes": "noop", "paths": [str(photos)], "params": {"noop.sleep": 2}}
    ).json()["job"]
    # When it runs, the workers view shows the worker with its lane, items and a fresh heartbeat
    # (idle workers are listed too: wait for one that holds an item)
    workers = wait_for(
        lambda: [w for w in http.get("/api/workers").json()["workers"] if w["held"]],
        60,
        what="a live worker holding an item",
    )
    assert workers[0]["lanes"] == ["noop"] and workers[0]["held"] >= 1 and workers[0]["pid"] > 0
    assert workers[0]["heartbeat_age"] is not None and workers[0]["heartbeat_age"] < 30
    assert workers[0]["state"] == "live" and workers[0]["registered"] is True
    # When it is paused, paused again, resumed and finished
    paused = http.post(f"/api/jobs/{job}/pause")
    assert paused.status_code == 200 and paused.json()["status"]["state"] in ("pausing", "paused")
    wait_job(http, job, {"paused"})
    assert http.post(f"/api/jobs/{job}/pause").status_code == 409
    assert http.post(f"/api/jobs/{job}/resume").status_code == 200
    st = wait_job(http, job)
    # Then it succeeds, and a cancelled-after-finish is refused
    assert st["state"] == "succeeded" and st["lanes"] == {"noop": {"succeeded": 6}}
    assert http.post(f"/api/jobs/{job}/cancel").status_code == 409


def _follow(
    url: str,
    headers: dict[str, str],
    seen: list[SseMessage],
    stop_after: int | None,
    until: int | None = None,
) -> None:
    """Read the stream into ``seen`` until ``stop_after`` more messages (then drop the connection),
    or until the message with cursor ``until``, or until the server goes away."""
    got = 0
    try:
        with httpx.stream("GET", url, headers=headers, timeout=httpx.Timeout(30, read=30)) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            for msg in sse_messages(r.iter_lines()):
                seen.append(msg)
                got += 1
                if stop_after is not None and got >= stop_after:
                    return
                if until is not None and msg.id is not None and int(msg.id) >= until:
                    return
    except (httpx.RemoteProtocolError, httpx.ReadError):
        return  # the server went away mid-stream


def test_sse_resumes_across_a_dropped_connection_and_a_server_restart(
    server: WebServer, fleet: Fleet, photos: Path, engine: Engine
) -> None:
    # Given a job of 40 items being worked on
    fleet.start_worker(["noop"], threads=4)
    fleet.start_sweeper()
    make_files(photos, 40)
    http = server.client()
    job = http.post(
        "/api/jobs", json={"lanes": ["noop"], "paths": [str(photos)], "params": {"noop.sleep": 0.1}}
    ).json()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    seen: list[SseMessage] = []
    # When a client follows the stream from the start and drops the connection after 30 events
    _follow(f"{server.url}/api/events/stream?after=0", auth, seen, stop_after=30)
    first = len(seen)
    # And resumes with Last-Event-ID, and the server is restarted while it reads
    resumed = {**auth, "Last-Event-ID": seen[-1].id or ""}
    import threading

    reader = threading.Thread(target=_follow, args=(f"{server.url}/api/events/stream", resumed, seen, 60))
    reader.start()
    wait_for(lambda: len(seen) >= first + 20 or not reader.is_alive(), 60, what="events after resuming")
    server.stop(signal.SIGKILL)
    reader.join(60)
    server.start()
    # And resumes again after the last event it saw, until the job has finished
    wait_job(http, job["job"])
    log = read_events(engine, after=0, limit=1_000_000)
    resumed = {**auth, "Last-Event-ID": seen[-1].id or ""}
    _follow(f"{server.url}/api/events/stream", resumed, seen, None, until=log[-1].cursor)
    # Then the union of what the client saw is exactly the event log, in order, with no duplicates
    assert [int(m.id or 0) for m in seen] == [e.cursor for e in log]
    assert [m.event for m in seen] == [e.type for e in log]
    assert [m.json() for m in seen] == [json.loads(json.dumps(e.as_dict())) for e in log]
    assert len(log) > 120  # 40 x (created, queued, claimed, succeeded) + the job's own


def test_sse_sends_keep_alive_comments_and_filters_by_job(server: WebServer, photos: Path) -> None:
    # Given two jobs (no workers: nothing moves after submission)
    make_files(photos / "a", 2)
    make_files(photos / "b", 2)
    http = server.client()
    a = http.post("/api/jobs", json={"lanes": ["noop"], "paths": ["a"]}).json()["job"]
    b = http.post("/api/jobs", json={"lanes": ["noop"], "paths": ["b"]}).json()["job"]
    comments: list[str] = []
    seen: list[SseMessage] = []
    # When a client follows job b's stream until it is idle long enough for keep-alives
    with httpx.stream(
        "GET",
        f"{server.url}/api/events/stream?job={b}&after=0",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    ) as r:
        for msg in sse_messages(_until_comments(r.iter_lines(), comments, 2), comments):
            seen.append(msg)
    # Then it saw only job b's events and keep-alive comments while idle
    assert seen and {m.json()["job"] for m in seen} == {b} and a != b
    assert [m.event for m in seen] == ["item_created", "item_created", "job_submitted"]
    assert sum(c.startswith(": keep-alive") for c in comments) >= 2
    # And a bad Last-Event-ID is a 400
    bad = http.get("/api/events/stream", headers={"Last-Event-ID": "abc"})
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_request"


def _until_comments(lines: Iterator[str], comments: list[str], n: int) -> Iterator[str]:
    for line in lines:
        yield line
        if sum(c.startswith(": keep-alive") for c in comments) >= n:
            return


def test_prune_through_the_api_and_cli_parity(
    server: WebServer, fleet: Fleet, photos: Path, env: dict[str, str]
) -> None:
    # Given two finished jobs
    fleet.start_worker(["noop"])
    fleet.start_sweeper()
    make_files(photos / "old", 3)
    make_files(photos / "new", 2)
    http = server.client()
    old = http.post("/api/jobs", json={"lanes": ["noop"], "paths": ["old"]}).json()["job"]
    wait_job(http, old)
    job = http.post("/api/jobs", json={"lanes": ["noop"], "paths": ["new"]}).json()["job"]
    wait_job(http, job)
    before = _events(http, job)
    # When `photojobs jobs --json` and `items` read the same store

    listed = json.loads(photojobs(env, "jobs", "--json").stdout)
    api_listed = http.get("/api/jobs").json()
    items = json.loads(photojobs(env, "items", str(job), "--json").stdout)
    # Then they match the API's shapes
    assert listed["jobs"][0]["job"] == job and listed["jobs"][0]["lanes"] == api_listed["jobs"][0]["lanes"]
    assert items == http.get(f"/api/jobs/{job}/items").json()
    # When events and jobs older than 0 s are pruned
    pruned = http.post("/api/prune", json={"older_than": 0})
    # Then the older job is gone, the newest job stays (so its id is never handed out again), every
    # event but the newest is gone, and cursors and ids continue after them
    assert pruned.status_code == 200 and pruned.json()["jobs"] == 1 and pruned.json()["items"] == 3
    assert http.get(f"/api/jobs/{old}").status_code == 404
    assert http.get(f"/api/jobs/{job}").json()["lanes"] == {"noop": {"succeeded": 2}}
    left = http.get("/api/events", params={"after": 0}).json()["events"]
    assert [e["cursor"] for e in left] == [before[-1]["cursor"]]
    make_files(photos / "more", 1)
    again = http.post("/api/jobs", json={"lanes": ["noop"], "paths": ["more"]}).json()["job"]
    assert again > job
    wait_job(http, again)
    later = _events(http, again)
    assert later[0]["cursor"] == before[-1]["cursor"] + 1
    assert http.post("/api/prune", json={"older_than": "soon"}).status_code == 400


def test_walking_a_large_folder_does_not_block_the_server(server: WebServer, photos: Path) -> None:
    # Given a folder of 20,000 files
    for i in range(20):
        make_files(photos / "big" / f"d{i:02d}", 1000, prefix=f"d{i:02d}_")
    import threading

    http = server.client()
    result: dict[str, Any] = {}

    def submit() -> None:
        # (a loaded machine may take more than the default 30 s to walk and store 20,000 files)
        with server.client(timeout=240) as client:
            result["response"] = client.post("/api/jobs", json={"lanes": ["noop"], "paths": ["big"]})

    # When it is submitted, and the server is asked for its health while the submission runs
    worker = threading.Thread(target=submit)
    worker.start()
    answered_meanwhile = 0
    while worker.is_alive():
        if http.get("/healthz").status_code == 200 and worker.is_alive():
            answered_meanwhile += 1
    worker.join()
    # Then other requests were answered during the walk and the job has every file
    assert result["response"].status_code == 201, result["response"].text
    assert result["response"].json()["items"] == 20_000
    assert answered_meanwhile > 0
