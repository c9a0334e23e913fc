"""Fresh stores for every test, at less than a migration each (tests/conftest.py's ``db_url``,
``pg_url``).

- SQLite: the schema is migrated once per pytest process into a template file; each test gets a
  copy (an Alembic upgrade of a new file costs 0.25-0.35 s of fsyncs, a copy 0.07 s).
- PostgreSQL: each test still gets its own database, ``CREATE DATABASE ... TEMPLATE`` of the
  process's migrated template, but made one test ahead and dropped after the test, by background
  threads: a test waits for neither (each took 0.1-3.6 s on the shared 2-core machine,
  most of it waiting for the server's other backends and disk).

The template never changes after it is migrated, so a database made ahead is what one made at the
test's start would be.
"""

from __future__ import annotations

import queue
import shutil
import threading
import uuid
from pathlib import Path

import psycopg

from store.engine import make_engine
from store.schema import upgrade


def sqlite_template(folder: Path) -> Path:
    """A migrated SQLite store in ``folder`` (once; later calls return it)."""
    path = folder / "template.db"
    if not path.exists():
        engine = make_engine(f"sqlite:///{path}")
        upgrade(engine)
        engine.dispose()
    return path


def sqlite_copy(template: Path, path: Path) -> str:
    """A fresh store at ``path``: a copy of the migrated template; its URL."""
    shutil.copyfile(template, path)
    return f"sqlite:///{path}"


class PgDatabases:
    """Fresh databases from ``template`` on the server of ``admin_url``: one made before it is
    asked for (by one thread) and the used ones dropped (by another)."""

    def __init__(self, admin_url: str, template: str) -> None:
        self.admin_url = admin_url
        self.template = template
        self.ready: queue.Queue[str | Exception] = queue.Queue(maxsize=1)
        self.to_drop: queue.Queue[str | None] = queue.Queue()
        self.closing = threading.Event()
        self.threads = [
            threading.Thread(target=self._make, name="pg-databases-make", daemon=True),
            threading.Thread(target=self._drop_all, name="pg-databases-drop", daemon=True),
        ]
        for t in self.threads:
            t.start()

    def url(self, name: str) -> str:
        return self.admin_url.rsplit("/", 1)[0] + f"/{name}"

    def take(self) -> str:
        """The name of a fresh database (made ahead, or waited for)."""
        got = self.ready.get(timeout=300)
        if isinstance(got, Exception):
            raise got
        return got

    def drop(self, name: str) -> None:
        """Drop ``name`` soon (its test's processes are gone; ``WITH (FORCE)`` ends what is left)."""
        self.to_drop.put(name)

    def close(self) -> None:
        """Drop every database made here (those made ahead too) and stop the threads."""
        self.closing.set()
        maker, dropper = self.threads
        while maker.is_alive():  # it may be blocked handing over the next one
            try:
                got = self.ready.get(timeout=0.1)
            except queue.Empty:
                continue
            if isinstance(got, str):
                self.drop(got)
        while not self.ready.empty():  # handed over just before it stopped
            got = self.ready.get_nowait()
            if isinstance(got, str):
                self.drop(got)
        self.to_drop.put(None)
        dropper.join(timeout=300)

    def _make(self) -> None:
        while not self.closing.is_set():
            made: str | Exception
            try:
                made = self._create()
            except Exception as exc:  # noqa: BLE001 - raised in the test that takes it
                made = exc
            while True:
                try:
                    self.ready.put(made, timeout=0.1)
                    break
                except queue.Full:
                    if self.closing.is_set():
                        if isinstance(made, str):
                            self.drop(made)
                        return

    def _drop_all(self) -> None:
        while (name := self.to_drop.get()) is not None:
            try:
                with psycopg.connect(self.admin_url, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            except Exception:  # noqa: BLE001, S110 - a database left behind fails no test
                pass

    def _create(self) -> str:
        name = f"pj_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        return name
