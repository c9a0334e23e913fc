"""The protocol's named statements: the per-item path as text per dialect, and the shared ORM builders.

Why text and not ORM/Core expressions here: building an expression, generating its cache key and
loading ORM entities cost ~2–3 ms of CPU per transaction — more than the database's own work. These
statements are parsed by SQLAlchemy once per process (``text`` caches on its string) and carry
every protocol check in their ``WHERE`` clauses, so a claim or a finish is one ``UPDATE …
RETURNING`` plus its event row. The protocol is unchanged: the same compare-and-set on (item id,
fencing token, state), the database clock, the same events. The pipeline's statements that a
query-plan test also explains (``successors_query``, ``unfinished_in_lane``) are ORM builders here;
a statement used once stays beside its one caller, inside its documented function.
"""

# ruff: noqa: S608 - every statement here is text built once per process from constant fragments (the
# dialect's clock expression, fixed column lists and clauses); every value is a bound parameter.

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    Float,
    Integer,
    Select,
    String,
    TextClause,
    and_,
    bindparam,
    column,
    literal,
    select,
    text,
    tuple_,
)
from sqlalchemy.sql.selectable import TextualSelect

from .models import WAITING, Event, Item, ItemPhoto, Job, unindexed_state

RENEW_KEY = 4294967296  # renew matches (id, token) pairs as id * RENEW_KEY + token (tokens < 2**32)

_NOW = {
    "postgresql": "CAST(extract(epoch from clock_timestamp()) AS double precision)",
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
}

_ITEM_JSON = Item.__table__.c.checkpoint.type
_JOB_JSON = Job.__table__.c.params.type
_EVENT_JSON = Event.__table__.c.detail.type


def sql_now(dialect: str) -> str:
    """The database clock (as ``store.clock.db_now``) as SQL text."""
    return _NOW[dialect]


@cache
def claim_sql(dialect: str) -> TextualSelect:
    """Claim = one compare-and-set: queued/pending -> running with token and attempt bumped and the
    lease from the database clock, for the message's (item, token) of this lane, unless the job is
    still being submitted or the lane is paused (``store.lane_control``); it returns what the lease
    needs (the photo's current path, the job's parameters). No row: not claimable
    (``store.claims.claim`` then says why)."""
    now = sql_now(dialect)
    return text(
        f"""
        UPDATE items SET state = 'running', fencing_token = fencing_token + 1, attempt = attempt + 1,
            lease_owner = :worker, lease_ttl = :ttl, lease_expires_at = {now} + :ttl,
            ready_at = updated_at, queued_at = NULL, updated_at = {now}
        WHERE id = :item_id AND fencing_token = :token AND lane = :lane
            AND state IN ('queued', 'pending')
            AND NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.id = items.job_id AND jobs.submitting)
            AND NOT EXISTS (SELECT 1 FROM lane_control WHERE lane_control.lane = :lane
                            AND lane_control.paused_at IS NOT NULL)
        RETURNING job_id, position, photo_id, attempt, fencing_token, checkpoint,
            lease_expires_at - lease_ttl AS claimed_at, ready_at,
            (SELECT photos.path FROM photos WHERE photos.id = items.photo_id) AS photo_path,
            (SELECT jobs.params FROM jobs WHERE jobs.id = items.job_id) AS params,
            (SELECT jobs.roots FROM jobs WHERE jobs.id = items.job_id) AS roots,
            (SELECT jobs.lanes FROM jobs WHERE jobs.id = items.job_id) AS lanes
        """
    ).columns(
        column("job_id", Integer),
        column("position", Integer),
        column("photo_id", Integer),
        column("attempt", Integer),
        column("fencing_token", Integer),
        column("checkpoint", _ITEM_JSON),
        column("claimed_at", Float),
        column("ready_at", Float),
        column("photo_path", String),
        column("params", _JOB_JSON),
        column("roots", _JOB_JSON),
        column("lanes", _JOB_JSON),
    )


_CLAIM_SET = """state = 'running', fencing_token = fencing_token + 1, attempt = attempt + 1,
    lease_owner = :worker, lease_ttl = :ttl, lease_expires_at = {now} + :ttl,
    ready_at = updated_at, queued_at = NULL, updated_at = {now}
"""


