"""path_trigrams: the console's photo-path search served by a trigram index (issue 29)

``store.console.search_hint`` finds jobs by a part of a photo path (``ILIKE '%part%'``). Without an
index every search read every photo's path (1.5-3.5 s on 300k items); PostgreSQL's ``pg_trgm`` GIN
index ``ix_photos_path_trgm`` answers it from the index. The extension is trusted (PostgreSQL 13+:
a database owner may create it); where it cannot be created the migration goes on without the
index (searches are still bounded by their statement timeout) and says so. SQLite: nothing (its
searches are bounded by time, ``store.console.SEARCH_TIMEOUT``).

Revision ID: 0012
Revises: 0010
Create Date: 2026-12-05 11:00:00

"""

import logging
from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

log = logging.getLogger("alembic.runtime.migration")


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    savepoint = bind.begin_nested()
    try:
        bind.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    except Exception as exc:  # noqa: BLE001 - without the extension the search is still time-bounded
        savepoint.rollback()
        log.warning("pg_trgm is not available (%s): photo-path searches run without an index", exc)
        return
    savepoint.commit()
    bind.exec_driver_sql(
        "CREATE INDEX IF NOT EXISTS ix_photos_path_trgm ON photos USING gin (path gin_trgm_ops)"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX IF EXISTS ix_photos_path_trgm")
