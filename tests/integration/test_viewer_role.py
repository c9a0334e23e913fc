"""Issue 41: a read-only role. ``PHOTOJOBS_VIEWER_TOKEN`` reads everything — every GET of the API,
the console's page, the event stream, the metrics — and every state change is a 403 ``read_only``
naming why, decided in one place (``auth.authenticate``). The routes are taken from the app itself,
so a route added later is covered without touching this test. A real uvicorn server in a thread,
real HTTP, both stores."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.web import create_app
from store import jobs as store_jobs
from store.lanes import all_lanes
from store.models import Event, Item, Job
from tests.web_support import TOKEN, uvicorn_in_thread

VIEWER = "viewer-token-9876543210"
SAFE = {"GET", "HEAD", "OPTIONS"}
PATH_VALUES = {"lane": "noop"}  # every other path parameter is an id: the job's own
SPECS = all_lanes({})


def _path(path: str, job: int) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: PATH_VALUES.get(m.group(1), str(job)), path)


def _operations(app: FastAPI) -> list[tuple[str, str, list[str]]]:
    """(METHOD, path, tags) of every operation of the app's OpenAPI schema."""
    return [
        (method.upper(), path, op.get("tags", []))
        for path, ops in app.openapi()["paths"].items()
        for method, op in ops.items()
    ]


def _changes(app: FastAPI) -> list[tuple[str, str]]:
    """Every (method, path) of the app that may change state: not GET/HEAD/OPTIONS, and not the
    login/logout of ``/api/session`` (a viewer logs in and out)."""
    return [(m, p) for m, p, tags in _operations(app) if m not in SAFE and "auth" not in tags]


def _reads(app: FastAPI) -> list[str]:
    return [p for m, p, _ in _operations(app) if m == "GET"]


def _snapshot(engine: Engine) -> tuple[Any, ...]:
    """What any state change would touch: jobs and their controls, items' states, events."""
    with Session(engine) as s:
        jobs = tuple(s.execute(select(Job.id, Job.control).order_by(Job.id)).all())
        states = tuple(s.execute(select(Item.id, Item.state).order_by(Item.id)).all())
        events = s.execute(select(func.count()).select_from(Event)).scalar_one()
    return jobs, states, events


@pytest.fixture
def served(engine: Engine, redis_url: str, tmp_path: Path) -> Iterator[tuple[FastAPI, str, int]]:
    """The app with an operator and a viewer token on a real uvicorn server, and a job of 3 items."""
    env = {"PHOTOJOBS_DATABASE_URL": str(engine.url), "PHOTOJOBS_REDIS_URL": redis_url}
    client = Client(Settings.from_env(env), engine, migrate=False)
    app = create_app(client, token=TOKEN, viewer_token=VIEWER, photo_roots=[tmp_path], env=env)
    photos = [store_jobs.PhotoInput(str(tmp_path / f"v{i}.jpg")) for i in range(3)]
    job = store_jobs.submit(engine, [SPECS["noop"]], photos).job_id
    with uvicorn_in_thread(app) as url:
        yield app, url, job


@contextmanager
def _viewer_cookie(url: str) -> Iterator[httpx.Client]:
    """A client logged in (``POST /api/session``) with the viewer token, sending the app's Origin."""
    with httpx.Client(base_url=url, timeout=30, headers={"Origin": url}) as http:
        r = http.post("/api/session", json={"token": VIEWER})
        assert r.status_code == 204, r.text
        yield http


def test_every_state_changing_route_is_refused_to_the_viewer_with_403_and_nothing_changes(
    engine: Engine, served: tuple[FastAPI, str, int]
) -> None:
    """Given a server with an operator token and a viewer token, and a job with work to do
    When the viewer sends every state-changing route the app has (taken from its routes), by bearer
    token and by a session cookie got with the viewer token
    Then each is a 403 ``read_only`` naming the method and the operator's token, and the store is
    unchanged; the operator's token still pauses the job (the routes do work)."""
    app, url, job = served
    changes = _changes(app)
    paths = set(changes)
    assert {("POST", "/api/jobs"), ("POST", "/api/jobs/{job_id}/pause"), ("POST", "/api/bulk")} <= paths
    assert {("POST", "/api/lanes/{lane}/pause"), ("POST", "/api/prune"), ("POST", "/api/sync")} <= paths
    before = _snapshot(engine)
    bearer = httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {VIEWER}"})
    with bearer, _viewer_cookie(url) as cookie:
        for http in (bearer, cookie):
            for method, path in changes:
                r = http.request(method, _path(path, job), json={})
                assert r.status_code == 403, (method, path, r.status_code, r.text)
                body = r.json()
                assert body["error"] == "read_only", (method, path, body)
                assert "read-only" in body["message"] and "PHOTOJOBS_API_TOKEN" in body["message"]
                assert f"{method} " in body["message"]
    assert _snapshot(engine) == before
    operator = httpx.post(f"{url}/api/jobs/{job}/pause", headers={"Authorization": f"Bearer {TOKEN}"})
    assert operator.status_code == 200, operator.text
    assert _snapshot(engine) != before


def test_every_read_answers_the_viewer_the_stream_included(served: tuple[FastAPI, str, int]) -> None:
    """Given the same server
    When the viewer GETs every readable route of the app (taken from its routes), the console's page,
    and opens the event stream
    Then none is refused (no 401/403, no 5xx), the job reads as it is, ``/api/session`` says
    ``role: viewer``, the page is served and the stream is open (200, text/event-stream)."""
    app, url, job = served
    reads = _reads(app)
    assert len(reads) >= 10
    headers = {"Authorization": f"Bearer {VIEWER}"}
    with httpx.Client(base_url=url, timeout=30, headers=headers) as http:
        for path in reads:
            if path == "/api/events/stream":
                continue
            r = http.get(_path(path, job))
            assert r.status_code not in (401, 403), (path, r.status_code, r.text)
            assert r.status_code < 500, (path, r.status_code, r.text)
        assert http.get(f"/api/jobs/{job}").json()["job"] == job
        assert http.get("/api/session").json() == {"authenticated": True, "via": "bearer", "role": "viewer"}
        assert http.get("/").status_code == 200
        with http.stream("GET", "/api/events/stream", params={"job": job}) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
    with _viewer_cookie(url) as cookie:
        assert cookie.get("/api/session").json()["role"] == "viewer"
        assert cookie.get(f"/api/jobs/{job}/items").status_code == 200
    operator = httpx.get(f"{url}/api/session", headers={"Authorization": f"Bearer {TOKEN}"})
    assert operator.json()["role"] == "operator"


def test_a_viewer_token_needs_an_operator_token_and_must_differ_from_it(engine: Engine) -> None:
    """Given a viewer token with no API token, or equal to it
    When the app is created
    Then it is refused, saying which setting is wrong."""
    client = Client(Settings.from_env({"PHOTOJOBS_DATABASE_URL": str(engine.url)}), engine, migrate=False)
    with pytest.raises(ValueError, match="PHOTOJOBS_VIEWER_TOKEN needs PHOTOJOBS_API_TOKEN"):
        create_app(client, viewer_token=VIEWER, insecure=True, env={})
    with pytest.raises(ValueError, match="must differ from PHOTOJOBS_API_TOKEN"):
        create_app(client, token=TOKEN, viewer_token=TOKEN, env={})
