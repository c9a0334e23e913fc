"""The Dramatiq internals ``middleware.dramatiq_compat`` adapts: each exists and behaves as it assumes
(against a real Redis where Redis is involved), and an unknown Dramatiq version is refused."""

from __future__ import annotations

import hashlib
import inspect
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.brokers.stub import StubBroker
from dramatiq.errors import DecodeError
from dramatiq.middleware import TimeLimit
from dramatiq.middleware.time_limit import TimeLimitExceeded
from dramatiq.worker import _WorkQueueItem

from middleware import dramatiq_compat as compat
from tests.support import wait_for

ROOT = Path(__file__).resolve().parents[2]
NS = "dramatiq"
QUEUE = "compat"
# sha256 of ``inspect.getsource(_RedisConsumer.__next__)`` in Dramatiq 2.2.1: ConsumerBase.__next__
# is a copy of it. A new hash means Dramatiq changed it: compare, update the copy, then this.
REDIS_CONSUMER_NEXT_SHA256 = "b8245bc4ab8044d67d72216baca5e5be0d07fccce15c443a5887b6397c9906e1"


def _message(redis_id: str, data: dict[str, Any] | None = None) -> dramatiq.Message:
    """A message as ``photojobs.broker`` encodes it: its Redis id in its options."""
    return dramatiq.Message(
        queue_name=QUEUE,
        actor_name="compat_actor",
        args=(1, 2),
        kwargs=data or {},
        options={"redis_message_id": redis_id},
    )


def _enqueue(broker: RedisBroker, redis_id: str, data: bytes) -> None:
    """Through the dispatch script with ``enqueue_args`` (as ``RedisPublisher`` does)."""
    args = compat.enqueue_args(broker, QUEUE, redis_id, data, maintain=True)
    broker.scripts["dispatch"](keys=[broker.namespace], args=args)


def _next(consumer: Any) -> MessageProxy:
    return wait_for(lambda: next(consumer), timeout=30, what="the consumer returns the message")


# -- the version check -------------------------------------------------------------------------------
def test_the_installed_dramatiq_is_a_known_version() -> None:
    # Given the venv's Dramatiq / When the version is checked / Then it passes
    assert dramatiq.__version__ in compat.KNOWN_VERSIONS
    compat.check_version()


def test_an_unknown_dramatiq_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given an installed Dramatiq 2.3.0
    monkeypatch.setattr(dramatiq, "__version__", "2.3.0")
    # When the version is checked, Then it is refused, naming both versions and what is adapted
    with pytest.raises(compat.UnsupportedDramatiq) as refused:
        compat.check_version(env={})
    assert "supports Dramatiq 2.2.1; installed 2.3.0" in str(refused.value)
    assert "_RedisConsumer.__next__" in str(refused.value)
    # And with the escape hatch set it is only a warning
    compat.check_version(env={compat.ALLOW_ENV: "1"})


def test_importing_the_adapter_under_an_unknown_dramatiq_fails() -> None:
    # Given a process whose Dramatiq says it is 2.3.0
    code = "import dramatiq; dramatiq.__version__ = '2.3.0'; import middleware.dramatiq_compat"
    env = {k: v for k, v in os.environ.items() if k != compat.ALLOW_ENV}
    # When it imports the adapter (as every worker does through photojobs.broker)
    refused = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, timeout=120
    )
    allowed = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**env, compat.ALLOW_ENV: "1"},
        capture_output=True,
        timeout=120,
    )
    # Then the import fails with the clear error; with the escape hatch it goes on
    assert refused.returncode != 0 and b"UnsupportedDramatiq" in refused.stderr
    assert b"installed 2.3.0" in refused.stderr
    assert allowed.returncode == 0, allowed.stderr


# -- the Redis consumer ------------------------------------------------------------------------------
def test_the_redis_consumer_next_is_the_one_copied() -> None:
    # Given Dramatiq's _RedisConsumer.__next__ / When its source is hashed / Then it is 2.2.1's
    source = inspect.getsource(_RedisConsumer.__next__)
    assert hashlib.sha256(source.encode()).hexdigest() == REDIS_CONSUMER_NEXT_SHA256


