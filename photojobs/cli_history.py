"""``photojobs history PATH|PHOTO_ID`` and ``photojobs undo JOB`` (issue 31)."""

from __future__ import annotations

import json
import shlex
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
    """One history entry on one line (``echo`` shows a newline in a path as ``\\n``, never breaks
    the line): when, which job, what it did (``undo of job N``, ``restored``), where, the hashes."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["when"]))
    what = e["kind"] + (" (sidecar)" if e["sidecar"] else "")
    where = e["to_path"] if e["from_path"] in (None, e["to_path"]) else f"{e['from_path']} -> {e['to_path']}"
    job = f"job {e['job']:<6}" if e["job"] is not None else "found by sync"  # a move by hand
    line = f"{when}  {job} {e['lane']:8} {what:15} {where}"
    if e.get("undoes_job") is not None:  # (a version brought back on purpose: its kind, "restored")
        line += f"  undo of job {e['undoes_job']}"
    line += f"  sha256 {e['before_sha256'] or '-'} -> {e['after_sha256'] or '-'}"
    if e.get("target") is not None:  # a remote upload: the operator's target, the key, the ETag
        line += f"  target {e['target']}  key {e['key']}  etag {e['etag']}"
    for tag, (before, after) in sorted((e.get("changes") or {}).items()):
        line += f"  {tag}: {before!r} -> {after!r}"
    if e["undone_by"] is not None:
        line += f"  undone by job {e['undone_by']}"
    return line


@click.command()
@click.argument("photo")
@click.option(
    "--limit", type=click.IntRange(1, 1000), default=100, show_default=True, help="Changes per page."
)
@click.option("--after", type=click.IntRange(0), default=None, help="Start after this change (next).")
@click.option(
    "--json", "as_json", is_flag=True, help='Print {"photo", "path", "history": [ENTRY, ...], "next"}.'
)
def history(photo: str, limit: int, after: int | None, as_json: bool) -> None:
    """Every change a job made to a photo (by PATH or PHOTO_ID), oldest first, with its sidecars:
    a page of --limit changes; the last line says how to see the next page."""
    try:
        found = _client().photo_history(photo, limit=limit, after=after)
    except StoreError as exc:
        _fail(str(exc))
    if as_json:
        echo(json.dumps(found))
        return
    echo(f"photo {found['photo']}: {found['path']}")
    if not found["history"]:
        echo("  no job changed it" if after is None else f"  no change after {after}")
    for e in found["history"]:
        echo(f"  {_entry_line(e)}")
    if found.get("next") is not None:
        more = f" --limit {limit}" if limit != 100 else ""
        echo(f"more: photojobs history {shlex.quote(photo)} --after {found['next']}{more}")


@click.command()
@click.argument("job", type=int)
@click.option("--lane", help="Undo only this lane's effects.")
@click.option("--uploads", is_flag=True, help="Also remove the copies the job uploaded (never an original).")
@click.option(
    "--photo", "photos", multiple=True, metavar="PATH",
    help="Undo only this photo of JOB (its current path; repeatable).",
)  # fmt: skip
@click.option(
    "--dry-run", is_flag=True,
    help="Print what the undo would do to each photo (restore, or refuse and why); change nothing.",
)  # fmt: skip
@click.option(
    "--json", "as_json", is_flag=True,
    help='Print {"job": UNDO_JOB_ID, "items": N} (--dry-run: {"dry_run": true, "plan": [...]}).',
)  # fmt: skip
def undo(
    job: int, lane: str | None, uploads: bool, photos: tuple[str, ...], dry_run: bool, as_json: bool
) -> None:
    """Put back what JOB did to its photos: a job of its own, in the reverse order of JOB's lanes.
    Photos changed since are refused ("changed since …"), never overwritten."""
    try:
        out = _client().undo(job, lane=lane, uploads=uploads, photos=photos or None, dry_run=dry_run)
    except UnknownJob as exc:
        _fail(str(exc))
    except BacklogFull as exc:
        _fail(str(exc), EX_TEMPFAIL)
    except (SubmissionError, ValueError) as exc:
        _fail(str(exc), EX_USAGE)
    if as_json:
        echo(json.dumps(out))
    elif out.get("dry_run"):
        for step in out["plan"]:
            echo(f"{step['action']:8} {step['path']}: {step['reason']}")
        restored = sum(step["action"] == "restore" for step in out["plan"])
        echo(f"dry run: {restored} of {len(out['plan'])} photo(s) would be restored; nothing changed")
        if out.get("note"):
            echo(out["note"])
    elif out["job"] is None:
        echo(out["note"])
    else:
        echo(f"undo job {out['job']}: {out['items']} item(s)")
        if out.get("note"):
            echo(out["note"])


@click.command()
@click.argument("photo")
@click.option("--to", "to_effect", type=click.IntRange(1), help="The version this effect left (history).")
@click.option("--before", "before_job", type=click.IntRange(1), help="The version before this job.")
@click.option("--json", "as_json", is_flag=True, help='Print {"job": RESTORE_JOB_ID, "items": 1, ...}.')
def restore(photo: str, to_effect: int | None, before_job: int | None, as_json: bool) -> None:
    """Bring back a kept version of PHOTO (its path or id) over what it holds now, on purpose (an
    edit by hand is replaced): the version effect --to left, or the one before job --before. The
    version replaced is kept: `photojobs undo` of the restore job puts it back."""
    if (to_effect is None) == (before_job is None):
        _fail("give exactly one of --to EFFECT and --before JOB", EX_USAGE)
    try:
        out = _client().restore(photo, to_effect=to_effect, before_job=before_job)
    except BacklogFull as exc:
        _fail(str(exc), EX_TEMPFAIL)
    except (SubmissionError, ValueError) as exc:
        _fail(str(exc), EX_USAGE)
    except StoreError as exc:  # an unknown photo
        _fail(str(exc))
    if as_json:
        echo(json.dumps(out))
    elif out["job"] is None:
        echo(out["note"])
    else:
        echo(f"restore job {out['job']}: {out['version']} (sha256 {out['sha256']})")


def register(cli: click.Group) -> None:
    for command in (history, undo, restore):
        cli.add_command(command)
