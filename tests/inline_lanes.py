"""Run a photo lane's own code on one item in the test's process: claimed, run, finished through the
store like a worker would (no Dramatiq, no Redis), in the order the test chooses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from actors.undo import undoable
from middleware.context import Deferred, ItemContext
from photos.errors import PhotoError
from store import items as store_items
from store.fencing import fenced
from store.finishing import fail, stop, succeed
from store.lanes import lane_spec
from store.models import Item


def lane_code(lane: str) -> Callable[[ItemContext], dict[str, Any]]:
    """The plain function behind a lane's actor."""
    from actors.analysis import analyse_photo
    from actors.archive import archive_photo
    from actors.exif import edit_photo
    from actors.rename import rename_photo
    from actors.upload import upload_photo

    return {"analysis": analyse_photo, "exif": edit_photo, "rename": rename_photo,
            "upload": upload_photo, "archive": archive_photo}[lane]  # fmt: skip


def run_item(engine: Engine, item: Item, *, fail_refused: bool = False) -> dict[str, Any]:
    """Claim ``item`` (as it is now in the store), run its lane's code on it and finish it.
    ``fail_refused``: an item refused (PhotoError) is failed for good as a worker fails it (its
    later lanes skipped, its photo locks released) before the error is raised."""
    spec = lane_spec(item.lane, env={})
    outcome = store_items.claim(engine, spec, item.id, item.fencing_token, "test-worker")
    assert outcome.lease is not None, outcome
    ctx = ItemContext(lease=outcome.lease, spec=spec, engine=engine, worker="test-worker")
    try:
        result = undoable(lane_code(item.lane))(ctx)  # an undo job's item reverses instead (actors.undo)
    except Deferred as exc:  # waits for another item of its job: pending again, as a worker leaves it
        with fenced(engine, item.id, outcome.lease.token, worker="test-worker") as s:
            stop(s, outcome.lease, "test-worker", str(exc), delay=exc.delay)
        return {"deferred": exc.reason}
    except PhotoError as exc:
        if fail_refused:
            with fenced(engine, item.id, outcome.lease.token, worker="test-worker") as s:
                fail(s, spec, outcome.lease, str(exc), "test-worker", retry=False)
        raise
    with fenced(engine, item.id, outcome.lease.token, worker="test-worker") as s:
        succeed(s, outcome.lease, result, "test-worker", ctx.at_finish)
    return result


def run_lane(engine: Engine, job_id: int, lane: str) -> dict[int, dict[str, Any]]:
    """Every item of the job's ``lane``, in id order; their results by photo id."""
    with Session(engine) as s:
        items = s.execute(
            select(Item).where(Item.job_id == job_id, Item.lane == lane).order_by(Item.id)
        ).scalars().all()
        for item in items:
            s.expunge(item)
    return {item.photo_id: run_item(engine, item) for item in items}  # type: ignore[misc]
