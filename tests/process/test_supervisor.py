"""Supervisor: each worker slot is restarted alone, gives up after too many crashes, stops cleanly."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker

from photojobs.embedded_redis import EmbeddedRedis, find_redis_server
from photojobs.supervisor import Supervisor, SupervisorEvent
from tests.support import alive, unavailable, wait_for

# A long-running worker: starts a grandchild in its own process group (like dramatiq's worker
# processes), records "<pid> <grandchild pid>" atomically in <dir>/worker-<index>-<pid>.pid, then
# idles.  With "ignore-term" it ignores SIGTERM so only SIGKILL ends it.
WORKER = """
import os, signal, subprocess, sys, time
directory, index, mode = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(1)"])
path = os.path.join(directory, f"worker-{index}-{os.getpid()}.pid")
with open(path + ".tmp", "w") as fh:
    fh.write(f"{os.getpid()} {child.pid}")
os.rename(path + ".tmp", path)
print(f"worker {index} up", flush=True)
while True:
    time.sleep(1)
"""


def recorded(directory: Path, index: int, pid: int | None) -> tuple[int, int] | None:
    """(worker pid, grandchild pid) written by the worker with that pid, if it has written it."""
    if pid is None:
        return None
    path = directory / f"worker-{index}-{pid}.pid"
    if not path.exists():
        return None
    worker, child = path.read_text().split()
    return int(worker), int(child)


class Recorder:
    def __init__(self) -> None:
        self.events: list[SupervisorEvent] = []
        self.lock = threading.Lock()

    def __call__(self, event: SupervisorEvent) -> None:
        with self.lock:
            self.events.append(event)

    def of(self, kind: str, index: int | None = None) -> list[SupervisorEvent]:
        with self.lock:
            return [e for e in self.events if e.kind == kind and (index is None or e.index == index)]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def supervisors() -> Iterator[list[Supervisor]]:
    created: list[Supervisor] = []
    yield created
    for sup in created:
        sup.stop(timeout=2)


def worker_factory(directory: Path, mode: str = "normal") -> Callable[[int], list[str]]:
    return lambda index: [sys.executable, "-c", WORKER, str(directory), str(index), mode]


def wait_all_up(sup: Supervisor, directory: Path) -> list[tuple[int, int]]:
    def ready() -> bool:
        return all(recorded(directory, i, pid) for i, pid in enumerate(sup.pids()))

    wait_for(ready, what="all workers to record their pids")
    return [recorded(directory, i, pid) for i, pid in enumerate(sup.pids())]  # type: ignore[misc]


def test_sigkilled_worker_is_restarted_alone(
    tmp_path: Path, recorder: Recorder, supervisors: list[Supervisor]
) -> None:
    # Given three supervised workers, each in its own process group
    sup = Supervisor(
        worker_factory(tmp_path), 3, backoff_initial=0.05, on_event=recorder, log_dir=tmp_path / "logs"
    )
    supervisors.append(sup)
    sup.start()
    before = wait_all_up(sup, tmp_path)
    assert len({os.getpgid(pid) for pid, _ in before}) == 3
    victim_pid, victim_child = before[1]
    # When worker 1 is SIGKILLed
    os.kill(victim_pid, signal.SIGKILL)
    # Then slot 1 is restarted with a new process and a restarted event
    wait_for(lambda: recorder.of("restarted", 1), what="the restarted event")
    wait_for(lambda: recorded(tmp_path, 1, sup.pids()[1]) is not None, what="the new worker 1 to come up")
    after = wait_all_up(sup, tmp_path)
    assert after[1][0] != victim_pid
    # And the other workers were not touched
    assert after[0] == before[0] and after[2] == before[2]
    assert all(alive(pid) and alive(child) for i, (pid, child) in enumerate(after))
    # And the dead worker's leftover grandchild was cleaned up with its process group
    wait_for(lambda: not alive(victim_child), what="the killed worker's grandchild to be cleaned up")
    # And the restart is counted and reported with how the worker died
    assert sup.restarts == 1
    assert sup.restart_counts() == [0, 1, 0]
    [exited] = recorder.of("exited")
    assert (exited.index, exited.pid, exited.signal, exited.returncode) == (1, victim_pid, "SIGKILL", -9)
    [restarted] = recorder.of("restarted")
    assert (restarted.index, restarted.pid, restarted.restarts) == (1, after[1][0], 1)
    assert not sup.failed and sup.gave_up_slots == []
    # And worker output went to its log file
    wait_for(lambda: "worker 1 up" in (tmp_path / "logs" / "worker-1.log").read_text(), what="log")


def test_worker_that_always_exits_is_given_up_after_max_restarts(
    tmp_path: Path, recorder: Recorder, supervisors: list[Supervisor]
) -> None:
    # Given slot 1 runs a command that always exits at once, slots 0 and 2 are healthy
    healthy = worker_factory(tmp_path)

    def make_command(index: int) -> list[str]:
        return [sys.executable, "-c", "import sys; sys.exit(3)"] if index == 1 else healthy(index)

    sup = Supervisor(
        make_command, 3, backoff_initial=0.01, backoff_max=0.05, max_restarts=3, restart_window=60,
        on_event=recorder,
    )  # fmt: skip
    supervisors.append(sup)
    sup.start()
    # When the supervisor keeps restarting it
    wait_for(lambda: sup.failed, what="the supervisor to give up on slot 1")
    # Then it gave up on slot 1 only, after exactly max_restarts restarts, with a clear message
    assert sup.gave_up_slots == [1]
    [gave_up] = recorder.of("gave_up")
    assert gave_up.index == 1
    assert "giving up on worker 1" in gave_up.message and "max_restarts=3" in gave_up.message
    assert sup.restart_counts() == [0, 3, 0]
    assert len(recorder.of("exited", 1)) == 4
    assert all(e.returncode == 3 and e.signal is None for e in recorder.of("exited", 1))
    pids = sup.pids()
    assert pids[1] is None
    # And the healthy slots keep running their original processes
    started = {e.index: e.pid for e in recorder.of("started")}
    assert pids[0] == started[0] and pids[2] == started[2]
    assert pids[0] is not None and alive(pids[0])
    assert pids[2] is not None and alive(pids[2])
    assert recorder.of("exited", 0) == [] and recorder.of("exited", 2) == []


def test_stop_terminates_every_process_group_and_does_not_restart(
    tmp_path: Path, recorder: Recorder, supervisors: list[Supervisor]
) -> None:
    # Given two running workers, each with a grandchild in its process group
    sup = Supervisor(worker_factory(tmp_path), 2, backoff_initial=0.01, on_event=recorder)
    supervisors.append(sup)
    sup.start()
    procs = wait_all_up(sup, tmp_path)
    # When the supervisor is stopped (twice: stop is idempotent)
    sup.stop(timeout=5)
    sup.stop(timeout=5)
    # Then no worker nor grandchild survives and nothing was restarted
    for pid, child in procs:
        assert not alive(pid), f"worker {pid} survived stop()"
        wait_for(lambda c=child: not alive(c), what=f"grandchild {child} to exit")
    assert sup.pids() == [None, None]
    assert sup.restarts == 0
    assert recorder.of("exited") == [] and recorder.of("restarted") == []


def test_stop_sigkills_workers_that_ignore_sigterm(tmp_path: Path, supervisors: list[Supervisor]) -> None:
    # Given a worker that ignores SIGTERM
    sup = Supervisor(worker_factory(tmp_path, "ignore-term"), 1)
    supervisors.append(sup)
    sup.start()
    [(pid, child)] = wait_all_up(sup, tmp_path)
    # When stop's grace period runs out
    sup.stop(timeout=0.3)
    # Then the whole process group was killed
    assert not alive(pid)
    wait_for(lambda: not alive(child), what="grandchild to be killed")
    assert sup.restarts == 0


def test_fixed_command_list_and_context_manager(tmp_path: Path) -> None:
    # Given a list of commands, one per slot
    commands = [worker_factory(tmp_path)(i) for i in range(2)]
    # When used as a context manager
    with Supervisor(commands) as sup:
        procs = wait_all_up(sup, tmp_path)
        assert sup.count == 2
    # Then leaving the block stops every worker
    assert not any(alive(pid) for pid, _ in procs)


def test_mismatched_count_and_unspawnable_command_are_rejected(tmp_path: Path) -> None:
    # Given a count that does not match the command list, Then construction fails
    with pytest.raises(ValueError, match="count=3"):
        Supervisor([["true"]], 3)
    # Given a command that cannot be executed, When starting, Then it raises and leaves nothing running
    good = worker_factory(tmp_path)(0)
    sup = Supervisor([good, [str(tmp_path / "no-such-program")]])
    with pytest.raises(FileNotFoundError):
        sup.start()
    assert sup.pids() == [None, None]
    sup.stop()


ACTORS = """
import os
import time
from pathlib import Path

