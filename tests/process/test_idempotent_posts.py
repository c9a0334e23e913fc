"""Idempotent submission against a real ``photojobs serve`` process (issue 38): a client that
retries a POST it never saw answered (a double click, a timeout) makes one job, on both stores."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from store.models import Item, Job
from tests.support import Fleet, make_files
from tests.web_support import serving, wait_job

CLIENTS = 6


def _race(url_client: Any, body: dict[str, Any], key: str) -> list[httpx.Response | BaseException]:
    """``CLIENTS`` POSTs of ``body`` with ``key``, each from its own connection, released together."""
    barrier = threading.Barrier(CLIENTS)
    out: list[httpx.Response | BaseException] = []

    def post() -> None:
        with url_client() as http:
            barrier.wait(30)
            try:
                out.append(http.post("/api/jobs", json=body, headers={"Idempotency-Key": key}))
            except Exception as exc:  # noqa: BLE001 - reported by the assertion
                out.append(exc)

    threads = [threading.Thread(target=post) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


@pytest.mark.timeout(240)
def test_posts_racing_with_one_idempotency_key_make_one_job_that_runs_once(
    engine: Engine, env: dict[str, str], fleet: Fleet, photos: Path, tmp_path: Path
) -> None:
    # Given a serve process with a photo root, a worker and a sweeper, and three photos
    fleet.start_worker(["noop"])
    fleet.start_sweeper()
    make_files(photos / "batch", 3)
    body = {"lanes": ["noop"], "paths": [str(photos / "batch")]}
    with serving(env, tmp_path, [photos]) as server:
        # When six clients POST the same job at once with one Idempotency-Key (a retried request)
        answers = _race(server.client, body, "upload-2026-12-07")
        # Then one answer is 201 (the job made) and the other five 200 with the same job (replayed)
        assert all(isinstance(a, httpx.Response) for a in answers), answers
        codes = sorted(a.status_code for a in answers)  # type: ignore[union-attr]
        assert codes == [200] * (CLIENTS - 1) + [201], [a.text for a in answers]  # type: ignore[union-attr]
        ids = {a.json()["job"] for a in answers}  # type: ignore[union-attr]
        assert len(ids) == 1, ids
        (job,) = ids
        # And that one job runs its three photos once, and the store holds no other job
        with server.client() as http:
            assert wait_job(http, job)["state"] == "succeeded"
            # And the same key with another body is refused, naming the first job
            other = http.post("/api/jobs", json=body | {"lanes": ["noop", "analysis"]},
                              headers={"Idempotency-Key": "upload-2026-12-07"})  # fmt: skip
            assert other.status_code == 409 and other.json()["detail"] == {"job": job}, other.text
    with Session(engine) as s:
        assert s.execute(select(func.count()).select_from(Job)).scalar_one() == 1
        states = s.execute(select(Item.state, Item.attempt).where(Item.job_id == job)).all()
    assert sorted(states) == [("succeeded", 1)] * 3
