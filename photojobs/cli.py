"""The ``photojobs`` command."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click

from photojobs.cli_support import worker_command, worker_env
from photojobs.config import Settings
from photojobs.lanes import LANE_NAMES, parse_lanes
from photojobs.params import parse_param_pairs
from photos.errors import InvalidParameter
from store.errors import BacklogFull, StoreError, SubmissionError, UnknownJob

EX_TEMPFAIL = 75
EX_USAGE = 64


def _client():  # type: ignore[no-untyped-def]
    from photojobs.api import Client

    return Client()


def _fail(message: str, code: int = 1) -> None:
    click.echo(f"photojobs: {message}", err=True)
    sys.exit(code)


@click.group()
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def cli(verbose: int) -> None:
    """photojobs: durable photo jobs on Dramatiq, Redis and SQLAlchemy."""
    level = logging.WARNING - 10 * verbose
    logging.basicConfig(
        level=max(level, logging.DEBUG), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )


@cli.command()
@click.option("--lanes", required=True, help=f"Comma-separated pipeline of lanes: {', '.join(LANE_NAMES)}.")
@click.option(
    "--param", "params", multiple=True, metavar="KEY=VALUE", help="A lane parameter, e.g. exif.rating=5."
)
@click.option("--json", "as_json", is_flag=True, help="Print {job, items} as JSON.")
@click.argument("paths", nargs=-1, required=True)
def submit(lanes: str, params: tuple[str, ...], as_json: bool, paths: tuple[str, ...]) -> None:
    """Submit a job over PATHS (files or folders, recursed); prints the job id."""
    try:
        result = _client().submit(parse_lanes(lanes), list(paths), parse_param_pairs(params))
    except BacklogFull as exc:
        _fail(str(exc), EX_TEMPFAIL)
    except (InvalidParameter, SubmissionError, ValueError) as exc:
        _fail(str(exc), EX_USAGE)
    if as_json:
        click.echo(json.dumps({"job": result.job_id, "items": result.items}))
    else:
        click.echo(result.job_id)


@cli.command()
@click.argument("job", type=int, required=False)
@click.option("--json", "as_json", is_flag=True)
def status(job: int | None, as_json: bool) -> None:
    """Job state and per-lane counts of items by state (the newest job if JOB is omitted)."""
    try:
        st = _client().status(job)
    except UnknownJob as exc:
        _fail(str(exc) if job else "no jobs yet")
    if as_json:
        out = {"job": st.job_id, "state": st.state, "lanes": st.lanes}
        click.echo(json.dumps(out | ({"submission": st.submission} if st.submission else {})))
        return
    click.echo(f"job {st.job_id}: {st.state}" + (f" (control: {st.control})" if st.control else ""))
    if st.submission:  # its photos are still landing, or its submitter died half-way
        sub = st.submission
        click.echo(
            f"  submission: {sub['landed']} of {sub['photos']} photo(s) written, last chunk "
            f"{sub['idle']:.0f} s ago; nothing runs until it completes (cancel it if its submitter died)"
        )
    for lane in st.lane_order:
        counts = st.lanes.get(lane, {})
        parts = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        click.echo(f"  {lane:9} {parts}")


def _format_event(e: dict[str, Any]) -> str:
    at = time.strftime("%H:%M:%S", time.localtime(e["at"]))
    who = f" item {e['item']}" if e["item"] else ""
    lane = f" {e['lane']}" if e["lane"] else ""
    extra = f" {json.dumps(e['detail'])}" if e["detail"] else ""
    head = f"{e['cursor']:>8} {at} job {e['job']}{lane}{who} {e['type']}"
    return f"{head} attempt={e['attempt']} token={e['token']}{extra}"


@cli.command()
@click.option("--job", type=int, help="Only this job's events.")
@click.option("--after", type=int, default=0, help="Start after this cursor.")
@click.option("--follow", is_flag=True, help="Keep streaming new events.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
def events(job: int | None, after: int, follow: bool, as_json: bool) -> None:
    """Print the event log from a cursor; never misses an event, never repeats one."""
    client = _client()
    cursor = after
    while True:
        batch = client.events(after=cursor, job_id=job)
        for e in batch:
            d = e.as_dict()
            click.echo(json.dumps(d) if as_json else _format_event(d))
            cursor = e.cursor
        if not follow:
            if len(batch) < 1000:
                return
            continue
        if len(batch) < 1000:
            time.sleep(0.5)


def _control(action: str, job: int) -> None:
    client = _client()
    try:
        n = getattr(client, action)(job)
    except UnknownJob as exc:
        _fail(str(exc))
    st = client.status(job)
    click.echo(f"job {job}: {action} requested; {n} item(s) changed now; job is {st.state}")


@cli.command()
@click.argument("job", type=int)
def cancel(job: int) -> None:
    """Cancel JOB: not-yet-running items are cancelled now, running ones stop at a safe point."""
    _control("cancel", job)


@cli.command()
@click.argument("job", type=int)
def pause(job: int) -> None:
    """Pause JOB: items become paused (resumable); running ones stop at a safe point."""
    _control("pause", job)


@cli.command()
@click.argument("job", type=int)
def resume(job: int) -> None:
    """Resume a paused JOB."""
    _control("resume", job)


@cli.group()
def db() -> None:
    """Database schema commands."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Create or upgrade the schema to the newest revision."""
    from store.engine import make_engine
    from store.schema import current_revision, upgrade

    settings = Settings.from_env()
    engine = make_engine(settings.database_url)
    upgrade(engine)
    click.echo(f"schema at revision {current_revision(engine)}")