@cache
def claim_many_sql(dialect: str) -> TextualSelect:
    """``claim_sql``'s compare-and-set for a batch message's items in one statement: the items
    named by ``:ids`` whose ``id * RENEW_KEY + fencing_token`` is in ``:keys`` (the message's
    (item, token) pairs), with the same checks and the same ``ready_at``, returning
    ``claim_sql``'s columns (the claim's time and the attempt's ready time: the run-time and
    queue-wait histograms) and the item's id. On PostgreSQL the named items are locked first by a
    ``SELECT … ORDER BY id FOR UPDATE`` (a materialized CTE that the ``UPDATE`` reads whole before
    its first row: the rows are locked in ascending id whatever plan the ``UPDATE`` gets); SQLite
    serializes whole write transactions.

    Only the ids are compared in a form an index serves (``state || ''``, as ``mark_queued_sql``):
    on a table not yet analyzed (a big job's first minutes) PostgreSQL's planner otherwise read
    every item of the lane through ``ix_items_dispatch`` and ``ix_items_lease`` for these few."""
    now = sql_now(dialect)
    checks = f"""
            AND id * {RENEW_KEY} + fencing_token IN :keys AND lane || '' = :lane
            AND state || '' IN ('queued', 'pending')
            AND NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.id = items.job_id AND jobs.submitting)
            AND NOT EXISTS (SELECT 1 FROM lane_control WHERE lane_control.lane = :lane
                            AND lane_control.paused_at IS NOT NULL)"""
    returning = """
        RETURNING id, job_id, position, photo_id, attempt, fencing_token, checkpoint,
            lease_expires_at - lease_ttl AS claimed_at, ready_at,
            (SELECT photos.path FROM photos WHERE photos.id = items.photo_id) AS photo_path,
            (SELECT jobs.params FROM jobs WHERE jobs.id = items.job_id) AS params,
            (SELECT jobs.roots FROM jobs WHERE jobs.id = items.job_id) AS roots,
            (SELECT jobs.lanes FROM jobs WHERE jobs.id = items.job_id) AS lanes"""
    if dialect == "postgresql":
        sql = f"""
        WITH picked AS MATERIALIZED (SELECT id FROM items WHERE id IN :ids ORDER BY id FOR UPDATE)
        UPDATE items SET {_CLAIM_SET.format(now=now)}
        WHERE id = ANY(ARRAY(SELECT id FROM picked)) {checks} {returning}
        """
    else:
        sql = f"UPDATE items SET {_CLAIM_SET.format(now=now)} WHERE id IN :ids {checks} {returning}"
    return (
        text(sql)
        .bindparams(
            # keys exceed 2**31: BIGINT
            bindparam("ids", expanding=True, type_=Integer),
            bindparam("keys", expanding=True, type_=BigInteger),
        )
        .columns(
            column("id", Integer),
            column("job_id", Integer),
            column("position", Integer),
            column("photo_id", Integer),
            column("attempt", Integer),
            column("fencing_token", Integer),
            column("checkpoint", _ITEM_JSON),
            column("claimed_at", Float),
            column("ready_at", Float),
            column("photo_path", String),
            column("params", _JOB_JSON),
            column("roots", _JOB_JSON),
            column("lanes", _JOB_JSON),
        )
    )


@cache
def end_lease_sql(dialect: str, state: str, *, result: bool = False, error: bool = False) -> TextualSelect:
    """The finishing compare-and-set with the fence folded into its ``WHERE``: a running item with
    the session's token ends in ``state`` (lease cleared). It returns the row only while the lease
    holds, and then keeps the row locked (PostgreSQL) / the write lock (SQLite) until the commit,
    so no separate fence read is needed. ``:not_before`` is a delay from the database clock."""
    now = sql_now(dialect)
    sets = [f"state = '{state}'", "lease_owner = NULL", "lease_expires_at = NULL", f"updated_at = {now}"]
    if result:
        sets.append("result = :result")
    if error:
        sets += ["error = :error", f"not_before = {now} + :delay"]
    elif result:
        sets.append("error = NULL")
    clause: TextClause = text(
        f"""
        UPDATE items SET {", ".join(sets)}
        WHERE id = :item_id AND fencing_token = :token AND state = 'running'
        RETURNING id
        """
    )
    if result:
        clause = clause.bindparams(bindparam("result", type_=_ITEM_JSON))
    return clause.columns(column("id", Integer))


