"""A submission whose submitter died half-way, as ``photojobs status`` and ``cancel`` show it."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from sqlalchemy import Engine

from store import jobs as store_jobs
from store import submission as store_submission
from store.lanes import lane_spec
from tests.support import photojobs as run_photojobs


def photojobs(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_photojobs({**os.environ, "PHOTOJOBS_DATABASE_URL": db_url}, *args)


def test_status_shows_a_stalled_submission_and_cancel_ends_it(
    engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a submitter killed after two chunks of 100 photos out of 1,000
    monkeypatch.setattr(store_submission, "CHUNK_FIRST", 100)
    monkeypatch.setattr(store_submission, "CHUNK_MAX", 100)
    land = store_submission._land_chunk
    calls = []

    def dies(*args):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt("submitter killed")
        return land(*args)

    monkeypatch.setattr(store_submission, "_land_chunk", dies)
    # (killed: none of its own clean-up runs, as under SIGKILL)
    monkeypatch.setattr(store_submission, "end_submission", lambda *args: False)
    with pytest.raises(KeyboardInterrupt):
        store_jobs.submit(
            engine, [lane_spec("noop", env={})], [store_jobs.PhotoInput(f"/x/p{i}.jpg") for i in range(1000)]
        )
    # When status is asked
    text = photojobs(db_url, "status")
    data = json.loads(photojobs(db_url, "status", "--json").stdout)
    # Then it says the job is submitting, how far it got, and that nothing runs meanwhile
    assert text.returncode == 0 and "job 1: submitting" in text.stdout
    assert "200 of 1000 photo(s) written" in text.stdout
    assert data["state"] == "submitting" and data["submission"]["landed"] == 200
    # When it is cancelled / Then it is over
    assert photojobs(db_url, "cancel", "1").returncode == 0
    final = json.loads(photojobs(db_url, "status", "--json").stdout)
    assert final.pop("times")["work"] == {}  # nothing left to do (issue 41's ETA figures)
    assert final == {
        "job": 1,
        "state": "cancelled",
        "lanes": {"noop": {"cancelled": 200}},
        "waiting": [],
        "waiting_for": None,
        "failures": [],
    }
