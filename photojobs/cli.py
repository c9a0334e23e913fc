"""The ``photojobs`` command."""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click

from photojobs.cli_support import echo, shown, worker_command, worker_env
from photojobs.config import Settings, masked, service_error
from photojobs.errors import EX_TEMPFAIL, EX_UNAVAILABLE, EX_USAGE, ConfigError, ServiceUnavailable
from photos.errors import InvalidParameter
from photos.params import parse_param_pairs
from store.errors import BacklogFull, NotApplicable, StoreError, SubmissionError, UnknownJob
from store.lanes import LANE_NAMES, parse_lanes

_DEBUG = {"on": False}


def _existing_database(settings: Settings) -> None:
    """Commands that only read or change existing jobs never create a store: a SQLite file that is
    not there (or a folder that is not there) is an error, and nothing is created."""
    from sqlalchemy.engine import make_url

    url = make_url(settings.database_url)
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return
    path = Path(url.database)
    if not path.is_file():
        where = "its folder does not exist" if not path.parent.is_dir() else "no such file"
        raise ServiceUnavailable(
            "the database",
            masked(settings.database_url),
            f"{where} (nothing was created): point at a store with --state-dir DIR (`make demo`'s "
            "is --state-dir .photojobs) or PHOTOJOBS_DATABASE_URL; `photojobs submit` or "
            "`photojobs db upgrade` creates one",
        )


def _client(existing: bool = False):  # type: ignore[no-untyped-def]
    """The API client; ``existing``: a store that must already exist (read-only and control commands)."""
    from photojobs.api import Client

    settings = Settings.from_env()
    if existing:
        _existing_database(settings)  # an existing store is still brought to the current schema
    return Client(settings)


def _check_database(settings: Settings) -> None:
    """A server database (PostgreSQL) accepts a connection, else exit 69 before anything starts."""
    if settings.database_url.startswith("sqlite"):
        return  # created on first use
    from store.engine import make_engine

    engine = make_engine(settings.database_url, pool_size=1)
    try:
        with engine.connect():
            pass
    finally:
        engine.dispose()


