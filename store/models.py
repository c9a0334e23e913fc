"""SQLAlchemy models: jobs, photos, items, photo locks, file-effect intents, the event log and the
worker registry."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.elements import ColumnElement

# Item states (docs/design.md "Model").
WAITING = "waiting"  # an earlier lane of the pipeline is not done for this photo
PENDING = "pending"  # ready, no message in the broker
QUEUED = "queued"  # a message is (believed to be) in Redis
RUNNING = "running"  # leased by a worker
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"
SKIPPED = "skipped"
PAUSED = "paused"

TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED, SKIPPED})
NOT_STARTED = frozenset({WAITING, PENDING, QUEUED, PAUSED})
ALL_STATES = (WAITING, PENDING, QUEUED, RUNNING, PAUSED, SUCCEEDED, FAILED, CANCELLED, SKIPPED)

# Job control requests.
CANCEL = "cancel"
PAUSE = "pause"

# Photo lock modes.
SHARED = "S"
EXCLUSIVE = "X"


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    lanes: Mapped[list[Any]] = mapped_column(JSON)
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    roots: Mapped[list[Any]] = mapped_column(JSON, default=list)
    fingerprint: Mapped[str] = mapped_column(String(64), index=True)
    control: Mapped[str | None] = mapped_column(String(16), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    # Submission lands in chunks (store.jobs.submit): while ``submitting`` is true the job's items
    # are not dispatched; ``photos`` is how many photos the submission announced, ``landed`` how many
    # are written, ``submit_touched_at`` the database time of the last chunk (a crashed submitter
    # leaves a job that stays ``submitting``; status shows how long ago it last moved).
    submitting: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    photos: Mapped[int | None] = mapped_column(Integer, nullable=True)
    landed: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    submit_touched_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # "interactive" or "normal" as submitted; None: by its size (store.dispatch.is_interactive).
    priority: Mapped[str | None] = mapped_column(String(16), nullable=True)

    __table_args__ = (
        Index(
            "ix_jobs_submitting",
            "id",
            postgresql_where=text("submitting"),
            sqlite_where=text("submitting = 1"),
        ),
    )


class Photo(Base):
    __tablename__ = "photos"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    path: Mapped[str] = mapped_column(Text, unique=True)
    size: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    updated_at: Mapped[float] = mapped_column(Float)
    # the file's modification time when first submitted: rename's fallback when there is no
    # capture time (stable across later edits of the file); revision 0003
    file_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    # PostgreSQL also has ix_photos_path_trgm (revision 0012: a pg_trgm GIN index for the console's
    # path search) where the extension could be created; not modelled, since it may be absent.


class Item(Base):
    __tablename__ = "items"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    lane: Mapped[str] = mapped_column(String(32))
    position: Mapped[int] = mapped_column(Integer)  # index of the lane in the job's pipeline
    photo_id: Mapped[int | None] = mapped_column(ForeignKey("photos.id"), nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    fencing_token: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    lease_ttl: Mapped[float | None] = mapped_column(Float, nullable=True)
    lease_expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    not_before: Mapped[float] = mapped_column(Float, default=0.0)
    queued_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # When the current attempt became ready (revision 0013): written by its claim from the row's old
    # ``updated_at`` (queuing and deferrals keep it); the claim's event carries the wait (ready -> claim).
    ready_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # While queued: the items its message carries (a batch message's size; NULL: one); kept while
    # running (> 1: claimed from a batch message). 0 (ALONE, store.dispatch): its worker died while
    # it was claimed in a batch; not charged, its next message carries it alone.
    message_items: Mapped[int | None] = mapped_column(Integer, nullable=True)
    checkpoint: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    updated_at: Mapped[float] = mapped_column(Float)

    __table_args__ = (
        Index("ix_items_dispatch", "lane", "state", "job_id", "id"),
        Index("ix_items_lease", "state", "lease_expires_at"),
        Index("ix_items_job_photo", "job_id", "photo_id", "position"),
        Index("ix_items_job_state", "job_id", "lane", "state"),
        # The console's state filter (revision 0010): settled items that no claim or success touches.
        Index(
            "ix_items_settled_job",
            "state",
            "job_id",
            postgresql_where=text("items.state IN ('failed', 'skipped', 'cancelled', 'paused')"),
            sqlite_where=text("items.state IN ('failed', 'skipped', 'cancelled', 'paused')"),
        ),
    )


class ItemPhoto(Base):
    """Extra photos of an item that names several (an archive bundle)."""

    __tablename__ = "item_photos"

    item_id: Mapped[int] = mapped_column(ForeignKey("items.id", ondelete="CASCADE"), primary_key=True)
    photo_id: Mapped[int] = mapped_column(ForeignKey("photos.id"), primary_key=True)


class PhotoLock(Base):
    """A held photo lock: part of its item's lease (released by its final commit, freed on revoke),
    except while the item has an unsettled intent: then the intent holds it (``intent_id``) until
    the intent is applied-and-marked or discarded (docs/design.md rule 6)."""

    __tablename__ = "photo_locks"

    photo_id: Mapped[int] = mapped_column(ForeignKey("photos.id"), primary_key=True)
    item_id: Mapped[int] = mapped_column(ForeignKey("items.id", ondelete="CASCADE"), primary_key=True)
    mode: Mapped[str] = mapped_column(String(1))
    token: Mapped[int] = mapped_column(Integer)
    intent_id: Mapped[int | None] = mapped_column(Integer, nullable=True)

    __table_args__ = (Index("ix_photo_locks_item", "item_id"),)


class Intent(Base):
    """A recorded file effect: staged file -> target, applied at most once.

    ``base_sha256`` is the content the target had when the effect was planned (None: a new name,
    or recorded before revision 0002), ``result_sha256`` the content the effect produces.
    """

    __tablename__ = "intents"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    item_id: Mapped[int] = mapped_column(ForeignKey("items.id", ondelete="CASCADE"), index=True)
    token: Mapped[int] = mapped_column(Integer)
    photo_id: Mapped[int | None] = mapped_column(ForeignKey("photos.id"), nullable=True)
    kind: Mapped[str] = mapped_column(String(16))
    staged: Mapped[str] = mapped_column(Text)
    target: Mapped[str] = mapped_column(Text)
    source: Mapped[str | None] = mapped_column(Text, nullable=True)
    base_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    result_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)
    # What the effect log (``photo_effects``) needs once it is applied (revision 0011): the tags a
    # metadata edit changes, where the displaced original is kept, the effect it undoes.
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    __table_args__ = (
        Index("ix_intents_target", "target"),
        Index("ix_intents_live", "state", "item_id"),
        # At most one live (recorded) intent per target path: two items can never both plan to
        # publish to the same name.
        Index(
            "uq_intents_live_target",
            "target",
            unique=True,
            postgresql_where=text("state = 'recorded'"),
            sqlite_where=text("state = 'recorded'"),
        ),
    )


class PhotoEffect(Base):
    """The effect log (revision 0011, ``store.history``): one row per file effect a job applied to a
    photo (its sidecars' rows name the photo too), written in the transaction that marks the intent
    applied. ``undone_by`` is the job whose effect reversed it (cleared when that one is undone in
    turn: a redo); ``undoes`` the effect row an undo effect reversed. No foreign keys: the history
    outlives the pruned jobs and items it names."""

    __tablename__ = "photo_effects"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    photo_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # None for a move a sync found on disk (revision 0015, ``store.sync``): no job made it
    job_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    item_id: Mapped[int] = mapped_column(Integer)
    # None for a remote effect (revision 0014): an S3 upload or its removal is no intent
    intent_id: Mapped[int | None] = mapped_column(Integer, unique=True, nullable=True)
    lane: Mapped[str] = mapped_column(String(32))
    kind: Mapped[str] = mapped_column(String(32))  # metadata edit, rename, move, archive, upload, ...
    effect: Mapped[str] = mapped_column(String(16))  # the intent's kind: replace, move, publish
    sidecar: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    from_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    to_path: Mapped[str] = mapped_column(Text)
    before_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    after_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    changes: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    kept: Mapped[str | None] = mapped_column(Text, nullable=True)  # the displaced original's copy
    undoes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    undone_by: Mapped[int | None] = mapped_column(Integer, nullable=True)
    at: Mapped[float] = mapped_column(Float)
    # A remote object's identity (revision 0014): target, bucket, key, etag, size, created
    remote: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    __table_args__ = (
        Index("ix_photo_effects_photo", "photo_id", "id"),
        Index("ix_photo_effects_job", "job_id", "lane"),
    )


class PhotoFile(Base):
    """What ``photojobs sync`` last recorded of a photo's file (revision 0015, ``store.sync``): its
    ``stat`` identity (size, mtime in ns, inode, device), content hash, its sidecars' signature
    (``sidecars``: of their names and ``stat``; ``sidecars_sha256``: of their content) and, per
    lane, the version and job a sync last submitted it with (``lanes``: ``{LANE: [VERSION, JOB]}``)."""

    __tablename__ = "photo_files"

    photo_id: Mapped[int] = mapped_column(ForeignKey("photos.id"), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    mtime_ns: Mapped[int] = mapped_column(BigInteger)
    inode: Mapped[int] = mapped_column(BigInteger)
    device: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    sidecars: Mapped[str | None] = mapped_column(Text, nullable=True)
    sidecars_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lanes: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    recorded_at: Mapped[float] = mapped_column(Float)


class Event(Base):
    """One row per committed state change (transactional outbox).

    ``id`` is assigned at insert and may commit out of order on PostgreSQL; ``seq`` (the
    reader's cursor) is assigned afterwards, in commit order, by ``store.events.assign_cursors``.
    """

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    seq: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    job_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    item_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    photo_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    lane: Mapped[str | None] = mapped_column(String(32), nullable=True)
    type: Mapped[str] = mapped_column(String(40))
    attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    token: Mapped[int | None] = mapped_column(Integer, nullable=True)
    worker: Mapped[str | None] = mapped_column(String(128), nullable=True)
    at: Mapped[float] = mapped_column(Float)
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    __table_args__ = (
        UniqueConstraint("seq", name="uq_events_seq"),
        Index(
            "ix_events_unsequenced",
            "id",
            postgresql_where=text("seq IS NULL"),
            sqlite_where=text("seq IS NULL"),
        ),
        Index("ix_events_job_seq", "job_id", "seq"),
    )


class Worker(Base):
    """A worker process, as its heartbeat reports it (revision 0005): ``id`` is its lease owner
    string (``host:pid:nonce``), ``lanes`` the lanes it serves, ``last_beat`` the database time of
    its latest beat, ``items_held`` how many items it held then, ``stopped_at`` set by a clean
    shutdown. Rows whose beats stopped long ago are deleted by the sweeper."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    lanes: Mapped[list[Any]] = mapped_column(JSON)
    interval: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float] = mapped_column(Float)
    last_beat: Mapped[float] = mapped_column(Float, index=True)
    items_held: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    stopped_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Revision 0013: the process's worker threads, and what each ran at the latest beat
    # ([{"thread": name, "item": id, "age": seconds}], ``store.workers.beat``).
    threads: Mapped[int | None] = mapped_column(Integer, nullable=True)
    running: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)