@cache
def succeed_many_sql(dialect: str) -> TextualSelect:
    """``end_lease_sql``'s success for several running items with the same result in one
    statement: the items named by ``:ids`` whose ``id * RENEW_KEY + fencing_token`` is in ``:keys``
    and still ``running``; it returns the ids it matched (the others' leases are stale). On
    PostgreSQL the caller has locked the rows already, in ascending id (``lock_batch_finish``).
    Only the ids in an indexable form (``claim_many_sql`` says why)."""
    now = sql_now(dialect)
    return (
        text(
            f"""
            UPDATE items SET state = 'succeeded', lease_owner = NULL, lease_expires_at = NULL,
                updated_at = {now}, result = :result, error = NULL
            WHERE id IN :ids AND id * {RENEW_KEY} + fencing_token IN :keys AND state || '' = 'running'
            RETURNING id
            """
        )
        .bindparams(
            bindparam("ids", expanding=True, type_=Integer),
            bindparam("keys", expanding=True, type_=BigInteger),
            bindparam("result", type_=_ITEM_JSON),
        )
        .columns(column("id", Integer))
    )


@cache
def event_sql(dialect: str) -> TextClause:
    """One event row, stamped with the database clock in the same statement."""
    return text(
        f"""
        INSERT INTO events (type, job_id, item_id, photo_id, lane, attempt, token, worker, detail, at)
        VALUES (:type, :job_id, :item_id, :photo_id, :lane, :attempt, :token, :worker, :detail,
                {sql_now(dialect)})
        """
    ).bindparams(bindparam("detail", type_=_EVENT_JSON))


EVENT_COLUMNS = ("type", "job_id", "item_id", "photo_id", "lane", "attempt", "token", "worker", "detail")

# PostgreSQL: many event rows in one statement with one parameter set, its columns as arrays (an
# executemany goes through psycopg's pipeline row by row: ~0.1 ms of client CPU per row). The
# rows are numbered in array order, so their ids keep the order they were given in.
EVENTS_UNNEST_PG = text(
    f"""
    INSERT INTO events (type, job_id, item_id, photo_id, lane, attempt, token, worker, detail, at)
    SELECT u.type, u.job_id, u.item_id, u.photo_id, u.lane, u.attempt, u.token, u.worker, u.detail,
           {_NOW["postgresql"]}
    FROM unnest(CAST(:type AS text[]), CAST(:job_id AS integer[]), CAST(:item_id AS integer[]),
                CAST(:photo_id AS integer[]), CAST(:lane AS text[]), CAST(:attempt AS integer[]),
                CAST(:token AS integer[]), CAST(:worker AS text[]), CAST(:detail AS json[]))
         WITH ORDINALITY AS u(type, job_id, item_id, photo_id, lane, attempt, token, worker, detail, n)
    ORDER BY u.n
    """
)


@cache
def renew_sql(dialect: str) -> TextualSelect:
    """Heartbeat: extend the leases still held (guarded by token), returning each one's job
    control request."""
    return (
        text(
            f"""
            UPDATE items SET lease_expires_at = {sql_now(dialect)} + lease_ttl
            WHERE id IN :ids AND state = 'running' AND id * {RENEW_KEY} + fencing_token IN :keys
            RETURNING id, (SELECT jobs.control FROM jobs WHERE jobs.id = items.job_id) AS control
            """
        )
        .bindparams(bindparam("ids", expanding=True), bindparam("keys", expanding=True))
        .columns(column("id", Integer), column("control", String))
    )


# -- the dispatcher (store.dispatch.take_for_dispatch) ------------------------------------------------
# (bind types declared, so that store.scale can render them with literal values for EXPLAIN)

_LANE = bindparam("lane", type_=String)


