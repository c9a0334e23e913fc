"""Property-based fuzzing of the whole OpenAPI schema (Schemathesis) against the real app in-process.

The app runs on a real SQLite store and a real Redis. Every operation gets schema-valid and
schema-violating requests (bodies, paths, queries, headers), authenticated and not: no response may
be a 5xx other than an outage's 503 (there is none here), and every error is the JSON error shape of
``photojobs.web.errors``. ``PHOTOJOBS_FUZZ_EXAMPLES`` sets the examples per operation and mode
(default 15: the whole run stays well under a minute; ``make chaos`` runs a longer one).

The SSE stream (an endless response) is left out: its bad inputs are tested against a real server
(``tests/process/test_web_boundary.py``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from sqlalchemy import Engine

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.web import create_app
from store.engine import make_engine
from store.schema import upgrade
from tests.support import make_files
from tests.web_support import TOKEN

EXAMPLES = int(os.environ.get("PHOTOJOBS_FUZZ_EXAMPLES") or 15)
ERROR_KEYS = {"error", "message", "detail"}
SKIPPED = {"/api/events/stream"}


@pytest.fixture
def fuzz_engine(tmp_path: Path) -> Iterator[Engine]:
    eng = make_engine(f"sqlite:///{tmp_path / 'fuzz.db'}")
    upgrade(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def app(fuzz_engine: Engine, redis_url: str, tmp_path: Path) -> Any:
    roots = tmp_path / "photos"
    make_files(roots / "album", 3)
    env = {
        "PHOTOJOBS_DATABASE_URL": str(fuzz_engine.url),
        "PHOTOJOBS_REDIS_URL": redis_url,
        # Schemathesis sends many wrong tokens: do not let the login limit turn them all into 429s.
        "PHOTOJOBS_LOGIN_FAILURES": "1000000",
    }
    client = Client(Settings.from_env(env), fuzz_engine, migrate=False)
    return create_app(client, token=TOKEN, photo_roots=[roots], env=env)


def check_response(case: Any, response: Any) -> None:
    where = f"{case.method} {case.formatted_path} q={case.query} h={case.headers} body={case.body!r:.300}"
    where = where[:1000]
    assert response.status_code < 500, f"{where} -> {response.status_code} {response.text[:500]}"
    if response.status_code >= 400:
        content_type = response.headers.get("content-type") or [""]
        content_type = content_type[0] if isinstance(content_type, list) else content_type
        assert content_type.startswith("application/json"), (where, response.text)
        body = response.json()
        assert isinstance(body, dict) and ERROR_KEYS <= set(body), (where, body)
        assert isinstance(body["error"], str) and isinstance(body["message"], str), (where, body)


def test_every_operation_answers_without_a_server_error_and_errors_are_json(app: Any) -> None:
    # Given the app's own OpenAPI schema
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [op.ok() for op in schema.get_all_operations()]
    operations = [op for op in operations if op.path not in SKIPPED]
    assert len(operations) >= 10, [op.path for op in operations]
    # When each operation is called with generated valid and invalid requests, with and without the token
    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=op.as_strategy(generation_mode=mode), with_token=st.booleans())
            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            def call(case: Any, with_token: bool) -> None:
                headers = dict(case.headers or {})
                if with_token and not {k.lower() for k in headers} & {"authorization"}:
                    headers["Authorization"] = f"Bearer {TOKEN}"
                # Then no response is a server error and every error is the JSON error shape
                check_response(case, case.call(headers=headers))

            try:
                call()
            except Unsatisfiable:
                # No invalid request exists for an operation without inputs (e.g. GET /healthz)
                assert mode is GenerationMode.NEGATIVE, op.path
