"""The supervised worker fleet of ``photojobs run`` and what happened to it (restarts, give-ups)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from photojobs.cli_support import worker_command, worker_env
from photojobs.supervisor import Supervisor, SupervisorEvent


class WorkerFleet:
    """``processes`` supervised worker processes of ``lanes`` with ``threads`` threads each. Keeps
    the count of restarts and one line per notable event (exited, restarted, gave up, spawn
    failed) for the progress display."""

    def __init__(
        self,
        lanes: list[str],
        processes: int,
        threads: int,
        env: Mapping[str, str],
        log_dir: Path,
        record: Path,
        recorder: Callable[[SupervisorEvent], None] | None = None,
    ) -> None:
        self.processes = processes
        self.restarts = 0
        self.events: list[str] = []
        self._lock = threading.Lock()
        self._seen = 0
        self.recorder = recorder  # e.g. ``supervisor.store_recorder``: restarts by reason, in the store
        self.supervisor = Supervisor(
            lambda i: worker_command(lanes, threads),
            processes,
            env=worker_env(threads, dict(env), processes=processes),
            on_event=self.on_event,
            log_dir=log_dir,
            record=record,
        )

    def on_event(self, event: SupervisorEvent) -> None:
        if self.recorder is not None:
            self.recorder(event)
        with self._lock:
            if event.kind == "restarted":
                self.restarts += 1
            if event.kind in ("exited", "restarted", "gave_up", "spawn_failed"):
                what = f"worker {event.index}: {event.kind}"
                if event.signal or event.returncode is not None:
                    what += f" ({event.signal or f'exit {event.returncode}'})"
                if event.kind == "gave_up":
                    what += f" - {event.message}"
                self.events.append(what)

    def new_events(self) -> list[str]:
        """The event lines not returned before."""
        with self._lock:
            new, self._seen = self.events[self._seen :], len(self.events)
        return new

    @property
    def all_given_up(self) -> bool:
        return len(self.supervisor.gave_up_slots) == self.processes

    def start(self) -> None:
        self.supervisor.start()

    def stop(self, timeout: float) -> None:
        self.supervisor.stop(timeout=timeout)