@cache
def queued_count_sql(dialect: str) -> TextualSelect:
    """The lane's queued items and the messages they travel in (each item a 1/message_items share
    of its message; a range of ``ix_items_dispatch``, at most the lane's item bound)."""
    return (
        text(
            "SELECT count(*) AS items, coalesce(sum(1.0 / coalesce(message_items, 1)), 0) AS messages "
            "FROM items WHERE lane = :lane AND state = 'queued'"
        )
        .bindparams(_LANE)
        .columns(column("items", Integer), column("messages", Float))
    )


@cache
def next_pending_job_sql(dialect: str) -> TextualSelect:
    """The first (lane, state, job) after (``:lane``, pending, ``:after``) in ``ix_items_dispatch``
    (lane, state, job_id, id): one seek, however many items are pending; it is the next job with a
    pending item in the lane when its lane and state are still the lane and pending.

    On PostgreSQL a row-value comparison ordered like the index, so that the planner cannot prefer
    an index that starts with ``job_id``; on SQLite, whose row-value ranges are slow, the plain
    equality-and-range form of the same seek."""
    if dialect == "postgresql":
        where = "(lane, state, job_id) > (:lane, 'pending', :after)"
    else:
        where = "lane = :lane AND state = 'pending' AND job_id > :after"
    return (
        text(f"SELECT lane, state, job_id FROM items WHERE {where} ORDER BY lane, state, job_id LIMIT 1")
        .bindparams(_LANE, bindparam("after", type_=Integer))
        .columns(column("lane", String), column("state", String), column("job_id", Integer))
    )


@cache
def pending_of_job_sql(dialect: str) -> TextualSelect:
    """A job's oldest ready items in the lane (a range of ``ix_items_dispatch``)."""
    return (
        text(
            f"""
        SELECT id, fencing_token, job_id, photo_id, attempt, message_items FROM items
        WHERE lane = :lane AND state = 'pending' AND job_id = :job_id AND not_before <= {sql_now(dialect)}
        ORDER BY id LIMIT :limit
        """
        )
        .bindparams(_LANE, bindparam("job_id", type_=Integer), bindparam("limit", type_=Integer))
        .columns(
            column("id", Integer),
            column("fencing_token", Integer),
            column("job_id", Integer),
            column("photo_id", Integer),
            column("attempt", Integer),
            column("message_items", Integer),  # 0: its worker died holding it in a batch (goes alone)
        )
    )


@cache
def mark_queued_sql(dialect: str) -> TextualSelect:
    """The picked items, still pending, become queued: by primary key (the state compared in a
    form no index serves, so SQLite does not read every pending item through the state index).
    ``updated_at`` stays when the item became ready (pending): the claim reads it as ``ready_at``
    and the lane's oldest ready age (``store.listing``) too; ``queued_at`` says when it was queued."""
    now = sql_now(dialect)
    return (
        text(
            f"""
            UPDATE items SET state = 'queued', queued_at = {now}, message_items = NULL
            WHERE id IN :ids AND state || '' = 'pending'
            RETURNING id
            """
        )
        .bindparams(bindparam("ids", expanding=True, type_=Integer))
        .columns(column("id", Integer))
    )


@cache
def message_items_sql(dialect: str) -> TextClause:
    """Queued items that share a message of ``:n`` items (by primary key)."""
    return text("UPDATE items SET message_items = :n WHERE id IN :ids").bindparams(
        bindparam("ids", expanding=True, type_=Integer), bindparam("n", type_=Integer)
    )


# -- releasing photo locks and recording a photo's hash (the finish of a photo lane) ----------------

