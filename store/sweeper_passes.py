"""When each sweeper duty last passed (issue 41: an alert on a stalled sweeper).

After a pass the sweeper records, for every duty that ran without an error since its last record,
the database time (``#pass`` rows of table ``counters``, lane = the duty's name) and the duty's
interval (``#every`` rows), at most once per ``RECORD_EVERY`` seconds (one small transaction). The
metrics read them as ages (``photojobs_sweeper_last_pass_age_seconds``): several sweepers share the
rows, so the age is that of the newest pass of any of them. The rows are not counters: their names
start with ``#``, which ``store.counters.read`` leaves out of the folded totals.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import Engine, cast, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.types import BigInteger

from .clock import db_now
from .engine import reader
from .models import Counter

PASS = "#pass"  # noqa: S105 - a row name, not a secret
EVERY = "#every"
RECORD_EVERY = 5.0  # seconds between two records of one sweeper


def record_passes(engine: Engine, intervals: Mapping[str, float]) -> None:
    """Record that the duties of ``intervals`` (name -> interval in seconds) passed now."""
    if not intervals:
        return
    dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
    now = cast(db_now(), BigInteger)
    rows = [{"name": PASS, "lane": duty, "value": now} for duty in sorted(intervals)]
    rows += [{"name": EVERY, "lane": duty, "value": round(intervals[duty])} for duty in sorted(intervals)]
    with Session(engine) as s, s.begin():
        stmt = dialect.insert(Counter).values(rows)
        s.execute(
            stmt.on_conflict_do_update(
                index_elements=[Counter.name, Counter.lane], set_={"value": stmt.excluded.value}
            )
        )


def pass_ages(engine: Engine) -> dict[str, tuple[float, float]]:
    """duty -> (seconds since its last recorded pass, its interval), database clock."""
    with Session(reader(engine)) as s:
        now = float(s.execute(select(db_now())).scalar_one())
        rows = s.execute(
            select(Counter.name, Counter.lane, Counter.value).where(Counter.name.in_((PASS, EVERY)))
        ).all()
    passed = {lane: float(v) for name, lane, v in rows if name == PASS}
    every = {lane: float(v) for name, lane, v in rows if name == EVERY}
    return {duty: (max(0.0, now - at), every.get(duty, 0.0)) for duty, at in sorted(passed.items())}
