"""Schedules (revision 0016's ``schedules`` table, issue 38): named ``sync``/``submit`` command lines
that the sweepers of every fleet run every ``every`` seconds or by a ``cron`` expression.

The single-run rule (docs/design.md, "Schedules"):

- **One run per tick across all fleets.** Every sweeper reads the due schedules (``next_run`` at or
  before the database's now, not paused) and takes a tick with a compare-and-set on ``next_run``:
  ``UPDATE schedules SET next_run = :next … WHERE name = :name AND next_run = :tick AND NOT paused``.
  Of the sweepers that read the same tick, one updates a row; the others update none and do nothing.
- **No overlap.** A run is its sync (``running_since`` set from the claim until the run records its
  job, refreshed by :func:`heartbeat` while it walks) and the job it submitted (``last_job``) until
  that job is finished (it has a ``job_ends`` row, ``store.job_end``; a job pruned away is finished).
  A tick while the last run is unfinished is taken the same way but runs nothing: ``skipped`` + 1.
  A run whose sweeper died (``running_since`` not refreshed for :data:`RUN_ABANDONED` s) is over.
- **One catch-up, never a burst.** The new ``next_run`` is the schedule's first tick after now
  (the caller's ``next_tick``), however many ticks passed while no sweeper ran: after downtime
  a due schedule runs once, then keeps its cadence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from .clock import db_now
from .engine import reader
from .errors import StoreError
from .models import Job, JobEnd, Schedule

#: Seconds without a heartbeat after which a run's sync is taken as abandoned (its sweeper died).
RUN_ABANDONED = 300.0
#: The longest ``last_error`` kept.
ERROR_CHARS = 2000


class UnknownSchedule(StoreError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"no schedule named {name!r}")


class ScheduleExists(StoreError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"a schedule named {name!r} exists already (remove it first)")


@dataclass(frozen=True)
class ScheduleRow:
    """A schedule as stored, and whether its last run is unfinished (``running``)."""

    name: str
    every: float | None
    cron: str | None
    command: list[str]
    paused: bool
    next_run: float
    last_run_at: float | None
    last_job: int | None
    last_error: str | None
    running_since: float | None
    runs: int
    skipped: int
    created_at: float
    running: bool = False

    def as_dict(self) -> dict[str, Any]:
        """``{name, every, cron, command, paused, running, last_run: {at, job} | null, next_run,
        skipped, runs, last_error}`` (times: epoch seconds)."""
        last = None if self.last_run_at is None else {"at": self.last_run_at, "job": self.last_job}
        return {
            "name": self.name,
            "every": self.every,
            "cron": self.cron,
            "command": list(self.command),
            "paused": self.paused,
            "running": self.running,
            "last_run": last,
            "next_run": self.next_run,
            "skipped": self.skipped,
            "runs": self.runs,
            "last_error": self.last_error,
        }


@dataclass(frozen=True)
class Claim:
    """A tick taken by this sweeper: ``run`` (its command runs now; ``at`` identifies the run for
    :func:`finish` and :func:`heartbeat`) or a skip (the last run was unfinished)."""

    name: str
    command: list[str]
    tick: float
    at: float
    run: bool


def _busy(now: Any, abandoned: float = RUN_ABANDONED) -> Any:
    """SQL: the schedule's last run is unfinished (its sync under way — a heartbeat within
    ``abandoned`` seconds —, or its job not finished)."""
    syncing = Schedule.running_since.is_not(None) & (Schedule.running_since > now - abandoned)
    job_open = (
        Schedule.last_job.is_not(None)
        & select(Job.id).where(Job.id == Schedule.last_job).exists()
        & ~select(JobEnd.job_id).where(JobEnd.job_id == Schedule.last_job).exists()
    )
    return syncing | job_open


def _columns() -> tuple[Any, ...]:
    return tuple(getattr(Schedule, c) for c in ScheduleRow.__dataclass_fields__ if c != "running")


def _row(r: Any, running: bool = False) -> ScheduleRow:
    return ScheduleRow(*r[: len(_columns())], running=bool(running))


def now(engine: Engine) -> float:
    """The database's clock (epoch seconds)."""
    with Session(reader(engine)) as s:
        return float(s.execute(select(db_now())).scalar_one())


def add(
    engine: Engine,
    name: str,
    command: Sequence[str],
    *,
    every: float | None,
    cron: str | None,
    first_run: Callable[[float], float],
) -> ScheduleRow:
    """Store a schedule whose first run is ``first_run(now)``; ``ScheduleExists`` for a taken name."""
    at = now(engine)
    try:
        with Session(engine) as s, s.begin():
            s.add(
                Schedule(
                    name=name, every=every, cron=cron, command=list(command), paused=False,
                    next_run=first_run(at), runs=0, skipped=0, created_at=at,
                )
            )  # fmt: skip
    except IntegrityError:
        raise ScheduleExists(name) from None
    return get(engine, name)


