"""``create_app()`` mounted inside another FastAPI app (as the README shows), on both stores."""

from __future__ import annotations

import warnings
from pathlib import Path

from fastapi import FastAPI
from sqlalchemy import Engine

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.web import create_app
from tests.support import make_files

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient


def test_mounted_app_serves_api_dashboard_and_scoped_cookie(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    # Given the user's app with photojobs mounted at /jobs
    make_files(tmp_path / "photos", 2)
    client = Client(Settings.from_env({"PHOTOJOBS_DATABASE_URL": db_url}), engine)
    host = FastAPI()

    @host.get("/")
    def home() -> dict[str, str]:
        return {"app": "theirs"}

    host.mount("/jobs", create_app(client, token="tok", photo_roots=[tmp_path / "photos"], env={}))
    http = TestClient(host)
    # When the dashboard is loaded, a session opened and a job submitted through the mount
    page = http.get("/jobs/")
    login = http.post("/jobs/api/session", json={"token": "tok"})
    submitted = http.post(
        "/jobs/api/jobs", json={"lanes": ["noop"], "paths": ["."]}, headers={"Origin": "http://testserver"}
    )
    # Then the host app is untouched, the dashboard and its script load, the cookie is scoped to /jobs
    assert http.get("/").json() == {"app": "theirs"}
    assert page.status_code == 200 and "static/app.js" in page.text
    assert http.get("/jobs/static/app.js").status_code == 200
    assert login.status_code == 204 and "Path=/jobs/" in login.headers["set-cookie"]
    assert submitted.status_code == 201 and submitted.json()["items"] == 2
    assert http.get("/jobs/api/jobs").json()["jobs"][0]["job"] == submitted.json()["job"]
    assert http.get("/jobs/openapi.json").status_code == 200


def test_create_app_needs_a_token_unless_insecure(engine: Engine, db_url: str) -> None:
    client = Client(Settings.from_env({"PHOTOJOBS_DATABASE_URL": db_url}), engine)
    try:
        create_app(client, env={})
    except ValueError as exc:
        assert "PHOTOJOBS_API_TOKEN" in str(exc)
    else:  # pragma: no cover - the assertion is the point
        raise AssertionError("create_app without a token must refuse")
    # (an app without a token answers a loopback Host only)
    open_app = TestClient(create_app(client, insecure=True, env={}), base_url="http://127.0.0.1")
    assert open_app.get("/api/jobs").json() == {"jobs": [], "next": None}
