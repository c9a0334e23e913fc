"""Building blocks shared by ``photojobs worker`` and ``photojobs run``."""

from __future__ import annotations

import os
import sys

from store.lanes import all_lanes, usable_cores


def worker_command(lanes: list[str], threads: int, watch: str | None = None) -> list[str]:
    """One ``dramatiq actors`` worker process serving ``lanes`` (through :mod:`photojobs.dramatiq_worker`,
    which adds the lifeline to the supervisor); ``watch``: reload when a ``*.py`` under it changes."""
    specs = all_lanes()
    queues = [q for n in lanes for q in specs[n].queues]
    return [
        sys.executable,
        "-m",
        "photojobs.dramatiq_worker",
        "actors",
        "--processes",
        "1",
        "--threads",
        str(threads),
        "--queues",
        *queues,
        # Dramatiq's main process waits up to this long for its worker process to finish booting
        # before it starts watching it (default 30 s). A worker that dies while booting — or is
        # killed right after it began taking messages, its boot hooks still running — would go
        # unnoticed that long and its slot would not be restarted. We fork no extra processes, so
        # there is nothing to wait for.
        "--worker-fork-timeout",
        "10",
        # dramatiq's default pattern "**.py" matches no absolute path under watchdog 7 (full_match)
        *(["--watch", watch, "--watch-include", "**/*.py"] if watch else []),
    ]


def worker_env(threads: int, base: dict[str, str] | None = None, *, processes: int = 1) -> dict[str, str]:
    """The environment of the ``processes`` worker processes of one ``photojobs worker``/``run``."""
    env = dict(os.environ if base is None else base)
    # This host's cores shared out between its worker processes: the CPU-bound lanes' slots in each
    # (``middleware.cpu_slots``), so a 2-core host with 2 processes decodes one photo per core.
    env.setdefault("PHOTOJOBS_CPU_SLOTS", str(max(1, usable_cores() // max(1, processes))))
    # Each process holds as many messages again as it has threads, so a thread that finishes an item
    # takes the next from memory instead of waiting for the consumer's next Redis poll. A dead
    # worker strands nothing: the sweeper publishes again whatever is only in the ack set of a worker
    # whose Dramatiq heartbeat stopped (``RedisPublisher.held``), within seconds.
    env.setdefault("dramatiq_queue_prefetch", str(2 * threads))
    env.setdefault("dramatiq_worker_timeout", "250")  # an idle worker looks at Redis 4x a second
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
