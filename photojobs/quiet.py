"""Log hygiene for long-running processes: an outage is one line per retry period, not a flood.

* Anything logged with the traceback of a lost connection to Redis or the database (the sweeper's
  steps, the lease middleware's top-up, the heartbeat, dramatiq's acknowledgements): one line per
  retry period per process, without the traceback.
* Dramatiq's consumer threads (one per queue, two queues per lane) each log a CRITICAL line and an
  INFO line every 3 s while Redis is unreachable: with six lanes, 24 lines per 3 s per worker
  process.  :class:`OutageFilter` lets one line through per retry period per process, naming the
  next retry time, and drops the "Restarting consumer" lines.
* Dramatiq logs "Message ... was skipped." for every message our middleware skips on purpose (a
  deferral, an item its job paused); the middleware logs the reason itself, so those are dropped.
* APScheduler warns "maximum number of running instances reached" whenever a sweep pass outlasts
  its interval; the pass simply runs again at the next interval (``coalesce``), so that is dropped.
"""

from __future__ import annotations

import logging
import threading
import time

CONSUMER_RESTART_DELAY = 3.0  # dramatiq.worker.CONSUMER_RESTART_DELAY_SECS


def next_retry_text(delay: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(time.time() + delay))


def outage_of(exc: BaseException | None) -> str | None:
    """``"Redis"`` or ``"Database"`` when ``exc`` (or an exception it came from) says that
    service is out of reach; None otherwise."""
    import redis
    from sqlalchemy.exc import InterfaceError, OperationalError

    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, redis.ConnectionError | redis.TimeoutError | ConnectionRefusedError):
            return "Redis"
        if isinstance(exc, OperationalError | InterfaceError):
            return "Database"
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def _first_line(text: object) -> str:
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


class OutageFilter(logging.Filter):
    """On a handler: while Redis or the database is out of reach, one line per retry period per
    process (naming the service, the error and the next retry time), no tracebacks, no repeats."""

    def __init__(self, period: float = CONSUMER_RESTART_DELAY) -> None:
        super().__init__()
        self.period = period
        self.sweep_interval = 1.0
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def _gate(self, service: str) -> bool:
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(service, -1e9) < self.period:
                return False
            self._last[service] = now
            return True

    def _rewrite(self, record: logging.LogRecord, service: str, error: str, retry: float) -> None:
        what = _first_line(record.getMessage())
        record.msg = "%s unreachable (%s): %s; retrying every %gs, next at %s"
        record.args = (service, error, what, retry, next_retry_text(retry))
        record.exc_info, record.exc_text = None, None
        if record.levelno > logging.WARNING:
            record.levelno, record.levelname = logging.WARNING, "WARNING"

    def filter(self, record: logging.LogRecord) -> bool:
        name, msg = record.name, str(record.msg)
        if name.startswith("apscheduler") and "maximum number of running instances" in msg:
            return False
        if name.startswith("dramatiq.worker.WorkerThread") and msg.endswith("was skipped."):
            return False
        if name.startswith("dramatiq.worker.ConsumerThread"):
            if msg.startswith("Restarting consumer"):
                return False
            if msg.startswith("Consumer encountered a connection error"):
                if not self._gate("Redis"):
                    return False
                error = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
                record.msg, record.args = "the consumers lost Redis", ()
                self._rewrite(record, "Redis", _first_line(error), CONSUMER_RESTART_DELAY)
                return True
            if msg.startswith("Failed to post_process_message") and "connection error" in msg:
                if not self._gate("Redis"):
                    return False
                error = record.args[-1] if isinstance(record.args, tuple) and record.args else "?"
                record.msg, record.args = "a message could not be acknowledged", ()
                self._rewrite(record, "Redis", _first_line(error), 5.0)
                return True
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None and isinstance(record.args, tuple):
            # "could not claim item %s (%s)": the error as an argument, not a traceback
            exc = next((a for a in record.args if isinstance(a, BaseException)), None)
        service = outage_of(exc)
        if service is None:
            return True
        if not self._gate(service):
            return False
        retry = self.sweep_interval if name == "photojobs.sweeper" else self.period
        self._rewrite(record, service, _first_line(getattr(exc, "orig", None) or exc), retry)
        return True


_installed = OutageFilter()


def install(logger: logging.Logger | None = None, sweep_interval: float | None = None) -> None:
    """Put the filter on every handler of ``logger`` (default: the root logger) and on the loggers
    that log the repeats (for handlers added later)."""
    if sweep_interval is not None:
        _installed.sweep_interval = sweep_interval
    target = logger or logging.getLogger()
    for handler in target.handlers:
        if _installed not in handler.filters:
            handler.addFilter(_installed)
    for name in ("apscheduler.scheduler", "apscheduler.executors.default"):
        lg = logging.getLogger(name)
        if _installed not in lg.filters:
            lg.addFilter(_installed)
