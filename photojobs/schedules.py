"""Schedules (issue 38): ``photojobs schedule add NAME --every 15m | --cron "0 3 * * *" -- sync PATH…``.

A schedule is a ``sync`` or ``submit`` command line stored in the store (``store.schedules``, where
the single-run rule lives) and run by every ``photojobs worker``'s sweeper service
(:class:`ScheduleRunner`, registered in ``photojobs.sweeper_service``): each due tick is taken by
exactly one sweeper across all fleets, which runs the command in its process through the same
functions the commands call (``Client.sync``/``Client.submit``) and records the job or the error.

The command line is checked when the schedule is added by parsing it with the very click commands
``photojobs sync``/``photojobs submit`` (a bad option is refused with their message), its lanes and
parameters as a submission checks them, its paths made absolute, required to exist and, when photo
roots are set (``PHOTOJOBS_PHOTO_ROOTS``, or the web API's roots), confined to them as a sync's are.
Cron expressions (five fields) are read by APScheduler's ``CronTrigger`` in the host's time zone.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from sqlalchemy import Engine

from photojobs.config import Settings
from photojobs.roots import ROOTS_ENV, confine, parse_roots
from store import schedules as store_schedules
from store.errors import SubmissionError
from store.schedules import Claim, ScheduleRow

log = logging.getLogger("photojobs.schedules")

VERBS = ("sync", "submit")
#: The shortest ``--every``.
MIN_EVERY = 1.0
#: Seconds between a running sync's heartbeats (``store.schedules.heartbeat``), at most.
HEARTBEAT = 30.0
#: ``PHOTOJOBS_SCHEDULE_ABANDONED``: seconds without a heartbeat after which a run whose sweeper
#: died is over (default ``store.schedules.RUN_ABANDONED``, 300; at least 3). Heartbeats are sent
#: ten times as often (at most every :data:`HEARTBEAT` s).
ABANDONED_ENV = "PHOTOJOBS_SCHEDULE_ABANDONED"


def abandoned_after(env: Mapping[str, str]) -> float:
    """``PHOTOJOBS_SCHEDULE_ABANDONED`` read, or ``ValueError`` naming it."""
    raw = env.get(ABANDONED_ENV, "").strip()
    if not raw:
        return store_schedules.RUN_ABANDONED
    try:
        seconds = float(raw)
    except ValueError:
        raise ValueError(f"{ABANDONED_ENV}={raw!r}: not a number of seconds") from None
    if not 3 <= seconds <= 86_400:
        raise ValueError(f"{ABANDONED_ENV}={raw!r}: must be between 3 and 86400 seconds")
    return seconds


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class BadSchedule(SubmissionError):
    """A schedule refused at ``add`` (its name, cadence or command line), saying why."""


# -- cadence -----------------------------------------------------------------------------------------
def parse_every(text: str | float) -> float:
    """``"15m"`` -> 900.0 (units s, m, h, d; a bare number is seconds); at least :data:`MIN_EVERY`."""
    raw = str(text).strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd]?)", raw)
    if m is None:
        raise BadSchedule(f"--every {raw!r}: give a number and a unit, e.g. 30s, 15m, 2h, 1d")
    seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if seconds < MIN_EVERY or not math.isfinite(seconds):
        raise BadSchedule(f"--every {raw!r}: at least {MIN_EVERY:g} s")
    return seconds


def cron_trigger(expr: str) -> Any:
    """APScheduler's ``CronTrigger`` for a five-field crontab line, in the host's time zone."""
    from apscheduler.triggers.cron import CronTrigger
    from tzlocal import get_localzone

    try:
        return CronTrigger.from_crontab(expr, timezone=get_localzone())
    except ValueError as exc:
        raise BadSchedule(
            f"--cron {expr!r}: {exc} (five fields: minute hour day-of-month month day-of-week)"
        ) from None


def first_tick_after(
    every: float | None, cron: str | None, after: float, anchor: float | None = None
) -> float:
    """The first tick strictly after ``after``: ``anchor + k * every`` (anchor: the tick that was
    due; none: ``after + every``), or the cron expression's next fire time."""
    if every is not None:
        if anchor is None:
            return after + every
        return anchor + every * (math.floor((after - anchor) / every) + 1)
    trigger = cron_trigger(cron or "")
    start = datetime.fromtimestamp(math.floor(after) + 1, trigger.timezone)
    fire = trigger.get_next_fire_time(None, start)
    return float(fire.timestamp())


