"""A process opening a store already at the head does not load Alembic (store/schema.py).

Every sweeper, ``photojobs`` command and web server upgrades its store at start, and the suite
starts hundreds of them: Alembic's import and script loading cost ~0.13 s of CPU each (0.90 s vs
1.04 s of user+sys for ``photojobs sweep --once``, 3 runs each, A-B alternated, 2-core machine).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sqlalchemy import text

from store.engine import make_engine
from store.schema import _head_in_files, head_revision, upgrade
from tests.support import ROOT


def test_the_head_read_from_the_migration_files_is_alembics_head() -> None:
    # Given the migration files of this tree
    # When their head is read from their revision lines, and by Alembic
    # Then both name the same revision
    assert _head_in_files() is not None
    assert _head_in_files() == head_revision()


def test_a_store_at_the_head_is_opened_without_importing_alembic(tmp_path: Path) -> None:
    # Given a store migrated to the head
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    # When a fresh interpreter upgrades it again, as every process does when it opens a store
    code = (
        "import sys, json; from store.engine import make_engine; from store.schema import upgrade; "
        f"upgrade(make_engine({url!r})); print(json.dumps('alembic' in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    # Then Alembic was never imported
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) is False


def test_a_store_behind_the_head_is_still_upgraded(tmp_path: Path) -> None:
    # Given a store at the first revision
    engine = make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    upgrade(engine, "0001")
    # When it is upgraded to the head
    upgrade(engine)
    # Then Alembic brought it there
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == head_revision()
    engine.dispose()
