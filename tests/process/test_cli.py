"""The ``photojobs`` command as scripts and the web app call it (real processes, both stores)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT, make_files

EVENT_KEYS = {"cursor", "job", "item", "photo", "lane", "type", "attempt", "token", "worker", "at", "detail"}


def photojobs(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "photojobs", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_submit_status_events_and_control_speak_json(env: dict[str, str], tmp_path: Path) -> None:
    # Given three files
    make_files(tmp_path / "photos", 3)
    # When a job is submitted, inspected, paused, resumed and cancelled through the CLI
    submitted = photojobs(
        env, "submit", "--lanes", "noop", "--param", "noop.sleep=1", "--json", str(tmp_path / "photos")
    )
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(submitted.stdout)
    status = json.loads(photojobs(env, "status", str(job["job"]), "--json").stdout)
    paused = photojobs(env, "pause", str(job["job"]))
    resumed = photojobs(env, "resume", str(job["job"]))
    cancelled = photojobs(env, "cancel", str(job["job"]))
    final = json.loads(photojobs(env, "status", str(job["job"]), "--json").stdout)
    lines = photojobs(env, "events", "--job", str(job["job"]), "--json").stdout.splitlines()
    # Then each speaks the documented shape
    assert job == {"job": job["job"], "items": 3}
    assert status == {"job": job["job"], "state": "running", "lanes": {"noop": {"pending": 3}}}
    assert "pause requested; 3 item(s) changed now; job is paused" in paused.stdout
    assert "resume requested; 3 item(s) changed now" in resumed.stdout
    assert "cancel requested; 3 item(s) changed now; job is cancelled" in cancelled.stdout
    assert final["state"] == "cancelled" and final["lanes"] == {"noop": {"cancelled": 3}}
    events = [json.loads(line) for line in lines]
    assert all(set(e) == EVENT_KEYS for e in events)
    cursors = [e["cursor"] for e in events]
    assert cursors == sorted(cursors) and len(set(cursors)) == len(cursors)
    types = [e["type"] for e in events]
    assert types.count("item_created") == 3 and types.count("item_paused") == 3
    assert types.count("item_resumed") == 3 and types.count("item_cancelled") == 3
    # And following from a cursor gives exactly the later events
    later = photojobs(env, "events", "--job", str(job["job"]), "--json", "--after", str(cursors[4])).stdout
    assert [json.loads(line)["cursor"] for line in later.splitlines()] == cursors[5:]


def test_bad_input_gets_a_specific_error_and_status_64(env: dict[str, str], tmp_path: Path) -> None:
    # Given a folder with photos
    make_files(tmp_path / "photos", 1)
    # When the CLI gets an unknown lane, an unknown parameter, a malformed value and a missing path
    unknown_lane = photojobs(env, "submit", "--lanes", "resize", str(tmp_path / "photos"))
    unknown_param = photojobs(
        env, "submit", "--lanes", "noop", "--param", "exif.rating=5", str(tmp_path / "photos")
    )
    bad_value = photojobs(
        env, "submit", "--lanes", "exif", "--param", "exif.rating=9", str(tmp_path / "photos")
    )
    missing = photojobs(env, "submit", "--lanes", "noop", str(tmp_path / "nowhere"))
    # Then each exits 64 and says exactly what was wrong
    for done in (unknown_lane, unknown_param, bad_value, missing):
        assert done.returncode == 64, done.stderr
    assert (
        "unknown lane(s) resize; lanes are: noop, analysis, exif, rename, upload, archive"
        in unknown_lane.stderr
    )
    assert "unknown parameter(s) exif.rating for lanes noop; valid: noop.crash_if" in unknown_param.stderr
    assert "exif.rating='9'" in bad_value.stderr and "0-5" in bad_value.stderr
    assert "nowhere: no such file or folder" in missing.stderr
