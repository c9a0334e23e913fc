"""Message checks: is a message a valid lane message, and the record of one that is rejected."""

from __future__ import annotations

import logging
from typing import Any, Protocol

import dramatiq
from dramatiq.middleware import SkipMessage
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from store.events import emit
from store.lanes import ACTOR_PREFIX, LaneSpec

log = logging.getLogger("photojobs.lease")


class Owner(Protocol):
    """What the checks read from the lease middleware (its identity and engine change at boot)."""

    @property
    def engine(self) -> Engine: ...

    worker: str


def is_lane_message(message: dramatiq.Message) -> bool:
    """A message for a lane actor (other messages are left to their actors)."""
    return message.actor_name.startswith(ACTOR_PREFIX)


def lane_of(by_actor: dict[str, LaneSpec], message: Any) -> tuple[LaneSpec | None, str]:
    """The lane of a lane actor's message, and what is wrong with the message ("" if nothing)."""
    spec = by_actor.get(message.actor_name)
    if spec is None:
        return None, f"unknown lane actor {message.actor_name!r}"
    if message.queue_name != spec.route(message.actor_name == spec.interactive_actor)[0]:
        return spec, f"{spec.name} message arrived on queue {message.queue_name!r}"
    return spec, spec.message_args_valid(list(message.args), message.kwargs) or ""


def throws_of(broker: dramatiq.Broker, message: dramatiq.Message) -> tuple[type[BaseException], ...]:
    """The exceptions the message's actor declares (its ``throws`` option): they fail an item at once."""
    throws = broker.get_actor(message.actor_name).options.get("throws") or ()
    return throws if isinstance(throws, tuple) else (throws,)


class Rejections:
    """Rejected messages: logged, counted and recorded as ``message_rejected`` events."""

    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self.count = 0

    def record(self, queue: str, actor: str | None, reason: str, args: str) -> None:
        """Count a rejected message: a ``message_rejected`` event (no item changes)."""
        self.count += 1
        try:
            with Session(self.owner.engine) as s, s.begin():
                emit(
                    s,
                    "message_rejected",
                    worker=self.owner.worker,
                    detail={"reason": reason, "queue": queue, "actor": actor, "args": args},
                )
        except Exception:  # noqa: BLE001 - recording the rejection must not fail the worker
            log.exception("could not record the rejected message")

    def record_message(self, message: dramatiq.Message, reason: str) -> None:
        """Log and record ``message`` as rejected for ``reason``."""
        log.warning("rejected message %s on %s: %s", message.message_id, message.queue_name, reason)
        self.record(message.queue_name, message.actor_name, reason, repr(message.args)[:200])

    def reject(self, message: dramatiq.Message, reason: str) -> None:
        """Record ``message`` as rejected and skip it: it never runs."""
        self.record_message(message, reason)
        raise SkipMessage(reason)

    def after_nack(self, broker: dramatiq.Broker, message: dramatiq.Message) -> None:
        """Dramatiq dead-letters a message for an unknown actor: recorded as rejected."""
        if message.actor_name not in broker.actors:
            self.record_message(message, f"unknown actor {message.actor_name!r}")