def next_tick(row: ScheduleRow, now: float) -> float:
    """A schedule's next tick after ``now`` (``store.schedules.claim_due``/``resume``): one catch-up
    run after downtime, then the cadence; never a tick at or before ``now``."""
    return first_tick_after(row.every, row.cron, now, anchor=row.next_run)


# -- the command line --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Command:
    """A parsed ``sync``/``submit`` command line: what a run calls."""

    verb: str
    lanes: str
    paths: list[str]
    params: list[str]
    outdated: bool = False
    priority: str | None = None

    def argv(self) -> list[str]:
        """The canonical command line stored and shown (absolute paths last)."""
        out = [self.verb, "--lanes", self.lanes]
        for p in self.params:
            out += ["--param", p]
        if self.outdated:
            out.append("--outdated")
        if self.priority:
            out += ["--priority", self.priority]
        return out + list(self.paths)


def _click_command(verb: str) -> click.Command:
    if verb == "sync":
        from photojobs.cli_sync import sync

        return sync
    from photojobs.cli import submit

    return submit


def parse_command(argv: Sequence[str]) -> Command:
    """``["sync", "/photos", "--lanes", "analysis"]`` parsed by ``photojobs sync``'s (or
    ``submit``'s) own click command; ``BadSchedule`` naming what is wrong."""
    args = [str(a) for a in argv]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        raise BadSchedule("no command given: add `-- sync PATH… --lanes LANES` (or `-- submit …`)")
    if args[0] not in VERBS:
        raise BadSchedule(
            f"{args[0]!r}: a schedule runs `sync` or `submit` (e.g. -- sync PATH --lanes analysis)"
        )
    verb = args[0]
    try:
        ctx = _click_command(verb).make_context(f"photojobs {verb}", args[1:])
    except click.exceptions.Exit:
        raise BadSchedule(f"`{verb}`: --help is not a command to schedule") from None
    except click.ClickException as exc:
        raise BadSchedule(f"`{' '.join(args)}`: {exc.format_message()}") from None
    p = ctx.params
    if p.get("idempotency_key"):
        raise BadSchedule("--idempotency-key: each run of a schedule is a new submission; leave it out")
    return Command(
        verb, p["lanes"], list(p["paths"]), list(p["params"]),
        outdated=bool(p.get("outdated")), priority=p.get("priority"),
    )  # fmt: skip


def check_command(
    client: Any,
    argv: Sequence[str],
    *,
    allowed_roots: Sequence[str | Path] | None = None,
    untrusted: bool = False,
    base: Path | None = None,
) -> Command:
    """The command line parsed and checked as its submission would be, its paths absolute (relative
    to ``base``, else the current folder; to the first photo root with ``allowed_roots``) and
    existing; ``BadSchedule``/``SubmissionError`` (``OutsideRoots``) otherwise."""
    from photos.errors import InvalidParameter
    from photos.params import parse_param_pairs

    cmd = parse_command(argv)
    try:
        client.check_job(cmd.lanes, parse_param_pairs(cmd.params), untrusted=untrusted)
    except (InvalidParameter, ValueError) as exc:
        raise BadSchedule(str(exc)) from None
    roots = [Path(r) for r in allowed_roots] if allowed_roots is not None else _env_roots(client.settings)
    if roots:
        paths = confine(cmd.paths, roots)
    else:
        paths = [str((base or Path.cwd()) / Path(p).expanduser()) for p in cmd.paths]
    resolved = [str(Path(p).resolve()) if Path(p).exists() else p for p in paths]
    for given, path in zip(cmd.paths, resolved, strict=True):
        if not Path(path).exists():
            raise BadSchedule(f"{given}: no such file or folder")
    return Command(cmd.verb, cmd.lanes, resolved, cmd.params, cmd.outdated, cmd.priority)


def _env_roots(settings: Settings) -> list[Path]:
    return parse_roots(settings.env.get(ROOTS_ENV))


