"""``lane_actor``: declare a Dramatiq actor for a lane; the function receives its ``ItemContext``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import dramatiq
from dramatiq.middleware import TimeLimit

from middleware.batch import run_batch
from middleware.context import ItemContext, Stopped, current, current_batch
from middleware.cpu_slots import cpu_slot
from photos.errors import PhotoError
from store.lanes import lane_spec

THROWS = (PhotoError, Stopped)


def lane_actor(name: str) -> Callable[[Callable[[ItemContext], Any]], dramatiq.Actor]:
    spec = lane_spec(name)

    def declare(fn: Callable[[ItemContext], Any]) -> dramatiq.Actor:
        def work(ctx: ItemContext) -> Any:
            with cpu_slot(ctx):  # a CPU-bound lane's work waits for a core (middleware.cpu_slots)
                return fn(ctx)

        def run(*args: int) -> None:
            batch = current_batch()
            if batch is not None:  # a batch message: every claimed item in turn (middleware.batch)
                run_batch(batch, work, restart_clock=restart_clock, throws=THROWS)
                return
            ctx = current()
            assert ctx.item_id == args[0], "the middleware claimed another item than the message names"
            ctx.result = work(ctx)  # committed by the middleware through the fence

        def restart_clock(ctx: ItemContext) -> None:
            """Each item of a batch gets the lane's whole time limit (Dramatiq's TimeLimit counts
            from the message's start)."""
            for m in actor.broker.middleware:
                if isinstance(m, TimeLimit):
                    m.manager.add_timeout(threading.get_ident(), int(ctx.spec.time_limit * 1000))

        run.__name__ = run.__qualname__ = spec.actor
        run.__doc__ = fn.__doc__
        actor = dramatiq.actor(
            run,
            actor_name=spec.actor,
            queue_name=spec.queue,
            time_limit=int(spec.time_limit * 1000),
            throws=THROWS,
        )
        return actor

    return declare