class LaneControl(Base):
    """A lane's control across all jobs (revision 0008, ``store.lane_control``): paused while
    ``paused_at`` (database time) is set; ``paused_by`` says who paused it."""

    __tablename__ = "lane_control"

    lane: Mapped[str] = mapped_column(String(32), primary_key=True)
    paused_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    paused_by: Mapped[str | None] = mapped_column(String(128), nullable=True)
    updated_at: Mapped[float] = mapped_column(Float)


def unindexed_state(state: str) -> ColumnElement[bool]:
    """``items.state = state`` written so that no index on ``state`` can serve it.

    For statements that pick rows by primary key (``id IN (…)``) and re-check the state: without
    statistics SQLite takes an equality on an indexed column for selective and would read every
    pending (or waiting) item through ``ix_items_lease`` instead of looking up the listed ids.
    """
    return (Item.state + "") == state


class WebSession(Base):
    """A dashboard session of the web API (revision 0007): ``id`` is the SHA-256 of the session
    cookie (the cookie itself is never stored), ``created_at``/``last_seen``/``expires_at`` are
    database times. A session ends at ``expires_at`` (absolute), after ``idle`` seconds without a
    request, or when its row is deleted (logout)."""

    __tablename__ = "web_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)
    idle: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float, index=True)


class Counter(Base):
    """A persisted metric counter (revision 0009): how many events of type ``name`` on ``lane``
    (``""``: no lane) were folded from the event log by ``store.counters``; it only grows, so a
    prune of the events leaves it as it was. The row ``(FOLD_CURSOR, "")`` holds the cursor
    (``events.seq``) folded through."""

    __tablename__ = "counters"

    name: Mapped[str] = mapped_column(String(40), primary_key=True)
    lane: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))


