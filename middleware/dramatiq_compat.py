"""The one place photojobs touches Dramatiq's private APIs, checked against the versions it was written for.

What it adapts (each has a test in ``tests/unit/test_dramatiq_compat.py``):

- ``dramatiq.brokers.redis._RedisConsumer``: ``ConsumerBase`` subclasses it; ``ConsumerBase.__next__``
  is a copy of its ``__next__`` (message cache, ``queued_message_ids``, ``misses``,
  ``outstanding_message_count``, ``broker.do_fetch``) with hooks for the doorbell and for a message
  that does not decode;
- ``RedisBroker._should_do_maintenance``, ``RedisBroker._max_unpack_size``, ``scripts["dispatch"]``,
  ``broker_id``, ``dead_message_ttl``: the arguments of the enqueue script (``enqueue_args``), for a
  pipelined publish;
- Dramatiq's Redis key layout (``<ns>:<queue>.msgs``, ``<ns>:__acks__.<broker>.<queue>``,
  ``<ns>:__heartbeats__``), read by ``ack_undecodable`` and ``photojobs.broker``'s ``_WHERE_LUA``;
- ``TimeLimit.manager.add_timeout`` / ``remove_timeout`` (``restart_time_limit``, ``disarm_time_limit``);
- ``Worker.work_queue`` (a ``PriorityQueue`` of ``_WorkQueueItem`` with ``.priority`` and
  ``.message``) and ``Worker.consumer_whitelist`` (``take_waiting``, ``put_back``, ``take_first_below``,
  ``first_is_below``, ``served_queues``);
- ``WorkerThread.work_queue`` and ``WorkerThread.process_message`` (``current_worker_thread``,
  ``process_inline``): a worker thread runs a message it took from the work queue itself.

Importing this module checks ``dramatiq.__version__`` against ``KNOWN_VERSIONS`` and raises
``UnsupportedDramatiq`` for any other version: an upgrade must be checked (run the compat tests,
then add the version) rather than break the lease protocol silently. Escape hatch, at your own
risk: ``PHOTOJOBS_ALLOW_UNKNOWN_DRAMATIQ=1`` logs a warning instead of raising.
"""

from __future__ import annotations

import contextvars
import logging
import os
import queue
import threading
import time
from typing import Any

import dramatiq
import redis
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.common import compute_backoff, current_millis
from dramatiq.errors import ConnectionClosed, DecodeError
from dramatiq.message import Message
from dramatiq.middleware import TimeLimit
from dramatiq.worker import WorkerThread

KNOWN_VERSIONS = ("2.2.1",)
ALLOW_ENV = "PHOTOJOBS_ALLOW_UNKNOWN_DRAMATIQ"
ADAPTED = (
    "_RedisConsumer.__next__, RedisBroker._should_do_maintenance and _max_unpack_size, the Redis key "
    "layout, TimeLimit.manager.add_timeout/remove_timeout, Worker.work_queue, "
    "WorkerThread.work_queue/process_message"
)
log = logging.getLogger("photojobs.dramatiq_compat")


class UnsupportedDramatiq(RuntimeError):
    """The installed Dramatiq is not a version whose private APIs this module was checked against."""