import dramatiq
from dramatiq.brokers.redis import RedisBroker

dramatiq.set_broker(RedisBroker(url=os.environ["PJ_TEST_REDIS_URL"]))
OUT = Path(os.environ["PJ_TEST_OUT"])


@dramatiq.actor(max_retries=0)
def slow(name):
    (OUT / f"{name}.started").write_text(str(os.getpid()))
    time.sleep(1.0)  # the work itself; the test waits on files, not on this duration
    (OUT / f"{name}.done").write_text(str(os.getpid()))
"""


@pytest.fixture
def redis_state_dir() -> Iterator[Path]:
    try:
        find_redis_server()
    except RuntimeError as exc:
        unavailable(f"a Redis server: {exc}")
    path = Path("/tmp") / f"pj-sup-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_real_dramatiq_workers_restart_alone_and_stop_gracefully(
    tmp_path: Path, redis_state_dir: Path, recorder: Recorder
) -> None:
    # Given two `dramatiq --processes 1` workers on an embedded Redis
    (tmp_path / "pjtest_actors.py").write_text(ACTORS)
    out = tmp_path / "out"
    out.mkdir()
    logs = tmp_path / "logs"
    with EmbeddedRedis(redis_state_dir) as server:
        env = dict(os.environ, PJ_TEST_REDIS_URL=server.url, PJ_TEST_OUT=str(out), PYTHONPATH=str(tmp_path))
        command = [sys.executable, "-m", "dramatiq", "pjtest_actors", "--processes", "1", "--threads", "1"]
        sup = Supervisor(lambda _: command, 2, env, backoff_initial=0.05, on_event=recorder, log_dir=logs)
        sup.start()
        try:

            def ready(index: int, times: int = 1) -> bool:
                path = logs / f"worker-{index}.log"
                return path.exists() and path.read_text().count("Worker process is ready for action") >= times

            wait_for(lambda: ready(0) and ready(1), timeout=30, what="dramatiq workers to be ready")
            before = sup.pids()
            # When the main process of worker 0 is SIGKILLed
            os.kill(before[0], signal.SIGKILL)
            # Then only slot 0 is restarted and comes up again
            wait_for(lambda: ready(0, times=2), timeout=30, what="worker 0 to be restarted")
            after = sup.pids()
            assert after[0] not in (None, before[0]) and after[1] == before[1]
            assert sup.restart_counts() == [1, 0]
            # And the workers consume messages (enqueued from here with the same broker URL)
            broker = RedisBroker(url=server.url)
            for name in ("a", "b"):
                broker.enqueue(dramatiq.Message(
                    queue_name="default", actor_name="slow", args=(name,), kwargs={}, options={}
                ))  # fmt: skip
            broker.close()
            wait_for(lambda: (out / "a.started").exists() and (out / "b.started").exists(), timeout=30,
                     what="both messages to start")  # fmt: skip
        finally:
            # When stopping while both messages are in flight
            sup.stop(timeout=20)
        # Then the workers finished their messages (graceful: no second SIGTERM, no hard kill)
        assert (out / "a.done").exists() and (out / "b.done").exists()
        text = "".join((logs / f"worker-{i}.log").read_text() for i in range(2))
        assert "Killing worker process" not in text
        assert sup.pids() == [None, None] and sup.restarts == 1
