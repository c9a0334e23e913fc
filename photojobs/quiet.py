"""Log hygiene for long-running processes: an outage is one line per retry period, not a flood.

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


class OutageFilter(logging.Filter):
    """On a handler: one "Redis unreachable" line per retry period, none of the repeats."""

    def __init__(self, period: float = CONSUMER_RESTART_DELAY) -> None:
        super().__init__()
        self.period = period
        self._last = 0.0
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        if name.startswith("dramatiq.worker.ConsumerThread"):
            msg = str(record.msg)
            if msg.startswith("Restarting consumer"):
                return False
            if msg.startswith("Consumer encountered a connection error"):
                now = time.monotonic()
                with self._lock:
                    if now - self._last < self.period:
                        return False
                    self._last = now
                error = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
                record.msg = "Redis unreachable (%s); the consumers retry every %gs, next at %s"
                record.args = (error, self.period, next_retry_text(self.period))
                record.levelno, record.levelname = logging.WARNING, "WARNING"
                return True
        if name.startswith("dramatiq.worker.WorkerThread") and str(record.msg).endswith("was skipped."):
            return False
        if name.startswith("apscheduler") and "maximum number of running instances" in str(record.msg):
            return False
        return True


_installed = OutageFilter()


def install(logger: logging.Logger | None = None) -> None:
    """Put the filter on every handler of ``logger`` (default: the root logger) and on the loggers
    that log the repeats (for handlers added later)."""
    target = logger or logging.getLogger()
    for handler in target.handlers:
        if _installed not in handler.filters:
            handler.addFilter(_installed)
    for name in ("apscheduler.scheduler", "apscheduler.executors.default"):
        lg = logging.getLogger(name)
        if _installed not in lg.filters:
            lg.addFilter(_installed)
