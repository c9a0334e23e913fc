"""Lane declarations: one per lane, each overridable by environment.

A lane is a typed queue: its own Redis queue and actor, message schema, photo-lock mode, lease
TTL, time limit, attempt limit, backoff, worker threads, broker bound and backlog bound.
Environment overrides: ``PHOTOJOBS_LEASE_TTL`` and ``PHOTOJOBS_MAX_ATTEMPTS`` for every lane, and
``PHOTOJOBS_LANE_<LANE>_<FIELD>`` (e.g. ``PHOTOJOBS_LANE_EXIF_BOUND=64``) for one lane.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any

from store.errors import ConfigError

SHARED = "S"
EXCLUSIVE = "X"
NO_LOCK = ""

QUEUE_PREFIX = "photojobs."
ACTOR_PREFIX = "lane_"
INTERACTIVE_SUFFIX = ".interactive"
# Dramatiq actor priorities (lower runs first among a worker's fetched messages).
INTERACTIVE_PRIORITY = 0
NORMAL_PRIORITY = 10
# The default broker bound's floor: the top-up dispatches when a lane's queue is down to half its
# bound, so the bound sets the dispatch batch. 2 x threads x processes gave a CPU-bound lane like
# analysis (2 declared threads) 8 messages, a dispatch transaction and its Redis calls every ~4
# photos; with 32 about every 16 (README, Benchmarks: analysis).
MIN_BOUND = 32
# The most items one message may name (``LaneSpec.batch``; the schema refuses longer messages).
MAX_BATCH = 64


@dataclass(frozen=True)
class LaneSpec:
    name: str
    lock: str  # SHARED, EXCLUSIVE or NO_LOCK
    lease_ttl: float = 10.0
    time_limit: float = 600.0
    max_attempts: int = 3
    backoff: float = 1.0  # first retry delay; doubles per attempt
    backoff_max: float = 60.0
    threads: int = 4  # worker threads per worker process serving this lane
    bound: int = 0  # most messages in Redis at once; 0 = 2 x threads x fleet processes, >= MIN_BOUND
    backlog: int = 1_000_000  # most unfinished items in the store before submit refuses
    lock_retry: float = 0.2  # delay before retrying an item whose photo is locked
    cpu_bound: bool = False  # its work runs in one of the process's CPU slots (middleware.cpu_slots)
    # Most items one message names (batch messages: one fetch, claim transaction, finish transaction
    # and acknowledgement for several short items). Only an item's first attempt rides in a batch.
    batch: int = 1

    @property
    def queue(self) -> str:
        return QUEUE_PREFIX + self.name

    @property
    def actor(self) -> str:
        return ACTOR_PREFIX + self.name

    # Interactive work (``store.dispatch``: small or interactive jobs while the lane is busy) has a
    # queue and an actor of its own: not behind the lane's Redis backlog, and before its prefetched
    # messages in a worker's work queue (the actor's Dramatiq priority, ``INTERACTIVE_PRIORITY``).
    @property
    def interactive_queue(self) -> str:
        return self.queue + INTERACTIVE_SUFFIX

    @property
    def interactive_actor(self) -> str:
        return self.actor + "_interactive"

    @property
    def queues(self) -> tuple[str, str]:
        """The lane's queues: its own and its interactive one (a worker of the lane consumes both)."""
        return (self.queue, self.interactive_queue)

    def route(self, interactive: bool) -> tuple[str, str]:
        """(queue, actor) of a message of the lane."""
        return (self.interactive_queue, self.interactive_actor) if interactive else (self.queue, self.actor)

    fleet_processes: int = 2  # PHOTOJOBS_FLEET_PROCESSES: worker processes in the fleet

    @property
    def effective_bound(self) -> int:
        if self.bound > 0:
            return self.bound
        return max(MIN_BOUND, 2 * self.threads * self.fleet_processes)

    @property
    def effective_batch(self) -> int:
        """Items per message: ``batch`` (at most ``MAX_BATCH``), or 1 when an item has a single
        attempt (in a batch, a worker killed by one photo costs its batch-mates an attempt, so each
        must have one left to run alone)."""
        return max(1, min(self.batch, MAX_BATCH)) if self.max_attempts >= 2 else 1

    @property
    def item_bound(self) -> int:
        """Most items queued at once: the bound (messages) times the items a message may name."""
        return self.effective_bound * self.effective_batch

    def retry_delay(self, attempt: int) -> float:
        return min(self.backoff_max, self.backoff * (2 ** max(0, attempt - 1)))

    def message_args_valid(self, args: Any, kwargs: Any) -> str | None:
        """The lane's message schema: ``args == [item_id:int>0, token:int>=0]``, or several such
        pairs one after the other (``[id, token, id, token, …]``: a batch message, distinct items, at
        most ``MAX_BATCH``); no kwargs.

        Returns None when valid, else the reason.
        """
        if not isinstance(args, list | tuple) or len(args) < 2 or len(args) % 2:
            return f"expected args [item_id, token] (or several such pairs), got {args!r}"
        if len(args) > 2 * MAX_BATCH:
            return f"a message names at most {MAX_BATCH} items, got {len(args) // 2}"
        for item_id, token in message_pairs(args):
            if not isinstance(item_id, int) or isinstance(item_id, bool) or item_id <= 0:
                return f"item id must be a positive integer, got {item_id!r}"
            if not isinstance(token, int) or isinstance(token, bool) or token < 0:
                return f"token must be a non-negative integer, got {token!r}"
        if len(args) > 2 and len(set(args[::2])) != len(args) // 2:
            return f"a batch message names an item twice: {args!r}"
        if kwargs:
            return f"unexpected kwargs {sorted(kwargs)!r}"
        return None


