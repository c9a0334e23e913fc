"""Issue 41: ``more:`` hints name the command that shows the next page with every filter it was
given and its ``--state-dir``: following the hint lists the rest of the same listing. The CLI
in-process against a real store (both stores; the state folder: SQLite, as ``photojobs run`` makes)."""

from __future__ import annotations

import shlex
from pathlib import Path

from click.testing import CliRunner
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from photojobs.cli import cli
from store import items as store_items
from store import jobs as store_jobs
from store.engine import make_engine
from store.fencing import fenced
from store.lanes import all_lanes
from store.models import Item
from store.schema import upgrade

SPECS = all_lanes({})


def _hint(output: str) -> list[str]:
    lines = [line for line in output.splitlines() if line.startswith("more: ")]
    assert len(lines) == 1, output
    words = shlex.split(lines[0].removeprefix("more: "))
    assert words[0] == "photojobs"
    return words[1:]


def _ids(output: str) -> list[int]:
    return [int(line.split()[0]) for line in output.splitlines() if line and line.split()[0].isdigit()]


def test_the_items_hint_keeps_the_lane_state_and_limit_filters(engine: Engine, tmp_path: Path) -> None:
    """Given an analysis → rename job of 5 photos (10 items; the renames wait)
    When ``items J --lane rename --state waiting --limit 2`` is run, then its ``more:`` hint, then
    that one's
    Then each hint keeps ``--lane rename --state waiting --limit 2``, and the pages together are the
    job's 5 waiting rename items, each once (no analysis item)."""
    photos = [store_jobs.PhotoInput(str(tmp_path / f"m{i}.jpg")) for i in range(5)]
    job = store_jobs.submit(engine, [SPECS["analysis"], SPECS["rename"]], photos).job_id
    env = {"PHOTOJOBS_DATABASE_URL": engine.url.render_as_string(hide_password=False)}
    runner = CliRunner()
    args = ["items", str(job), "--lane", "rename", "--state", "waiting", "--limit", "2"]
    seen: list[int] = []
    lanes: set[str] = set()
    for _ in range(3):
        out = runner.invoke(cli, args, env=env)
        assert out.exit_code == 0, out.output
        seen += _ids(out.output)
        lanes |= {line.split()[1] for line in out.output.splitlines() if line.split()[0].isdigit()}
        if "more: " not in out.output:
            break
        args = _hint(out.output)
        assert args[args.index("--lane") + 1] == "rename" and args[args.index("--limit") + 1] == "2"
        assert args[args.index("--state") + 1] == "waiting"
    assert len(seen) == 5 and len(set(seen)) == 5 and lanes == {"rename"}


def test_the_jobs_hint_keeps_the_state_dir(tmp_path: Path) -> None:
    """Given a state folder holding a SQLite store with 3 jobs
    When ``jobs --limit 2 --state-dir DIR`` is run, then its hint
    Then the hint keeps ``--limit 2 --state-dir DIR`` and lists the third job."""
    state = tmp_path / "state folder"
    state.mkdir()
    engine = make_engine(f"sqlite:///{state / 'photojobs.db'}")
    upgrade(engine)
    photos = [[store_jobs.PhotoInput(str(tmp_path / f"j{i}.jpg"))] for i in range(3)]
    made = [store_jobs.submit(engine, [SPECS["noop"]], p).job_id for p in photos]
    engine.dispose()
    runner = CliRunner()
    first = runner.invoke(cli, ["jobs", "--limit", "2", "--state-dir", str(state)], env={})
    assert first.exit_code == 0, first.output
    hint = _hint(first.output)
    assert hint[hint.index("--state-dir") + 1] == str(state) and "--limit" in hint
    rest = runner.invoke(cli, hint, env={})
    assert rest.exit_code == 0, rest.output
    assert _ids(first.output) + _ids(rest.output) == sorted(made, reverse=True)


def test_the_status_hint_keeps_the_state_dir(tmp_path: Path) -> None:
    """Given a state folder whose job has a failed item
    When ``status J --state-dir DIR`` is run
    Then its closing ``photojobs items J --state failed`` hint carries ``--state-dir DIR``, and
    following it lists the failed item."""
    state = tmp_path / "run state"
    state.mkdir()
    engine = make_engine(f"sqlite:///{state / 'photojobs.db'}")
    upgrade(engine)
    job = store_jobs.submit(engine, [SPECS["noop"]], [store_jobs.PhotoInput(str(tmp_path / "f.jpg"))]).job_id
    with Session(engine) as s:
        item = s.execute(select(Item).where(Item.job_id == job)).scalar_one()
        item_id, token = item.id, item.fencing_token
    lease = store_items.claim(engine, SPECS["noop"], item_id, token, "host:1:w").lease
    assert lease is not None
    with fenced(engine, item_id, lease.token) as s:
        store_items.fail(s, SPECS["noop"], lease, "OSError: boom", "host:1:w", retry=False)
    engine.dispose()
    runner = CliRunner()
    out = runner.invoke(cli, ["status", str(job), "--state-dir", str(state)], env={})
    assert out.exit_code == 0, out.output
    hint = [line for line in out.output.splitlines() if "(every item: photojobs items" in line]
    assert len(hint) == 1, out.output
    words = shlex.split(hint[0].strip().removeprefix("(every item: ").removesuffix(")"))
    assert words[words.index("--state-dir") + 1] == str(state)
    listed = runner.invoke(cli, words[1:], env={})
    assert listed.exit_code == 0, listed.output
    assert _ids(listed.output) == [item_id]