def check_version(version: str | None = None, env: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Raise ``UnsupportedDramatiq`` unless ``version`` (default: the installed one) is known, or
    ``PHOTOJOBS_ALLOW_UNKNOWN_DRAMATIQ=1`` is set (then only a warning is logged)."""
    version = dramatiq.__version__ if version is None else version
    if version in KNOWN_VERSIONS:
        return
    msg = (
        f"photojobs supports Dramatiq {', '.join(KNOWN_VERSIONS)}; installed {version}: the private "
        f"APIs it adapts ({ADAPTED}) may have changed. Run tests/unit/test_dramatiq_compat.py and add "
        f"the version to middleware.dramatiq_compat.KNOWN_VERSIONS, or set {ALLOW_ENV}=1 at your own risk"
    )
    if env.get(ALLOW_ENV) == "1":
        log.warning("%s", msg)
        return
    raise UnsupportedDramatiq(msg)


check_version()


# -- the Redis consumer ------------------------------------------------------------------------------
class ConsumerBase(_RedisConsumer):
    """Dramatiq's Redis consumer with hooks: ``on_undecodable`` for a message that does not decode
    (instead of the consumer crashing), ``between_polls`` / ``before_fetch`` / ``longest_backoff`` /
    ``idle`` for how an idle consumer waits (Dramatiq sleeps)."""

    def __next__(self):  # type: ignore[no-untyped-def]
        while True:
            try:
                return self._next_message()
            except DecodeError as exc:
                self.on_undecodable(exc)

    def on_undecodable(self, exc: DecodeError) -> None:
        raise exc

    def between_polls(self) -> bool:
        """True when the consumer waited instead of asking Redis (``__next__`` returns None)."""
        return False

    def before_fetch(self) -> None:
        """Called just before Redis is asked for messages."""

    def longest_backoff(self) -> float:
        """The longest idle wait, in ms."""
        return float(self.timeout)

    def idle(self, backoff_ms: float) -> None:
        """Wait ``backoff_ms`` after a fetch that found nothing."""
        time.sleep(backoff_ms / 1000)

    def _next_message(self) -> MessageProxy | None:
        """``_RedisConsumer.__next__`` of Dramatiq 2.2.1 (its source is pinned by a test) with the hooks."""
        try:
            while True:
                try:
                    data = self.message_cache.pop(0)
                    if data is None:
                        continue
                    self.misses = 0
                    message = Message.decode(data)
                    self.queued_message_ids.add(message.message_id)
                    return MessageProxy(message)
                except IndexError:
                    if self.between_polls():
                        return None
                    self.before_fetch()
                    messages = []
                    if self.outstanding_message_count < self.prefetch:
                        self.message_cache = messages = self.broker.do_fetch(
                            self.queue_name, self.prefetch - self.outstanding_message_count
                        )
                    if not messages:
                        self.misses, backoff_ms = compute_backoff(
                            self.misses, max_backoff=self.longest_backoff()
                        )
                        self.idle(backoff_ms)
                        return None
        except redis.ConnectionError as e:
            raise ConnectionClosed(e) from None


def ack_undecodable(broker: RedisBroker, queue_name: str, raw: bytes) -> None:
    """Acknowledge the message whose stored data is ``raw`` (it never became a Message to ack)."""
    for redis_id, data in broker.client.hscan_iter(f"{broker.namespace}:{queue_name}.msgs"):
        if data == raw:
            broker.do_ack(queue_name, redis_id.decode())
            return


def enqueue_args(
    broker: RedisBroker, queue_name: str, message_id: str, data: bytes, *, maintain: bool
) -> list[Any]:
    """The arguments ``RedisBroker.do_enqueue`` gives the dispatch script (``broker.scripts["dispatch"]``,
    keys ``[broker.namespace]``); ``maintain``: let Dramatiq's random maintenance run in this call."""
    return [
        "enqueue",
        current_millis(),
        queue_name,
        broker.broker_id,
        broker.heartbeat_timeout,
        broker.dead_message_ttl,
        broker._should_do_maintenance("enqueue") if maintain else 0,
        broker._max_unpack_size(),
        message_id,
        data,
    ]


# -- TimeLimit -----------------------------------------------------------------------------------------
def _time_limits(broker: dramatiq.Broker) -> list[TimeLimit]:
    return [m for m in broker.middleware if isinstance(m, TimeLimit)]


def restart_time_limit(broker: dramatiq.Broker, limit_ms: int) -> None:
    """The current worker thread's time limit counts ``limit_ms`` from now."""
    for m in _time_limits(broker):
        m.manager.add_timeout(threading.get_ident(), limit_ms)


def disarm_time_limit(broker: dramatiq.Broker) -> None:
    """Stop Dramatiq's ``TimeLimit`` clock for the current worker thread."""
    for m in _time_limits(broker):
        m.manager.remove_timeout(threading.get_ident())


# -- the worker's work queue ---------------------------------------------------------------------------
def take_waiting(worker: dramatiq.Worker) -> Any | None:
    """The next entry of the worker process's work queue (``entry.message``), taken out; None if empty.
    Give it back with ``put_back``."""
    try:
        return worker.work_queue.get_nowait()
    except queue.Empty:
        return None


def put_back(worker: dramatiq.Worker, entry: Any) -> None:
    """``entry`` back in the work queue, at its place (its priority and queue time)."""
    worker.work_queue.put(entry)
    worker.work_queue.task_done()  # the put counted a second task for one message


def take_first_below(work_queue: queue.PriorityQueue[Any], priority: int) -> Any | None:
    """The work queue's first entry, taken out, if its Dramatiq priority is below ``priority``
    (a message of an actor that goes first); None otherwise. One look and one take under the
    queue's own lock: two threads never both take it, and a normal message is never taken."""
    with work_queue.not_empty:
        if not work_queue.queue or work_queue.queue[0].priority >= priority:  # a heap: [0] is first
            return None
        entry = work_queue._get()  # what PriorityQueue.get does under this lock
        work_queue.not_full.notify()
        return entry


def first_is_below(
    work_queue: queue.PriorityQueue[Any], priority: int, queue_name: str | None = None
) -> bool:
    """Whether the work queue's first entry has a Dramatiq priority below ``priority`` (and, given
    ``queue_name``, came from that queue): a look only."""
    with work_queue.mutex:
        if not work_queue.queue or work_queue.queue[0].priority >= priority:
            return False
        return queue_name is None or work_queue.queue[0].message.queue_name == queue_name


def current_worker_thread() -> WorkerThread | None:
    """This thread, if it is one of a Dramatiq worker's threads (it has a work queue and runs
    messages), else None (a test calling an actor directly, the heartbeat thread)."""
    thread = threading.current_thread()
    return thread if isinstance(thread, WorkerThread) else None


def process_inline(thread: WorkerThread, entry: Any) -> None:
    """Run ``entry``'s message in this worker thread now, through every middleware hook, ack
    included, as the thread's own loop would (``WorkerThread.process_message``). In a copy of the
    thread's context: Dramatiq's ``CurrentMessage`` (a context variable) is the caller's again after."""
    contextvars.copy_context().run(thread.process_message, entry.message)


def served_queues(worker: dramatiq.Worker) -> set[str] | None:
    """The queues the worker consumes (``--queues``), None for all."""
    queues = getattr(worker, "consumer_whitelist", None)
    return set(queues) if queues else None
