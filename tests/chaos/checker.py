"""An invariant checker for photojobs: replays the event log and compares it with the store.

``check(engine, job_ids=...)`` reads every event through ``store.events.read_events`` (following
cursors in batches), reads the items, jobs and photo locks, and returns the violations found
(an empty list means the run was correct). ``check_history`` does the same on events and a store
snapshot given by hand, which is how the checker itself is unit-tested.

What is checked:

- cursors: they run 1..N without a gap, a repeat or a step backwards;
- per item, the events are a valid walk of the state machine (``item_created`` first; a claim only
  from queued/pending with token = previous token + 1 and attempt = previous attempt + 1, where a
  cooperative pause, cancel or release gives its attempt back (only failures and expiries use one up); a lease
  holder's commit (succeeded, failed, retry, released, stopped) only while running and with the
  token and the worker of the latest claim; ``lease_expired`` only while running, bumping the token
  by one; job-level changes only from the states they apply to; tokens never go backwards);
- at most one ``item_succeeded`` per item; the stored result is the one the event reports;
- a ``stale_commit_rejected`` is justified (the token had moved on or the item had stopped running)
  and no state change with the rejected token is accepted afterwards;
- job control: an item paused/cancelled by its worker, or sent to paused/cancelled/pending by the
  store, agrees with its job's control request at that point of the log; no pause/resume after a
  cancel;
- the log's final state, token and attempt of every item equal the stored ones;
- every job has settled (each item terminal or paused); a paused item belongs to a job whose
  control is ``pause``; a cancelled job has only terminal items; no photo lock outlives its lease;
- photo locks: from the claim -> finish (or revocation) intervals of each photo, no exclusive lease
  overlaps any other lease of the same photo (lock modes come from the lane declarations).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from store.events import EventRecord, read_events
from store.jobs import job_status
from store.lanes import EXCLUSIVE, LANE_NAMES, NO_LOCK, lane_spec
from store.models import Event, Item, Job, PhotoLock

# Item states (as in store.models; spelled out so hand-made histories read plainly).
WAITING, PENDING, QUEUED, RUNNING, PAUSED = "waiting", "pending", "queued", "running", "paused"
SUCCEEDED, FAILED, CANCELLED, SKIPPED = "succeeded", "failed", "cancelled", "skipped"
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED, SKIPPED})
SETTLED_JOB_STATES = frozenset({"succeeded", "failed", "partial", "cancelled", "paused"})

JOB_EVENTS = frozenset(
    {
        "job_submitted",
        "job_cancel_requested",
        "job_pause_requested",
        "job_resumed",
        "job_retried",
        "job_finished",
    }
)
ITEM_EVENTS = frozenset(
    {
        "item_created",
        "item_queued",
        "item_republished",
        "item_claimed",
        "item_deferred",
        "item_succeeded",
        "item_failed",
        "item_retry_scheduled",
        "item_cancelled",
        "item_paused",
        "item_resumed",
        "item_released",
        "item_ready",
        "item_skipped",
        "item_claim_failed",
        "item_retried",
        "lease_expired",
        "stale_commit_rejected",
    }
)
# Lane events name no job; a sync's photo_moved (store.sync: a move found on disk) names a photo only.
OTHER_EVENTS = frozenset({"message_rejected", "lane_paused", "lane_resumed", "photo_moved"})
# File-effect intents (store.intents): recorded by a lease holder through its fence, then settled
# (applied/discarded) by that attempt, a later one, or whatever settles the intents of stopped items.
INTENT_EVENTS = frozenset({"intent_recorded", "intent_applied", "intent_discarded"})

# Events written by _set_items inside a job's cancel/pause/resume transaction, and the job event
# that closes that transaction (it is written after the item events, so it follows them in the log).
BATCH_REASONS = {
    "job cancelled": "job_cancel_requested",
    "job paused": "job_pause_requested",
    "job resumed": "job_resumed",
}
# The job control a state chosen by ``store.items.ready_state`` implies.
CONTROL_OF_READY_STATE = {PENDING: None, PAUSED: "pause", CANCELLED: "cancel"}


def default_lock_modes() -> dict[str, str]:
    """Lane -> photo lock mode ("S", "X" or ""), from the lane declarations."""
    return {name: lane_spec(name, env={}).lock for name in LANE_NAMES}


@dataclass(frozen=True)
class StoredItem:
    id: int
    job_id: int
    lane: str
    state: str
    fencing_token: int
    attempt: int
    result: dict[str, Any] | None = None
    error: str | None = None


@dataclass(frozen=True)
class StoredLock:
    photo_id: int
    item_id: int
    mode: str
    token: int


@dataclass
class Snapshot:
    """What the store holds at the end of a run (or what a unit test says it holds)."""

    items: dict[int, StoredItem] = field(default_factory=dict)
    controls: dict[int, str | None] = field(default_factory=dict)  # job id -> control request
    job_states: dict[int, str] = field(default_factory=dict)  # job id -> derived state
    locks: list[StoredLock] = field(default_factory=list)


@dataclass
class _Item:
    id: int
    job: int | None = None
    lane: str | None = None
    state: str | None = None
    token: int = 0
    attempt: int = 0
    claim_workers: dict[int, str | None] = field(default_factory=dict)  # token -> worker
    stale: dict[int, int] = field(default_factory=dict)  # rejected token -> cursor
    expired: set[int] = field(default_factory=set)
    quarantining: bool = False
    successes: int = 0
    success_result: Any = None
    has_success_detail: bool = False
    lease_expiries: int = 0
    open_lease: tuple[int, int, tuple[int, ...]] | None = None  # (claim cursor, token, photos)
    history: list[str] = field(default_factory=list)


@dataclass
class _Job:
    control: str | None = None
    submitted: int | None = None  # items announced by job_submitted
    created: int = 0
    expect: str | None = None  # the job event that must close a batch of item events
    finished: int = 0  # job_finished events since the job last came back to work (job_retried)


@dataclass
class Analysis:
    violations: list[str] = field(default_factory=list)
    events: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    quarantined: dict[int, tuple[int, int]] = field(default_factory=dict)  # item -> (attempt, expiries)
    records: list[EventRecord] = field(default_factory=list, repr=False)

    def summary(self) -> str:
        top = ", ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        return f"{self.events} events ({top}); {len(self.violations)} violation(s)"


@dataclass(frozen=True)
class _Interval:
    start: int
    end: float  # cursor of the finishing event, or +inf while the lease is held
    item: int
    token: int
    mode: str


class _Walker:
    def __init__(
        self,
        lock_modes: Mapping[str, str],
        max_attempts: int | None,
    ) -> None:
        self.lock_modes = lock_modes
        self.max_attempts = max_attempts
        self.items: dict[int, _Item] = {}
        self.jobs: dict[int, _Job] = defaultdict(_Job)
        self.intervals: dict[int, list[_Interval]] = defaultdict(list)  # photo -> lease intervals
        self.out: list[str] = []
        self.quarantined: dict[int, tuple[int, int]] = {}
        self.complete = True  # the whole log (no job pruned): job_finished's counts are checked

    # -- helpers ----------------------------------------------------------------
    def bad(self, it: _Item, e: EventRecord, msg: str) -> None:
        recent = " ".join(it.history[-10:])
        self.out.append(
            f"item {it.id} (job {it.job}, lane {it.lane}) at cursor {e.cursor} {e.type}"
            f"[token {e.token}, worker {e.worker}]: {msg}; history: {recent}"
        )

    def _photos(self, e: EventRecord) -> tuple[int, ...]:
        ids = set()
        if e.photo is not None:
            ids.add(e.photo)
        extra = (e.detail or {}).get("photos")
        if isinstance(extra, list):
            ids.update(int(p) for p in extra)
        return tuple(sorted(ids))

    def _close_lease(self, it: _Item, cursor: int) -> None:
        if it.open_lease is None:
            return
        start, token, photos = it.open_lease
        mode = self.lock_modes.get(it.lane or "", NO_LOCK)
        if mode != NO_LOCK:
            for p in photos:
                self.intervals[p].append(_Interval(start, cursor, it.id, token, mode))
        it.open_lease = None

    def _control_is(self, it: _Item, e: EventRecord, want: str | None, what: str) -> None:
        if it.job is None:
            return
        have = self.jobs[it.job].control
        if have != want:
            self.bad(
                it,
                e,
                f"{what} while its job's control is {have!r} (expected {want!r}): "
                "the job's cancel/pause/resume and this change did not serialize",
            )

    # -- the walk ---------------------------------------------------------------
    def job_event(self, e: EventRecord) -> None:
        if e.job is None:
            self.out.append(f"cursor {e.cursor}: {e.type} without a job")
            return
        job = self.jobs[e.job]
        if job.expect is not None and e.type != job.expect:
            self.out.append(
                f"job {e.job} at cursor {e.cursor}: {e.type} arrived but {job.expect} was due to close the "
                "batch of item changes before it"
            )
        job.expect = None
        if e.type == "job_submitted":
            if job.submitted is not None:
                self.out.append(f"job {e.job} at cursor {e.cursor}: submitted twice")
            job.submitted = int((e.detail or {}).get("items", -1))
            if job.submitted != job.created:
                self.out.append(
                    f"job {e.job} at cursor {e.cursor}: job_submitted announces {job.submitted} items "
                    f"but {job.created} item_created events precede it"
                )
        elif e.type == "job_cancel_requested":
            job.control = "cancel"
        elif e.type in ("job_pause_requested", "job_resumed"):
            if job.control == "cancel":
                self.out.append(f"job {e.job} at cursor {e.cursor}: {e.type} after the job was cancelled")
            job.control = "pause" if e.type == "job_pause_requested" else None
        elif e.type == "job_retried":
            job.finished = 0  # its next finish writes job_finished again (store.job_end.reopen)
            if job.control == "cancel":
                job.control = None  # a retry lifts the cancel request (a pause stays)
        elif e.type == "job_finished":
            self.job_finished(e, job)

    def job_states(self, job_id: int) -> Counter[str]:
        """The job's items by the state the log leaves them in so far."""
        return Counter(it.state for it in self.items.values() if it.job == job_id and it.state is not None)

    def job_finished(self, e: EventRecord, job: _Job) -> None:
        """Written once per finish, in the transaction that ended the job's last item: every item
        the log knows of the job has ended, and the counts it reports are theirs."""
        job.finished += 1
        if job.finished > 1:
            self.out.append(f"job {e.job} at cursor {e.cursor}: job_finished written twice for one finish")
        states = self.job_states(int(e.job or 0))
        open_ = {s: n for s, n in states.items() if s not in TERMINAL}
        if open_:
            self.out.append(f"job {e.job} at cursor {e.cursor}: job_finished while items are {dict(open_)}")
        if job.submitted is None and job.control != "cancel":
            self.out.append(f"job {e.job} at cursor {e.cursor}: job_finished before it was submitted")
        counts = (e.detail or {}).get("counts")
        if self.complete and counts != dict(states):
            have = dict(states)
            self.out.append(f"job {e.job} at cursor {e.cursor}: job_finished counts {counts}, items {have}")

    def item_event(self, e: EventRecord) -> None:
        assert e.item is not None
        it = self.items.get(e.item)
        if it is None:
            it = self.items[e.item] = _Item(e.item, job=e.job, lane=e.lane)
        it.history.append(f"{e.cursor}:{e.type}[{e.token}]")
        if e.job is not None and it.job is not None and e.job != it.job:
            self.bad(it, e, f"event names job {e.job}, the item belongs to job {it.job}")
        t, st, tok = e.type, it.state, e.token
        detail = e.detail or {}

        if t == "item_created":
            if st is not None:
                self.bad(it, e, "created twice")
            it.state = detail.get("state")
            if it.state not in (PENDING, WAITING):
                self.bad(it, e, f"created in state {it.state!r}")
            if tok not in (None, 0):
                self.bad(it, e, f"created with token {tok}")
            if it.job is not None:
                self.jobs[it.job].created += 1
            return
        if st is None:
            self.bad(it, e, "event before item_created")
            it.state = "?"
            st = it.state
        if tok is None:
            self.bad(it, e, "event without a token")
            return
        if tok < it.token and t != "stale_commit_rejected":
            self.bad(it, e, f"token went backwards ({it.token} -> {tok})")
        if t not in ("stale_commit_rejected", "item_failed"):
            it.quarantining = False  # a quarantine's item_failed follows its lease_expired at once

        if t == "item_queued":
            if st == PENDING and tok == it.token:
                it.state = QUEUED
            else:
                # The dispatcher's UPDATE is guarded by state = pending: the store did not change, so
                # the walk does not either (no cascade); only the event is wrong.
                self._need(it, e, False, tok == it.token)
                it.history[-1] += "(phantom)"
        elif t == "item_republished":
            self._need(it, e, st == QUEUED, tok == it.token)
        elif t == "item_deferred":
            self._need(it, e, st in (QUEUED, PENDING), tok == it.token)
            it.state = PENDING
        elif t == "item_claimed":
            self._need(it, e, st in (QUEUED, PENDING), tok == it.token + 1, "claimed")
            if e.attempt != it.attempt + 1:
                self.bad(it, e, f"claim attempt {e.attempt}, expected {it.attempt + 1}")
            it.state, it.token = RUNNING, tok
            it.attempt = e.attempt if e.attempt is not None else it.attempt + 1
            it.claim_workers[tok] = e.worker
            it.open_lease = (e.cursor, tok, self._photos(e))
        elif t == "item_succeeded":
            self._lease_end(it, e, SUCCEEDED)
            it.successes += 1
            if it.successes > 1:
                self.bad(it, e, f"succeeded {it.successes} times")
            it.has_success_detail = True
            it.success_result = detail.get("result")
        elif t == "item_failed":
            if st == FAILED and it.quarantining:
                it.quarantining = False
                if tok != it.token:
                    self.bad(it, e, f"quarantine with token {tok}, the item's token is {it.token}")
                if self.max_attempts is not None and it.attempt < self.max_attempts:
                    self.bad(it, e, f"quarantined after {it.attempt} attempt(s) < {self.max_attempts}")
                self.quarantined[it.id] = (it.attempt, it.lease_expiries)
            else:
                self._lease_end(it, e, FAILED)
        elif t == "item_retry_scheduled":
            to = detail.get("state")
            if to not in CONTROL_OF_READY_STATE:
                self.bad(it, e, f"retry to state {to!r}")
            elif st == RUNNING:
                self._control_is(it, e, CONTROL_OF_READY_STATE[to], f"retry into {to}")
            self._lease_end(it, e, to or "?")
        elif t == "item_released":
            to = detail.get("state")
            if to not in CONTROL_OF_READY_STATE:
                self.bad(it, e, f"released to state {to!r}")
            elif st == RUNNING:
                self._control_is(it, e, CONTROL_OF_READY_STATE[to], f"released into {to}")
            if self._lease_end(it, e, to or "?"):
                it.attempt -= 1  # a shutdown (or a resume before the stop) is no failure either
        elif t in ("item_cancelled", "item_paused"):
            to, control = (CANCELLED, "cancel") if t == "item_cancelled" else (PAUSED, "pause")
            reason = detail.get("reason")
            if st == RUNNING:
                self._control_is(it, e, control, f"stopped by its worker as {to}")
                if self._lease_end(it, e, to):
                    it.attempt -= 1  # a pause or a cancel is no failure: it does not use up an attempt
            else:
                allowed = (WAITING, PENDING, QUEUED) + ((PAUSED,) if to == CANCELLED else ())
                self._need(it, e, st in allowed, tok == it.token)
                if reason in BATCH_REASONS and it.job is not None:
                    self.jobs[it.job].expect = BATCH_REASONS[reason]
                else:  # the next lane became ready into the job's control (advance_pipeline)
                    self._control_is(it, e, control, f"made ready as {to}")
                it.state = to
        elif t == "item_retried":
            # store.retry: a failed/cancelled/skipped item back to work with fresh attempts, same token
            to = detail.get("state")
            self._need(it, e, st in (FAILED, CANCELLED, SKIPPED), tok == it.token)
            if to not in (PENDING, WAITING, PAUSED):
                self.bad(it, e, f"retried into state {to!r}")
            if it.job is not None:
                self.jobs[it.job].expect = "job_retried"
            it.state, it.attempt = to or "?", 0
        elif t == "item_resumed":
            self._need(it, e, st == PAUSED, tok == it.token)
            if it.job is not None:
                self.jobs[it.job].expect = "job_resumed"
            it.state = PENDING
        elif t == "item_ready":
            self._need(it, e, st == WAITING, tok == it.token)
            self._control_is(it, e, None, "made ready as pending")
            it.state = PENDING
        elif t == "item_skipped":
            self._need(it, e, st == WAITING, tok == it.token)
            it.state = SKIPPED
        elif t == "item_claim_failed":
            # A claim that raised and counted as an attempt: token and attempt move on, no lease.
            to = detail.get("state")
            self._need(it, e, st in (QUEUED, PENDING), tok == it.token + 1, "claim failed")
            if e.attempt != it.attempt + 1:
                self.bad(it, e, f"failed claim attempt {e.attempt}, expected {it.attempt + 1}")
            if to in CONTROL_OF_READY_STATE:
                self._control_is(it, e, CONTROL_OF_READY_STATE[to], f"failed claim into {to}")
            elif to != FAILED:
                self.bad(it, e, f"failed claim into state {to!r}")
            it.token = tok
            it.attempt = e.attempt if e.attempt is not None else it.attempt + 1
            it.state = to or "?"
            it.quarantining = to == FAILED  # its item_failed follows at once
        elif t == "lease_expired":
            to = detail.get("state")
            old = detail.get("old_token")
            self._need(it, e, st == RUNNING, tok == it.token + 1, "revoked")
            if old != it.token:
                self.bad(it, e, f"old_token {old} but the lease token was {it.token}")
            claimer = it.claim_workers.get(it.token)
            if e.worker != claimer:
                self.bad(it, e, f"revoked worker {e.worker} but the lease belonged to {claimer}")
            if to in CONTROL_OF_READY_STATE:
                self._control_is(it, e, CONTROL_OF_READY_STATE[to], f"revoked into {to}")
            elif to != FAILED:
                self.bad(it, e, f"revoked into state {to!r}")
            self._close_lease(it, e.cursor)
            it.expired.add(it.token)
            it.lease_expiries += 1
            if detail.get("charged") is False:
                it.attempt -= 1  # claimed in a batch: its worker's death is not charged to it
            # The store bumps the token by exactly one; carry on from there even if the event says
            # otherwise (reported above), so one wrong event does not cascade into every later one.
            it.token += 1
            it.state = to or "?"
            it.quarantining = to == FAILED
        elif t == "stale_commit_rejected":
            if tok == it.token and st == RUNNING:
                self.bad(it, e, "the fence rejected the current, valid lease")
            elif tok > it.token:
                self.bad(it, e, f"rejected token {tok} is newer than the item's token {it.token}")
            claimer = it.claim_workers.get(tok)
            if tok in it.claim_workers and e.worker is not None and e.worker != claimer:
                self.bad(it, e, f"rejected commit came from {e.worker}, but token {tok} was {claimer}'s")
            it.stale.setdefault(tok, e.cursor)
        else:
            self.bad(it, e, "unknown item event type")

    def intent_event(self, e: EventRecord) -> None:
        """An intent is recorded only by the current lease holder (its fenced session)."""
        it = self.items.get(e.item) if e.item is not None else None
        if it is None:
            self.out.append(f"cursor {e.cursor}: {e.type} for item {e.item}, which has no events")
            return
        it.history.append(f"{e.cursor}:{e.type}[{e.token}]")
        if e.type == "intent_recorded" and (it.state != RUNNING or e.token != it.token):
            self.bad(it, e, f"intent recorded while {it.state!r} at token {it.token}: not by the holder")

    def _need(self, it: _Item, e: EventRecord, state_ok: bool, token_ok: bool, what: str = "") -> None:
        if not state_ok:
            self.bad(it, e, f"not allowed from state {it.state!r}")
        if not token_ok and e.token is not None and e.token >= it.token:
            expected = it.token + 1 if what in ("claimed", "revoked") else it.token
            self.bad(it, e, f"token {e.token}, expected {expected}")

    def _lease_end(self, it: _Item, e: EventRecord, to: str) -> bool:
        """A lease holder's commit. Returns True when it is the current lease's (else reports)."""
        tok = e.token
        assert tok is not None
        ok = True
        if tok in it.stale:
            self.bad(it, e, f"stale commit accepted: token {tok} was rejected at cursor {it.stale[tok]}")
            ok = False
        elif tok in it.expired:
            self.bad(it, e, f"commit with token {tok} after its lease expired")
            ok = False
        elif it.state != RUNNING or tok != it.token:
            self.bad(it, e, f"lease commit while {it.state!r} at token {it.token}")
            ok = False
        claimer = it.claim_workers.get(tok)
        if ok and e.worker != claimer:
            self.bad(it, e, f"committed by {e.worker} but the lease was claimed by {claimer}")
        if ok:
            self._close_lease(it, e.cursor)
        it.state = to  # the log says so; a wrong change shows again against the store
        return ok

    # -- after the walk ---------------------------------------------------------
    def check_locks(self) -> None:
        for it in self.items.values():
            if it.open_lease is not None:
                start, token, photos = it.open_lease
                mode = self.lock_modes.get(it.lane or "", NO_LOCK)
                if mode != NO_LOCK:
                    for p in photos:
                        self.intervals[p].append(_Interval(start, float("inf"), it.id, token, mode))
        for photo, spans in self.intervals.items():
            spans.sort(key=lambda s: s.start)
            active: list[_Interval] = []
            for s in spans:
                active = [a for a in active if a.end > s.start]
                for a in active:
                    if a.item != s.item and (a.mode == EXCLUSIVE or s.mode == EXCLUSIVE):
                        end = "still held" if a.end == float("inf") else f"released at cursor {a.end}"
                        self.out.append(
                            f"photo {photo}: lock overlap: item {s.item} (token {s.token}, {s.mode}) "
                            f"claimed at cursor {s.start} while item {a.item} (token {a.token}, {a.mode}) "
                            f"held it since cursor {a.start} ({end})"
                        )
                active.append(s)


