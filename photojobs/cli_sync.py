"""``photojobs sync PATH…`` and ``photojobs watch PATH…`` (issue 38), registered onto the
``photojobs`` group by :func:`register`; ``photojobs worker --watch-photos`` uses
:func:`worker_watcher`."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import click

from photojobs.cli_support import echo, shown
from photos.errors import InvalidParameter
from photos.params import parse_param_pairs
from store.errors import BacklogFull, SubmissionError
from store.lanes import LANE_NAMES

EX_USAGE = 64
EX_TEMPFAIL = 75
LANES_HELP = f"Comma-separated pipeline of lanes: {', '.join(LANE_NAMES)}."
PARAM_HELP = "A lane parameter, e.g. exif.rating=5."


def _fail(message: str, code: int = 1) -> None:
    click.echo(f"photojobs: {shown(message, keep_newlines=True)}", err=True)
    sys.exit(code)


def _client() -> Any:
    from photojobs.api import Client

    return Client()


def summary_line(report: Any) -> str:
    """``job 12: 3 new, 1 changed, 120 unchanged, 1 moved, 2 missing`` (``no job``: nothing to do)."""
    head = f"job {report.job}" if report.job is not None else "no job"
    if len(report.jobs) > 1:
        head = "jobs " + ", ".join(map(str, report.jobs))
    counts = [f"{report.new} new", f"{report.changed} changed", f"{report.unchanged} unchanged"]
    counts += [f"{report.moved} moved", f"{report.missing} missing"]
    counts += [f"{n} {what}" for n, what in ((report.outdated, "outdated"), (report.busy, "busy")) if n]
    return f"{head}: {', '.join(counts)}"


def _print_report(report: Any, as_json: bool) -> None:
    if as_json:
        echo(json.dumps(report.as_dict()))
        return
    echo(summary_line(report))
    for m in report.moves:
        echo(f"  moved: {m['from']} -> {m['to']} (photo {m['photo']})", err=True)
    for path in report.missing_paths:
        echo(f"  missing: {path}", err=True)
    if report.missing > len(report.missing_paths):
        echo(f"  … and {report.missing - len(report.missing_paths)} more missing (--json)", err=True)
    if report.skipped:
        from photojobs.api import skipped_text

        echo(f"left out: {skipped_text(report.skipped)}", err=True)


@click.command()
@click.option("--lanes", required=True, help=LANES_HELP)
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help=PARAM_HELP)
@click.option(
    "--outdated",
    is_flag=True,
    help="Also run each lane again on unchanged photos whose recorded lane version differs "
    "(the lane's code or parameters changed since), or whose item was cancelled.",
)
@click.option(
    "--idempotency-key",
    "idempotency_key",
    default=None,
    metavar="KEY",
    help="Run again with the same KEY and arguments: the first sync's report, nothing walked or "
    "submitted again (another command line with the same KEY: exit 64).",
)
@click.option("--json", "as_json", is_flag=True, help='Print {"job", "new", "changed", "unchanged", …}.')
@click.argument("paths", nargs=-1, required=True)
def sync(
    lanes: str,
    params: tuple[str, ...],
    outdated: bool,
    idempotency_key: str | None,
    as_json: bool,
    paths: tuple[str, ...],
) -> None:
    """Submit one job for the photos under PATHS that are new or changed since the store last saw
    them; moved photos keep their id and history, missing ones are reported (never deleted)."""
    try:
        report = _client().sync(
            lanes, list(paths), parse_param_pairs(params), outdated=outdated, idempotency_key=idempotency_key
        )
    except BacklogFull as exc:
        _fail(str(exc), EX_TEMPFAIL)
    except (InvalidParameter, SubmissionError, ValueError) as exc:
        _fail(str(exc), EX_USAGE)
    _print_report(report, as_json)


def _options(
    debounce: float, wait: float, most: int, max_wait: float, poll: bool, poll_interval: float
) -> Any:
    from photojobs.watch import WatchOptions

    if debounce < 0 or wait < 0 or most < 1 or max_wait < 0 or poll_interval <= 0:
        _fail(
            "--debounce, --batch-wait and --batch-max-wait must be >= 0, --batch-max >= 1, "
            "--poll-interval > 0",
            EX_USAGE,
        )
    return WatchOptions(debounce, wait, most, max_wait, poll, poll_interval)


@click.command()
@click.option("--lanes", required=True, help=LANES_HELP)
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help=PARAM_HELP)
@click.option(
    "--debounce",
    default=3.0,
    show_default=True,
    help="Seconds a photo and its sidecars stay unchanged before it is synced.",
)  # noqa: E501
@click.option(
    "--batch-wait",
    default=1.0,
    show_default=True,
    help="Seconds without a newly settled photo before a batch is synced.",
)  # noqa: E501
@click.option("--batch-max", default=5000, show_default=True, help="Most photos in one batch.")
@click.option(
    "--batch-max-wait",
    default=10.0,
    show_default=True,
    help="Seconds the first photo of a batch waits at most.",
)  # noqa: E501
@click.option("--poll", is_flag=True, help="Poll instead of inotify (network mounts; automatic on NFS/SMB).")
@click.option("--poll-interval", default=5.0, show_default=True, help="Seconds between polls.")
@click.option("--json", "as_json", is_flag=True, help="Print each sync's report as one JSON line.")
@click.argument("paths", nargs=-1, required=True)
def watch(
    lanes: str,
    params: tuple[str, ...],
    debounce: float,
    batch_wait: float,
    batch_max: int,
    batch_max_wait: float,
    poll: bool,
    poll_interval: float,
    as_json: bool,
    paths: tuple[str, ...],
) -> None:
    """Watch folders and sync each photo once it and its sidecars have stopped changing, in
    batches; runs until SIGTERM or Ctrl-C (starts with one sync of the folders)."""
    from photojobs.watch import Watcher

    options = _options(debounce, batch_wait, batch_max, batch_max_wait, poll, poll_interval)
    try:
        watcher = Watcher(
            _client(), lanes.split(","), list(paths), parse_param_pairs(params), options,
            on_sync=lambda report: _print_report(report, as_json),
        )  # fmt: skip
    except (InvalidParameter, SubmissionError, ValueError) as exc:
        _fail(str(exc), EX_USAGE)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: watcher.stop())
    watcher.start()
    echo(f"photojobs watch: {', '.join(watcher.roots)} ({watcher.kind}), lanes {lanes}", err=True)
    try:
        watcher.run()
    finally:
        watcher.stop()


def worker_watcher(settings: Any, paths: tuple[Path, ...], lanes: str, poll: bool) -> Any:
    """``photojobs worker --watch-photos PATH``: a :class:`photojobs.watch.Watcher` started in a
    thread of the worker command (stopped with ``.stop()``), or None without paths."""
    if not paths:
        return None
    from photojobs.api import Client
    from photojobs.watch import Watcher, WatchOptions, start_in_thread

    watcher = Watcher(Client(settings), lanes.split(","), list(paths), None, WatchOptions(poll=poll))
    start_in_thread(watcher)
    return watcher


def register(cli: click.Group) -> None:
    for command in (sync, watch):
        cli.add_command(command)


__all__ = ["register", "summary_line", "worker_watcher"]
