"""Files another item is moving right now: the sources of its recorded (not yet settled) intents.
A photo's sidecar that is on its way with another photo's unit (a raw whose own move has landed,
its ``NAME.xmp`` not yet) is not this photo's to take. Read-only."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from .engine import reader
from .models import Intent


def moving_elsewhere(engine: Engine, paths: Iterable[str], item_id: int) -> set[str]:
    """Those of ``paths`` that are the source of a recorded intent of another item than ``item_id``
    (``ix_intents_live``: the live intents only)."""
    wanted = sorted(set(paths))
    if not wanted:
        return set()
    with Session(reader(engine)) as s:
        rows = s.execute(
            select(Intent.source).where(
                Intent.state == "recorded", Intent.item_id != item_id, Intent.source.in_(wanted)
            )
        ).scalars()
        return {r for r in rows if r}
