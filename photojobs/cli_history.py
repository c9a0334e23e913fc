"""``photojobs history PATH|PHOTO_ID`` and ``photojobs undo JOB`` (issue 31)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from photojobs.cli_support import echo
from store.errors import BacklogFull, StoreError, SubmissionError, UnknownJob

EX_USAGE = 64
EX_TEMPFAIL = 75


def _fail(message: str, code: int = 1) -> None:
    echo(f"photojobs: {message}", err=True)
    sys.exit(code)


def _client():  # type: ignore[no-untyped-def]
    from photojobs.api import Client

    return Client()


def _entry_line(e: dict[str, Any]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["when"]))
    what = e["kind"] + (" (sidecar)" if e["sidecar"] else "")
    where = e["to_path"] if e["from_path"] in (None, e["to_path"]) else f"{e['from_path']} -> {e['to_path']}"
    line = f"{when}  job {e['job']:<6} {e['lane']:8} {what:15} {where}"
    line += f"\n      sha256 {e['before_sha256'] or '-'} -> {e['after_sha256'] or '-'}"
    if e.get("target") is not None:  # a remote upload: the operator's target, the key, the ETag
        line += f"\n      target {e['target']}  key {e['key']}  etag {e['etag']}"
    for tag, (before, after) in sorted((e.get("changes") or {}).items()):
        line += f"\n      {tag}: {before!r} -> {after!r}"
    if e["undone_by"] is not None:
        line += f"\n      undone by job {e['undone_by']}"
    return line


@click.command()
@click.argument("photo")
@click.option("--json", "as_json", is_flag=True, help='Print {"photo", "path", "history": [ENTRY, ...]}.')
def history(photo: str, as_json: bool) -> None:
    """Every change a job made to a photo (by PATH or PHOTO_ID), oldest first, with its sidecars."""
    try:
        found = _client().photo_history(photo)
    except StoreError as exc:
        _fail(str(exc))
    if as_json:
        echo(json.dumps(found))
        return
    echo(f"photo {found['photo']}: {found['path']}")
    if not found["history"]:
        echo("  no job changed it")
    for e in found["history"]:
        echo(f"  {_entry_line(e)}")


@click.command()
@click.argument("job", type=int)
@click.option("--lane", help="Undo only this lane's effects.")
@click.option("--uploads", is_flag=True, help="Also remove the copies the job uploaded (never an original).")
@click.option("--json", "as_json", is_flag=True, help='Print {"job": UNDO_JOB_ID, "items": N}.')
def undo(job: int, lane: str | None, uploads: bool, as_json: bool) -> None:
    """Put back what JOB did to its photos: a job of its own, in the reverse order of JOB's lanes.
    Photos changed since are refused ("changed since …"), never overwritten."""
    try:
        out = _client().undo(job, lane=lane, uploads=uploads)
    except UnknownJob as exc:
        _fail(str(exc))
    except BacklogFull as exc:
        _fail(str(exc), EX_TEMPFAIL)
    except (SubmissionError, ValueError) as exc:
        _fail(str(exc), EX_USAGE)
    if as_json:
        echo(json.dumps(out))
    elif out["job"] is None:
        echo(out["note"])
    else:
        echo(f"undo job {out['job']}: {out['items']} item(s)")
        if out.get("note"):
            echo(out["note"])


def register(cli: click.Group) -> None:
    for command in (history, undo):
        cli.add_command(command)