def test_the_consumer_fetches_tracks_and_acks_in_dramatiqs_key_layout(redis_url: str) -> None:
    # Given a message enqueued with enqueue_args on a real Redis
    broker = RedisBroker(url=redis_url, namespace=NS)
    client = broker.client
    redis_id = f"pj-{uuid.uuid4().hex}"
    message = _message(redis_id)
    _enqueue(broker, redis_id, message.encode())
    assert client.lrange(f"{NS}:{QUEUE}", 0, -1) == [redis_id.encode()]  # waiting
    assert client.hexists(f"{NS}:{QUEUE}.msgs", redis_id)
    # When the adapted consumer takes it
    consumer = compat.ConsumerBase(broker, QUEUE, 2, 100)
    proxy = _next(consumer)
    # Then it is the message, tracked as outstanding, and fetched into this broker's ack set
    assert proxy.message_id == message.message_id and proxy.options["redis_message_id"] == redis_id
    assert consumer.queued_message_ids == {message.message_id} and consumer.outstanding_message_count == 1
    assert consumer.misses == 0
    assert client.smembers(f"{NS}:__acks__.{broker.broker_id}.{QUEUE}") == {redis_id.encode()}
    assert client.zscore(f"{NS}:__heartbeats__", broker.broker_id) is not None
    # And once acknowledged it is gone from the ack set and the message hash
    consumer.ack(proxy)
    assert consumer.outstanding_message_count == 0
    assert not client.smembers(f"{NS}:__acks__.{broker.broker_id}.{QUEUE}")
    assert not client.hexists(f"{NS}:{QUEUE}.msgs", redis_id)
    broker.close()


def test_an_idle_consumer_calls_its_hooks_and_backs_off(redis_url: str) -> None:
    # Given a consumer on an empty queue whose hooks record their calls
    broker = RedisBroker(url=redis_url, namespace=NS)
    calls: list[Any] = []

    class Recording(compat.ConsumerBase):
        def between_polls(self) -> bool:
            calls.append("between")
            return False

        def before_fetch(self) -> None:
            calls.append("fetch")

        def idle(self, backoff_ms: float) -> None:
            calls.append(("idle", backoff_ms))

    consumer = Recording(broker, QUEUE, 2, 100)
    # When it is asked for a message twice
    assert next(consumer) is None and next(consumer) is None
    # Then each time it asked Redis and waited a backoff (compute_backoff), counting its misses
    assert [c if isinstance(c, str) else c[0] for c in calls] == ["between", "fetch", "idle"] * 2
    assert consumer.misses == 2 and all(0 < c[1] <= 100 for c in calls if isinstance(c, tuple))
    broker.close()


def test_an_undecodable_message_reaches_the_hook_and_can_be_acknowledged(redis_url: str) -> None:
    # Given a message whose data is not a Dramatiq message
    broker = RedisBroker(url=redis_url, namespace=NS)
    raw = b"not a message"
    _enqueue(broker, "pj-bad", raw)
    seen: list[DecodeError] = []

    class Catching(compat.ConsumerBase):
        def on_undecodable(self, exc: DecodeError) -> None:
            seen.append(exc)
            compat.ack_undecodable(self.broker, self.queue_name, exc.data)

    consumer = Catching(broker, QUEUE, 2, 100)
    # When the consumer takes it
    wait_for(lambda: seen or next(consumer), timeout=30, what="the undecodable message is seen")
    # Then the hook got Dramatiq's DecodeError with the raw data, and the ack removed it from Redis
    assert seen[0].data == raw and seen[0].error is not None
    assert not broker.client.hexists(f"{NS}:{QUEUE}.msgs", "pj-bad")
    assert not broker.client.smembers(f"{NS}:__acks__.{broker.broker_id}.{QUEUE}")
    broker.close()


def test_the_enqueue_arguments_use_the_brokers_maintenance_and_unpack_size(redis_url: str) -> None:
    # Given a Redis broker
    broker = RedisBroker(url=redis_url, namespace=NS)
    # When its private helpers are asked / Then they answer as enqueue_args assumes
    maintenance = broker._should_do_maintenance("enqueue")
    assert isinstance(maintenance, int) and maintenance in (0, 1)
    unpack = broker._max_unpack_size()
    assert isinstance(unpack, int) and unpack > 0
    args = compat.enqueue_args(broker, QUEUE, "pj-1", b"x", maintain=False)
    assert args[0] == "enqueue" and args[2] == QUEUE and args[3] == broker.broker_id and args[6] == 0
    assert args[-2:] == ["pj-1", b"x"]
    # And a message enqueued with them is consumed by Dramatiq's own consumer
    message = _message("pj-2", {"k": 1})
    _enqueue(broker, "pj-2", message.encode())
    proxy = _next(broker.consume(QUEUE, prefetch=1, timeout=100))
    assert proxy.message_id == message.message_id and proxy.kwargs == {"k": 1}
    broker.close()


# -- TimeLimit ---------------------------------------------------------------------------------------
def test_the_time_limit_manager_has_add_and_remove_timeout() -> None:
    # Given Dramatiq's TimeLimit / When its manager's methods are inspected / Then they take what we pass
    manager = TimeLimit().manager
    assert list(inspect.signature(manager.add_timeout).parameters) == ["thread_id", "ttl"]
    assert list(inspect.signature(manager.remove_timeout).parameters) == ["thread_id"]


