"""Run by test_xdist_isolation.py under ``pytest -n 2 --dist each`` (not collected otherwise): each
xdist worker records the session resources its tests get, to the folder in PJ_XDIST_PROBE_OUT."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.support import RedisServer


def test_record_this_workers_resources(
    redis_server: RedisServer, redis_url: str, pg_template: str, lockdep_dir: str | None, tmp_path: Path
) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    # The worker's Redis is its own: a key set here is not seen by the other worker's server
    redis_server.client().set("probe", worker)
    record = {
        "worker": worker,
        "redis_port": redis_server.port,
        "redis_dir": str(redis_server.workdir),
        "template": pg_template,
        "lockdep": lockdep_dir,
        "tmp": str(tmp_path),
    }
    out = Path(os.environ["PJ_XDIST_PROBE_OUT"])
    (out / f"{worker}.json").write_text(json.dumps(record))
