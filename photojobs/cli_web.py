"""CLI commands for inspection, retry, retention and the web server, and ``--state DIR`` on every
command: ``jobs``, ``items``, ``retry``, ``prune``, ``serve``. Registered onto the ``photojobs``
group by ``register(cli)``."""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from photojobs.cli_support import echo, shown
from store.errors import NotApplicable, StoreError, SubmissionError, UnknownJob

EX_USAGE = 64
EX_TEMPFAIL = 75  # try again later: e.g. the port is taken (sysexits.h)
STATE_HELP = "Read the store of a `photojobs run` state folder (its .photojobs folder)."


def _fail(message: str, code: int = 1) -> None:
    click.echo(f"photojobs: {shown(message, keep_newlines=True)}", err=True)
    sys.exit(code)


def _client(existing: bool = False):  # type: ignore[no-untyped-def]
    """The API client; ``existing``: a read-only command, whose store must exist (never created)."""
    from photojobs.api import Client

    if existing:
        from photojobs.cli import _existing_database
        from photojobs.config import Settings

        _existing_database(Settings.from_env())
    return Client()


def use_state_dir(state: Path) -> str:
    """Point this process (and the workers it starts) at the SQLite store of a run's state folder."""
    folder = state.expanduser()
    db = folder / "photojobs.db"
    if not db.exists() and (folder / ".photojobs" / "photojobs.db").exists():
        db = folder / ".photojobs" / "photojobs.db"
    if not db.exists():
        raise click.UsageError(f"{state}: no photojobs store here (expected {folder / 'photojobs.db'})")
    url = f"sqlite:///{db.resolve()}"
    os.environ["PHOTOJOBS_DATABASE_URL"] = url
    return url


def store_folder(value: str | None) -> Path | None:
    """``value`` as a state folder when it names a folder holding a photojobs store, else None."""
    if not value:
        return None
    folder = Path(value).expanduser()
    if (folder / "photojobs.db").exists() or (folder / ".photojobs" / "photojobs.db").exists():
        return folder
    return None


def _with_state(command: click.Command) -> None:
    """Give ``command`` a ``--state DIR`` option (``--state-dir DIR`` where ``--state`` already means
    something: ``run``'s state folder, the state filter of ``jobs`` and ``items``)."""
    if command.callback is None or command.name == "run":
        return
    taken = any("--state" in getattr(p, "opts", ()) for p in command.params)
    flags = ["--state-dir", "state_dir"] if taken else ["--state", "--state-dir", "state_dir"]
    command.params.append(
        click.Option(flags, type=click.Path(path_type=Path, file_okay=False), help=STATE_HELP)
    )
    callback: Callable[..., Any] = command.callback

    @functools.wraps(callback)
    def wrapped(*args: Any, state_dir: Path | None = None, **kwargs: Any) -> Any:
        if state_dir is not None:
            use_state_dir(state_dir)
            click.get_current_context().meta[STATE_META] = state_dir
        return callback(*args, **kwargs)

    command.callback = wrapped


STATE_META = "photojobs.state_dir"  # the state folder this command was given (for its hints)


def more_line(*words: object) -> str:
    """``more: photojobs …``: the command that shows the next page — every filter it was given
    (``words``) and its ``--state-dir``, each word quoted for a shell."""
    ctx = click.get_current_context(silent=True)
    state = ctx.meta.get(STATE_META) if ctx is not None else None
    parts = ["photojobs", *(str(w) for w in words)]
    if state is not None:
        parts += ["--state-dir", str(state)]
    return "more: " + " ".join(shlex.quote(p) for p in parts)


def _flag(name: str, value: object, default: object = None) -> list[object]:
    return [] if value is None or value == default else [name, value]


def _all_commands(group: click.Group) -> list[click.Command]:
    out: list[click.Command] = []
    for cmd in group.commands.values():
        if isinstance(cmd, click.Group):
            out.extend(_all_commands(cmd))
        else:
            out.append(cmd)
    return out


def _status_json(st: Any) -> dict[str, Any]:
    return {
        **st.as_dict(),
        "lane_order": st.lane_order,
        "totals": {k: v for k, v in st.totals().items() if v},
        "created_at": st.created_at,
    }