def check_cursors(events: Sequence[EventRecord], *, after: int = 0) -> list[str]:
    """Cursors must run after+1, after+2, ... without a gap, a repeat or a step back."""
    out: list[str] = []
    expected = after + 1
    for e in events:
        if e.cursor != expected:
            kind = "gap" if e.cursor > expected else "repeat or step back"
            out.append(f"cursor {kind}: expected {expected}, got {e.cursor} ({e.type}, item {e.item})")
        expected = max(expected, e.cursor + 1)
    return out


def check_history(
    events: Sequence[EventRecord],
    snapshot: Snapshot,
    *,
    job_ids: Iterable[int],
    lock_modes: Mapping[str, str] | None = None,
    max_attempts: int | None = None,
    require_settled: bool = True,
    pruned: set[int] | None = None,
) -> Analysis:
    """Check a complete event history (cursor order) against the store's final snapshot.

    ``pruned``: jobs the run pruned (not in the snapshot): each of their items must have ended in
    the history; cursors may then have gaps (events pruned before any reader saw them)."""
    jobs = sorted(set(job_ids))
    walker = _Walker(lock_modes if lock_modes is not None else default_lock_modes(), max_attempts)
    analysis = Analysis(events=len(events))
    walker.complete = not pruned
    if pruned is None:
        analysis.violations.extend(check_cursors(events))
    for e in events:
        analysis.counts[e.type] += 1
        if e.type == "item_claimed" and (e.detail or {}).get("batch"):
            analysis.counts["batched_claims"] += 1  # claimed with others of a batch message
        if e.type in JOB_EVENTS:
            walker.job_event(e)
        elif e.type in ITEM_EVENTS:
            if e.item is None:
                walker.out.append(f"cursor {e.cursor}: {e.type} without an item")
            else:
                walker.item_event(e)
        elif e.type in INTENT_EVENTS or e.type.startswith("intent_"):  # settle kinds may grow
            walker.intent_event(e)
        elif e.type not in OTHER_EVENTS:
            walker.out.append(f"cursor {e.cursor}: unknown event type {e.type!r}")
    for it in walker.items.values():
        if it.quarantining:
            walker.out.append(f"item {it.id}: revoked into failed without an item_failed event")
    for job_id, job in walker.jobs.items():
        if job.expect is not None:
            walker.out.append(f"job {job_id}: the log ends before {job.expect} closed its batch")
        ended = all(s in TERMINAL for s in walker.job_states(job_id))
        over = job.submitted is not None or job.control == "cancel"
        if ended and over and not job.finished and not (pruned and job_id in pruned):
            walker.out.append(f"job {job_id}: every item ended but no job_finished was written")
    walker.check_locks()
    out = walker.out
    for it in walker.items.values():
        if pruned and it.job in pruned and it.state not in TERMINAL:
            out.append(
                f"item {it.id} (job {it.job}): its job was pruned while the item was {it.state!r}; "
                f"history: {' '.join(it.history[-12:])}"
            )

    # The log against the store.
    for job_id in jobs:
        if job_id not in walker.jobs or walker.jobs[job_id].submitted is None:
            out.append(f"job {job_id}: no job_submitted event")
    wanted = set(jobs)
    for item in snapshot.items.values():
        if item.job_id not in wanted:
            continue
        it = walker.items.get(item.id)
        if it is None or it.state is None:
            out.append(f"item {item.id} (job {item.job_id}): stored as {item.state} but has no events")
            continue
        if (it.state, it.token, it.attempt) != (item.state, item.fencing_token, item.attempt):
            out.append(
                f"item {item.id} (job {item.job_id}): the log ends at state {it.state!r} token {it.token} "
                f"attempt {it.attempt}, the store holds {item.state!r} token {item.fencing_token} "
                f"attempt {item.attempt}; history: {' '.join(it.history[-12:])}"
            )
        if item.state == SUCCEEDED and it.has_success_detail and item.result != it.success_result:
            out.append(
                f"item {item.id} (job {item.job_id}): stored result {item.result!r} is not the result its "
                f"item_succeeded event reported ({it.success_result!r})"
            )
        control = snapshot.controls.get(item.job_id)
        if item.state == PAUSED and control != "pause":
            out.append(
                f"item {item.id} (job {item.job_id}): paused, but its job's control is {control!r}: nothing "
                f"will ever resume it; history: {' '.join(it.history[-12:])}"
            )
        if require_settled and item.state not in TERMINAL and item.state != PAUSED:
            out.append(f"item {item.id} (job {item.job_id}): not settled, still {item.state}")
        if control == "cancel" and require_settled and item.state not in TERMINAL:
            out.append(f"item {item.id} (job {item.job_id}): job cancelled but the item is {item.state}")
    for job_id in jobs:
        created = walker.jobs[job_id].created if job_id in walker.jobs else 0
        stored = sum(1 for i in snapshot.items.values() if i.job_id == job_id)
        if created != stored:
            out.append(f"job {job_id}: {created} item_created events but {stored} items stored")
        state = snapshot.job_states.get(job_id)
        if require_settled and state not in SETTLED_JOB_STATES:
            out.append(f"job {job_id}: did not settle (state {state!r})")
    for lock in snapshot.locks:
        item = snapshot.items.get(lock.item_id)
        if item is None or item.state != RUNNING or item.fencing_token != lock.token:
            held_by = f"{item.state} token {item.fencing_token}" if item else "a missing item"
            out.append(
                f"photo {lock.photo_id}: lock ({lock.mode}, token {lock.token}) of item {lock.item_id} "
                f"outlived its lease (item is {held_by})"
            )
    analysis.violations.extend(out)
    analysis.quarantined = walker.quarantined
    return analysis


