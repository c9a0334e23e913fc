"""What a lane message carries: one or several items (``Publish``), its Redis id, and how a dispatch's
items are planned into messages (first attempts of one job share a message; a retry goes alone)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import zip_longest
from typing import TypeVar

from store.lanes import LaneSpec


@dataclass(frozen=True)
class Publish:
    item_id: int
    token: int
    lane: str
    age: float = 0.0  # seconds since it was queued (for stale ones)
    group: int | None = None  # the message it shares with the dispatch's other items of this group
    interactive: bool = False  # its message goes to the lane's interactive queue (``is_interactive``)

    @property
    def message_id(self) -> str:
        """Deterministic: the same (item, token) is one message, so Redis can be asked if it holds it.
        A batch message's Redis id joins its items' ids (``batch_message_id``)."""
        return f"pj-{self.item_id}-{self.token}"


BATCH_ID_SEPARATOR = "."


def batch_message_id(items: Sequence[Publish]) -> str:
    """The Redis id of a message naming ``items``: ``pj-<item>-<token>`` for one item, the items'
    ids joined by ``.`` for a batch, so the sweeper can tell from an id alone which (item, token)
    pairs a held message carries (``items_of_message_id``)."""
    return BATCH_ID_SEPARATOR.join(p.message_id for p in items)


def items_of_message_id(message_id: str) -> list[str]:
    """The per-item ids (``pj-<item>-<token>``) a Redis message id stands for."""
    return message_id.split(BATCH_ID_SEPARATOR)


def message_groups(items: Sequence[Publish]) -> list[list[Publish]]:
    """The messages that carry ``items``, in order: the items of one dispatch ``group`` share a
    message, every other item (``group`` None: re-published, or published by hand) goes alone."""
    out: list[list[Publish]] = []
    shared: dict[tuple[str, int], list[Publish]] = {}
    for p in items:
        if p.group is None:
            out.append([p])
            continue
        key = (p.lane, p.group)
        if key not in shared:
            shared[key] = []
            out.append(shared[key])
        shared[key].append(p)
    return out


R = TypeVar("R")


def plan_messages(
    rows: Sequence[R],
    spec: LaneSpec,
    max_messages: int,
    job_of: Callable[[R], int],
    first_attempt: Callable[[R], bool],
) -> list[list[R]]:
    """How a dispatch's items (``rows``, in the dispatcher's fair order) travel: at most
    ``max_messages`` messages, the first ones kept (the rest stay pending for the next dispatch).

    - An item's first attempt shares a message with others *of its job* (a cancel or pause then
      takes whole messages out of the count), up to the lane's ``effective_batch`` items, sizes
      balanced; but a dispatch is spread over at least as many messages as the fleet has threads
      for the lane (or one per item), so a small job still runs on every thread.
    - A retry goes alone: an item that comes back after its worker died (or failed) never rides in
      a batch again (``first_attempt`` is False for it: a retry, or an item whose batch's worker
      died, ``ALONE``), so a photo that kills its worker in a batch is charged alone the next time.
    """
    batch = spec.effective_batch
    singles: list[list[R]] = []
    by_job: dict[int, list[R]] = {}
    for r in rows:
        if batch > 1 and first_attempt(r):
            by_job.setdefault(job_of(r), []).append(r)
        else:
            singles.append([r])
    singles = singles[: max(0, max_messages)]
    room = max_messages - len(singles)
    needed = {j: -(-len(v) // batch) for j, v in by_job.items()}
    fresh = sum(len(v) for v in by_job.values())
    target = min(room, max(sum(needed.values()), min(fresh, max(1, spec.threads * spec.fleet_processes))))
    counts = dict.fromkeys(by_job, 0)
    while sum(counts.values()) < min(target, sum(needed.values())):  # full messages, job by job in turn
        for j in counts:
            if counts[j] < needed[j] and sum(counts.values()) < target:
                counts[j] += 1
    while sum(counts.values()) < target:  # then spread: split the job whose messages are fullest
        j = max((j for j in counts if counts[j] < len(by_job[j])), key=lambda j: len(by_job[j]) / counts[j])
        counts[j] += 1
    by_job = {j: v[: counts[j] * batch] for j, v in by_job.items() if counts[j]}  # the rest waits
    per_job: list[list[list[R]]] = []
    for j, group in by_job.items():
        base, extra = divmod(len(group), counts[j])
        chunks, start = [], 0
        for k in range(counts[j]):
            n = base + (1 if k < extra else 0)
            chunks.append(group[start : start + n])
            start += n
        per_job.append(chunks)
    interleaved = [m for ms in zip_longest(*per_job) for m in ms if m is not None]
    return singles + interleaved



# ``items.message_items`` of a pending item whose worker died while it was claimed in a batch
# message (``store.sweeper.revoke_expired``): its attempt was handed back, and it rides alone next
# time, so that if it was the one that killed the worker, its next death is charged to it alone.
ALONE = 0
