"""A worker process that dies while it boots is noticed and its slot restarted at once.

Found by CI: Dramatiq's main process waits for its worker process to signal that it booted (up to
``--worker-fork-timeout``, 30 s by default) before it starts watching it. A worker process that
already takes messages while its boot hooks still run, and is killed then, went unnoticed for those
30 s: its slot was not restarted, and `photojobs run` finished on the other slot alone. The worker
command now passes a 10 ms fork timeout (it forks nothing else).
"""

from __future__ import annotations

from pathlib import Path

from photojobs.cli_support import worker_command, worker_env
from photojobs.supervisor import Supervisor, SupervisorEvent
from tests.support import wait_for

# Below Dramatiq's default 30 s fork timeout with room for a slow boot on a loaded machine: the
# old behaviour cannot pass this deadline, the fixed one passes it with the first crash.
DEADLINE = 20.0


def test_a_worker_process_killed_while_booting_is_restarted_without_waiting_out_the_boot_timeout(
    env: dict[str, str], tmp_path: Path
) -> None:
    # Given the worker command under a supervisor, its worker process set to die inside its boot hooks
    events: list[SupervisorEvent] = []
    worker_env_ = {**worker_env(1, env), "PHOTOJOBS_FAILPOINTS": "worker.boot"}
    command = worker_command(["noop"], 1)
    assert "--worker-fork-timeout" in command
    sup = Supervisor(
        lambda _: command,
        1,
        worker_env_,
        backoff_initial=0.05,
        on_event=events.append,
        log_dir=tmp_path / "logs",
    )

    # When it starts
    sup.start()
    try:
        # Then the dramatiq main process notices its dead worker process and exits, and the
        # supervisor restarts the slot — well before the 30 s boot timeout would have run out
        wait_for(
            lambda: [e for e in events if e.kind == "restarted"], DEADLINE, what="the slot to be restarted"
        )
    finally:
        sup.stop(timeout=10)
    # (Dramatiq's main process exits with RET_KILLED = 1 when a worker process dies under it. Its
    # "exited unexpectedly" log line is not asserted: its log watcher thread can stop before it
    # copies that last line to the log — CI saw a log without it.)
    exited = [e for e in events if e.kind == "exited"]
    assert exited and exited[0].index == 0
    assert exited[0].returncode == 1, exited[0]
    log = (tmp_path / "logs" / "worker-0.log").read_text()
    assert log.count("starting worker 0") >= 2, log