def message_pairs(args: Any) -> list[tuple[Any, Any]]:
    """``[id, token, id, token, …]`` -> ``[(id, token), …]`` (a lane message's items)."""
    return list(zip(args[::2], args[1::2], strict=True))


_DEFAULTS: dict[str, LaneSpec] = {
    "noop": LaneSpec("noop", NO_LOCK, threads=8, backlog=1_000_000, batch=16),
    "analysis": LaneSpec("analysis", SHARED, threads=2, time_limit=300.0, cpu_bound=True, batch=8),
    "exif": LaneSpec("exif", EXCLUSIVE, threads=4),
    "rename": LaneSpec("rename", EXCLUSIVE, threads=4),
    "upload": LaneSpec("upload", SHARED, threads=4, time_limit=3600.0),
    "archive": LaneSpec("archive", EXCLUSIVE, threads=2, time_limit=3600.0),
}
LANE_NAMES: tuple[str, ...] = tuple(_DEFAULTS)
PHOTO_LANES: tuple[str, ...] = ("analysis", "exif", "rename", "upload", "archive")


def _coerce(value: str, like: Any, key: str = "") -> Any:
    """``value`` as the type of ``like``; a malformed or negative number raises ConfigError(key)."""
    if isinstance(like, bool):
        return value.lower() in ("1", "true", "yes")
    if isinstance(like, int | float):
        kind = "whole number" if isinstance(like, int) else "number"
        try:
            number = int(value) if isinstance(like, int) else float(value)
        except ValueError:
            raise ConfigError(key, f"{value!r} is not a {kind}") from None
        if not number >= 0 or number == float("inf"):
            raise ConfigError(key, f"must be a {kind} >= 0, not {value!r}")
        return number
    return value


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which containers and taskset narrow)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def cpu_slots(env: dict[str, str] | None = None) -> int:
    """``PHOTOJOBS_CPU_SLOTS``: items of CPU-bound lanes that do their work at once in one worker
    process (``middleware.cpu_slots``); default the usable cores. 0 or a malformed value raises
    ConfigError."""
    env = dict(os.environ) if env is None else env
    raw = env.get("PHOTOJOBS_CPU_SLOTS")
    if raw is None or raw == "":
        return usable_cores()
    slots = _coerce(raw, 0, "PHOTOJOBS_CPU_SLOTS")
    if slots < 1:
        raise ConfigError("PHOTOJOBS_CPU_SLOTS", f"must be a whole number >= 1, not {raw!r}")
    return int(slots)


def lane_spec(name: str, env: dict[str, str] | None = None) -> LaneSpec:
    """The declaration of lane ``name`` with environment overrides applied."""
    env = dict(os.environ) if env is None else env
    if name not in _DEFAULTS:
        raise KeyError(f"unknown lane {name!r}; lanes are: {', '.join(LANE_NAMES)}")
    spec = _DEFAULTS[name]
    changes: dict[str, Any] = {}
    if "PHOTOJOBS_LEASE_TTL" in env:
        changes["lease_ttl"] = _coerce(env["PHOTOJOBS_LEASE_TTL"], 0.0, "PHOTOJOBS_LEASE_TTL")
    if "PHOTOJOBS_MAX_ATTEMPTS" in env:
        changes["max_attempts"] = _coerce(env["PHOTOJOBS_MAX_ATTEMPTS"], 0, "PHOTOJOBS_MAX_ATTEMPTS")
    if "PHOTOJOBS_FLEET_PROCESSES" in env:
        changes["fleet_processes"] = _coerce(env["PHOTOJOBS_FLEET_PROCESSES"], 0, "PHOTOJOBS_FLEET_PROCESSES")
    for f in fields(LaneSpec):
        key = f"PHOTOJOBS_LANE_{name.upper()}_{f.name.upper()}"
        if key in env and f.name != "name":
            changes[f.name] = _coerce(env[key], getattr(spec, f.name), key)
    for key_field in ("lease_ttl", "time_limit", "threads", "max_attempts", "batch"):
        if key_field in changes and not changes[key_field] > 0:
            key = f"PHOTOJOBS_LANE_{name.upper()}_{key_field.upper()}"
            setting = key if key in env else f"PHOTOJOBS_{key_field.upper()}"
            raise ConfigError(setting, "must be greater than 0")
    return replace(spec, **changes) if changes else spec


def all_lanes(env: dict[str, str] | None = None) -> dict[str, LaneSpec]:
    return {name: lane_spec(name, env) for name in LANE_NAMES}


def parse_lanes(text: str | list[str]) -> list[str]:
    """``"analysis,exif"`` -> ``["analysis", "exif"]``, refusing unknown or repeated lanes."""
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text) if n.strip()]
    if not names:
        raise ValueError(f"no lanes given; lanes are: {', '.join(LANE_NAMES)}")
    unknown = [n for n in names if n not in _DEFAULTS]
    if unknown:
        raise ValueError(f"unknown lane(s) {', '.join(unknown)}; lanes are: {', '.join(LANE_NAMES)}")
    if len(set(names)) != len(names):
        raise ValueError(f"a lane appears twice in {','.join(names)}")
    return names
