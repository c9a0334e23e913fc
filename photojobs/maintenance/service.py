"""A maintenance service (one duty, its interval, its run counters) and the loop that runs them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

log = logging.getLogger("photojobs.sweeper")


@dataclass
class SweepReport:
    """What one pass did: counts by duty, and one ``"<service>: <error>"`` line per failed service."""

    revoked: int = 0
    quarantined: int = 0
    settled: int = 0
    strays: int = 0
    republished: int = 0
    dispatched: int = 0
    sequenced: int = 0
    workers_forgotten: int = 0
    submissions_ended: int = 0
    keys_forgotten: int = 0
    vacuumed: int = 0
    errors: list[str] = field(default_factory=list)
    passed: dict[str, float] = field(default_factory=dict)  # duty -> its interval, for those that ran fine

    def add(self, counts: Mapping[str, int]) -> None:
        for name, n in counts.items():
            setattr(self, name, getattr(self, name) + n)


class Service:
    """One maintenance duty. ``run_once`` does it once (raising on failure) and returns what it did
    as :class:`SweepReport` counts; :class:`Maintenance` runs it when due (every pass when
    ``interval`` is 0, else at most once per ``interval`` seconds, the first pass included).

    Test hook: ``runs`` and ``failures`` count the loop's runs of it (``last_error`` names the latest
    failure) and ``wait_runs(n, timeout)`` blocks until it has run ``n`` times."""

    name: str = "service"  # the prefix of its lines in ``SweepReport.errors``
    what: str = "a maintenance duty"  # its log line on failure: "<what> failed"
    interval: float = 0.0

    def __init__(self) -> None:
        self.runs = 0
        self.failures = 0
        self.last_error: str | None = None
        self.last_start: float | None = None  # time.monotonic() of the loop's latest start of it
        self._ran = threading.Condition()

    def run_once(self) -> Mapping[str, int]:
        raise NotImplementedError

    def due(self, now: float) -> bool:
        return self.last_start is None or now - self.last_start >= self.interval

    def wait_runs(self, n: int, timeout: float) -> bool:
        """Whether the loop has run this service ``n`` times (success or failure) within ``timeout`` s."""
        with self._ran:
            return self._ran.wait_for(lambda: self.runs >= n, timeout)

    def _ended(self, error: BaseException | None) -> None:
        with self._ran:
            self.runs += 1
            if error is not None:
                self.failures += 1
                self.last_error = str(error)
            self._ran.notify_all()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} every {self.interval or 'pass'}>"


class Maintenance:
    """Runs its services in order, each in its own ``try``: one failing duty is logged and reported
    and the others still run. Passes are the caller's to schedule (``photojobs.sweeper_service``)."""

    def __init__(self, services: Iterable[Service]) -> None:
        self.services = list(services)

    def service(self, name: str) -> Service:
        """The service named ``name`` (KeyError if none)."""
        for svc in self.services:
            if svc.name == name:
                return svc
        raise KeyError(name)

    def run_pass(self, first: Callable[[Service], bool] | None = None) -> SweepReport:
        """Every due service once, in order; those ``first`` names before the others (a rung pass:
        the lanes' dispatch, so a job just submitted is not behind the pass's other duties)."""
        report = SweepReport()
        order = self.services
        if first is not None:
            order = [s for s in self.services if first(s)] + [s for s in self.services if not first(s)]
        for svc in order:
            now = time.monotonic()
            if not svc.due(now):
                continue
            svc.last_start = now
            try:
                counts = svc.run_once()
            except Exception as exc:  # noqa: BLE001 - one failing duty must not stop the others
                log.exception("%s failed", svc.what)
                report.errors.append(f"{svc.name}: {exc}")
                svc._ended(exc)
            else:
                report.add(counts)
                report.passed[svc.name] = svc.interval
                svc._ended(None)
        return report
