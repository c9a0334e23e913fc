"""The CLI's inspection commands (jobs, items, retry, prune) and ``--state DIR``, as real processes."""

from __future__ import annotations

import json
from pathlib import Path

from photojobs.api import Client
from photojobs.config import Settings
from tests.support import Fleet, make_files, photojobs, wait_for


def test_jobs_items_retry_and_prune(env: dict[str, str], fleet: Fleet, tmp_path: Path) -> None:
    # Given a finished noop job where two of four items failed (one attempt each)
    make_files(tmp_path / "photos", 2)
    make_files(tmp_path / "photos", 2, prefix="bad")
    fleet.start_worker(["noop"], env={"PHOTOJOBS_LANE_NOOP_MAX_ATTEMPTS": "1"})
    fleet.start_sweeper()
    out = photojobs(
        env, "submit", "--lanes", "noop", "--param", "noop.fail_if=bad", "--json", str(tmp_path / "photos")
    )
    job = json.loads(out.stdout)["job"]

    def finished() -> dict | None:
        st = json.loads(photojobs(env, "status", str(job), "--json").stdout)
        return st if st["state"] == "partial" else None

    wait_for(finished, 120, 0.5, what="job to end partial")
    # When jobs and failed items are listed
    jobs = json.loads(photojobs(env, "jobs", "--json").stdout)
    failed = json.loads(photojobs(env, "items", str(job), "--state", "failed", "--json").stdout)
    text = photojobs(env, "items", str(job), "--state", "failed", "--lane", "noop").stdout
    # Then they show the job and exactly the failed photos with their errors
    assert jobs["next"] is None and jobs["jobs"][0]["job"] == job
    assert jobs["jobs"][0]["lanes"] == {"noop": {"succeeded": 2, "failed": 2}}
    assert sorted(Path(i["path"]).name for i in failed["items"]) == ["bad00000.txt", "bad00001.txt"]
    assert all(i["reason"] == "RuntimeError: noop.fail_if matched <path>" for i in failed["items"])
    assert text.count("failed") == 2 and "bad00000.txt" in text
    # When the failed items are retried
    retried = photojobs(env, "retry", str(job), "--lane", "noop")
    # Then they run again
    assert retried.returncode == 0 and f"job {job}: 2 item(s) back to work" in retried.stdout
    wait_for(finished, 120, 0.5, what="retried job to end partial again")
    # And the errors for a bad request are specific
    nothing = photojobs(env, "retry", str(job), "--lane", "exif")
    unknown = photojobs(env, "items", "999999")
    bad_state = photojobs(env, "items", str(job), "--state", "bogus")
    bad_age = photojobs(env, "prune", "--older-than", "soon")
    assert nothing.returncode == 1 and "no failed or cancelled items in lane exif" in nothing.stderr
    assert unknown.returncode == 1 and "no job with id 999999" in unknown.stderr
    assert bad_state.returncode == 64 and "unknown item state 'bogus'" in bad_state.stderr
    assert bad_age.returncode == 64 and "30d" in bad_age.stderr
    # And prune keeps a recent job
    pruned = json.loads(photojobs(env, "prune", "--older-than", "30d", "--json").stdout)
    assert pruned["jobs"] == 0 and pruned["events"] == 0


def test_state_dir_reads_a_run_folder(env: dict[str, str], tmp_path: Path) -> None:
    # Given a `photojobs run` state folder with its own store holding one job
    state = tmp_path / "album" / ".photojobs"
    make_files(tmp_path / "album", 2)
    client = Client(Settings.from_env({"PHOTOJOBS_DATABASE_URL": f"sqlite:///{state / 'photojobs.db'}"}))
    job = client.submit(["noop"], [tmp_path / "album"]).job_id
    client.engine.dispose()
    # When commands are pointed at the folder (the environment names another store)
    status = photojobs(env, "status", str(job), "--state", str(state), "--json")
    jobs = photojobs(env, "jobs", "--state", str(state), "--json")
    items = photojobs(env, "items", str(job), "--state-dir", str(tmp_path / "album"), "--json")
    elsewhere = photojobs(env, "jobs", "--json")
    (tmp_path / "empty").mkdir()
    missing = photojobs(env, "status", "--state", str(tmp_path / "empty"))
    # Then they read the folder's store
    assert json.loads(status.stdout)["lanes"] == {"noop": {"pending": 2}}
    assert [j["job"] for j in json.loads(jobs.stdout)["jobs"]] == [job]
    assert len(json.loads(items.stdout)["items"]) == 2
    assert json.loads(elsewhere.stdout)["jobs"] == []
    assert missing.returncode != 0 and "no photojobs store here" in missing.stderr
