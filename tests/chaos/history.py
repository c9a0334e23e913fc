"""Hand-made event histories for testing the checker: one call per event, cursors numbered in order."""

from __future__ import annotations

from typing import Any

from store.events import EventRecord
from tests.chaos.checker import Snapshot, StoredItem, StoredLock


class History:
    """Builds a list of ``EventRecord`` the way the runtime would write them."""

    def __init__(self) -> None:
        self.events: list[EventRecord] = []
        self.lanes: dict[int, str] = {}
        self.jobs: dict[int, int] = {}  # item -> job
        self.photos: dict[int, int | None] = {}

    def add(
        self,
        type: str,
        *,
        job: int | None = None,
        item: int | None = None,
        token: int | None = None,
        attempt: int | None = None,
        worker: str | None = None,
        photo: int | None = None,
        detail: dict[str, Any] | None = None,
    ) -> History:
        if item is not None:
            job = self.jobs.get(item, job)
            photo = self.photos.get(item, photo)
        self.events.append(
            EventRecord(
                cursor=len(self.events) + 1,
                job=job,
                item=item,
                photo=photo,
                lane=self.lanes.get(item) if item is not None else None,
                type=type,
                attempt=attempt,
                token=token,
                worker=worker,
                at=float(len(self.events)),
                detail=detail,
            )
        )
        return self

    # -- job level ----------------------------------------------------------------
    def submit(
        self, job: int, items: list[int], *, lane: str = "noop", photos: list[int] | None = None
    ) -> History:
        for n, item in enumerate(items):
            self.lanes[item], self.jobs[item] = lane, job
            self.photos[item] = photos[n] if photos else None
            self.add("item_created", item=item, detail={"state": "pending"})
        return self.add("job_submitted", job=job, detail={"items": len(items)})

    def cancel(self, job: int, items: list[tuple[int, int]]) -> History:
        """items: (item, current token) of the not-yet-running items the cancel sweeps up."""
        for item, token in items:
            self.add("item_cancelled", item=item, token=token, detail={"reason": "job cancelled"})
        return self.add("job_cancel_requested", job=job, detail={"cancelled_now": len(items)})

    def pause(self, job: int, items: list[tuple[int, int]]) -> History:
        for item, token in items:
            self.add("item_paused", item=item, token=token, detail={"reason": "job paused"})
        return self.add("job_pause_requested", job=job, detail={"paused_now": len(items)})

    def resume(self, job: int, items: list[tuple[int, int]]) -> History:
        for item, token in items:
            self.add("item_resumed", item=item, token=token, detail={"reason": "job resumed"})
        return self.add("job_resumed", job=job, detail={"resumed": len(items)})

    def finished(self, job: int, state: str = "succeeded", **counts: int) -> History:
        """The job's job_finished (store.job_end), with its items' counts by state."""
        return self.add("job_finished", job=job, detail={"state": state, "counts": counts})

    # -- item level ---------------------------------------------------------------
    def queued(self, item: int, token: int) -> History:
        return self.add("item_queued", item=item, token=token)

    def claimed(
        self, item: int, token: int, attempt: int, worker: str, photos: list[int] | None = None
    ) -> History:
        detail = {"photos": photos} if photos and len(photos) > 1 else None
        return self.add("item_claimed", item=item, token=token, attempt=attempt, worker=worker, detail=detail)

    def succeeded(self, item: int, token: int, attempt: int, worker: str, result: Any = None) -> History:
        detail = {"result": result} if result else None
        return self.add(
            "item_succeeded", item=item, token=token, attempt=attempt, worker=worker, detail=detail
        )

    def stopped(self, item: int, kind: str, token: int, attempt: int, worker: str) -> History:
        """A cooperative stop: kind is "paused" or "cancelled"."""
        return self.add(
            f"item_{kind}",
            item=item,
            token=token,
            attempt=attempt,
            worker=worker,
            detail={"reason": "stopped", "state": kind},
        )

    def released(self, item: int, token: int, attempt: int, worker: str, state: str = "pending") -> History:
        return self.add(
            "item_released",
            item=item,
            token=token,
            attempt=attempt,
            worker=worker,
            detail={"reason": "shutdown", "state": state},
        )

    def expired(self, item: int, old: int, attempt: int, worker: str, state: str = "pending") -> History:
        return self.add(
            "lease_expired",
            item=item,
            token=old + 1,
            attempt=attempt,
            worker=worker,
            detail={"old_token": old, "state": state},
        )

    def stale(self, item: int, token: int, worker: str) -> History:
        return self.add(
            "stale_commit_rejected", item=item, token=token, worker=worker, detail={"what": "succeed"}
        )

    def run(self, item: int, token: int, attempt: int, worker: str, result: Any = None) -> History:
        """queued -> claimed -> succeeded, from token ``token`` (the queued one)."""
        self.queued(item, token).claimed(item, token + 1, attempt, worker)
        return self.succeeded(item, token + 1, attempt, worker, result)


def snapshot(
    history: History,
    states: dict[int, tuple[str, int, int]],
    *,
    controls: dict[int, str | None] | None = None,
    job_states: dict[int, str] | None = None,
    results: dict[int, Any] | None = None,
    locks: list[StoredLock] | None = None,
) -> Snapshot:
    """The store at the end: states = {item: (state, token, attempt)}; jobs settle as "succeeded"."""
    snap = Snapshot()
    for item, (state, token, attempt) in states.items():
        snap.items[item] = StoredItem(
            item, history.jobs[item], history.lanes[item], state, token, attempt, (results or {}).get(item)
        )
    jobs = set(history.jobs.values())
    snap.controls = {j: (controls or {}).get(j) for j in jobs}
    snap.job_states = {j: (job_states or {}).get(j, "succeeded") for j in jobs}
    snap.locks = list(locks or [])
    return snap