# -- reading a real store ------------------------------------------------------------


def read_all_events(
    engine: Engine, *, batch: int = 500, pruned: bool = False
) -> tuple[list[EventRecord], list[str]]:
    """Every event, following cursors batch by batch, and the cursor violations seen on the way
    (none when the run pruned: deleted events leave gaps, judged against the live reader instead)."""
    events: list[EventRecord] = []
    violations: list[str] = []
    cursor = 0
    while True:
        got = read_events(engine, after=cursor, limit=batch)
        if not got:
            break
        if not pruned:
            violations.extend(check_cursors(got, after=cursor))
        events.extend(got)
        cursor = max(cursor, got[-1].cursor)
    with Session(engine) as s:
        numbered = s.execute(
            select(func.count()).select_from(Event).where(Event.seq.is_not(None), Event.seq <= cursor)
        ).scalar_one()
    if numbered != cursor and not pruned:
        violations.append(f"events table holds {numbered} numbered events up to cursor {cursor}")
    return events, violations


def read_snapshot(engine: Engine, job_ids: Iterable[int]) -> Snapshot:
    snap = Snapshot()
    ids = sorted(set(job_ids))
    with Session(engine) as s:
        for i in s.execute(select(Item).where(Item.job_id.in_(ids))).scalars():
            snap.items[i.id] = StoredItem(
                i.id, i.job_id, i.lane, i.state, i.fencing_token, i.attempt, i.result, i.error
            )
        snap.controls = dict(s.execute(select(Job.id, Job.control).where(Job.id.in_(ids))).all())
        for lock in s.execute(select(PhotoLock)).scalars():
            snap.locks.append(StoredLock(lock.photo_id, lock.item_id, lock.mode, lock.token))
        # Locks of items outside the checked jobs still need their item to judge them.
        missing = {lk.item_id for lk in snap.locks} - set(snap.items)
        if missing:
            for i in s.execute(select(Item).where(Item.id.in_(missing))).scalars():
                snap.items[i.id] = StoredItem(
                    i.id, i.job_id, i.lane, i.state, i.fencing_token, i.attempt, i.result, i.error
                )
    for job_id in ids:
        snap.job_states[job_id] = job_status(engine, job_id).state
    return snap


