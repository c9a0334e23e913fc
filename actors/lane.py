"""``lane_actor``: declare a Dramatiq actor for a lane; the function receives its ``ItemContext``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dramatiq

from middleware.context import ItemContext, Stopped, current
from middleware.cpu_slots import cpu_slot
from photos.errors import PhotoError
from store.lanes import lane_spec


def lane_actor(name: str) -> Callable[[Callable[[ItemContext], Any]], dramatiq.Actor]:
    spec = lane_spec(name)

    def declare(fn: Callable[[ItemContext], Any]) -> dramatiq.Actor:
        def run(item_id: int, token: int) -> None:
            ctx = current()
            assert ctx.item_id == item_id, "the middleware claimed another item than the message names"
            with cpu_slot(ctx):  # a CPU-bound lane's work waits for a core (middleware.cpu_slots)
                ctx.result = fn(ctx)  # committed by the middleware through the fence

        run.__name__ = run.__qualname__ = spec.actor
        run.__doc__ = fn.__doc__
        return dramatiq.actor(
            run,
            actor_name=spec.actor,
            queue_name=spec.queue,
            time_limit=int(spec.time_limit * 1000),
            throws=(PhotoError, Stopped),
        )

    return declare