LIVE_INTENT = text(
    "SELECT id FROM intents WHERE item_id = :item_id AND state = 'recorded' ORDER BY id LIMIT 1"
).bindparams(bindparam("item_id", type_=Integer))
DROP_LOCKS = text("DELETE FROM photo_locks WHERE item_id = :item_id")
# The usual release in one statement: the item's lock rows go unless it has an unsettled intent
# (then nothing is deleted and ``store.finishing.release_locks`` hands them to the intent).
DROP_LOCKS_UNLESS_INTENT = text(
    "DELETE FROM photo_locks WHERE item_id = :item_id AND NOT EXISTS "
    "(SELECT 1 FROM intents WHERE intents.item_id = :item_id AND intents.state = 'recorded')"
).bindparams(bindparam("item_id", type_=Integer))
# A batch finish's releases in one statement (``store.finishing.release_locks_together``): the
# items it names drop their rows unless they have an unsettled intent; it returns the ones it dropped.
DROP_MANY_LOCKS_UNLESS_INTENT = (
    text(
        "DELETE FROM photo_locks WHERE item_id IN :ids AND NOT EXISTS (SELECT 1 FROM intents "
        "WHERE intents.item_id = photo_locks.item_id AND intents.state = 'recorded') RETURNING item_id"
    )
    .bindparams(bindparam("ids", expanding=True, type_=Integer))
    .columns(column("item_id", Integer))
)
LOCKS_TO_INTENT = text("UPDATE photo_locks SET intent_id = :intent_id WHERE item_id = :item_id")


@cache
def photo_hash_sql(dialect: str) -> TextClause:
    """A photo lane's finish records the photo's hash and size (``store.intents``)."""
    now = sql_now(dialect)
    return text(f"UPDATE photos SET sha256 = :sha256, size = :size, updated_at = {now} WHERE id = :photo_id")


# -- the pipeline: an item's photos, its successors, a lane's unfinished items (ORM builders) ------


def item_photos_query(item_id: int) -> Select[tuple[int]]:
    """The photos of a bundle item (``item_photos``); an item with one photo has none there."""
    return select(ItemPhoto.photo_id).where(ItemPhoto.item_id == item_id)


def job_for_change(job_id: int, *columns: Any) -> Select[Any]:
    """The job row (or ``columns`` of it) locked for a change of its own columns — cancel, pause,
    resume, retry, discard: ``FOR NO KEY UPDATE`` on PostgreSQL, the lock its own ``UPDATE`` takes.
    Not ``FOR UPDATE``: that one also conflicts with the ``KEY SHARE`` lock PostgreSQL's foreign-key
    check takes on the job when a transaction updates one of its items a second time, after that
    item's row lock — the job → item order turned around, a deadlock with any transaction holding
    the job and waiting for that item (docs/design.md, "The dispatcher locks its jobs first"). It
    still conflicts with every share lock the claim, finish, dispatch and sweeper paths take on
    the job. Only a prune, which deletes jobs, locks them ``FOR UPDATE`` (``store.retention``)."""
    return select(*(columns or (Job,))).where(Job.id == job_id).with_for_update(key_share=True)


def job_control_shared(job_id: int) -> Select[tuple[str | None]]:
    """The job's control request under a share lock (lock order: the job before any of its items)."""
    return select(Job.control).where(Job.id == job_id).with_for_update(read=True)


def successors_query(job_id: int, position: int, photo_ids: Sequence[int]) -> Select[Any]:
    """Waiting items of later lanes for these photos: ``ix_items_job_photo`` (job, photo, position);
    the columns the finish needs, not ORM entities."""
    return select(Item.id, Item.photo_id, Item.lane, Item.fencing_token, Item.position).where(
        Item.job_id == job_id,
        Item.position > position,
        Item.photo_id.in_(photo_ids),
        unindexed_state(WAITING),
    )


def unfinished_in_lane(job_id: int, lane: str, state: str, dialect: str) -> Select[tuple[int, str, str]]:
    """The first (job, lane, state) at or after (``job_id``, ``lane``, ``state``) in
    ``ix_items_job_state``: one seek that stops at the first row. An item of the lane is in
    ``state`` when that row equals the key. On PostgreSQL a row-value comparison in the index's
    order, so the planner cannot prefer reading the table for a LIMIT 1; on SQLite plain equalities
    (its row-value ranges are slow)."""
    if dialect == "postgresql":
        key = tuple_(Item.job_id, Item.lane, Item.state)
        where = key >= tuple_(literal(job_id), literal(lane), literal(state))
    else:
        where = and_(Item.job_id == job_id, Item.lane == lane, Item.state == state)
    return (
        select(Item.job_id, Item.lane, Item.state)
        .where(where)
        .order_by(Item.job_id, Item.lane, Item.state)
        .limit(1)
    )
