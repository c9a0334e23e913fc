"""Errors raised by the store."""

from __future__ import annotations


class StoreError(Exception):
    """Base class of the store's errors."""


class StaleLease(StoreError):
    """A commit was attempted under a lease that no longer holds (token moved on or item not running)."""

    def __init__(
        self, item_id: int, token: int, current_state: str | None, current_token: int | None
    ) -> None:
        self.item_id = item_id
        self.token = token
        self.current_state = current_state
        self.current_token = current_token
        super().__init__(
            f"stale lease on item {item_id}: held token {token}, item is now "
            f"{current_state or 'missing'} with token {current_token}"
        )


class SubmissionError(StoreError, ValueError):
    """Submission refused for bad input (no photos, a path outside the roots, an unknown lane)."""


class BacklogFull(SubmissionError):
    """Submission refused: a lane's backlog would exceed its bound (retry later: HTTP 429)."""

    def __init__(self, lane: str, backlog: int, adding: int, bound: int) -> None:
        self.lane = lane
        self.backlog = backlog
        self.adding = adding
        self.bound = bound
        super().__init__(
            f"lane {lane!r} is full: {backlog} items waiting + {adding} new would exceed its backlog bound "
            f"of {bound}; retry later or raise PHOTOJOBS_LANE_{lane.upper()}_BACKLOG"
        )


class UnknownJob(StoreError):
    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        super().__init__(f"no job with id {job_id}")


class NotApplicable(StoreError):
    """A control action that does not apply to the job as it is (resume a cancelled job: HTTP 409)."""


class ConfigError(ValueError):
    """A setting that cannot work, named with its problem (``photojobs`` exits 64 on it)."""

    def __init__(self, setting: str, problem: str) -> None:
        self.setting = setting
        self.problem = problem
        super().__init__(f"{setting}: {problem}")


# How a store error raised by a claim is treated (``classify_store_error``).
UNAVAILABLE = "unavailable"  # the store cannot be reached: nothing is recorded, the sweeper re-publishes
TRANSIENT = "transient"  # may pass (a lock, a deadlock): recorded; counts as an attempt if it repeats
DETERMINISTIC = "deterministic"  # will fail the same way again: counts as an attempt at once

_UNAVAILABLE_TEXT = (
    "connection",
    "could not connect",
    "server closed",
    "terminating",
    "unable to open database",
    "disk i/o error",
)
_DETERMINISTIC_TEXT = (
    "number of parameters",  # psycopg: more than 65,535 bind parameters
    "too many sql variables",  # SQLite: more than 32,766
    "too many terms",
    "no such table",
    "no such column",
    "syntax error",
)
_TRANSIENT_TEXT = ("database is locked", "database table is locked", "deadlock", "could not serialize")


def error_text(exc: BaseException, limit: int = 500) -> str:
    """A one-line description of an error: the driver's own message, without the SQL and its
    parameters SQLAlchemy appends (a bundle's statement can be megabytes long)."""
    orig = getattr(exc, "orig", None) or exc
    first = (str(orig).strip().splitlines() or [""])[0]
    return f"{type(orig).__name__}: {first}"[:limit]


TRACE_LIMIT = 4000  # characters of an unexpected exception's traceback kept in its attempt's event
TRACE_FRAMES = 30  # the innermost frames kept
TRACE_MESSAGE = 300  # characters of the exception's message kept (it may quote what it read)


def bounded_trace(exc: BaseException) -> str:
    """The traceback of an unexpected exception for the item page, bounded: the innermost
    ``TRACE_FRAMES`` frames (file, line, function and the code line: source code, never the
    photo's bytes), then the exception's type and the first ``TRACE_MESSAGE`` characters of its
    message's first line; at most ``TRACE_LIMIT`` characters (the innermost end kept)."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)[-TRACE_FRAMES:]
    lines = [
        f'  File "{f.filename}", line {f.lineno}, in {f.name}' + (f"\n    {f.line.strip()}" if f.line else "")
        for f in frames
    ]
    message = (str(exc).strip().splitlines() or [""])[0][:TRACE_MESSAGE]
    cause = exc.__cause__ or exc.__context__
    tail = f"{type(exc).__name__}: {message}" + (f" (after {type(cause).__name__})" if cause else "")
    text = "Traceback (most recent call last):\n" + "\n".join(lines) + "\n" + tail
    return text if len(text) <= TRACE_LIMIT else "…" + text[-(TRACE_LIMIT - 1) :]


def classify_store_error(exc: BaseException) -> str:
    """``UNAVAILABLE``, ``TRANSIENT`` or ``DETERMINISTIC`` for an exception raised by a store call."""
    from sqlalchemy import exc as sa_exc

    if isinstance(exc, sa_exc.DisconnectionError | sa_exc.TimeoutError | OSError):
        return UNAVAILABLE
    if isinstance(exc, sa_exc.DBAPIError):
        text = str(exc.orig).lower()
        code = str(getattr(exc.orig, "sqlstate", None) or "")
        if exc.connection_invalidated or isinstance(exc, sa_exc.InterfaceError):
            return UNAVAILABLE
        if code[:2] in ("08", "53", "57", "58"):  # connection, resources, operator intervention, system
            return UNAVAILABLE
        if code[:2] == "40" or code == "55P03":  # serialization failure, deadlock, lock not available
            return TRANSIENT
        if isinstance(exc, sa_exc.ProgrammingError | sa_exc.DataError | sa_exc.IntegrityError):
            return DETERMINISTIC
        if isinstance(exc, sa_exc.NotSupportedError) or any(t in text for t in _DETERMINISTIC_TEXT):
            return DETERMINISTIC
        if any(t in text for t in _TRANSIENT_TEXT):
            return TRANSIENT
        if any(t in text for t in _UNAVAILABLE_TEXT):
            return UNAVAILABLE
        return TRANSIENT  # other operational errors: judged by whether they repeat
    if isinstance(exc, sa_exc.OperationalError):
        return TRANSIENT
    return DETERMINISTIC  # a bug (TypeError, KeyError, …) fails the same way every time


class SearchTooCostly(StoreError):
    """A search ran past its time bound (``store.console.find_jobs``): it was stopped."""

    def __init__(self, seconds: float) -> None:
        super().__init__(
            f"the search took longer than {seconds:g} s and was stopped; search a longer part of a "
            "photo path, a job id or a lane"
        )
        self.seconds = seconds


class SearchBusy(StoreError):
    """Every search slot of this process stayed taken for the search's whole time bound."""

    def __init__(self, slots: int) -> None:
        super().__init__(f"{slots} searches are running already; try again in a moment")
        self.slots = slots