def _check_redis(settings: Settings) -> None:
    """Redis answers PING, else :class:`ServiceUnavailable` (exit 69) before anything starts."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    client = redis.Redis.from_url(
        settings.redis_url, socket_connect_timeout=5, socket_timeout=5, retry=Retry(NoBackoff(), 0)
    )
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise ServiceUnavailable("Redis", masked(settings.redis_url), str(exc).splitlines()[0]) from exc
    finally:
        client.close()


def _fail(message: str, code: int = 1) -> None:
    click.echo(f"photojobs: {shown(message, keep_newlines=True)}", err=True)
    sys.exit(code)


@click.group()
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.option("--debug", is_flag=True, help="Show the traceback of an error (also PHOTOJOBS_DEBUG=1).")
def cli(verbose: int, debug: bool) -> None:
    """photojobs: durable photo jobs on Dramatiq, Redis and SQLAlchemy.

    Exit statuses: 0 done, 1 failed (job or command), 64 bad usage or setting, 69 Redis or the
    database unreachable, 75 try again later (a lane is full, the state folder is in use).
    """
    _DEBUG["on"] = _DEBUG["on"] or debug
    level = logging.WARNING - 10 * verbose
    logging.basicConfig(
        level=max(level, logging.DEBUG), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )


@cli.command()
@click.option("--lanes", required=True, help=f"Comma-separated pipeline of lanes: {', '.join(LANE_NAMES)}.")
@click.option(
    "--param", "params", multiple=True, metavar="KEY=VALUE", help="A lane parameter, e.g. exif.rating=5."
)
@click.option(
    "--priority",
    type=click.Choice(["interactive", "normal"]),
    default=None,
    help="interactive: runs before the lanes' queued backlog; normal: waits its turn "
    "[default: interactive when at most PHOTOJOBS_INTERACTIVE_PHOTOS (16) photos].",
)
@click.option(
    "--idempotency-key",
    "idempotency_key",
    default=None,
    metavar="KEY",
    help="Run again with the same KEY and arguments: the first job's id, nothing submitted again "
    "(another command line with the same KEY: exit 64). Keys are kept PHOTOJOBS_IDEMPOTENCY_KEEP.",
)
@click.option("--json", "as_json", is_flag=True, help="Print {job, items, skipped, left_out} as JSON.")
@click.argument("paths", nargs=-1, required=True)
def submit(
    lanes: str,
    params: tuple[str, ...],
    priority: str | None,
    idempotency_key: str | None,
    as_json: bool,
    paths: tuple[str, ...],
) -> None:
    """Submit a job over PATHS (files or folders, recursed); prints the job id."""
    try:
        result = _client().submit(
            parse_lanes(lanes),
            list(paths),
            parse_param_pairs(params),
            priority=priority,
            idempotency_key=idempotency_key,
        )
    except BacklogFull as exc:
        _fail(str(exc), EX_TEMPFAIL)
    except (InvalidParameter, SubmissionError, ValueError) as exc:
        _fail(str(exc), EX_USAGE)
    if not result.broker_reached:  # on stderr: stdout stays the job id (or the JSON)
        echo(
            f"photojobs: job {result.job_id} is queued in the store, but Redis did not answer; "
            "it runs once Redis is back and a sweeper (photojobs worker, photojobs sweep) dispatches it",
            err=True,
        )
    if as_json:
        echo(json.dumps(result.as_dict()))
    else:
        echo(result.job_id)
        if result.skipped:  # nothing left out silently (on stderr: stdout stays the job id)
            from photojobs.api import left_out_lines, skipped_text

            echo(f"left out: {skipped_text(result.skipped)}", err=True)
            for line in left_out_lines(result.left_out):
                echo(line, err=True)


@cli.command()
@click.argument("job", type=int, required=False)
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "--watch", is_flag=True, help="Again every --interval when it changed, until the job has finished."
)
@click.option("--interval", default=2.0, show_default=True, type=click.FloatRange(0.1, 3600.0),
              help="Seconds between looks with --watch.")  # fmt: skip
def status(job: int | None, as_json: bool, watch: bool, interval: float) -> None:
    """Job state, per-lane counts of items by state, and failures grouped by reason class with counts
    and example items (the newest job if JOB is omitted). With --watch: again every --interval
    seconds when it changed (one JSON object a line with --json), ending once the job has finished."""
    from store.control import FINISHED_STATES

    client = _client(existing=True)
    shown = None
    while True:
        lines, state, job = _status_lines(client, job, as_json)
        if lines != shown:
            if watch and shown is not None and not as_json:
                echo(f"-- {time.strftime('%H:%M:%S')}")
            for line in lines:
                echo(line)
            shown = lines
        if not watch or state in FINISHED_STATES:
            return
        time.sleep(interval)


def _status_lines(client: Any, job: int | None, as_json: bool) -> tuple[list[str], str, int]:
    """``status``'s output for ``job`` (the newest when None): its lines, the job's state, its id."""
    from photojobs.progress import failure_lines, times_line, waiting_lines

    try:
        st = client.status(job)
        failures = [g.as_dict() for g in client.failures(st.job_id)]
        times = client.job_times(st).as_dict()
    except UnknownJob as exc:
        _fail(str(exc) if job else "no jobs yet")
    if as_json:
        out = {"job": st.job_id, "state": st.state, "lanes": st.lanes}
        out |= {"submission": st.submission} if st.submission else {}
        out |= {"waiting": st.waiting or [], "waiting_for": st.waiting_for, "times": times}
        return [json.dumps(out | {"failures": failures})], st.state, st.job_id
    lines = [f"job {st.job_id}: {st.shown_state()}" + (f" (control: {st.control})" if st.control else "")]
    add = lines.append  # --watch compares them before anything is shown
    add(f"  {times_line(times)}")
    if st.submission:  # its photos are still landing, or its submitter died half-way
        sub = st.submission
        add(
            f"  submission: {sub['landed']} of {sub['photos']} photo(s) written, last chunk "
            f"{sub['idle']:.0f} s ago; nothing runs until it completes (cancel it if its submitter died)"
        )
    for lane in st.lane_order:
        counts = st.lanes.get(lane, {})
        parts = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        add(f"  {lane:9} {parts}")
    if st.waiting:
        add("  why waiting:")
        for line in waiting_lines(st.waiting):
            add(f"    {line}")
    from photojobs.cli_web import STATE_META

    state_dir = click.get_current_context().meta.get(STATE_META)  # kept in the closing hint
    where = f" --state-dir {shlex.quote(str(state_dir))}" if state_dir is not None else ""
    for line in failure_lines(st.job_id, failures, where):
        add(f"  {line}")
    return lines, st.state, st.job_id


def _format_event(e: dict[str, Any]) -> str:
    at = time.strftime("%H:%M:%S", time.localtime(e["at"]))
    who = f" item {e['item']}" if e["item"] else ""
    lane = f" {e['lane']}" if e["lane"] else ""
    extra = f" {json.dumps(e['detail'])}" if e["detail"] else ""
    job = f" job {e['job']}" if e.get("job") is not None else ""
    cursor = "" if e.get("cursor") is None else e["cursor"]
    head = f"{cursor:>8} {at}{job}{lane}{who} {e['type']}"
    # Only what the event has: no ``attempt=None token=None`` on a job's or a worker's event.
    tail = "".join(f" {k}={e[k]}" for k in ("attempt", "token") if e.get(k) is not None)
    return f"{head}{tail}{extra}"


@cli.command()
@click.option("--job", type=int, help="Only this job's events.")
@click.option("--after", type=int, default=0, help="Start after this cursor.")
@click.option("--follow", is_flag=True, help="Keep streaming new events.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
def events(job: int | None, after: int, follow: bool, as_json: bool) -> None:
    """Print the event log from a cursor; never misses an event, never repeats one."""
    client = _client(existing=True)
    cursor = after
    while True:
        batch = client.events(after=cursor, job_id=job)
        for e in batch:
            d = e.as_dict()
            echo(json.dumps(d) if as_json else _format_event(d))
            cursor = e.cursor
        if not follow:
            if len(batch) < 1000:
                return
            continue
        if len(batch) < 1000:
            time.sleep(0.5)


def _control(action: str, job: int) -> None:
    """``action`` through the one rule of ``store.control`` (the web API's too): a finished job is
    refused, naming its state, exit 1."""
    client = _client(existing=True)
    try:
        n = client.control(action, job)
    except (UnknownJob, NotApplicable) as exc:
        _fail(str(exc))
    st = client.status(job)
    echo(f"job {job}: {action} requested; {n} item(s) changed now; job is {st.state}")


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
    echo(f"schema at revision {current_revision(engine)}")


@cli.command()
@click.option("--once", is_flag=True, help="One pass, then exit.")
def sweep(once: bool) -> None:
    """Run the sweeper: revoke expired leases, re-publish lost messages, top up lanes."""
    from photojobs.sweeper_service import Sweeper
    from store.schema import upgrade

    settings = Settings.from_env()
    _check_redis(settings)
    sweeper = Sweeper(settings)
    upgrade(sweeper.engine)
    if once:
        r = sweeper.once()
        echo(
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
@click.option(
    "--watch",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Development: reload the workers when a *.py file under this folder changes.",
)
@click.option(
    "--watch-photos",
    multiple=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Watch this photo folder and sync what settles in it (photojobs watch; repeatable).",
)
@click.option("--watch-lanes", default="analysis", show_default=True, help="The lanes --watch-photos syncs.")
@click.option("--watch-poll", is_flag=True, help="--watch-photos polls instead of inotify (network mounts).")
def worker(
    lanes: str,
    processes: int,
    threads: int,
    no_sweeper: bool,
    watch: Path | None,
    watch_photos: tuple[Path, ...],
    watch_lanes: str,
    watch_poll: bool,
) -> None:
    """Run worker processes (each its own `dramatiq actors`) plus the sweeper until SIGTERM/Ctrl-C.

    The workers stop with this command however it ends (even SIGKILL); workers that an earlier,
    killed `photojobs worker` of this user left behind are stopped at start.
    """
    from photojobs.lifeline import runtime_dir, stop_orphans
    from photojobs.supervisor import Supervisor, store_recorder
    from photojobs.sweeper_service import Sweeper
    from store.engine import make_engine
    from store.schema import upgrade

    names = parse_lanes(lanes)
    if processes < 1 or threads < 1:
        raise ConfigError("--processes/--threads", "must be at least 1")
    # The lane bounds and the top-up's share fit this fleet unless the operator set the whole
    # fleet's size (several hosts): for this command's sweeper and its workers alike.
    os.environ.setdefault("PHOTOJOBS_FLEET_PROCESSES", str(processes))
    settings = Settings.from_env()
    _check_redis(settings)
    upgrade(make_engine(settings.database_url))
    records = runtime_dir()
    orphans = stop_orphans(sorted(records.glob("worker-*.json")))
    if orphans:
        echo(f"photojobs worker: stopped {orphans} orphaned process(es) of an earlier fleet", err=True)
    command = worker_command(names, threads, str(watch.resolve()) if watch else None)
    sup = Supervisor(
        lambda i: command,
        processes,
        env=worker_env(threads, processes=processes),
        record=records / f"worker-{os.getpid()}.json",
        on_event=store_recorder(make_engine(settings.database_url)),  # restarts by reason, in /metrics
    )
    sweeper = None if no_sweeper else Sweeper(settings)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    sup.start()
    if sweeper:
        sweeper.start()
    from photojobs.cli_sync import worker_watcher

    photo_watcher = worker_watcher(settings, watch_photos, watch_lanes, watch_poll)
    echo(
        f"photojobs worker: {processes} process(es) x {threads} thread(s) on {','.join(names)}"
        + (f", reloading on changes under {watch}" if watch else ""),
        err=True,
    )
    try:
        stop.wait()
    finally:
        if photo_watcher is not None:
            photo_watcher.stop()
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
@click.option("--wait", is_flag=True, help="Wait for another run holding the state folder (else exit 75).")
@click.option("--kill-worker-at", type=float, hidden=True, help="Demo: SIGKILL a worker at this share done.")
@click.argument("paths", nargs=-1, required=True)
def run(
    lanes: str,
    params: tuple[str, ...],
    workers: int,
    threads: int,
    state: Path | None,
    as_json: bool,
    wait: bool,
    kill_worker_at: float | None,
    paths: tuple[str, ...],
) -> None:
    """Run a job over PATHS on this machine: embedded Redis, workers, sweeper, live progress.

    Ctrl-C pauses (a second Ctrl-C stops at once); the same command again resumes the job.
    """
    from photojobs.run import RunOptions, StateFolderBusy
    from photojobs.run import run as run_job

    settings = Settings.from_env()  # every setting checked before anything starts
    if os.environ.get("PHOTOJOBS_REDIS_URL"):
        _check_redis(settings)
    if os.environ.get("PHOTOJOBS_DATABASE_URL"):
        _check_database(settings)
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
            wait=wait,
        )
        code = run_job(opts)
    except StateFolderBusy as exc:
        _fail(str(exc), EX_TEMPFAIL)
    except (InvalidParameter, SubmissionError, ValueError) as exc:
        _fail(str(exc), EX_USAGE)
    sys.exit(code)


def _settings_or_none() -> Settings | None:
    try:
        return Settings.from_env()
    except Exception:  # noqa: BLE001 - only used to name the service in a message
        return None


@cli.group()
def lane() -> None:
    """Lanes across all jobs: list them, pause or resume one (stored: a pause survives restarts)."""


def _lane_control(action: str, name: str, as_json: bool) -> None:
    from photojobs.api import UnknownLane

    client = _client()
    try:
        changed = getattr(client, f"{action}_lane")(name, by=f"cli:{os.getpid()}")
    except UnknownLane as exc:
        _fail(str(exc), EX_USAGE)
    if as_json:
        echo(json.dumps({"lane": name, "action": action, "changed": changed}))
    else:
        done, already = {"pause": ("paused", "paused"), "resume": ("resumed", "running")}[action]
        echo(f"lane {name} {done}" if changed else f"lane {name} was already {already}")


@lane.command("pause")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
def lane_pause(name: str, as_json: bool) -> None:
    """Pause lane NAME for every job: nothing of it starts (queued work waits), running items finish."""
    _lane_control("pause", name, as_json)


@lane.command("resume")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
def lane_resume(name: str, as_json: bool) -> None:
    """Resume lane NAME: its waiting work is dispatched again."""
    _lane_control("resume", name, as_json)


@lane.command("list")
@click.option("--json", "as_json", is_flag=True)
def lane_list(as_json: bool) -> None:
    """Every lane and whether it is paused (and since when)."""
    lanes = _client(existing=True).lanes()
    if as_json:  # the one shape of every listing: {"<things>": [...], "next": cursor or null}
        echo(json.dumps({"lanes": lanes, "next": None}))
        return
    for entry in lanes:
        since = entry["paused_at"]
        when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(since)) if since else ""
        state = f"paused since {when}" if since else "running"
        echo(f"{entry['lane']:9} {state}")


from photojobs.cli_history import register as _register_history  # noqa: E402
from photojobs.cli_ops import register as _register_ops  # noqa: E402
from photojobs.cli_schedule import register as _register_schedule  # noqa: E402
from photojobs.cli_sync import register as _register_sync  # noqa: E402
from photojobs.cli_web import register as _register_web  # noqa: E402 - after the commands above

_register_history(cli)
_register_sync(cli)
_register_schedule(cli)
_register_ops(cli)

_register_web(cli)


def main() -> None:
    """The command; an operator's mistake or an outage is one line and an exit status (see ``cli``),
    with the traceback only under ``--debug`` / ``PHOTOJOBS_DEBUG=1``."""
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    _DEBUG["on"] = os.environ.get("PHOTOJOBS_DEBUG", "") not in ("", "0")
    try:
        cli()
    except SystemExit:
        raise
    except ConfigError as exc:
        _reraise_if_debug()
        _fail(str(exc), EX_USAGE)
    except (ArgumentError, NoSuchModuleError) as exc:
        _reraise_if_debug()
        _fail(f"PHOTOJOBS_DATABASE_URL: {str(exc).splitlines()[0]}", EX_USAGE)
    except StoreError as exc:
        _reraise_if_debug()
        _fail(str(exc))
    except Exception as exc:
        err = service_error(exc, _settings_or_none())
        if err is None or _DEBUG["on"]:
            raise
        _fail(str(err), EX_UNAVAILABLE)


def _reraise_if_debug() -> None:
    if _DEBUG["on"]:
        raise


if __name__ == "__main__":
    main()
