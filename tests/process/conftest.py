"""Fixtures of the process tests that more than one module uses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.web_support import WebServer


@pytest.fixture
def serve(env: dict[str, str], tmp_path: Path, photos: Path) -> Iterator[Any]:
    """Start ``photojobs serve`` processes on the photo root with extra settings (``serve(**extra)``
    returns the started server); all stopped at the end."""
    servers: list[WebServer] = []

    def start(**extra: str) -> WebServer:
        logdir = tmp_path / f"web-logs-{len(servers)}"
        logdir.mkdir()
        srv = WebServer(env, logdir, roots=[photos], extra=extra)
        servers.append(srv)
        return srv.start()

    yield start
    for srv in servers:
        srv.stop()
