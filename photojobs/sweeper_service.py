"""The sweeper as an APScheduler job (inside ``photojobs worker``/``run``, or alone: ``photojobs sweep``)."""

from __future__ import annotations

import logging
import threading
import time

from apscheduler.schedulers.background import BackgroundScheduler

from photojobs.broker import RedisPublisher, build_broker
from photojobs.config import Settings, describe_outage
from photojobs.doorbell import SWEEP, SWEEP_CHANNEL, Doorbell
from photojobs.maintenance import Maintenance, SweepReport, default_services
from photojobs.maintenance.duties import DispatchLane
from photojobs.maintenance.service import Service
from photojobs.quiet import install as quiet_logging
from photojobs.quiet import next_retry_text
from photojobs.webhooks import schedule as schedule_webhooks
from store.engine import make_engine
from store.lanes import all_lanes
from store.sweeper_passes import RECORD_EVERY, record_passes

log = logging.getLogger("photojobs.sweeper")


class Sweeper:
    """Runs a pass of its maintenance services (``photojobs.maintenance``) every
    ``settings.sweep_interval`` seconds, and at once when a client rings the sweepers' doorbell
    (``photojobs.doorbell.ring_sweepers``: a job was submitted, resumed or retried). Passes never
    overlap: a ring during a pass runs one more pass after it. Each service keeps its own interval
    (the stray-file sweep runs at most once a minute) and its own run counters."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.specs = all_lanes(settings.env)
        self.engine = make_engine(settings.database_url)
        self.broker = build_broker(settings.redis_url)
        self.publisher = RedisPublisher(self.broker, self.specs)
        self.maintenance = Maintenance(
            default_services(
                self.engine,
                self.specs,
                self.publisher,
                republish_after=settings.republish_after,
                forget_workers_after=settings.forget_workers_after,
                submit_abandoned_after=settings.submit_abandoned_after,
                vacuum_every=settings.vacuum_every,
                idempotency_keep=settings.idempotency_keep,
            )
        )
        self.scheduler: BackgroundScheduler | None = None
        self.passes = 0
        self.failures = 0
        self.last: SweepReport | None = None
        self.rung_passes = 0  # passes run because the doorbell rang
        self.doorbell = Doorbell(lambda: self.broker.client, SWEEP_CHANNEL, ring_on_change=False)
        self._pass_lock = threading.Lock()
        self._stopping = threading.Event()
        self._waker: threading.Thread | None = None
        self._bell: threading.Event | None = None
        self._passed: dict[str, float] = {}  # duty -> interval, passed since the last record
        self._recorded = -RECORD_EVERY

    def once(self, *, rung: bool = False) -> SweepReport:
        """One pass of every due service now (``photojobs sweep --once``, and each tick); a pass the
        doorbell ``rung`` dispatches first (``DispatchLane``: what a ring asks for)."""
        report = self.maintenance.run_pass(first=_is_dispatch if rung else None)
        self.passes += 1
        self.last = report
        self._record_passes(report)
        if report.revoked or report.republished or report.quarantined:
            log.info(
                "sweep: revoked %d lease(s), quarantined %d, re-published %d, dispatched %d",
                report.revoked,
                report.quarantined,
                report.republished,
                report.dispatched,
            )
        return report

    def _record_passes(self, report: SweepReport) -> None:
        """Record in the store the duties that passed (``store.sweeper_passes``: the metrics' age of
        each duty's last pass), at most every ``RECORD_EVERY`` seconds; a failed record is retried
        with the next pass and never fails this one."""
        self._passed.update(report.passed)
        now = time.monotonic()
        if not self._passed or now - self._recorded < RECORD_EVERY:
            return
        try:
            record_passes(self.engine, self._passed)
        except Exception:  # noqa: BLE001 - the age grows, which is what an alert is for
            log.debug("recording the sweeper's passes failed", exc_info=True)
            return
        self._passed, self._recorded = {}, now

    def _tick(self, *, rung: bool = False) -> None:
        with self._pass_lock:
            self._tick_unlocked(rung=rung)

    def _wake_on_rings(self, bell: threading.Event) -> None:
        while True:
            bell.wait()  # a ring, or ``stop`` (which sets it after ``_stopping``)
            bell.clear()  # before the pass: a ring during it runs one more
            if self._stopping.is_set():
                break
            self.rung_passes += 1
            if self._pass_lock.acquire(blocking=False):
                try:
                    self._tick_unlocked(rung=True)
                finally:
                    self._pass_lock.release()
            else:
                self._dispatch_now()  # a pass is under way: the ring's dispatch does not wait for it
                self._tick(rung=True)

    def _dispatch_now(self) -> None:
        """The lanes' dispatch, outside the pass lock, while a pass is under way (its other duties
        take tens of milliseconds under a full load). A dispatch is safe beside another one (the
        workers' top-ups run beside the sweeper's); a failure here is left to the pass that follows."""
        for svc in self.maintenance.services:
            if _is_dispatch(svc):
                try:
                    svc.run_once()
                except Exception:  # noqa: BLE001 - the rung pass after this one dispatches again
                    log.debug("dispatch on a ring failed; the next pass dispatches", exc_info=True)

    def _tick_unlocked(self, *, rung: bool = False) -> None:
        try:
            self.once(rung=rung)
        except Exception as exc:  # noqa: BLE001 - keep sweeping through a database or Redis blip
            # One line per failed pass (the retry period) naming the next try; the traceback only
            # at debug level: an outage of Redis or the database is not a bug.
            self.failures += 1
            log.warning(
                "sweep pass failed (%s); next try at %s",
                describe_outage(exc, self.settings),
                next_retry_text(self.settings.sweep_interval),
            )
            log.debug("sweep pass failure", exc_info=True)
        else:
            if self.failures:
                log.warning("sweep passes work again after %d failure(s)", self.failures)
            self.failures = 0

    def start(self) -> None:
        quiet_logging(sweep_interval=self.settings.sweep_interval)
        self.scheduler = BackgroundScheduler(daemon=True)
        self.scheduler.add_job(
            self._tick,
            "interval",
            seconds=self.settings.sweep_interval,
            max_instances=1,
            coalesce=True,
            id="photojobs-sweep",
        )
        self.scheduler.add_job(
            run_schedules,
            "interval",
            args=[self],
            seconds=min(self.settings.sweep_interval, 5.0),
            max_instances=1,
            coalesce=True,
            id="photojobs-schedules",
        )
        self.webhooks = schedule_webhooks(self.scheduler, self.engine, self.settings)
        self.scheduler.start()
        self._tick()
        self._bell = self.doorbell.register(SWEEP)
        self._waker = threading.Thread(
            target=self._wake_on_rings, args=(self._bell,), name="photojobs-sweep-now", daemon=True
        )
        self._waker.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._bell is not None:
            self._bell.set()  # the waker sees the stop now, not at a ring
        self.doorbell.stop()
        if self._waker is not None:
            self._waker.join(timeout=10)
            self._waker = None
        if self.scheduler is not None:
            self.scheduler.shutdown(wait=True)
            self.scheduler = None
        self.broker.close()
        self.engine.dispose()


def run_schedules(sweeper: Sweeper) -> None:
    """The schedules duty (issue 38, ``photojobs.schedules``): claim the due schedules' ticks (one
    sweeper per tick across all fleets) and run the won runs' commands in this process, in
    APScheduler's own thread beside the sweep passes (a sync may walk a large library)."""
    from photojobs.schedules import ScheduleRunner

    runner = sweeper.__dict__.setdefault("schedules", ScheduleRunner(sweeper.settings, sweeper.engine))
    try:
        runner.run_due()
    except Exception as exc:  # noqa: BLE001 - the next tick tries again
        log.warning("schedules: %s", describe_outage(exc, sweeper.settings))
        log.debug("schedules failure", exc_info=True)


def _is_dispatch(service: Service) -> bool:
    return isinstance(service, DispatchLane)