def list_all(engine: Engine) -> list[ScheduleRow]:
    """Every schedule by name, with whether its last run is unfinished."""
    with Session(reader(engine)) as s:
        rows = s.execute(select(*_columns(), _busy(db_now()).label("running")).order_by(Schedule.name)).all()
    return [_row(r, r.running) for r in rows]


def get(engine: Engine, name: str) -> ScheduleRow:
    """The schedule ``name`` (``UnknownSchedule``)."""
    with Session(reader(engine)) as s:
        r = s.execute(
            select(*_columns(), _busy(db_now()).label("running")).where(Schedule.name == name)
        ).first()
    if r is None:
        raise UnknownSchedule(name)
    return _row(r, r.running)


def remove(engine: Engine, name: str) -> None:
    """Delete the schedule ``name`` (``UnknownSchedule``); a run under way finishes, unrecorded."""
    with Session(engine) as s, s.begin():
        if s.execute(delete(Schedule).where(Schedule.name == name)).rowcount == 0:
            raise UnknownSchedule(name)


def pause(engine: Engine, name: str) -> bool:
    """Pause ``name``: no tick of it is taken; True when it was running (``UnknownSchedule``)."""
    with Session(engine) as s, s.begin():
        changed = s.execute(
            update(Schedule).where(Schedule.name == name, Schedule.paused.is_(False)).values(paused=True)
        ).rowcount
    if not changed:
        get(engine, name)  # UnknownSchedule, or it was paused already
    return bool(changed)


def resume(engine: Engine, name: str, next_tick: Callable[[ScheduleRow, float], float]) -> bool:
    """Resume ``name`` from its next tick after now (the ticks missed while paused are not run);
    True when it was paused (``UnknownSchedule``)."""
    row = get(engine, name)
    if not row.paused:
        return False
    next_run = next_tick(row, now(engine))
    with Session(engine) as s, s.begin():
        changed = s.execute(
            update(Schedule)
            .where(Schedule.name == name, Schedule.paused.is_(True))
            .values(paused=False, next_run=next_run)
        ).rowcount
    return bool(changed)


def claim_due(
    engine: Engine,
    next_tick: Callable[[ScheduleRow, float], float],
    at: float | None = None,
    abandoned: float = RUN_ABANDONED,
) -> list[Claim]:
    """Take every due tick this sweeper wins (the compare-and-set on ``next_run``; see the module),
    each in its own transaction: the runs to start and the skips counted. ``next_tick(row, now)``:
    the schedule's first tick after ``now``. ``at``: the time to claim at (tests), else the
    database's clock. ``abandoned``: seconds without a heartbeat after which a run's sync is over."""
    when = now(engine) if at is None else at
    with Session(reader(engine)) as s:
        due = s.execute(
            select(*_columns(), _busy(when, abandoned).label("running")).where(
                Schedule.paused.is_(False), Schedule.next_run <= when
            )
        ).all()
    claims = []
    for r in due:
        row = _row(r, r.running)
        values: dict[str, Any] = {"next_run": next_tick(row, when)}
        if row.running:
            values |= {"skipped": Schedule.skipped + 1}
        else:
            values |= {
                "runs": Schedule.runs + 1, "running_since": when, "last_run_at": when,
                "last_job": None, "last_error": None,
            }  # fmt: skip
        with Session(engine) as s, s.begin():
            won = s.execute(
                update(Schedule)
                .where(
                    Schedule.name == row.name,
                    Schedule.next_run == row.next_run,
                    Schedule.paused.is_(False),
                )
                .values(**values)
            ).rowcount
        if won:
            claims.append(Claim(row.name, list(row.command), row.next_run, when, not row.running))
    return claims


def heartbeat(engine: Engine, name: str, at: float) -> bool:
    """The run ``at`` of ``name`` is still syncing (``running_since`` refreshed); False when the
    run is no longer the schedule's current one."""
    with Session(engine) as s, s.begin():
        return bool(
            s.execute(
                update(Schedule)
                .where(Schedule.name == name, Schedule.last_run_at == at, Schedule.running_since.is_not(None))
                .values(running_since=db_now())
            ).rowcount
        )


def finish(engine: Engine, name: str, at: float, *, job: int | None, error: str | None) -> bool:
    """Record the end of the run ``at`` of ``name``: the job it submitted (None: nothing to do, or
    it failed) or its error. False when the schedule was removed or the run was taken as abandoned."""
    with Session(engine) as s, s.begin():
        return bool(
            s.execute(
                update(Schedule)
                .where(Schedule.name == name, Schedule.last_run_at == at)
                .values(
                    running_since=None,
                    last_job=job,
                    last_error=None if error is None else error[:ERROR_CHARS],
                )
            ).rowcount
        )