@click.command()
@click.option("--state", "job_state", help="Only jobs in this state (running, paused, succeeded, failed, …).")
@click.option("--limit", default=20, show_default=True, help="Jobs per page.")
@click.option("--after", type=int, help="Continue after this job id (the previous page's next).")
@click.option("--json", "as_json", is_flag=True, help='Print {"jobs": [STATUS, …], "next": …}.')
def jobs(job_state: str | None, limit: int, after: int | None, as_json: bool) -> None:
    """List jobs, newest first, with their state and progress (--state-dir DIR: a run's folder)."""
    if store_folder(job_state):
        use_state_dir(Path(job_state or ""))
        click.get_current_context().meta[STATE_META] = job_state
        job_state = None
    from store.listing import JOB_STATES

    if job_state and job_state not in JOB_STATES:
        _fail(f"unknown job state {job_state!r}; states: {', '.join(JOB_STATES)}", EX_USAGE)
    from photojobs.progress import duration

    client = _client(existing=True)
    found, nxt = client.list_jobs(state=job_state, limit=limit, after=after)
    etas = client.etas(found)
    if as_json:
        shown_jobs = [_status_json(j) | {"eta": etas.get(j.job_id)} for j in found]
        echo(json.dumps({"jobs": shown_jobs, "next": nxt}))
        return
    if not found:
        echo("no jobs" + (f" in state {job_state}" if job_state else ""))
    for st in found:
        totals = st.totals()
        done = sum(totals[s] for s in ("succeeded", "failed", "cancelled", "skipped"))
        echo(
            f"{st.job_id:>6}  {st.shown_state():10} {','.join(st.lane_order):30} "
            f"{done}/{sum(totals.values())} done"
            + (f", {totals['failed']} failed" if totals["failed"] else "")
            + (f", ETA {duration(eta)}" if (eta := etas.get(st.job_id)) is not None else "")
        )
    if nxt:
        echo(more_line("jobs", *_flag("--state", job_state), *_flag("--limit", limit, 20), "--after", nxt))


@click.command()
@click.argument("job", type=int)
@click.option("--state", "item_state", help="Only items in this state (failed, running, …).")
@click.option("--lane", help="Only this lane's items.")
@click.option("--limit", default=100, show_default=True)
@click.option("--after", type=int, help="Continue after this item id (the previous page's next).")
@click.option("--json", "as_json", is_flag=True, help='Print {"items": [...], "next": …}.')
def items(
    job: int, item_state: str | None, lane: str | None, limit: int, after: int | None, as_json: bool
) -> None:
    """List a job's items (photo, lane, state, attempts, error), by id (--state-dir DIR: a run's folder)."""
    from store.models import ALL_STATES

    if store_folder(item_state):
        use_state_dir(Path(item_state or ""))
        click.get_current_context().meta[STATE_META] = item_state
        item_state = None
    if item_state and item_state not in ALL_STATES:
        _fail(f"unknown item state {item_state!r}; states: {', '.join(ALL_STATES)}", EX_USAGE)
    try:
        rows, nxt = _client(existing=True).items(job, state=item_state, lane=lane, limit=limit, after=after)
    except UnknownJob as exc:
        _fail(str(exc))
    if as_json:
        echo(json.dumps({"items": [r.as_dict() for r in rows], "next": nxt}))
        return
    for r in rows:
        extra = f"  {r.error}" if r.error else ""
        echo(f"{r.id:>8} {r.lane:9} {r.state:9} attempt {r.attempt}  {r.path or '(bundle)'}{extra}")
    if nxt:
        filters = [*_flag("--state", item_state), *_flag("--lane", lane), *_flag("--limit", limit, 100)]
        echo(more_line("items", job, *filters, "--after", nxt))