def analyse(
    engine: Engine,
    *,
    job_ids: Iterable[int],
    lock_modes: Mapping[str, str] | None = None,
    max_attempts: int | None = None,
    require_settled: bool = True,
    batch: int = 500,
    pruned: Iterable[int] | None = None,
    seen: Sequence[EventRecord] = (),
) -> Analysis:
    """Check the store's log and snapshot. A run that pruned passes ``pruned`` (the jobs it saw go)
    and ``seen`` (what a live reader saw): the history is the live reader's events with the final
    read on top, the pruned jobs are checked from it (every item had ended) and not in the store."""
    gone = set(pruned) if pruned is not None else None
    jobs = sorted(set(job_ids) - (gone or set()))
    snapshot = read_snapshot(engine, jobs)
    events, cursor_violations = read_all_events(engine, batch=batch, pruned=gone is not None)
    if gone is not None:
        merged = {e.cursor: e for e in seen}
        merged.update({e.cursor: e for e in events})
        events = [merged[c] for c in sorted(merged)]
    analysis = check_history(
        events,
        snapshot,
        job_ids=jobs,
        lock_modes=lock_modes,
        max_attempts=max_attempts,
        require_settled=require_settled,
        pruned=gone,
    )
    analysis.violations[:0] = cursor_violations
    analysis.records = events
    return analysis


def check(
    engine: Engine,
    *,
    job_ids: Iterable[int],
    lock_modes: Mapping[str, str] | None = None,
    max_attempts: int | None = None,
    require_settled: bool = True,
) -> list[str]:
    """The violations of the run's invariants (empty: the run was correct).

    Call it once the jobs had their time to settle (the caller owns the deadline); an unsettled
    job is reported as a violation unless ``require_settled`` is False.
    """
    return analyse(
        engine,
        job_ids=job_ids,
        lock_modes=lock_modes,
        max_attempts=max_attempts,
        require_settled=require_settled,
    ).violations