class IdempotencyKey(Base):
    """An ``Idempotency-Key`` a submission (scope ``jobs``) or a sync (``sync``) was given (revision
    0016, ``store.idempotency``): the SHA-256 of its request, the job it made (written in the job's
    own transaction) and, once the first request completed, what it answered."""

    __tablename__ = "idempotency_keys"

    scope: Mapped[str] = mapped_column(String(16), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    request_sha256: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    response: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)

    __table_args__ = (Index("ix_idempotency_keys_created", "created_at"),)


class JobEnd(Base):
    """A job whose ``job_finished`` event is written (revision 0016, ``store.job_end``): at most one
    per finish; a retry that reopens the job deletes it. No foreign key (last in the lock order)."""

    __tablename__ = "job_ends"

    job_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    state: Mapped[str] = mapped_column(String(16))
    finished_at: Mapped[float] = mapped_column(Float)


class WebhookState(Base):
    """A webhook target's delivery (revision 0016, ``store.webhooks``): ``target`` is the SHA-256 of
    its URL; ``cursor`` the event cursor delivered through; ``attempts`` and ``next_attempt_at``
    the current event's failed attempts and when the next is due; ``owner`` the sweeper delivering
    until ``lease_expires_at`` (one deliverer across fleets)."""

    __tablename__ = "webhook_state"

    target: Mapped[str] = mapped_column(String(64), primary_key=True)
    host: Mapped[str] = mapped_column(Text)
    cursor: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    next_attempt_at: Mapped[float] = mapped_column(Float, default=0.0, server_default=text("0"))
    delivered: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    failures: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    last_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    last_attempt_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_delivered_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    lease_expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class Schedule(Base):
    """A named command line (``sync``/``submit``) the sweepers run every ``every`` seconds or by
    ``cron`` (revision 0016, ``store.schedules``): ``next_run`` is compared-and-set by the run that
    takes a tick (one per tick across fleets); ``running_since`` is set from the claim until the
    run's job is recorded (``last_job``); a tick while the last run is unfinished counts ``skipped``."""

    __tablename__ = "schedules"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    every: Mapped[float | None] = mapped_column(Float, nullable=True)
    cron: Mapped[str | None] = mapped_column(String(128), nullable=True)
    command: Mapped[list[Any]] = mapped_column(JSON)
    paused: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    next_run: Mapped[float] = mapped_column(Float)
    last_run_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_job: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    running_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    runs: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    skipped: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    created_at: Mapped[float] = mapped_column(Float)
