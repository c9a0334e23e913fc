"""The store's half of ``photojobs sync`` (issue 38): what a sync last recorded of each photo's file,
found in batches, and the moves it finds (``photojobs.sync`` walks the folders and decides).

``photo_files`` (revision 0015) holds one row per photo a sync recorded: its ``stat`` identity,
its content hash, its sidecars' signature and per lane the version and job a sync last submitted
it with. Every look-up here takes a chunk of paths (or hashes) in one statement, as the submission
writes its chunks: a sync of an unchanged library costs a ``stat`` per file and one statement per
chunk, whatever the library's size.

A move a sync finds (a photo renamed or re-foldered by hand: its content at a new path, its old
path gone) re-points the photo's row in one transaction per chunk: the photo rows locked in
ascending id (rule 6's order), a photo that an item or an unsettled intent holds is left alone
(``busy``: the next sync looks again), and the move is logged in the photo's history
(``photo_effects``, no job: ``store.history``) with a ``photo_moved`` event.
"""

# ruff: noqa: S608 - statements built once from constant fragments (the clock)

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import Engine, bindparam, delete, insert, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from .clock import db_now
from .engine import reader
from .events import emit
from .models import CANCELLED, Item, Photo, PhotoEffect
from .photo_locks import chunked, lock_photo_rows
from .queries import sql_now

SYNC_LOCK = 0x73796E63  # "sync"
T = TypeVar("T")
#: Paths per look-up statement and identities per write transaction.
LOOKUP_CHUNK = 2000
MOVE_KIND = "moved outside photojobs"


class FileIdentity(NamedTuple):
    """A file as a sync records it: ``stat`` (size, mtime in ns, inode, device), content hash, and its
    sidecars' signature (of their names and ``stat``; of their content)."""

    size: int
    mtime_ns: int
    inode: int
    device: int
    sha256: str
    sidecars: str | None = None
    sidecars_sha256: str | None = None


def unchanged(st: os.stat_result, sidecars: str | None, recorded: FileIdentity) -> bool:
    """The rule of a no-change sync: the file's size, mtime (ns), inode and device, and its
    sidecars' ``stat`` signature, all equal what was recorded (then it is not read at all)."""
    return (
        st.st_size == recorded.size
        and st.st_mtime_ns == recorded.mtime_ns
        and st.st_ino == recorded.inode
        and st.st_dev == recorded.device
        and sidecars == recorded.sidecars
    )


class Known(NamedTuple):
    """What the store has at a path: the photo (``photo_id`` None: no photo row, only a job's move
    in flight to it: ``busy``), the content hash the photo lanes last recorded (``photos.sha256``),
    what a sync recorded (``identity``, ``lanes``), and whether an unsettled intent targets it."""

    path: str
    photo_id: int | None
    photo_sha256: str | None
    identity: FileIdentity | None
    lanes_recorded: Any  # as the driver returns the JSON column (parsed only when asked: ``lanes``)
    busy: bool

    @property
    def lanes(self) -> dict[str, Any]:
        return _lanes(self.lanes_recorded)


# -- look-ups --------------------------------------------------------------------------------------
_LOOKUP_COLUMNS = """
    p.id, p.sha256, f.size, f.mtime_ns, f.inode, f.device, f.sha256, f.sidecars, f.sidecars_sha256,
    f.lanes, EXISTS (SELECT 1 FROM intents i WHERE i.target = u.path AND i.state = 'recorded')
"""
# One statement per chunk (one snapshot: a move a job is making is either still an intent or
# already the photo's path, never neither).
_LOOKUP_SQLITE = text(
    f"""
    SELECT u.value, {_LOOKUP_COLUMNS}
    FROM json_each(:paths) AS u
    LEFT JOIN photos p ON p.path = u.value
    LEFT JOIN photo_files f ON f.photo_id = p.id
    WHERE p.id IS NOT NULL
       OR EXISTS (SELECT 1 FROM intents i WHERE i.target = u.value AND i.state = 'recorded')
    """.replace("u.path", "u.value")
)
_LOOKUP_PG = text(
    f"""
    SELECT u.path, {_LOOKUP_COLUMNS}
    FROM unnest(CAST(:paths AS text[])) AS u(path)
    LEFT JOIN photos p ON p.path = u.path
    LEFT JOIN photo_files f ON f.photo_id = p.id
    WHERE p.id IS NOT NULL
       OR EXISTS (SELECT 1 FROM intents i WHERE i.target = u.path AND i.state = 'recorded')
    """
)