def test_a_restarted_limit_interrupts_and_a_disarmed_one_does_not() -> None:
    # Given a running TimeLimit on a broker, checking every 10 ms
    limit = TimeLimit(interval=10)
    broker = StubBroker(middleware=[limit])
    limit.manager.start()
    done = threading.Event()
    outcome: dict[str, str] = {}

    def disarmed() -> None:  # armed first (the earlier deadline), then disarmed
        try:
            compat.restart_time_limit(broker, 50)
            compat.disarm_time_limit(broker)
            while not done.wait(0.01):
                pass
            for _ in range(10_000):  # bytecode for a pending asynchronous exception to land on
                pass
            outcome["disarmed"] = "ran on"
        except TimeLimitExceeded:
            outcome["disarmed"] = "interrupted"

    def armed() -> None:
        try:
            compat.restart_time_limit(broker, 50)
            while not done.wait(0.01):
                pass
            outcome["armed"] = "ran on"
        except TimeLimitExceeded:
            outcome["armed"] = "interrupted"
        finally:
            done.set()

    first = threading.Thread(target=disarmed)
    first.start()
    wait_for(lambda: first.ident in limit.manager.deadlines, timeout=30, what="the first thread armed")
    second = threading.Thread(target=armed)
    # When the second thread's limit (later than the first's) runs out
    second.start()
    second.join(60)
    first.join(60)
    # Then only the armed thread was interrupted: the manager checked the disarmed one's earlier
    # deadline in the same pass
    assert outcome == {"armed": "interrupted", "disarmed": "ran on"}


# -- the worker's work queue -------------------------------------------------------------------------
def test_a_message_taken_from_the_work_queue_goes_back_to_its_place() -> None:
    # Given a worker whose work queue holds two messages (as Dramatiq's consumer threads put them)
    worker = dramatiq.Worker(StubBroker(middleware=[]), worker_threads=1)
    a, b = MessageProxy(_message("pj-a")), MessageProxy(_message("pj-b"))
    worker.work_queue.put(_WorkQueueItem(0, a))
    worker.work_queue.put(_WorkQueueItem(0, b))
    # When the first is taken out and put back
    entry = compat.take_waiting(worker)
    assert entry is not None and entry.message is a
    compat.put_back(worker, entry)
    # Then it is first again, and the queue counts two unfinished tasks, not three
    assert worker.work_queue.unfinished_tasks == 2
    again = compat.take_waiting(worker)
    assert again is not None and again.message is a
    compat.put_back(worker, again)
    # And an empty work queue gives nothing
    empty = dramatiq.Worker(StubBroker(middleware=[]), worker_threads=1)
    assert compat.take_waiting(empty) is None


def test_the_served_queues_are_the_workers_whitelist() -> None:
    # Given a worker for some queues and one for all / Then served_queues says which
    broker = StubBroker(middleware=[])
    assert compat.served_queues(dramatiq.Worker(broker, queues={"a", "b"}, worker_threads=1)) == {"a", "b"}
    assert compat.served_queues(dramatiq.Worker(broker, worker_threads=1)) is None


def _entry(priority: int, queue_name: str) -> Any:
    message = dramatiq.Message(queue_name=queue_name, actor_name="a", args=(), kwargs={}, options={})
    return _WorkQueueItem(priority, MessageProxy(message))


def test_only_a_first_entry_of_a_lower_priority_is_taken_from_the_work_queue() -> None:
    import queue

    # Given a work queue holding a normal message, then an interactive one of another lane's queue
    work: queue.PriorityQueue[Any] = queue.PriorityQueue()
    work.put(_entry(10, "photojobs.analysis"))
    work.put(_entry(0, "photojobs.exif.interactive"))
    # Then it is first, of that queue and not of the analysis one, and only it is taken
    assert compat.first_is_below(work, 10)
    assert compat.first_is_below(work, 10, "photojobs.exif.interactive")
    assert not compat.first_is_below(work, 10, "photojobs.analysis.interactive")
    taken = compat.take_first_below(work, 10)
    assert taken is not None and taken.message.queue_name == "photojobs.exif.interactive"
    # And a normal message first is neither seen as interactive nor taken
    assert not compat.first_is_below(work, 10)
    assert compat.take_first_below(work, 10) is None
    assert work.qsize() == 1


def test_a_worker_thread_is_told_apart_from_other_threads() -> None:
    # Given a thread that is not one of a Dramatiq worker's
    # Then it is not taken for one (nothing runs inline in it)
    assert compat.current_worker_thread() is None
