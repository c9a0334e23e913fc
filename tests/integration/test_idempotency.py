"""Idempotent submission (issue 38): an ``Idempotency-Key`` on ``POST /api/jobs`` and ``POST
/api/sync``, ``Client.submit(idempotency_key=)`` and ``Client.sync``, on SQLite and PostgreSQL,
without workers. The race is real: threads submitting with one key at once, through the HTTP app."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select, update
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.web import create_app
from store.idempotency import KeyReused
from store.models import IdempotencyKey, Job
from store.retention import prune
from tests.web_support import TOKEN

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def client(engine: Engine, redis_url: str) -> Client:
    env = {"PHOTOJOBS_DATABASE_URL": str(engine.url), "PHOTOJOBS_REDIS_URL": redis_url}
    return Client(Settings.from_env(env), engine, migrate=False)


@pytest.fixture
def http(client: Client, photos: Path) -> Iterator[TestClient]:
    app = create_app(client, token=TOKEN, photo_roots=[photos], env=dict(client.settings.env))
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c


def library(root: Path, n: int = 3, tag: str = "") -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        path = root / f"IMG_{tag}{i:04d}.jpg"
        path.write_bytes(f"photo {tag}{i} ".encode() * 40)
        out.append(path)
    return out


def jobs(engine: Engine) -> int:
    with Session(engine) as s:
        return s.execute(select(func.count()).select_from(Job)).scalar_one()


def test_a_retry_with_the_same_key_and_request_answers_the_first_job(client: Client, photos: Path) -> None:
    """Given a submission with an idempotency key
    When the same request is submitted again with that key
    Then it answers the first job (replayed, the same counts) and no second job exists."""
    library(photos)
    first = client.submit("analysis", [photos], idempotency_key="order-17")
    again = client.submit("analysis", [photos], idempotency_key="order-17")
    assert (again.job_id, again.items, again.replayed) == (first.job_id, first.items, True)
    assert not first.replayed
    assert jobs(client.engine) == 1


def test_the_same_key_with_another_request_is_refused(client: Client, photos: Path) -> None:
    """Given a submission with an idempotency key
    When another request (other lanes) comes with that key
    Then it is refused with KeyReused naming the first job, and nothing is written."""
    library(photos)
    first = client.submit("analysis", [photos], idempotency_key="k1")
    with pytest.raises(KeyReused) as refused:
        client.submit("analysis,exif", [photos], idempotency_key="k1")
    assert refused.value.job_id == first.job_id
    assert jobs(client.engine) == 1


def _race(n: int, call: Any) -> list[Any]:
    """``call()`` in ``n`` threads released together; their answers (or exceptions)."""
    barrier = threading.Barrier(n)
    out: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            out[i] = call()
        except Exception as exc:  # noqa: BLE001 - the test looks at every answer
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_concurrent_posts_with_one_key_make_one_job(http: TestClient, engine: Engine, photos: Path) -> None:
    """Given a folder of photos
    When eight clients POST /api/jobs at once with the same Idempotency-Key and body
    Then exactly one job exists, one answer is 201, the others 200 with its id (replayed)."""
    library(photos, 4)
    body = {"lanes": "analysis", "paths": [str(photos)]}
    answers = _race(8, lambda: http.post("/api/jobs", json=body, headers={"Idempotency-Key": "double-click"}))
    assert all(not isinstance(a, Exception) for a in answers), answers
    codes = sorted(a.status_code for a in answers)
    assert codes == [200] * 7 + [201], [a.text for a in answers]
    assert len({a.json()["job"] for a in answers}) == 1
    assert jobs(engine) == 1
    with Session(engine) as s:
        assert s.execute(select(func.count()).select_from(IdempotencyKey)).scalar_one() == 1


def test_the_http_api_answers_a_replay_and_refuses_a_reused_key(http: TestClient, photos: Path) -> None:
    """Given a job POSTed with an Idempotency-Key
    When the same body is POSTed again, then another body with the key, then a bad key
    Then 200 with the first job (replayed), 409 with the JSON error naming it, 400."""
    library(photos)
    body = {"lanes": "analysis", "paths": [str(photos)]}
    first = http.post("/api/jobs", json=body, headers={"Idempotency-Key": "abc"})
    assert first.status_code == 201, first.text
    again = http.post("/api/jobs", json=body, headers={"Idempotency-Key": "abc"})
    assert again.status_code == 200 and again.json()["job"] == first.json()["job"]
    assert again.json()["replayed"] is True and again.json()["items"] == first.json()["items"]
    other = http.post("/api/jobs", json=body | {"lanes": "analysis,exif"}, headers={"Idempotency-Key": "abc"})
    assert other.status_code == 409
    assert other.json()["error"] == "idempotency_key_reused"
    assert other.json()["detail"] == {"job": first.json()["job"]}
    bad = http.post("/api/jobs", json=body, headers={"Idempotency-Key": "has space"})
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_submission"


def test_a_sync_retried_with_its_key_answers_its_first_report(
    http: TestClient, client: Client, engine: Engine, photos: Path
) -> None:
    """Given a sync POSTed with an Idempotency-Key that made a job
    When a photo is added and the same sync is POSTed again with the key, and once with another body
    Then the retry answers the first report (same job, replayed) without taking the new photo, the
    other body is refused (409), and a sync without the key then takes the new photo."""
    library(photos, 2)
    body = {"lanes": "analysis", "paths": [str(photos)]}
    first = http.post("/api/sync", json=body, headers={"Idempotency-Key": "nightly-1"})
    assert first.status_code == 200 and first.json()["new"] == 2
    library(photos, 1, tag="x")
    again = http.post("/api/sync", json=body, headers={"Idempotency-Key": "nightly-1"})
    assert again.status_code == 200, again.text
    assert again.json()["replayed"] is True
    assert (again.json()["job"], again.json()["new"]) == (first.json()["job"], 2)
    other = http.post("/api/sync", json=body | {"outdated": True}, headers={"Idempotency-Key": "nightly-1"})
    assert other.status_code == 409 and other.json()["error"] == "idempotency_key_reused"
    assert jobs(engine) == 1
    later = client.sync("analysis", [photos])
    assert (later.new, later.unchanged) == (1, 2)


def test_a_sync_that_made_no_job_is_replayed_from_its_key(client: Client, photos: Path) -> None:
    """Given an unchanged library and a sync with a key that found nothing to do
    When a photo is added and the sync is run again with the key
    Then the answer is the first report (no job, replayed)."""
    library(photos, 2)
    client.sync("analysis", [photos])
    first = client.sync("analysis", [photos], idempotency_key="k")
    assert first.job is None and not first.replayed
    library(photos, 1, tag="y")
    again = client.sync("analysis", [photos], idempotency_key="k")
    assert again.replayed and again.job is None and again.new == 0


def test_keys_are_pruned_after_their_keep_time(client: Client, engine: Engine, photos: Path) -> None:
    """Given a key recorded two days ago and one recorded now
    When prune runs (keys kept 24 h)
    Then the old key is gone (its request may be made again as a new job) and the new one stays."""
    library(photos)
    old = client.submit("analysis", [photos], idempotency_key="old")
    client.submit("analysis", [photos], idempotency_key="new")
    with Session(engine) as s, s.begin():
        s.execute(
            update(IdempotencyKey)
            .where(IdempotencyKey.key == "old")
            .values(created_at=IdempotencyKey.created_at - 2 * 86400)
        )
    assert prune(engine, 30 * 86400, keys_keep=86400).keys == 1
    with Session(engine) as s:
        assert set(s.execute(select(IdempotencyKey.key)).scalars()) == {"new"}
    assert client.submit("analysis", [photos], idempotency_key="old").job_id != old.job_id


def test_the_cli_takes_an_idempotency_key(engine: Engine, photos: Path, redis_url: str) -> None:
    """Given `photojobs submit --idempotency-key K --json` run once
    When the same command line runs again, then another command line with K
    Then the second prints the first job (replayed) and the third exits 64 naming the first job."""
    from click.testing import CliRunner

    from photojobs.cli import cli

    library(photos)
    env = {"PHOTOJOBS_DATABASE_URL": str(engine.url), "PHOTOJOBS_REDIS_URL": redis_url}
    args = ["submit", "--lanes", "analysis", "--idempotency-key", "K", "--json", str(photos)]
    runner = CliRunner()
    first = runner.invoke(cli, args, env=env)
    again = runner.invoke(cli, args, env=env)
    assert first.exit_code == again.exit_code == 0, first.output + again.output
    one, two = json.loads(first.output), json.loads(again.output)
    assert two["job"] == one["job"] and two["replayed"] is True and "replayed" not in one
    other = runner.invoke(cli, [*args[:2], "analysis,exif", *args[3:]], env=env)
    assert other.exit_code == 64 and f"job {one['job']}" in other.output
    sync = ["sync", "--lanes", "analysis", "--idempotency-key", "S", "--json", str(photos)]
    assert runner.invoke(cli, sync, env=env).exit_code == 0
    assert json.loads(runner.invoke(cli, sync, env=env).output)["replayed"] is True
    assert jobs(engine) == 2  # the submission's and the sync's
