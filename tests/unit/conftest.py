"""Fixtures of the unit tests: a migrated SQLite store in the test's tmp dir."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from store.engine import make_engine
from store.schema import upgrade


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'unit.db'}")
    upgrade(engine)
    yield engine
    engine.dispose()