def check_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise BadSchedule(
            f"schedule name {name!r}: 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


def check_cadence(every: str | float | None, cron: str | None) -> tuple[float | None, str | None]:
    """Exactly one of ``--every`` and ``--cron``, each checked."""
    if (every is None) == (cron is None):
        raise BadSchedule('give exactly one of --every (e.g. 15m) and --cron (e.g. "0 3 * * *")')
    if every is not None:
        return parse_every(every), None
    text = " ".join((cron or "").split())
    cron_trigger(text)
    return None, text


def add(
    client: Any,
    name: str,
    argv: Sequence[str],
    *,
    every: str | float | None = None,
    cron: str | None = None,
    allowed_roots: Sequence[str | Path] | None = None,
    untrusted: bool = False,
) -> ScheduleRow:
    """Check and store a schedule (its first run one tick from now); ``BadSchedule``,
    ``OutsideRoots``, ``store.schedules.ScheduleExists``."""
    check_name(name)
    secs, expr = check_cadence(every, cron)
    cmd = check_command(client, argv, allowed_roots=allowed_roots, untrusted=untrusted)
    return store_schedules.add(
        client.engine, name, cmd.argv(), every=secs, cron=expr,
        first_run=lambda now: first_tick_after(secs, expr, now),
    )  # fmt: skip


def resume(engine: Engine, name: str) -> bool:
    return store_schedules.resume(engine, name, next_tick)


# -- running -----------------------------------------------------------------------------------------
def run_command(client: Any, argv: Sequence[str]) -> int | None:
    """Run a stored command line in this process, as ``photojobs sync``/``submit`` would: the job
    it submitted (the newest of a sync's; None when a sync found nothing to do)."""
    from photos.params import parse_param_pairs

    cmd = parse_command(argv)
    params = parse_param_pairs(cmd.params)
    roots = _env_roots(client.settings) or None
    if cmd.verb == "sync":
        report = client.sync(cmd.lanes, cmd.paths, params, outdated=cmd.outdated, allowed_roots=roots)
        return max(report.jobs) if report.jobs else report.job
    from store.lanes import parse_lanes

    lanes = parse_lanes(cmd.lanes)
    plan = client.plan(lanes, cmd.paths, params, allowed_roots=roots) if roots else None
    return int(client.submit(lanes, cmd.paths, params, plan=plan, priority=cmd.priority).job_id)


class ScheduleRunner:
    """The sweeper service's schedule duty: claim the due ticks (``store.schedules.claim_due``) and
    run each won run's command, recording its job or error. One at a time per process
    (APScheduler's ``max_instances=1``); a run's sync sends a heartbeat every :data:`HEARTBEAT` s."""

    def __init__(self, settings: Settings, engine: Engine, client: Any = None) -> None:
        self.settings = settings
        self.engine = engine
        self._client = client
        self.runs = 0
        self.skips = 0
        self.abandoned = abandoned_after(settings.env)
        self.heartbeat = min(HEARTBEAT, self.abandoned / 10)

    @property
    def client(self) -> Any:
        if self._client is None:
            from photojobs.api import Client

            self._client = Client(self.settings, self.engine, migrate=False)
        return self._client

    def run_due(self, at: float | None = None) -> list[Claim]:
        """Claim every due tick this sweeper wins and run the won runs one after the other (each
        waiting one's heartbeat sent from its claim on); returns the claims."""
        claims = store_schedules.claim_due(self.engine, next_tick, at=at, abandoned=self.abandoned)
        for claim in claims:
            if not claim.run:
                self.skips += 1
                log.info("schedule %s: tick skipped, its last run is unfinished", claim.name)
        waiting = {c.name: c for c in claims if c.run}
        if not waiting:
            return claims
        stop = threading.Event()
        beat = threading.Thread(
            target=self._beat, args=(waiting, stop), name="schedule-heartbeat", daemon=True
        )
        beat.start()
        try:
            for claim in list(waiting.values()):
                self.runs += 1
                self.run(claim)
                waiting.pop(claim.name, None)
        finally:
            stop.set()
            beat.join(timeout=5)
        return claims

    def run(self, claim: Claim) -> None:
        """Run a claimed tick's command and record its job or error."""
        job, error = None, None
        try:
            job = run_command(self.client, claim.command)
        except Exception as exc:  # noqa: BLE001 - recorded on the schedule, shown by `schedule list`
            error = str(exc) or type(exc).__name__
            log.warning("schedule %s: run failed: %s", claim.name, error)
        store_schedules.finish(self.engine, claim.name, claim.at, job=job, error=error)
        log.info("schedule %s: ran, job %s", claim.name, job)

    def _beat(self, waiting: dict[str, Claim], stop: threading.Event) -> None:
        while not stop.wait(self.heartbeat):
            for claim in list(waiting.values()):
                try:
                    store_schedules.heartbeat(self.engine, claim.name, claim.at)
                except Exception:  # noqa: BLE001 - the next beat tries again
                    log.debug("schedule heartbeat failed", exc_info=True)
