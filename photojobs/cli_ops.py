"""The operator's verbs the console has and the CLI lacked (issue 41): ``photojobs workers`` (who is
serving, what each thread runs), ``photojobs discard`` (give up on a job's failed items) and
``photojobs bulk`` (retry, cancel or discard over several jobs at once). Each goes through the same
``photojobs.api.Client`` call as the console's button, so the rules (a finished job refuses a cancel,
only failed items are discarded) are the store's, in one place."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from photojobs.cli_support import echo
from photojobs.cli_web import EX_USAGE, _client, _fail
from store.errors import NotApplicable, UnknownJob

BULK_ACTIONS = ("retry", "cancel", "discard")


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.0f}s ago" if seconds < 120 else f"{seconds / 60:.0f}m ago"


def worker_lines(rows: list[dict[str, Any]], now: float | None = None) -> list[str]:
    """A table of workers (``Client.workers``): one line each, then one per busy thread."""
    if not rows:
        return ["no workers"]
    out = []
    for w in rows:
        threads = "-" if w.get("threads") is None else str(w["threads"])
        out.append(
            f"{w['id']}  {w['state']:7} lanes {','.join(w['lanes']) or '-'}  threads {threads}  "
            f"holds {w['held']}  last beat {_age(w.get('heartbeat_age'))}"
        )
        for r in w.get("running") or []:
            since = (w.get("now") or now or time.time()) - float(r["since"])
            where = r.get("path") or "(bundle)"
            out.append(
                f"    {r.get('thread') or 'thread'}: job {r['job']} item {r['item']} {r['lane']} "
                f"{where} for {max(0.0, since):.0f}s"
            )
    return out


@click.command()
@click.option("--all", "every", is_flag=True, help="Also workers stopped or stale for a while.")
@click.option("--json", "as_json", is_flag=True, help='Print {"workers": [...]}.')
def workers(every: bool, as_json: bool) -> None:
    """Workers: live first, then stale (beats stopped) and stopped ones, with the lanes each serves,
    its threads, the items it holds and what each busy thread runs now."""
    from store.listing import workers as listing_workers

    client = _client(existing=True)
    rows = listing_workers(client.engine, faded=every)
    if as_json:
        echo(json.dumps({"workers": rows}, default=sorted))
        return
    for line in worker_lines(rows):
        echo(line)


@click.command()
@click.argument("job", type=int)
@click.option("--lane", help="Only this lane's failed items.")
@click.option("--json", "as_json", is_flag=True)
def discard(job: int, lane: str | None, as_json: bool) -> None:
    """Give up on JOB's failed items: they become skipped, a retry no longer takes them, and the job
    ends as what is left says (exit 1, nothing changed, when it has no failed item)."""
    client = _client(existing=True)
    try:
        client.status(job)
        failed: list[int] = []
        after: int | None = None
        while True:
            rows, after = client.items(job, state="failed", lane=lane, limit=1000, after=after)
            failed += [r.id for r in rows]
            if after is None:
                break
        n = client.discard(job, failed) if failed else 0
    except UnknownJob as exc:
        _fail(str(exc))
    except NotApplicable as exc:
        _fail(str(exc))
    if not failed:
        _fail(f"job {job} has no failed item{f' in lane {lane}' if lane else ''} to discard")
    st = client.status(job)
    if as_json:
        echo(json.dumps({"job": job, "discarded": n, "state": st.state}))
    else:
        echo(f"job {job}: {n} failed item(s) discarded (skipped); job is {st.state}")


@click.command()
@click.argument("action", type=click.Choice(BULK_ACTIONS))
@click.argument("jobs", type=int, nargs=-1)
@click.option("--where", "where_state", help="Every job in this state (failed, partial, running, …).")
@click.option("--json", "as_json", is_flag=True)
def bulk(action: str, jobs: tuple[int, ...], where_state: str | None, as_json: bool) -> None:
    """ACTION (retry failed items, cancel, discard failed items) on each of JOBS, or on every job in
    a state (--where partial): one job at a time, each as the single verb would; jobs it does not
    apply to (finished for a cancel, no failed item for a retry) are counted as skipped."""
    from store.listing import JOB_STATES

    if bool(jobs) == bool(where_state):
        _fail("name the jobs, or --where STATE (not both)", EX_USAGE)
    client = _client(existing=True)
    chosen = list(jobs)
    if where_state:
        if where_state not in JOB_STATES:
            _fail(f"unknown job state {where_state!r}; states: {', '.join(JOB_STATES)}", EX_USAGE)
        after: int | None = None
        while True:
            found, after = client.list_jobs(state=where_state, limit=200, after=after)
            chosen += [st.job_id for st in found]
            if after is None:
                break
    done = client.bulk(action, chosen)
    if as_json:
        echo(json.dumps({"action": action, "job_ids": chosen} | done))
    else:
        echo(
            f"{action}: {done['jobs']} job(s) changed, {done['items']} item(s); "
            f"{done['skipped']} job(s) skipped (it did not apply)"
        )


def register(cli: click.Group) -> None:
    for command in (workers, discard, bulk):
        cli.add_command(command)
