"""Ctrl-C, a polite kill and a closed terminal, counted: once pauses the job, twice stops at once."""

from __future__ import annotations

import signal
from types import FrameType, TracebackType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignals:
    """``with StopSignals() as stops:`` SIGINT, SIGTERM and SIGHUP only count ``stops.interrupts``
    while the block runs; the previous handlers come back when it ends."""

    def __init__(self) -> None:
        self.interrupts = 0
        self._previous: dict[int, Any] = {}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.interrupts += 1

    def __enter__(self) -> StopSignals:
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    @property
    def pause_asked(self) -> bool:
        return self.interrupts >= 1

    @property
    def stop_now(self) -> bool:
        return self.interrupts >= 2
