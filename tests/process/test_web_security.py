"""Security of ``photojobs serve``: tokens, session cookies and Origin, photo roots, body size.

Each refused request must leave the store untouched (nothing submitted)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import ROOT, make_files
from tests.web_support import TOKEN, WebServer


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    inside = tmp_path / "photos"
    outside = tmp_path / "private"
    make_files(inside / "album", 2)
    make_files(outside, 2, prefix="secret")
    return inside, outside


@pytest.fixture
def server(env: dict[str, str], tmp_path: Path, roots: tuple[Path, Path]) -> Iterator[WebServer]:
    logdir = tmp_path / "web-logs"
    logdir.mkdir()
    srv = WebServer(env, logdir, roots=[roots[0]], extra={"PHOTOJOBS_API_MAX_BODY": "2048"})
    srv.start()
    yield srv
    srv.stop()


def jobs_in_store(server: WebServer) -> list[int]:
    with server.client() as http:
        return [j["job"] for j in http.get("/api/jobs").json()["jobs"]]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_missing_or_wrong_token_is_refused(server: WebServer) -> None:
    # Given a server with a token
    body = {"lanes": ["noop"], "paths": ["album"]}
    # When requests come without a token, with a wrong one, or another scheme
    attempts = [
        httpx.post(f"{server.url}/api/jobs", json=body),
        httpx.post(f"{server.url}/api/jobs", json=body, headers={"Authorization": "Bearer wrong"}),
        httpx.post(f"{server.url}/api/jobs", json=body, headers={"Authorization": f"Basic {TOKEN}"}),
        httpx.post(f"{server.url}/api/jobs", json=body, headers={"Authorization": f"Bearer {TOKEN}x"}),
        httpx.get(f"{server.url}/api/jobs"),
        httpx.get(f"{server.url}/metrics"),
        httpx.get(f"{server.url}/api/events/stream"),
        httpx.post(f"{server.url}/api/session", json={"token": "wrong"}),
        httpx.post(f"{server.url}/api/prune", json={"older_than": 0}),
    ]
    # Then each is a JSON 401 and nothing was submitted
    for r in attempts:
        assert r.status_code == 401, (r.request.url, r.text)
        assert r.json()["error"] == "unauthorized"
    assert attempts[0].headers["WWW-Authenticate"] == "Bearer"
    assert "set-cookie" not in attempts[7].headers
    assert jobs_in_store(server) == []
    # And the dashboard page itself is public but may not be framed or load foreign scripts
    page = httpx.get(f"{server.url}/")
    assert page.status_code == 200 and page.headers["X-Frame-Options"] == "DENY"
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_session_cookie_needs_a_matching_origin_for_changes(server: WebServer) -> None:
    # Given a browser session from POST /api/session
    browser = httpx.Client(base_url=server.url, timeout=30)
    login = browser.post("/api/session", json={"token": TOKEN})
    assert login.status_code == 204
    cookie = login.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    body = {"lanes": ["noop"], "paths": ["album"]}
    # When it reads, and when it changes something without an Origin, from another origin, or from its own
    read = browser.get("/api/jobs")
    no_origin = browser.post("/api/jobs", json=body)
    evil = browser.post("/api/jobs", json=body, headers={"Origin": "https://evil.example"})
    null = browser.post("/api/jobs", json=body, headers={"Origin": "null"})
    evil_login = httpx.post(
        f"{server.url}/api/session", json={"token": TOKEN}, headers={"Origin": "https://evil.example"}
    )
    # Then reads pass, cross-origin changes are 403 and nothing is submitted
    assert read.status_code == 200
    for r in (no_origin, evil, null, evil_login):
        assert r.status_code == 403 and r.json()["error"] == "bad_origin", r.text
    assert jobs_in_store(server) == []
    # And its own origin may submit; a forged or expired-looking cookie is 401
    own = browser.post("/api/jobs", json=body, headers={"Origin": server.url})
    assert own.status_code == 201, own.text
    forged = httpx.get(f"{server.url}/api/jobs", cookies={"photojobs_session": "9999999999.abc.def"})
    assert forged.status_code == 401
    # And logging out forgets the cookie
    browser.delete("/api/session")
    assert browser.get("/api/jobs").status_code == 401


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_paths_escaping_the_roots_are_refused(server: WebServer, roots: tuple[Path, Path]) -> None:
    # Given a photo root with a folder symlink and a file symlink pointing outside it
    inside, outside = roots
    (inside / "escape").symlink_to(outside, target_is_directory=True)
    (inside / "album" / "sneaky.txt").symlink_to(outside / "secret00000.txt")
    http = server.client()
    # When paths with .., absolute paths elsewhere and the symlinks are submitted
    tries = {
        "dotdot": ["../private"],
        "dotdot_inside": ["album/../../private"],
        "absolute": [str(outside)],
        "absolute_file": [str(outside / "secret00000.txt")],
        "root_prefix": [str(inside) + "-other"],
        "folder_symlink": ["escape"],
        "file_symlink_in_folder": ["album"],
        "file_symlink": ["album/sneaky.txt"],
        "one_bad_of_two": [str(inside / "album" / "f00000.txt"), "/etc/passwd"],
    }
    results = {k: http.post("/api/jobs", json={"lanes": ["noop"], "paths": v}) for k, v in tries.items()}
    # Then each is a 403 naming the path, and nothing was submitted
    for name, r in results.items():
        assert r.status_code == 403, (name, r.text)
        assert r.json()["error"] == "outside_roots"
    assert "'..' is not allowed" in results["dotdot"].json()["message"]
    assert "symlink" in results["folder_symlink"].json()["message"]
    assert "sneaky.txt" in results["file_symlink_in_folder"].json()["message"]
    assert jobs_in_store(server) == []
    # And a path inside the roots is accepted, relative or absolute
    (inside / "album" / "sneaky.txt").unlink()
    ok = http.post("/api/jobs", json={"lanes": ["noop"], "paths": ["album", str(inside / "album")]})
    assert ok.status_code == 201, ok.text


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_oversized_bodies_are_refused(server: WebServer) -> None:
    # Given a body limit of 2048 bytes
    http = server.client()
    big = {"lanes": ["noop"], "paths": ["album"] * 400}

    def chunks() -> Iterator[bytes]:
        yield b'{"lanes": ["noop"], "paths": ['
        for _ in range(400):
            yield b'"album",'
        yield b'"album"]}'

    # When a body over it is sent with a Content-Length, and chunked without one
    declared = http.post("/api/jobs", json=big)
    chunked = http.post("/api/jobs", content=chunks(), headers={"Content-Type": "application/json"})
    # Then both are 413 with a JSON error, and nothing was submitted
    for r in (declared, chunked):
        assert r.status_code == 413, r.text
        assert r.json()["error"] == "body_too_large"
    assert jobs_in_store(server) == []


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_serve_refuses_to_start_without_a_token_unless_loopback_and_insecure_local(
    env: dict[str, str], tmp_path: Path
) -> None:
    # Given no PHOTOJOBS_API_TOKEN
    bare = {k: v for k, v in env.items() if k != "PHOTOJOBS_API_TOKEN"}

    def serve(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "photojobs", "serve", *args],
            cwd=ROOT,
            env=bare,
            capture_output=True,
            text=True,
            timeout=60,
        )

    # When serve is started without a token, or with --insecure-local on a public address
    plain = serve("--port", "1")
    public = serve("--insecure-local", "--host", "0.0.0.0", "--port", "1")
    # Then it refuses with status 64 and says why
    assert plain.returncode == 64 and "PHOTOJOBS_API_TOKEN" in plain.stderr
    assert public.returncode == 64 and "loopback" in public.stderr
    # And with --insecure-local on loopback it serves without a token
    logdir = tmp_path / "open-logs"
    logdir.mkdir()
    srv = WebServer(bare, logdir, roots=[tmp_path])
    srv.env.pop("PHOTOJOBS_API_TOKEN")
    srv.start("--insecure-local")
    try:
        assert httpx.get(f"{srv.url}/api/jobs").status_code == 200
    finally:
        srv.stop()
    assert os.environ.get("PHOTOJOBS_API_TOKEN") != TOKEN
