"""Schema management through Alembic: ``photojobs db upgrade`` and the automatic upgrade on start.

Every process that opens a store upgrades it first (the sweeper, ``photojobs submit`` and every
other command through ``photojobs.api.Client``); a store already at the head costs one read of
``alembic_version`` against the head named in the migration files, with no Alembic import or
script loading (a third of a second of CPU per process start otherwise).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, exc, text

from .engine import reader

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).with_name("migrations")
UPGRADE_LOCK = 0x7363686D61  # "schma"
# ``revision: str = "0015"`` and ``down_revision: str | Sequence[str] | None = "0014"`` in a migration
_REVISION_LINE = re.compile(r"^(down_revision|revision)\s*(?::[^=\n]*)?=\s*(.+?)\s*$", re.MULTILINE)


def alembic_config(engine: Engine) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Create or upgrade the schema to ``revision``; safe when many processes start at once."""
    if revision == "head" and _at_head(engine):
        return
    from alembic import command

    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": UPGRADE_LOCK})
        cfg = alembic_config(engine)
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str:
    """The newest revision this code knows (what ``upgrade`` brings a store to)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    if head is None:
        raise RuntimeError('internal error: expected head is not None')
    return head


@functools.cache
def _head_in_files() -> str | None:
    """The one head of the migration files' chain, read from their ``revision`` and
    ``down_revision`` lines; None when that is not a single line of plain revisions (a merge, a
    branch, a line this cannot read): then Alembic decides."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in (MIGRATIONS / "versions").glob("*.py"):
        found: dict[str, object] = {}
        for name, value in _REVISION_LINE.findall(path.read_text(encoding="utf-8")):
            try:
                found.setdefault(name, ast.literal_eval(value))
            except (ValueError, SyntaxError):
                return None
        if not found:  # not a migration (the package's __init__.py)
            continue
        rev, down = found.get("revision"), found.get("down_revision")
        if not isinstance(rev, str) or not (down is None or isinstance(down, str)):
            return None
        revisions.add(rev)
        if down is not None:
            parents.add(down)
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 and parents <= revisions else None


def _at_head(engine: Engine) -> bool:
    """The store's schema is at the migration files' head already (read without a lock: the version
    only moves forward, in the transaction of its migration)."""
    head = _head_in_files()
    if head is None:
        return False
    try:
        # a read (SQLite: no write lock), so a control command answers while a writer holds it
        with reader(engine).connect() as conn:
            versions = {row[0] for row in conn.execute(text("SELECT version_num FROM alembic_version"))}
    except exc.DBAPIError:  # no schema yet
        return False
    return versions == {head}
