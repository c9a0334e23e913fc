"""The boundary, round two (issue 29), against a real ``photojobs serve`` (and real workers where
they are the point): exiftool's format codes, proxies' headers, strings that are not text,
connections that never finish, names that are not UTF-8, paths in errors, the CLI's terminal."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from photojobs.testing.samples import generate_samples
from photos.exif import read_metadata
from photos.history import FOLDER as HISTORY  # kept originals (issue 31), not photos
from store.engine import normalise_url
from tests.support import ROOT, Fleet, photojobs, wait_for
from tests.web_support import TOKEN, wait_job

ERROR_KEYS = {"error", "message", "detail"}




def _photo(folder: Path, name: str, seed: int = 1) -> Path:
    """A real JPEG named ``name`` (str or the file system's bytes) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (made,) = generate_samples(folder / ".gen", 1, seed=seed, size=(64, 48))
    target = os.path.join(os.fsencode(folder), name if isinstance(name, bytes) else os.fsencode(name))
    os.rename(made, target)
    (folder / ".gen").rmdir()
    return Path(os.fsdecode(target))


def _files(folder: Path) -> set[str]:
    """The files under ``folder``, less the originals kept for undo (``HISTORY``, issue 31)."""
    return (
        {
            str(p.relative_to(folder))
            for p in folder.rglob("*")
            if not p.is_dir() and HISTORY not in p.relative_to(folder).parts
        }
        if folder.exists()
        else set()
    )


def _is_error(r: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, (r.request.method, r.request.url, r.status_code, r.text)
    body = r.json()
    assert ERROR_KEYS <= set(body), body
    if code is not None:
        assert body["error"] == code, body
    return body


# -- exiftool's format codes ---------------------------------------------------------------------------
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_format_codes_in_patterns_and_names_write_nothing_outside_the_roots(
    serve: Any, fleet: Fleet, photos: Path, tmp_path: Path
) -> None:
    # Given photos whose folders and names hold exiftool's format codes, and a server with workers
    weird = [
        _photo(photos / "%:9d.." / "%:9d.." / "escaped", "b.jpg", 2),
        _photo(photos, "a%d.jpg", 3),
        _photo(photos / "100%f", "c%e%c.jpg", 4),
    ]
    outside_before = _files(tmp_path) - {f"photos/{p}" for p in _files(photos)}
    srv = serve()
    http = srv.client()
    fleet.start_sweeper()
    fleet.start_worker(["exif", "rename"])
    # When a rename pattern with '%' codes is submitted
    attack = http.post(
        "/api/jobs",
        json={
            "lanes": ["rename"],
            "paths": ["a%d.jpg"],
            "params": {"rename.pattern": "%:9d../%:9d../escaped/{stem}{ext}"},
        },
    )
    # Then it is refused, saying where '%' may appear
    assert "'%' is allowed only in {taken:" in _is_error(attack, 400, "invalid_submission")["message"]
    # When an exif job edits every photo
    job = http.post(
        "/api/jobs",
        json={"lanes": ["exif"], "paths": [str(photos)], "params": {"exif.description": "edited"}},
    )
    assert job.status_code == 201, job.text
    st = wait_job(http, job.json()["job"])
    # Then each photo, '%' names included, was edited in place
    assert st["state"] == "succeeded", http.get(f"/api/jobs/{st['job']}/items").json()
    assert {str(p): read_metadata(p)["description"] for p in weird} == {str(p): "edited" for p in weird}
    # And nothing else exists in the root (no '.a/tmp/pj-pin-…' copy, no staged leftover) nor anywhere
    # outside it under the test's folder or the workers' working directory
    assert _files(photos) == {str(p.relative_to(photos)) for p in weird}
    outside_after = _files(tmp_path) - {f"photos/{p}" for p in _files(photos)}
    new_outside = {
        p for p in outside_after - outside_before if not p.endswith(".log") and "photojobs.db" not in p
    }
    assert new_outside == set(), new_outside
    assert not any((place / "escaped").exists() for place in (ROOT, ROOT.parent, Path("/"), tmp_path))


# -- proxies' headers and a proxy's credentials -----------------------------------------------------------
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_forwarded_headers_count_only_from_trusted_proxies_and_basic_beside_a_cookie_is_accepted(
    serve: Any,
) -> None:
    # Given a server that names no trusted proxy, and a browser logged in behind a proxy's basic auth
    srv = serve()
    login = httpx.post(f"{srv.url}/api/session", json={"token": TOKEN})
    assert login.status_code == 204
    cookie = {"photojobs_session": login.cookies["photojobs_session"]}
    basic = {"Authorization": "Basic dXNlcjpwYXNz"}
    # When the browser's requests carry the proxy's Basic credentials beside the session cookie
    with_basic = [httpx.get(f"{srv.url}/api/jobs", headers=basic, cookies=cookie) for _ in range(12)]
    # Then they are accepted, and none counts as a wrong token
    assert [r.status_code for r in with_basic] == [200] * 12
    # When 15 wrong tokens arrive, each with a fresh X-Forwarded-For
    guesses = [
        httpx.post(
            f"{srv.url}/api/session",
            json={"token": f"guess-{i}"},
            headers={"X-Forwarded-For": f"203.0.113.{i}"},
        )
        for i in range(15)
    ]
    # Then the header is ignored: the peer is one client, refused after ten
    assert [r.status_code for r in guesses] == [401] * 10 + [429] * 5
    _is_error(guesses[-1], 429, "too_many_attempts")
    # And the logged-in browser behind the proxy still works (its Basic header is not a guess)
    assert httpx.get(f"{srv.url}/api/jobs", headers=basic, cookies=cookie).status_code == 200
    # Given a server that trusts the local proxy
    trusting = serve(PHOTOJOBS_TRUSTED_PROXIES="127.0.0.1")
    # When 15 clients behind it guess once each, and one client guesses 11 times
    spread = [
        httpx.post(
            f"{trusting.url}/api/session", json={"token": "x"}, headers={"X-Forwarded-For": f"198.51.100.{i}"}
        )
        for i in range(15)
    ]
    one = [
        httpx.post(
            f"{trusting.url}/api/session", json={"token": "x"}, headers={"X-Forwarded-For": "192.0.2.7"}
        )
        for _ in range(11)
    ]
    # Then each client is counted on its own: the 15 are 401, the eleventh guess of the one is 429
    assert [r.status_code for r in spread] == [401] * 15
    assert [r.status_code for r in one] == [401] * 10 + [429]


# -- strings that are not text, numbers that are not finite -------------------------------------------------
def test_text_that_is_not_text_is_400_and_stored_bad_strings_are_shown_escaped(
    serve: Any, photos: Path, db_url: str, env: dict[str, str]
) -> None:
    # Given a server with one job (a photo whose name holds a newline and ESC) and a few events
    (photos / "album").mkdir()
    (photos / "album" / "evil\n  9 noop succeeded attempt 1  forged.jpg\x1b[2J.jpg").write_bytes(b"x")
    srv = serve()
    http = srv.client()
    created = http.post("/api/jobs", json={"lanes": ["noop"], "paths": ["album"]})
    assert created.status_code == 201, created.text
    job = created.json()["job"]
    events_before = http.get("/api/events").json()["events"]
    # When requests carry a lone surrogate (in params, nested keywords, a key, the search), a control
    # character, or a number that is not finite
    bad = {
        "surrogate_param": http.post(
            "/api/jobs",
            content=b'{"lanes":["exif"],"paths":["album"],"params":{"exif.description":"\\ud800"}}',
            headers={"Content-Type": "application/json"},
        ),
        "surrogate_keyword": http.post(
            "/api/jobs",
            content=b'{"lanes":["exif"],"paths":["album"],"params":{"exif.keywords":["a","\\udc80"]}}',
            headers={"Content-Type": "application/json"},
        ),
        "escape_in_path": http.post("/api/jobs", json={"lanes": ["noop"], "paths": ["album\x1b[2J"]}),
        "control_in_search": http.get("/api/jobs", params={"q": "a\nb"}),
        "nan_prune": http.post(
            "/api/prune", content=b'{"older_than": NaN}', headers={"Content-Type": "application/json"}
        ),
        "infinite_prune": http.post(
            "/api/prune", content=b'{"older_than": 1e999}', headers={"Content-Type": "application/json"}
        ),
    }
    # Then each is a 400 in the JSON error shape, nothing was submitted and no event was pruned
    for name, r in bad.items():
        body = _is_error(r, 400, "invalid_request")
        assert body["detail"]["where"], (name, body)
    assert [j["job"] for j in http.get("/api/jobs").json()["jobs"]] == [job]
    assert http.get("/api/events").json()["events"][: len(events_before)] == events_before
    # Given bad strings written into the store directly (by an older version, or another program)
    engine = create_engine(normalise_url(db_url))
    params = '{"exif.description": "x\\ud800y", "k\\udcff": ["\\udfff"]}'
    with engine.begin() as conn:
        conn.execute(text("UPDATE jobs SET params = :p WHERE id = :j"), {"p": params, "j": job})
        conn.execute(
            text("UPDATE items SET state = 'failed', error = :e WHERE job_id = :j"),
            {"e": "boom\n     7 noop      succeeded attempt 1  /forged.jpg\x1b[31m", "j": job},
        )
    engine.dispose()
    # When the job is listed, filtered, searched and shown
    pages = {
        "list": http.get("/api/jobs"),
        "filter": http.get("/api/jobs", params={"state": "failed"}),
        "search": http.get("/api/jobs", params={"q": "noop"}),
        "job": http.get(f"/api/jobs/{job}"),
        "items": http.get(f"/api/jobs/{job}/items"),
    }
    # Then every answer is 200 and shows the bad strings escaped
    assert {k: r.status_code for k, r in pages.items()} == {k: 200 for k in pages}, {
        k: r.text for k, r in pages.items()
    }
    shown = pages["job"].json()["params"]
    assert shown["exif.description"] == "x\\ud800y" and shown["k\\xff"] == ["\\udfff"]
    # And the CLI prints the forged newline and the ESC escaped: one line per item, no ESC byte
    cli = {
        cmd: photojobs(env, *args)
        for cmd, args in {
            "status": ("status", str(job)),
            "items": ("items", str(job)),
            "jobs": ("jobs",),
        }.items()
    }
    for cmd, done in cli.items():
        assert done.returncode == 0, (cmd, done.stderr)
        assert "\x1b" not in done.stdout and "\udcff" not in done.stdout, (cmd, done.stdout)
    item_lines = [line for line in cli["items"].stdout.splitlines() if line.strip()]
    assert len(item_lines) == 1 and "\\n  9 noop succeeded" in item_lines[0] and "boom\\n" in item_lines[0], (
        item_lines
    )
    assert not any(
        line.lstrip().startswith(("7 noop", "9 noop")) for line in cli["status"].stdout.splitlines()
    )
    assert "\\x1b[2J" in cli["status"].stdout and "\\x1b[31m" in cli["items"].stdout


# -- connections that never finish -----------------------------------------------------------------------
def _half_open(port: int, n: int, data: bytes) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(data)
        s.setblocking(False)
        socks.append(s)
    return socks


def _closed_by_server(s: socket.socket) -> bool:
    try:
        return s.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_half_open_connections_are_closed_within_the_header_timeout_while_healthz_answers(serve: Any) -> None:
    # Given a server whose requests must send their headers within 2 s and their body chunks 2 s apart
    srv = serve(PHOTOJOBS_HTTP_HEADER_TIMEOUT="2", PHOTOJOBS_HTTP_BODY_TIMEOUT="2")
    # When 200 connections send half a request header, one a body that stops, and one drips a byte
    # every 0.2 s (it never finishes its headers)
    started = time.monotonic()
    socks = _half_open(srv.port, 200, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    (body,) = _half_open(
        srv.port, 1, b'POST /api/session HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{"tok'
    )
    drip = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    dripped = threading.Event()

    def dribble() -> None:
        try:
            drip.sendall(b"GET /healthz HTTP/1.1\r\n")
            while not dripped.wait(0.2):
                drip.sendall(b"X")
        except OSError:
            pass  # closed by the server

    threading.Thread(target=dribble, daemon=True).start()
    # Then /healthz keeps answering meanwhile
    health = [httpx.get(f"{srv.url}/healthz", timeout=10).status_code for _ in range(5)]
    assert health == [200] * 5
    # And every one of them is closed by the server, the dripping one too
    drip.setblocking(False)
    everyone = [*socks, body, drip]
    wait_for(
        lambda: all(_closed_by_server(s) for s in everyone),
        30,
        interval=0.2,
        what="the half-open connections closed",
    )
    took = time.monotonic() - started
    dripped.set()
    for s in everyone:
        s.close()
    assert took >= 2, f"closed after {took:.1f} s, before the 2 s header timeout"
    # Given a server capped at 20 connections (and a long header timeout)
    capped = serve(PHOTOJOBS_HTTP_MAX_CONNECTIONS="20", PHOTOJOBS_HTTP_HEADER_TIMEOUT="120")
    # When 60 connections are opened and held
    held = _half_open(capped.port, 60, b"GET /healthz HTTP/1.1\r\n")
    # Then those past the cap are closed at once, the first 20 are kept
    wait_for(lambda: sum(_closed_by_server(s) for s in held) >= 40, 30, interval=0.2, what="40 closed")
    assert sum(not _closed_by_server(s) for s in held[:20]) == 20
    # And once they go, /healthz answers; the refusals were logged in a line or two, not one each
    for s in held:
        s.close()
    wait_for(
        lambda: httpx.get(f"{capped.url}/healthz", timeout=5).status_code == 200, 30, what="healthz again"
    )
    assert 1 <= capped.logs().count("connections open") <= 3, capped.logs()


# -- names that are not UTF-8 -------------------------------------------------------------------------------
def test_a_name_that_is_not_utf8_is_left_out_and_no_submission_stays_submitting(
    serve: Any, photos: Path, env: dict[str, str]
) -> None:
    # Given a folder with a photo named with a byte that is not UTF-8, a good one, and such a sub-folder
    album = photos / "album"
    _photo(album, b"bad\xffname.jpg")
    _photo(album, "good.jpg")
    _photo(Path(os.fsdecode(os.path.join(os.fsencode(album), b"sub\xfe"))), "in.jpg")
    srv = serve()
    http = srv.client()
    # When the folder is submitted over HTTP and with the CLI
    api = http.post("/api/jobs", json={"lanes": ["noop"], "paths": ["album"]})
    cli = photojobs(env, "submit", "--lanes", "noop", str(album))
    # Then each is one job over the good photo, the others left out with their reason
    assert api.status_code == 201, api.text
    assert api.json()["items"] == 1
    assert api.json()["skipped"] == {"folder name is not UTF-8": 1, "name is not UTF-8": 1}
    assert cli.returncode == 0, cli.stderr
    assert "left out: 1 folder name is not UTF-8, 1 name is not UTF-8" in cli.stderr
    # When the file itself is named on the command line
    direct = photojobs(
        env, "submit", "--lanes", "noop", os.fsdecode(os.path.join(os.fsencode(album), b"bad\xffname.jpg"))
    )
    # Then it is a usage error naming it (the byte escaped), and no job is created
    assert direct.returncode == 64 and "bad\\xffname.jpg" in direct.stderr and "not UTF-8" in direct.stderr, (
        direct.stderr
    )
    listed = http.get("/api/jobs").json()["jobs"]
    assert len(listed) == 2
    # And no job is left submitting
    assert http.get("/api/jobs", params={"state": "submitting"}).json()["jobs"] == []
    assert not any(j["state"] == "submitting" for j in listed)


# -- errors describe, never reveal -------------------------------------------------------------------------
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_errors_name_no_path_outside_the_roots(
    serve: Any, fleet: Fleet, photos: Path, tmp_path: Path
) -> None:
    # Given inside the root a folder symlinked to a secret place outside it, and photos
    secret = tmp_path / "secret" / "deep" / "inside"
    secret.mkdir(parents=True)
    (photos / "link").symlink_to(secret)
    _photo(photos / "album", "x.jpg")
    _photo(secret, "hidden.jpg")
    srv = serve()
    http = srv.client()
    fleet.start_sweeper()
    fleet.start_worker(["rename"])
    # When a rename would move a photo through the symlink, and a submission names a file behind it
    job = http.post(
        "/api/jobs",
        json={"lanes": ["rename"], "paths": [str(photos)], "params": {"rename.pattern": "link/{stem}{ext}"}},
    )
    assert job.status_code == 201, job.text
    st = wait_job(http, job.json()["job"])
    refused = http.post("/api/jobs", json={"lanes": ["rename"], "paths": ["link/hidden.jpg"]})
    # Then the item fails and the submission is refused, each saying what is wrong
    (item,) = http.get(f"/api/jobs/{st['job']}/items").json()["items"]
    assert item["state"] == "failed" and "outside the root" in item["error"], item
    _is_error(refused, 403, "outside_roots")
    # And no answer, event or error says where the symlink leads
    answers = [
        refused.text,
        http.get(f"/api/jobs/{st['job']}").text,
        http.get(f"/api/jobs/{st['job']}/items").text,
        http.get("/api/events", params={"job": st["job"]}).text,
        json.dumps(http.get("/api/jobs").json()),
    ]
    leaks = [a for a in answers if str(tmp_path / "secret") in a or "/secret/" in a]
    assert leaks == [], leaks
    # And the photo is where it was
    assert (photos / "album" / "x.jpg").is_file() and not any(secret.glob("x*"))