def _lanes(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        value = json.loads(value)
    return dict(value) if isinstance(value, dict) else {}


def lookup(engine: Engine, paths: Sequence[str]) -> dict[str, Known]:
    """What the store has at each of ``paths`` (a chunk: one statement), keyed by path; a path the
    store knows nothing of is absent."""
    if not paths:
        return {}
    postgres = engine.dialect.name == "postgresql"
    out: dict[str, Known] = {}
    with reader(engine).connect() as conn:
        for chunk in chunked(list(paths), LOOKUP_CHUNK):
            statement, value = (
                (_LOOKUP_PG, list(chunk)) if postgres else (_LOOKUP_SQLITE, json.dumps(list(chunk)))
            )
            for path, pid, photo_sha, size, *recorded, lanes, busy in conn.execute(
                statement, {"paths": value}
            ).all():
                identity = FileIdentity(size, *recorded) if size is not None else None
                out[path] = Known(path, pid, photo_sha, identity, lanes, bool(busy))
    return out


@dataclass(frozen=True)
class Recorded:
    """A photo a sync recorded with a given content hash: where the store says it is now."""

    photo_id: int
    path: str
    sha256: str
    lanes: dict[str, Any]


def by_content(engine: Engine, hashes: Sequence[str]) -> dict[str, list[Recorded]]:
    """The recorded photos whose content hash is one of ``hashes`` (``ix_photo_files_sha256``)."""
    out: dict[str, list[Recorded]] = {}
    if not hashes:
        return out
    from .models import PhotoFile

    with Session(reader(engine)) as s:
        for chunk in chunked(sorted(set(hashes)), LOOKUP_CHUNK):
            rows = s.execute(
                select(PhotoFile.sha256, Photo.id, Photo.path, PhotoFile.lanes)
                .join(Photo, Photo.id == PhotoFile.photo_id)
                .where(PhotoFile.sha256.in_(list(chunk)))
                .order_by(Photo.id)
            ).all()
            for sha, pid, path, lanes in rows:
                out.setdefault(sha, []).append(Recorded(pid, path, sha, _lanes(lanes)))
    return out


def item_states(engine: Engine, wanted: Sequence[tuple[int, int, str]]) -> dict[tuple[int, int, str], str]:
    """The state of the item of each (job, photo, lane) that exists (``ix_items_job_photo``)."""
    by_job: dict[int, set[int]] = {}
    for job, photo, _lane in wanted:
        by_job.setdefault(job, set()).add(photo)
    out: dict[tuple[int, int, str], str] = {}
    with Session(reader(engine)) as s:
        for job, photos in sorted(by_job.items()):
            for chunk in chunked(sorted(photos), LOOKUP_CHUNK):
                rows = s.execute(
                    select(Item.job_id, Item.photo_id, Item.lane, Item.state).where(
                        Item.job_id == job, Item.photo_id.in_(list(chunk))
                    )
                ).all()
                out.update(((j, p, lane), state) for j, p, lane, state in rows)
    return out


def was_cancelled(state: str | None) -> bool:
    """An item a sync submitted that never ran to an end of its own (cancelled with its job)."""
    return state == CANCELLED


# -- the photos under a folder --------------------------------------------------------------------
def _under(dialect: str, roots: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """SQL text selecting the photos at or under ``roots`` and its parameters. SQLite compares
    bytes (its default collation): ``root/`` <= path < ``root0`` is exactly the paths under the
    root, through the unique index on path. PostgreSQL's collation may not be bytewise: a scan
    with ``starts_with``."""
    parts, params = [], {}
    for n, root in enumerate(roots):
        base = root.rstrip("/")
        params[f"r{n}"], params[f"lo{n}"], params[f"hi{n}"] = base, base + "/", base + "0"
        if dialect == "postgresql":
            parts.append(f"(path = :r{n} OR starts_with(path, :lo{n}))")
        else:
            parts.append(f"(path = :r{n} OR (path >= :lo{n} AND path < :hi{n}))")
    return " OR ".join(parts) or "false", params


def count_under(engine: Engine, roots: Sequence[str]) -> int:
    """How many photo rows name a path at or under ``roots``."""
    where, params = _under(engine.dialect.name, roots)
    with reader(engine).connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM photos WHERE {where}"), params).scalar_one())


def photos_under(engine: Engine, roots: Sequence[str], batch: int = 5000) -> Iterator[tuple[int, str]]:
    """Every photo row (id, path) at or under ``roots``, streamed (memory flat)."""
    where, params = _under(engine.dialect.name, roots)
    after = 0
    statement = text(f"SELECT id, path FROM photos WHERE ({where}) AND id > :after ORDER BY id LIMIT :n")
    while True:
        with reader(engine).connect() as conn:
            rows = conn.execute(statement, {**params, "after": after, "n": batch}).all()
        yield from ((r[0], r[1]) for r in rows)
        if len(rows) < batch:
            return
        after = rows[-1][0]


# -- writing identities ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Identified:
    """A file to record at ``path`` (its photo row must exist): its identity and per-lane record."""

    path: str
    identity: FileIdentity
    lanes: Mapping[str, Any]


_UPSERT_COLUMNS = "size, mtime_ns, inode, device, sha256, sidecars, sidecars_sha256, lanes, recorded_at"
_UPSERT_SET = ", ".join(f"{c} = excluded.{c}" for c in _UPSERT_COLUMNS.split(", "))
_UPSERT_SQLITE = f"""
    INSERT INTO photo_files (photo_id, {_UPSERT_COLUMNS})
    SELECT id, ?, ?, ?, ?, ?, ?, ?, ?, {sql_now("sqlite")} FROM photos WHERE path = ?
    ON CONFLICT (photo_id) DO UPDATE SET {_UPSERT_SET}
"""
_UPSERT_PG = text(
    f"""
    INSERT INTO photo_files (photo_id, {_UPSERT_COLUMNS})
    SELECT p.id, u.size, u.mtime_ns, u.inode, u.device, u.sha256, u.sidecars, u.sidecars_sha256,
           CAST(u.lanes AS json), {sql_now("postgresql")}
    FROM unnest(CAST(:paths AS text[]), CAST(:sizes AS bigint[]), CAST(:mtimes AS bigint[]),
                CAST(:inodes AS bigint[]), CAST(:devices AS bigint[]), CAST(:shas AS text[]),
                CAST(:sidecars AS text[]), CAST(:side_shas AS text[]), CAST(:lanes AS text[]))
         AS u(path, size, mtime_ns, inode, device, sha256, sidecars, sidecars_sha256, lanes)
    JOIN photos p ON p.path = u.path
    ORDER BY p.id
    ON CONFLICT (photo_id) DO UPDATE SET {_UPSERT_SET}
    """
)


def record_files(engine: Engine, files: Iterable[Identified], chunk: int = LOOKUP_CHUNK) -> int:
    """Write (or replace) the identity of each file's photo, one transaction per chunk (``files``
    is read a chunk at a time); returns how many rows were written (a path with no photo row is
    passed over)."""
    written = 0
    postgres = engine.dialect.name == "postgresql"
    for part in batched(files, chunk):
        with Session(engine) as s, s.begin():
            if postgres:
                written += s.execute(
                    _UPSERT_PG,
                    {
                        "paths": [f.path for f in part],
                        "sizes": [f.identity.size for f in part],
                        "mtimes": [f.identity.mtime_ns for f in part],
                        "inodes": [f.identity.inode for f in part],
                        "devices": [f.identity.device for f in part],
                        "shas": [f.identity.sha256 for f in part],
                        "sidecars": [f.identity.sidecars for f in part],
                        "side_shas": [f.identity.sidecars_sha256 for f in part],
                        "lanes": [json.dumps(dict(f.lanes)) for f in part],
                    },
                ).rowcount
            else:
                rows = [
                    (
                        f.identity.size,
                        f.identity.mtime_ns,
                        f.identity.inode,
                        f.identity.device,
                        f.identity.sha256,
                        f.identity.sidecars,
                        f.identity.sidecars_sha256,
                        json.dumps(dict(f.lanes)),
                        f.path,
                    )
                    for f in sorted(part, key=lambda f: f.path)
                ]
                cursor = s.connection().exec_driver_sql(_UPSERT_SQLITE, rows)
                written += cursor.rowcount if cursor.rowcount >= 0 else len(rows)
    return written


def batched(values: Iterable[T], size: int) -> Iterator[list[T]]:
    """``values`` a list of at most ``size`` at a time."""
    part: list[T] = []
    for v in values:
        part.append(v)
        if len(part) >= size:
            yield part
            part = []
    if part:
        yield part


# -- moves ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Move:
    """A recorded photo found at a new path (its old path gone): ``identity`` is the file's there."""

    photo_id: int
    old_path: str
    new_path: str
    identity: FileIdentity
    lanes: Mapping[str, Any]


@dataclass(frozen=True)
class Moved:
    moved: list[Move]
    busy: list[Move]  # held by an item or an unsettled intent, moved since, or its new path taken


_HELD_PHOTOS = text("SELECT DISTINCT photo_id FROM photo_locks WHERE photo_id IN :ids").bindparams(
    bindparam("ids", expanding=True)
)
_INTENT_PHOTOS = text(
    "SELECT DISTINCT photo_id FROM intents WHERE state = 'recorded' AND photo_id IN :ids"
).bindparams(bindparam("ids", expanding=True))


def record_moves(engine: Engine, moves: Sequence[Move]) -> Moved:
    """Re-point each moved photo's row to its new path, record its identity there and log the move
    in its history, in one transaction (its photo rows locked in ascending id). A photo an item
    or an unsettled intent holds (a job is working on it: its own move may be in flight), whose
    row no longer names the old path, or whose new path another row names, is left as it is."""
    if not moves:
        return Moved([], [])
    ordered = sorted(moves, key=lambda m: m.photo_id)
    ids = [m.photo_id for m in ordered]
    done: list[Move] = []
    busy: list[Move] = []
    with Session(engine) as s, s.begin():
        conn = s.connection()
        if engine.dialect.name == "postgresql":
            paths = lock_photo_rows(conn, ids)
        else:  # SQLite: the transaction's write lock already keeps every other writer out
            paths = dict(s.execute(select(Photo.id, Photo.path).where(Photo.id.in_(ids))).all())
        held = {r[0] for part in chunked(ids) for r in conn.execute(_HELD_PHOTOS, {"ids": list(part)})}
        held |= {r[0] for part in chunked(ids) for r in conn.execute(_INTENT_PHOTOS, {"ids": list(part)})}
        for m in ordered:
            if m.photo_id in held or paths.get(m.photo_id) != m.old_path:
                busy.append(m)
                continue
            try:
                with s.begin_nested():
                    s.execute(
                        update(Photo)
                        .where(Photo.id == m.photo_id)
                        .values(path=m.new_path, sha256=m.identity.sha256, updated_at=db_now())
                    )
            except IntegrityError:  # another photo row names the new path already
                busy.append(m)
                continue
            s.execute(
                insert(PhotoEffect).values(
                    photo_id=m.photo_id, job_id=None, item_id=0, intent_id=None, lane="sync",
                    kind=MOVE_KIND, effect="found", sidecar=False, from_path=m.old_path,
                    to_path=m.new_path, before_sha256=m.identity.sha256,
                    after_sha256=m.identity.sha256, at=db_now(),
                )
            )  # fmt: skip
            emit(s, "photo_moved", photo_id=m.photo_id, detail={"from": m.old_path, "to": m.new_path})
            done.append(m)
    record_files(engine, [Identified(m.new_path, m.identity, m.lanes) for m in done])
    return Moved(done, busy)


def forget_file(engine: Engine, photo_ids: Sequence[int]) -> None:
    """Drop what syncs recorded of these photos (tests; a photo row itself is never deleted)."""
    from .models import PhotoFile

    with Session(engine) as s, s.begin():
        s.execute(delete(PhotoFile).where(PhotoFile.photo_id.in_(list(photo_ids))))


# -- one sync at a time per store ----------------------------------------------------------------
_local = threading.Lock()


@contextmanager
def sync_lock(engine: Engine) -> Iterator[None]:
    """Hold the store's sync lock for the duration (two syncs over the same photos must not both
    take a new photo for theirs): a PostgreSQL advisory lock on a connection of its own; for SQLite
    an ``flock`` on ``<database>.sync.lock`` beside the store (a thread lock for a store in memory)."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": SYNC_LOCK})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": SYNC_LOCK})
                conn.commit()
        return
    database = make_url(str(engine.url)).database
    if not database or database == ":memory:":
        with _local:
            yield
        return
    fd = os.open(f"{database}.sync.lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        with _local:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


__all__ = [
    "FileIdentity",
    "Identified",
    "Known",
    "Move",
    "Moved",
    "Recorded",
    "by_content",
    "count_under",
    "item_states",
    "lookup",
    "photos_under",
    "record_files",
    "record_moves",
    "sync_lock",
    "was_cancelled",
]
