"""``photojobs schedule add|list|remove|pause|resume`` (issue 38), registered onto the ``photojobs``
group by :func:`register`; the rules are ``photojobs.schedules``' and ``store.schedules``'."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from photojobs.cli_support import echo, shown
from store.errors import SubmissionError

EX_USAGE = 64


def _fail(message: str, code: int = 1) -> None:
    click.echo(f"photojobs: {shown(message, keep_newlines=True)}", err=True)
    sys.exit(code)


def _client() -> Any:
    from photojobs.api import Client

    return Client()


def _when(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at is not None else "-"


def _cadence(d: dict[str, Any]) -> str:
    if d["every"] is not None:
        secs = d["every"]
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if secs % size == 0:
                return f"every {secs / size:g}{unit}"
        return f"every {secs:g}s"
    return f"cron {d['cron']!r}"


@click.group()
def schedule() -> None:
    """Schedules stored in the store: a `sync` or `submit` command line that the sweeper of every
    `photojobs worker` runs once per tick across all fleets, never while its last run is unfinished."""


@schedule.command("add", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": True})
@click.argument("name")
@click.option("--every", default=None, metavar="DURATION", help="A tick every DURATION: 30s, 15m, 2h, 1d.")
@click.option("--cron", default=None, metavar="EXPR", help='A crontab line, e.g. "0 3 * * *" (host time).')
@click.option("--json", "as_json", is_flag=True, help="Print the schedule as JSON.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def add(name: str, every: str | None, cron: str | None, as_json: bool, command: tuple[str, ...]) -> None:
    """Add schedule NAME running COMMAND (after --): `sync PATH… --lanes LANES [--param …]` or
    `submit PATH… --lanes LANES [--param …]`, checked now as the command itself would check it."""
    from photojobs.schedules import add as add_schedule
    from store.schedules import ScheduleExists

    try:
        row = add_schedule(_client(), name, list(command), every=every, cron=cron)
    except ScheduleExists as exc:
        _fail(str(exc))
    except SubmissionError as exc:
        _fail(str(exc), EX_USAGE)
    d = row.as_dict()
    if as_json:
        echo(json.dumps(d))
        return
    echo(f"schedule {row.name}: {_cadence(d)}, first run {_when(row.next_run)}: {' '.join(row.command)}")


@schedule.command("list")
@click.option("--json", "as_json", is_flag=True, help="A JSON array of schedules.")
def list_(as_json: bool) -> None:
    """Every schedule: its cadence, command, last run (time and job), next run, runs and skips."""
    from store.schedules import list_all

    rows = [r.as_dict() for r in list_all(_client().engine)]
    if as_json:
        echo(json.dumps(rows))
        return
    if not rows:
        echo("no schedules")
    for d in rows:
        state = "paused" if d["paused"] else ("running" if d["running"] else "waiting")
        last = d["last_run"]
        ran = f"last run {_when(last['at'])} job {last['job'] or '-'}" if last else "never run"
        echo(
            f"{d['name']}: {_cadence(d)}, {state}, {ran}, next {_when(d['next_run'])}, "
            f"{d['runs']} run(s), {d['skipped']} skipped: {' '.join(d['command'])}"
        )
        if d["last_error"]:
            echo(f"  last error: {d['last_error']}")


@schedule.command("remove")
@click.argument("name")
def remove(name: str) -> None:
    """Remove schedule NAME (a run under way finishes)."""
    from store.schedules import UnknownSchedule
    from store.schedules import remove as remove_schedule

    try:
        remove_schedule(_client().engine, name)
    except UnknownSchedule as exc:
        _fail(str(exc))
    echo(f"schedule {name} removed")


@schedule.command("pause")
@click.argument("name")
def pause(name: str) -> None:
    """Pause schedule NAME: none of its ticks runs until it is resumed."""
    from store.schedules import UnknownSchedule
    from store.schedules import pause as pause_schedule

    try:
        changed = pause_schedule(_client().engine, name)
    except UnknownSchedule as exc:
        _fail(str(exc))
    echo(f"schedule {name} paused" if changed else f"schedule {name} was already paused")


@schedule.command("resume")
@click.argument("name")
def resume(name: str) -> None:
    """Resume schedule NAME from its next tick (the ticks missed while paused are not run)."""
    from photojobs.schedules import resume as resume_schedule
    from store.schedules import UnknownSchedule

    try:
        changed = resume_schedule(_client().engine, name)
    except UnknownSchedule as exc:
        _fail(str(exc))
    echo(f"schedule {name} resumed" if changed else f"schedule {name} was not paused")


def register(cli: click.Group) -> None:
    cli.add_command(schedule)


__all__ = ["register"]
