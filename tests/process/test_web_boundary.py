"""The HTTP boundary of ``photojobs serve``: the loopback guard of a server without a token, server-side
sessions and their end, slowed wrong tokens, bounded numbers and paths, outages as 503, /healthz.

Every test talks to a real ``photojobs serve`` process over TCP."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from photojobs.api import Client
from photojobs.config import Settings
from store.engine import normalise_url
from store.sessions import session_key
from tests.support import free_port, make_files, wait_for
from tests.web_support import TOKEN, SseMessage, TcpProxy, WebServer, sse_messages

ERROR_KEYS = {"error", "message", "detail"}


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    root = tmp_path / "photos"
    make_files(root / "album", 2)
    return root


def _server(env: dict[str, str], tmp_path: Path, photos: Path, name: str, **extra: str) -> WebServer:
    logdir = tmp_path / f"logs-{name}"
    logdir.mkdir()
    return WebServer(env, logdir, roots=[photos], extra=extra)


@pytest.fixture
def server(env: dict[str, str], tmp_path: Path, photos: Path) -> Iterator[WebServer]:
    srv = _server(env, tmp_path, photos, "main").start()
    yield srv
    srv.stop()


def _is_error(r: httpx.Response, status: int | set[int], code: str | None = None) -> None:
    statuses = {status} if isinstance(status, int) else status
    assert r.status_code in statuses, (r.request.method, r.request.url, r.status_code, r.text)
    body = r.json()
    assert ERROR_KEYS <= set(body), body
    if code is not None:
        assert body["error"] == code, body


# -- 1. a server without a token: loopback Host and Origin only --------------------------------------
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_insecure_local_refuses_a_foreign_host_and_a_cross_origin_page(
    env: dict[str, str], tmp_path: Path, photos: Path
) -> None:
    # Given `serve --insecure-local` (no token) with a job it runs
    srv = _server(env, tmp_path, photos, "open")
    srv.env.pop("PHOTOJOBS_API_TOKEN")
    srv.start("--insecure-local")
    try:
        http = httpx.Client(base_url=srv.url, timeout=30)
        own = f"http://127.0.0.1:{srv.port}"
        job = http.post("/api/jobs", json={"lanes": ["noop"], "paths": ["album"]}, headers={"Origin": own})
        assert job.status_code == 201, job.text
        job_id = job.json()["job"]
        other_port = free_port()
        # When requests name a foreign Host (DNS rebinding), another local port, or come from a page of
        # another site or of another local port
        refused = {
            "rebound_host": http.get("/api/jobs", headers={"Host": f"evil.example:{srv.port}"}),
            "rebound_post": http.post(
                f"/api/jobs/{job_id}/cancel", headers={"Host": f"evil.example:{srv.port}"}
            ),
            "other_port_host": http.get("/api/jobs", headers={"Host": f"127.0.0.1:{other_port}"}),
            "no_port_host": http.get("/api/jobs", headers={"Host": "localhost"}),
            "dashboard_rebound": http.get("/", headers={"Host": f"attacker.test:{srv.port}"}),
            "cross_site_post": http.post(
                "/api/jobs",
                json={"lanes": ["noop"], "paths": ["album"]},
                headers={"Origin": "https://evil.example"},
            ),
            "other_port_cancel": http.post(
                f"/api/jobs/{job_id}/cancel", headers={"Origin": f"http://127.0.0.1:{other_port}"}
            ),
            "other_port_read": http.get("/api/jobs", headers={"Origin": f"http://localhost:{other_port}"}),
            "null_origin": http.post(f"/api/jobs/{job_id}/pause", headers={"Origin": "null"}),
        }
        # Then each is a JSON 403 and the job is neither cancelled nor paused, nor a second one submitted
        for name, r in refused.items():
            assert r.status_code == 403, (name, r.text)
            assert r.json()["error"] in {"bad_host", "bad_origin"}, (name, r.text)
        jobs = http.get("/api/jobs").json()["jobs"]
        assert [j["job"] for j in jobs] == [job_id]
        assert jobs[0]["state"] not in ("cancelled", "paused"), jobs[0]
        types = {e["type"] for e in http.get("/api/events").json()["events"]}
        assert not [t for t in types if "cancel" in t or "pause" in t], types
        # And the loopback names of this server, from its own pages, pass
        for host in (f"localhost:{srv.port}", f"127.0.0.2:{srv.port}", f"[::1]:{srv.port}"):
            assert http.get("/api/jobs", headers={"Host": host}).status_code == 200, host
        same = http.get("/api/jobs", headers={"Origin": f"http://localhost:{srv.port}"})
        assert same.status_code == 200
    finally:
        srv.stop()


# -- 2. sessions end ---------------------------------------------------------------------------------
def _login(url: str) -> str:
    r = httpx.post(f"{url}/api/session", json={"token": TOKEN})
    assert r.status_code == 204, r.text
    return r.cookies["photojobs_session"]


def _with_cookie(url: str, cookie: str) -> int:
    return httpx.get(f"{url}/api/jobs", cookies={"photojobs_session": cookie}).status_code


def test_logout_revokes_the_session_everywhere_and_sessions_survive_a_restart(
    env: dict[str, str], tmp_path: Path, photos: Path, db_url: str
) -> None:
    # Given two server processes on one store and a session from the first
    one = _server(env, tmp_path, photos, "one").start()
    two = _server(env, tmp_path, photos, "two").start()
    try:
        cookie = _login(one.url)
        # When the first restarts
        one.stop()
        one.start()
        # Then the session works on both
        assert _with_cookie(one.url, cookie) == 200
        assert _with_cookie(two.url, cookie) == 200
        # When the browser logs out on the second
        out = httpx.delete(f"{two.url}/api/session", cookies={"photojobs_session": cookie})
        assert out.status_code == 204
        # Then a replayed copy of the cookie is refused by both (the session is revoked in the store)
        assert _with_cookie(one.url, cookie) == 401
        assert _with_cookie(two.url, cookie) == 401
        # And the store never held the cookie itself
        eng = create_engine(normalise_url(db_url))
        try:
            with eng.connect() as conn:
                ids = [r[0] for r in conn.execute(text("SELECT id FROM web_sessions"))]
        finally:
            eng.dispose()
        assert cookie not in ids
    finally:
        one.stop()
        two.stop()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_sessions_end_after_their_idle_time_and_at_their_absolute_expiry(
    server: WebServer, engine: Any
) -> None:
    # Given two live sessions
    idle, old = _login(server.url), _login(server.url)
    assert _with_cookie(server.url, idle) == 200 and _with_cookie(server.url, old) == 200
    # When one has not been used for longer than the default idle time (31 min > 30 min) and the other
    # has passed its absolute expiry (the rows say so; the clock is the database's)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE web_sessions SET last_seen = last_seen - 31 * 60 WHERE id = :k"),
            {"k": session_key(idle)},
        )
        conn.execute(
            text("UPDATE web_sessions SET expires_at = last_seen - 1 WHERE id = :k"), {"k": session_key(old)}
        )
    # Then both are refused
    assert _with_cookie(server.url, idle) == 401
    assert _with_cookie(server.url, old) == 401
    # And a new login works
    assert _with_cookie(server.url, _login(server.url)) == 200


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_many_wrong_tokens_are_slowed_with_429_and_retry_after(
    server: WebServer, env: dict[str, str], tmp_path: Path, photos: Path
) -> None:
    # Given a server with the default limit (10 wrong tokens per address per minute)
    # When 200 wrong logins arrive at once
    with httpx.Client(base_url=server.url, timeout=30) as http:
        results = [http.post("/api/session", json={"token": f"guess-{i}"}) for i in range(200)]
    # Then the first ten are 401 and the rest 429 with a Retry-After, none setting a cookie
    codes = [r.status_code for r in results]
    assert codes[:10] == [401] * 10 and set(codes[10:]) == {429}, codes
    for r in results[10:]:
        _is_error(r, 429, "too_many_attempts")
        assert 1 <= int(r.headers["Retry-After"]) <= 60
    assert not any("set-cookie" in r.headers for r in results)
    # And wrong bearer tokens are refused the same way, as is the right token (no oracle for a guess)
    wrong_bearer = httpx.get(f"{server.url}/api/jobs", headers={"Authorization": "Bearer guess"})
    _is_error(wrong_bearer, 429, "too_many_attempts")
    right = httpx.post(f"{server.url}/api/session", json={"token": TOKEN})
    _is_error(right, 429, "too_many_attempts")
    # Given a server counting wrong tokens over 5 s, refusing after its tenth
    short = _server(env, tmp_path, photos, "short", PHOTOJOBS_LOGIN_WINDOW="5").start()
    try:
        for i in range(10):
            httpx.post(f"{short.url}/api/session", json={"token": f"guess-{i}"})
        refused = httpx.post(f"{short.url}/api/session", json={"token": TOKEN})
        _is_error(refused, 429, "too_many_attempts")
        # When Retry-After has passed, Then the right token logs in
        wait_for(
            lambda: httpx.post(f"{short.url}/api/session", json={"token": TOKEN}).status_code == 204,
            30,
            interval=0.25,
            what="the login limit to let the right token in",
        )
    finally:
        short.stop()


# -- 3. never a 500 ------------------------------------------------------------------------------------
def test_out_of_range_numbers_are_400_or_404_not_500(server: WebServer, photos: Path) -> None:
    # Given a server with one job
    http = server.client()
    job = http.post("/api/jobs", json={"lanes": ["noop"], "paths": ["album"]})
    assert job.status_code == 201, job.text
    big, huge, past = 2**63, 2**31, 2**32  # past: above every job cursor (a job id, or 2**31 + one)
    # When ids, cursors and filters are out of range (past 64 bits, past the 32-bit ids, negative)
    bad = [
        http.get(f"/api/jobs?after={big}"),
        http.get("/api/jobs?after=-1"),
        http.get(f"/api/jobs/{big}"),
        http.get("/api/jobs/-5"),
        http.get(f"/api/jobs/{big}/items"),
        http.get(f"/api/jobs/{job.json()['job']}/items?after={big}"),
        http.post(f"/api/jobs/{big}/cancel"),
        http.post(f"/api/jobs/{big}/retry"),
        http.get(f"/api/events?after={big}"),
        http.get(f"/api/events?job={big}"),
        http.get("/api/events?after=-1"),
        http.get(f"/api/events/stream?after={big}"),
        http.get("/api/events/stream", headers={"Last-Event-ID": str(big)}),
        http.get("/api/events/stream", headers={"Last-Event-ID": "-3"}),
    ]
    # Then each is a JSON 400 (or 404 for a job id)
    for r in bad:
        _is_error(r, {400, 404})
    # And ids past the store's 32-bit ids are unknown jobs, empty pages or the first page
    _is_error(http.get(f"/api/jobs/{huge}"), 404, "unknown_job")
    _is_error(http.post(f"/api/jobs/{huge}/pause"), 404, "unknown_job")
    assert http.get(f"/api/jobs?after={past}").json()["jobs"][0]["job"] == job.json()["job"]
    assert http.get(f"/api/events?job={huge}").json()["events"] == []
    items = http.get(f"/api/jobs/{job.json()['job']}/items?after={huge}")
    assert items.status_code == 200 and items.json() == {"items": [], "next": None}


def _stream_after_cursor_of_2_pow_62(server: WebServer) -> list[str]:
    lines: list[str] = []
    with httpx.stream(
        "GET",
        f"{server.url}/api/events/stream",
        headers={"Authorization": f"Bearer {TOKEN}", "Last-Event-ID": str(2**62)},
        timeout=30,
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            lines.append(line)
            if line == ": keep-alive":
                break
    return lines


def test_a_large_valid_last_event_id_keeps_the_stream_open(server: WebServer) -> None:
    # Given a cursor in range but beyond every event
    # When a stream resumes from it
    lines = _stream_after_cursor_of_2_pow_62(server)
    # Then the stream opens and idles (keep-alive), it does not abort
    assert lines[0].startswith("retry:") and ": keep-alive" in lines


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_over_long_paths_are_400_and_repeated_paths_count_once(server: WebServer) -> None:
    # Given a server (1 MiB bodies)
    http = server.client()
    # When paths are over-long, have an over-long component, or a NUL
    tries = {
        "long_path": ["a/" * 2500],
        "long_component": ["x" * 5000],
        "component_256": ["album/" + "y" * 256],
        "nul": ["album\x00/x"],
        "empty": [""],
    }
    results = {k: http.post("/api/jobs", json={"lanes": ["noop"], "paths": v}) for k, v in tries.items()}
    # Then each is a JSON 400 naming the problem, and nothing was submitted
    for name, r in results.items():
        assert r.status_code == 400, (name, r.text)
        _is_error(r, 400, "invalid_request")
    assert "4096" in results["long_path"].json()["message"]
    assert "at most 255" in results["component_256"].json()["message"]
    assert http.get("/api/jobs").json()["jobs"] == []
    # When one folder is named 20,000 times
    many = http.post("/api/jobs", json={"lanes": ["noop"], "paths": ["album"] * 20_000})
    # Then it is one job over the folder's two files
    assert many.status_code == 201, many.text
    assert many.json()["items"] == 2


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # over the network (SQLite: a file)
def test_the_database_out_of_reach_is_503_and_the_stream_misses_nothing(
    env: dict[str, str], tmp_path: Path, photos: Path, db_url: str
) -> None:
    # Given a server that reaches PostgreSQL through a proxy, a job, and an SSE stream reading its events
    url = make_url(normalise_url(db_url))
    proxy = TcpProxy((url.host or "127.0.0.1", url.port or 5432)).restore()
    via_proxy = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    srv = _server({**env, "PHOTOJOBS_DATABASE_URL": via_proxy}, tmp_path, photos, "outage")
    srv.start()
    direct = Client(Settings.from_env(env))
    received: list[SseMessage] = []
    comments: list[str] = []
    stop = threading.Event()

    def read_stream() -> None:
        try:
            auth = {"Authorization": f"Bearer {TOKEN}"}
            with httpx.stream("GET", f"{srv.url}/api/events/stream", headers=auth, timeout=60) as r:
                for m in sse_messages(r.iter_lines(), comments):
                    received.append(m)
                    if stop.is_set():
                        return
        except httpx.HTTPError:
            if not stop.is_set():  # the server stopping at the end of the test ends the stream
                raise

    try:
        http = srv.client()
        first = http.post("/api/jobs", json={"lanes": ["noop"], "paths": ["album"]}).json()["job"]
        reader = threading.Thread(target=read_stream, daemon=True)
        reader.start()
        wait_for(lambda: any(m.json()["job"] == first for m in received), 30, what="the first job's events")
        # When the database goes out of reach
        proxy.cut()
        # Then every endpoint answers a JSON 503 with Retry-After (no 500), /healthz says which part is down
        outage = [
            http.get("/api/jobs"),
            http.get(f"/api/jobs/{first}"),
            http.get("/api/events"),
            http.get("/api/workers"),
            http.post(f"/api/jobs/{first}/cancel"),
            http.post("/api/jobs", json={"lanes": ["noop"], "paths": ["album"]}),
            httpx.post(f"{srv.url}/api/session", json={"token": TOKEN}),
        ]
        for r in outage:
            _is_error(r, 503, "store_unavailable")
            assert int(r.headers["Retry-After"]) > 0
        health = httpx.get(f"{srv.url}/healthz")
        assert health.status_code == 503
        assert health.json()["ok"] is False and health.json()["database"] != "ok"
        assert health.json()["redis"] == "ok"
        # And the stream stays open, saying so
        wait_for(lambda: any("store unavailable" in c for c in comments), 30, what="an outage comment")
        # When a job is submitted meanwhile (directly to the database) and the database comes back
        second = direct.submit(["noop"], [str(photos / "album")]).job_id
        proxy.restore()
        # Then the stream delivers every event, the second job's included, once each and in order
        def all_streamed() -> bool:
            listed = [e["cursor"] for e in http.get("/api/events", params={"limit": 10000}).json()["events"]]
            return any(m.json()["job"] == second for m in received) and len(received) >= len(listed)

        wait_for(all_streamed, 60, what="every event, the second job's included, on the stream")
        listed = [e["cursor"] for e in http.get("/api/events", params={"limit": 10000}).json()["events"]]
        streamed = [int(m.id or 0) for m in received]
        assert streamed == listed, (listed, streamed)
        assert http.get("/healthz").status_code == 200
    finally:
        stop.set()
        proxy.cut()
        srv.stop()
        direct.engine.dispose()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_healthz_reports_each_part_and_submissions_survive_redis_down(
    env: dict[str, str], tmp_path: Path, photos: Path, server: WebServer
) -> None:
    # Given a server with Redis up, and one whose Redis is not reachable
    up = httpx.get(f"{server.url}/healthz")
    dead_redis = f"redis://127.0.0.1:{free_port()}/0"
    down = _server({**env, "PHOTOJOBS_REDIS_URL": dead_redis}, tmp_path, photos, "noredis").start()
    try:
        # When /healthz is asked
        report = httpx.get(f"{down.url}/healthz")
        # Then the healthy one says ok for each part, the other 503 naming Redis
        assert up.status_code == 200
        assert up.json() == {"ok": True, "database": "ok", "redis": "ok", "workers": 0}
        assert report.status_code == 503, report.text
        body = report.json()
        assert body["ok"] is False and body["database"] == "ok" and body["redis"] != "ok"
        assert "redis" in body["message"] and ERROR_KEYS <= set(body)
        # And a submission still succeeds while Redis is down: the job is durable in the store
        job = down.client().post("/api/jobs", json={"lanes": ["noop"], "paths": ["album"]})
        assert job.status_code == 201, job.text
        assert server.client().get(f"/api/jobs/{job.json()['job']}").json()["state"] in ("pending", "running")
    finally:
        down.stop()


# -- 4. no CDN scripts ---------------------------------------------------------------------------------
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_docs_pages_are_off_and_the_schema_is_public(server: WebServer) -> None:
    # When the interactive docs, the schema and the dashboard's script are asked for
    docs, redoc = httpx.get(f"{server.url}/docs"), httpx.get(f"{server.url}/redoc")
    schema = httpx.get(f"{server.url}/openapi.json")
    # Then the pages (which load scripts from a CDN) are 404 JSON errors and the schema is served
    _is_error(docs, 404)
    _is_error(redoc, 404)
    assert "cdn" not in docs.text.lower()
    assert schema.status_code == 200 and "/api/jobs" in schema.json()["paths"]
    # And what the dashboard loads carries the dashboard's CSP
    script = httpx.get(f"{server.url}/static/app.js")
    assert script.status_code == 200
    assert script.headers["Content-Security-Policy"].startswith("default-src 'self'")
    assert script.headers["X-Content-Type-Options"] == "nosniff"
