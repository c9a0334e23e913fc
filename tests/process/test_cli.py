"""The ``photojobs`` command as scripts and the web app call it (real processes, both stores)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from photos.history import FOLDER as HISTORY  # kept originals (issue 31), not photos
from tests.support import Fleet, make_files, photojobs, wait_for

EVENT_KEYS = {"cursor", "job", "item", "photo", "lane", "type", "attempt", "token", "worker", "at", "detail"}


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
    assert job == {"job": job["job"], "items": 3, "skipped": {}, "left_out": []}
    times = status.pop("times")  # the ETA's figures (issue 41): the work left, nothing measured yet
    assert times["eta"] is None
    assert times["work"] == {"noop": {"remaining": 3, "per_item": None, "concurrency": 0}}
    assert status == {
        "job": job["job"],
        "state": "running",
        "lanes": {"noop": {"pending": 3}},
        # no worker runs: the status says so (store.waiting, issue 41)
        "waiting": [{"lane": "noop", "reason": "no live worker", "items": 3, "workers": 0}],
        "waiting_for": "no live worker",
        "failures": [],
    }
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


def test_status_groups_failures_by_reason_class_with_counts_and_examples(
    env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a job of 7 photos where 5, in different folders, fail with the same error class (their
    # paths in the error), one attempt each, and a worker and a sweeper running it
    photos = tmp_path / "photos"
    make_files(photos / "good", 2)
    for i in range(5):
        make_files(photos / f"batch {i}", 1, prefix="broken")
    fleet.start_worker(["noop"], env={"PHOTOJOBS_LANE_NOOP_MAX_ATTEMPTS": "1"})
    fleet.start_sweeper()
    submitted = photojobs(
        env, "submit", "--lanes", "noop", "--param", "noop.fail_if=broken", "--json", str(photos)
    )
    assert submitted.returncode == 0, submitted.stderr
    job = str(json.loads(submitted.stdout)["job"])

    def finished() -> dict | None:  # type: ignore[type-arg]
        st = json.loads(photojobs(env, "status", job, "--json").stdout)
        return st if st["state"] in ("partial", "failed", "succeeded") else None

    # When it has finished and its status is read as JSON and as text
    st = wait_for(finished, 120, 0.5, what="the job finished\n" + fleet.logs())
    text = photojobs(env, "status", job)
    # Then --json keeps its keys and adds the failures as the web API's groups: one group of 5
    assert st["state"] == "partial" and st["lanes"] == {"noop": {"succeeded": 2, "failed": 5}}
    [group] = st["failures"]
    assert group["lane"] == "noop" and group["state"] == "failed" and group["count"] == 5
    assert group["reason"] == "RuntimeError: noop.fail_if matched <path>"
    assert len(group["examples"]) == 3
    for x in group["examples"]:
        assert "broken" in x["path"] and x["error"] == f"RuntimeError: noop.fail_if matched {x['path']}"
    # And the text shows the group once with its count, its example paths and how to list them all
    assert text.returncode == 0, text.stderr
    assert "5 × failed in noop: RuntimeError: noop.fail_if matched <path>" in text.stdout
    assert text.stdout.count("matched") == 1
    for x in group["examples"]:
        assert f"item {x['item']}: {x['path']}" in text.stdout
    assert "… and 2 more" in text.stdout and f"photojobs items {job} --state failed" in text.stdout


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


# -- configuration mistakes: one line, a documented status, no traceback, nothing created ----------

MISTAKES = {
    # name: (environment, command, exit status, words the one line must hold)
    "sqlite in a missing folder": (
        {"PHOTOJOBS_DATABASE_URL": "sqlite:///{tmp}/missing/photojobs.db"},
        ["status"], 69, ["the database at sqlite:///", "its folder does not exist", "nothing was created"],
    ),
    "missing sqlite file": (
        {"PHOTOJOBS_DATABASE_URL": "sqlite:///{tmp}/photojobs.db"},
        ["events"], 69, ["the database at sqlite:///", "no such file"],
    ),
    "unparsable database url": (
        {"PHOTOJOBS_DATABASE_URL": "not a url"},
        ["status"], 64, ["PHOTOJOBS_DATABASE_URL", "cannot parse 'not a url'"],
    ),
    "unreachable database": (
        {"PHOTOJOBS_DATABASE_URL": "postgresql://photojobs:s3cret@127.0.0.1:1/none"},
        ["submit", "--lanes", "noop", "{tmp}"], 69, ["the database at postgresql://photojobs:***@127.0.0.1:1"],
    ),
    "negative lease ttl": (
        {"PHOTOJOBS_LEASE_TTL": "-1"}, ["status"], 64, ["PHOTOJOBS_LEASE_TTL", "positive", "'-1'"],
    ),
    "lane backlog not a number": (
        {"PHOTOJOBS_LANE_ANALYSIS_BACKLOG": "abc"},
        ["submit", "--lanes", "analysis", "{tmp}"], 64, ["PHOTOJOBS_LANE_ANALYSIS_BACKLOG", "'abc'"],
    ),
    "bad redis url in a worker": (
        {"PHOTOJOBS_REDIS_URL": "http://127.0.0.1:6379"},
        ["worker"], 64, ["PHOTOJOBS_REDIS_URL", "is not a Redis URL"],
    ),
    "unreachable redis in a worker": (
        {"PHOTOJOBS_REDIS_URL": "redis://127.0.0.1:1/0"}, ["worker"], 69, ["Redis at redis://127.0.0.1:1/0"],
    ),
    "unreachable redis for run": (
        {"PHOTOJOBS_REDIS_URL": "redis://127.0.0.1:1/0"}, ["run", "--lanes", "noop", "{tmp}/photos"], 69,
        ["Redis at redis://127.0.0.1:1/0"],
    ),
    "unreachable database for run": (
        {"PHOTOJOBS_DATABASE_URL": "postgresql://photojobs:s3cret@127.0.0.1:1/none"},
        ["run", "--lanes", "noop", "{tmp}/photos"], 69, ["the database at postgresql://photojobs:***@127.0.0.1:1"],
    ),
    "bad setting for run": (
        {"PHOTOJOBS_SWEEP_INTERVAL": "soon"}, ["run", "--lanes", "noop", "{tmp}/photos"], 64,
        ["PHOTOJOBS_SWEEP_INTERVAL", "'soon' is not a number"],
    ),
}  # fmt: skip


def mistake_env(tmp_path: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHOTOJOBS_")}
    env["PHOTOJOBS_DATABASE_URL"] = f"sqlite:///{tmp_path}/photojobs.db"
    env["PHOTOJOBS_RUNTIME_DIR"] = str(tmp_path / "runtime")
    env.update({k: v.format(tmp=tmp_path) for k, v in extra.items()})
    return env


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if HISTORY not in p.parts)


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_configuration_mistake_is_one_line_and_its_exit_status(tmp_path: Path, mistake: str) -> None:
    # Given a folder with a photo and a setting that is wrong
    extra, command, status, words = MISTAKES[mistake]
    make_files(tmp_path / "photos", 1)
    before = tree(tmp_path)
    # When the command runs
    done = photojobs(mistake_env(tmp_path, extra), *[a.format(tmp=tmp_path) for a in command])
    # Then it exits with the documented status and one line naming the setting and the problem
    assert done.returncode == status, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("photojobs: ") and all(w in lines[0] for w in words), lines[0]
    # And nothing was created
    assert tree(tmp_path) == before


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    # Given a wrong setting
    env = mistake_env(tmp_path, {"PHOTOJOBS_LEASE_TTL": "-1"})
    # When the command runs with --debug
    done = photojobs(env, "--debug", "status")
    # Then the traceback is shown, ending in the error
    assert done.returncode != 0
    assert "Traceback" in done.stderr and "ConfigError: PHOTOJOBS_LEASE_TTL" in done.stderr