@cli.command()
@click.option("--once", is_flag=True, help="One pass, then exit.")
def sweep(once: bool) -> None:
    """Run the sweeper: revoke expired leases, re-publish lost messages, top up lanes."""
    from photojobs.sweeper_service import Sweeper
    from store.schema import upgrade

    settings = Settings.from_env()
    sweeper = Sweeper(settings)
    upgrade(sweeper.engine)
    if once:
        r = sweeper.once()
        click.echo(
            f"revoked {r.revoked}, quarantined {r.quarantined}, re-published {r.republished}, "
            f"dispatched {r.dispatched}, numbered {r.sequenced} event(s)"
        )
        sweeper.stop()
        return
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    sweeper.start()
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        sweeper.stop()


@cli.command()
@click.option("--lanes", default=",".join(LANE_NAMES), show_default=True, help="Lanes this fleet serves.")
@click.option("--processes", default=2, show_default=True, help="Worker processes (each restarted alone).")
@click.option("--threads", default=4, show_default=True, help="Threads per worker process.")
@click.option("--no-sweeper", is_flag=True, help="Do not run a sweeper in this fleet.")
def worker(lanes: str, processes: int, threads: int, no_sweeper: bool) -> None:
    """Run worker processes (each its own `dramatiq actors`) plus the sweeper until SIGTERM/Ctrl-C."""
    from photojobs.supervisor import Supervisor
    from photojobs.sweeper_service import Sweeper
    from store.engine import make_engine
    from store.schema import upgrade

    names = parse_lanes(lanes)
    settings = Settings.from_env()
    upgrade(make_engine(settings.database_url))
    command = worker_command(names, threads)
    sup = Supervisor(lambda i: command, processes, env=worker_env(threads))
    sweeper = None if no_sweeper else Sweeper(settings)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    sup.start()
    if sweeper:
        sweeper.start()
    click.echo(
        f"photojobs worker: {processes} process(es) x {threads} thread(s) on {','.join(names)}", err=True
    )
    try:
        stop.wait()
    finally:
        sup.stop()
        if sweeper:
            sweeper.stop()


@cli.command()
@click.option("--lanes", required=True, help="Comma-separated pipeline, e.g. analysis,exif,rename.")
@click.option(
    "--param", "params", multiple=True, metavar="KEY=VALUE", help="A lane parameter, e.g. exif.rating=5."
)
@click.option("--workers", default=2, show_default=True, help="Worker processes (each restarted alone).")
@click.option("--threads", default=2, show_default=True, help="Threads per worker process.")
@click.option(
    "--state", type=click.Path(path_type=Path), help="State folder (default: .photojobs next to PATH)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the final summary as JSON.")
@click.option("--kill-worker-at", type=float, hidden=True, help="Demo: SIGKILL a worker at this share done.")
@click.argument("paths", nargs=-1, required=True)
def run(
    lanes: str,
    params: tuple[str, ...],
    workers: int,
    threads: int,
    state: Path | None,
    as_json: bool,
    kill_worker_at: float | None,
    paths: tuple[str, ...],
) -> None:
    """Run a job over PATHS on this machine: embedded Redis, workers, sweeper, live progress.

    Ctrl-C pauses (a second Ctrl-C stops at once); the same command again resumes the job.
    """
    from photojobs.run import RunOptions
    from photojobs.run import run as run_job

    try:
        opts = RunOptions(
            paths=list(paths),
            lanes=parse_lanes(lanes),
            params=parse_param_pairs(params),
            workers=workers,
            threads=threads,
            state=state,
            as_json=as_json,
            kill_worker_at=kill_worker_at,
        )
        code = run_job(opts)
    except (InvalidParameter, SubmissionError, ValueError) as exc:
        _fail(str(exc), EX_USAGE)
    sys.exit(code)


def main() -> None:
    try:
        cli()
    except StoreError as exc:
        _fail(str(exc))


if __name__ == "__main__":
    main()