@click.command()
@click.argument("job", type=int)
@click.option("--lane", help="Only this lane's failed/cancelled items.")
@click.option("--json", "as_json", is_flag=True)
def retry(job: int, lane: str | None, as_json: bool) -> None:
    """Put JOB's failed and cancelled items back to work (and the later lanes they held up)."""
    client = _client(existing=True)
    try:
        n = client.retry(job, lane)
    except UnknownJob as exc:
        _fail(str(exc))
    except NotApplicable as exc:
        _fail(str(exc))
    except SubmissionError as exc:
        _fail(str(exc), EX_USAGE)
    st = client.status(job)
    if as_json:
        echo(json.dumps({"job": job, "retried": n, "state": st.state}))
    else:
        echo(f"job {job}: {n} item(s) back to work; job is {st.state}")


@click.command()
@click.option(
    "--older-than", required=True, help="Age such as 30d, 12h, 90m (finished jobs and events older)."
)
@click.option("--json", "as_json", is_flag=True)
def prune(older_than: str, as_json: bool) -> None:
    """Delete finished jobs (with their items and events) and events older than an age."""
    from store.retention import parse_age

    try:
        seconds = parse_age(older_than)
    except ValueError as exc:
        _fail(str(exc), EX_USAGE)
    client = _client(existing=True)
    done = client.prune(seconds)
    try:  # displaced originals kept for undo: PHOTOJOBS_HISTORY_KEEP (default 30d), not --older-than
        originals = client.prune_history()
    except ValueError as exc:
        _fail(f"PHOTOJOBS_HISTORY_KEEP: {exc}", EX_USAGE)
    if as_json:
        echo(json.dumps(done.as_dict() | {"originals": originals}))
    else:
        echo(f"pruned {done.jobs} job(s), {done.items} item(s), {done.events} event(s)")
        if originals:
            echo(f"removed {originals} kept original(s) older than PHOTOJOBS_HISTORY_KEEP")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def port_in_use(host: str, port: int) -> bool:
    """Whether ``host:port`` is taken: a bind as uvicorn's (``SO_REUSEADDR``) fails with EADDRINUSE.
    Checked before starting, so a taken port is a clear exit 75, not a crash reported late."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8765, show_default=True, type=int)
@click.option(
    "--insecure-local", is_flag=True, help="Serve without PHOTOJOBS_API_TOKEN (only on a loopback address)."
)
def serve(host: str, port: int, insecure_local: bool) -> None:
    """Serve the HTTP API and the dashboard (uvicorn); needs PHOTOJOBS_API_TOKEN."""
    from photojobs.web import TOKEN_ENV, create_app
    from photojobs.web import server as web_server

    token = os.environ.get(TOKEN_ENV) or None
    if token is None:
        if not insecure_local:
            _fail(
                f"refusing to serve without a token: set {TOKEN_ENV} (or --insecure-local on 127.0.0.1)",
                EX_USAGE,
            )
        if not is_loopback(host):
            _fail(f"--insecure-local serves only on a loopback address, not {host}", EX_USAGE)
    if port_in_use(host, port):
        _fail(f"port {port} is in use: --port", EX_TEMPFAIL)
    try:
        limits = web_server.ServerLimits.from_env(os.environ)
        app = create_app(token=token, insecure=token is None, local_port=port if token is None else None)
    except ValueError as exc:
        _fail(str(exc), EX_USAGE)
    if os.environ.get("FORWARDED_ALLOW_IPS") and not limits.trusted:
        echo(
            "photojobs serve: FORWARDED_ALLOW_IPS is ignored; name your proxies in "
            f"{web_server.TRUSTED_PROXIES_ENV} to trust their X-Forwarded-For",
            err=True,
        )
    shown = f"[{host}]" if ":" in host else host
    echo(f"photojobs serve: http://{shown}:{port}/ (API at /api, schema at /openapi.json)", err=True)
    if token is None:
        echo("photojobs serve: no token: only a loopback Host, from a loopback page", err=True)
    web_server.run(app, host, port, limits)


def register(cli: click.Group) -> None:
    """Add the commands to the ``photojobs`` group and ``--state DIR`` to every command."""
    for command in (jobs, items, retry, prune, serve):
        cli.add_command(command)
    for command in _all_commands(cli):
        _with_state(command)


__all__ = ["register", "StoreError"]
