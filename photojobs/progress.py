"""Live progress per lane (rich) on a terminal; plain lines when stdout is not a terminal."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from photojobs.cli_support import shown
from store.jobs import JobStatus

DONE = ("succeeded", "failed", "skipped", "cancelled")


class LaneRate:
    """Items finished per second over the last ``window`` seconds."""

    def __init__(self, window: float = 15.0) -> None:
        self.samples: deque[tuple[float, int]] = deque()
        self.window = window

    def add(self, now: float, done: int) -> float:
        self.samples.append((now, done))
        while self.samples and now - self.samples[0][0] > self.window:
            self.samples.popleft()
        t0, d0 = self.samples[0]
        return (done - d0) / (now - t0) if now > t0 else 0.0


def lane_row(counts: dict[str, int]) -> dict[str, int]:
    total = sum(counts.values())
    done = sum(counts.get(s, 0) for s in DONE)
    return {
        "total": total,
        "succeeded": counts.get("succeeded", 0),
        "failed": counts.get("failed", 0),
        "skipped": counts.get("skipped", 0),
        "cancelled": counts.get("cancelled", 0),
        "running": counts.get("running", 0),
        "paused": counts.get("paused", 0),
        "done": done,
        "remaining": total - done,
    }


def failure_lines(job_id: int, groups: Sequence[Mapping[str, Any]], where: str = "") -> list[str]:
    """Failed and skipped items grouped by reason class (``store.listing.failure_groups`` as dicts),
    one headline per group with its count, then its example items' paths: the same grouping as the
    web API's ``failures``, so one missing tool on 500 photos is one line, not 500. ``where``: extra
    arguments of the closing ``photojobs items`` hint (``--state-dir DIR`` after a run)."""
    if not groups:
        return []
    out = ["failures by reason:"]
    for g in groups:
        out.append(f"  {g['count']} × {g['state']} in {g['lane']}: {shown(g['reason'])}")
        cascade = g.get("cascade") or {}
        if cascade:  # the later lanes' items skipped because of it (folded under their cause)
            lanes = ", ".join(f"{n} in {lane}" for lane, n in cascade.items())
            skipped = sum(cascade.values())
            out.append(f"      and {skipped} skipped in {len(cascade)} later lane(s): {shown(lanes)}")
        for x in g["examples"]:
            out.append(f"      item {x['item']}: {shown(x.get('path') or '(no photo)')}")
        more = g["count"] - len(g["examples"])
        if more > 0:
            out.append(f"      … and {more} more")
    states = sorted({g["state"] for g in groups})
    out.append(f"  (every item: photojobs items {job_id} --state {states[0]}{where})")
    return out


def _clock(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def waiting_lines(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """Why the job's items wait (``store.waiting``), one line each: a paused lane, a lane no live
    worker serves, a backoff, a photo another job holds, the job's own pause."""
    out = []
    for w in entries:
        n = f"{w['items']} item(s) of {w['lane']}"
        reason = w["reason"]
        if reason == "lane paused":
            since = f" since {_clock(w['since'])}" if w.get("since") else ""
            text = f"{n} held: lane {w['lane']} is paused{since} (photojobs lane resume {w['lane']})"
        elif reason == "no live worker":
            start = f"photojobs worker --lanes {w['lane']}"
            text = f"{n} wait: no live worker serves lane {w['lane']} (start one: {start})"
        elif reason == "photo locked":
            jobs = ", ".join(str(j) for j in w.get("jobs", []))
            text = f"{n} wait: their photos are locked by job {jobs}"
        elif reason == "backoff":
            text = f"{n} in backoff until {_clock(w['until'])}"
        elif reason == "job paused":
            text = f"{n} paused with the job (photojobs resume)"
        else:
            text = f"{n}: {reason}"
        out.append(shown(text))
    return out


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``: a span for a person."""
    whole = max(0, int(round(seconds)))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def times_line(times: dict[str, Any]) -> str:
    """``ran 1m02s, ETA 3m10s (from the work left)``: the job's times as ``status`` prints them
    (``store.console.JobTimes.as_dict``); never a ``None``."""
    parts = []
    if times.get("started_at") is None:
        parts.append("not started")
    elif times.get("ran") is not None:
        parts.append(f"ran {duration(times['ran'])}")
    if times.get("finished_at") is not None:
        parts.append(f"took {duration(times.get('took') or 0.0)}")
    elif times.get("eta") is None:
        parts.append("ETA measuring (from 10 % of items, once each lane left has a run time and a worker)")
    else:
        parts.append(f"ETA {duration(times['eta'])} (from the work left)")
    return ", ".join(parts)


def _eta(remaining: int, rate: float) -> str:
    if remaining == 0:
        return "done"
    if rate <= 0:
        return "-"
    seconds = int(remaining / rate)
    return f"{seconds // 60}m{seconds % 60:02d}s"


class Progress:
    def __init__(self, console: Console, *, live: bool | None = None, interval: float = 2.0) -> None:
        self.console = console
        self.live_mode = console.is_terminal if live is None else live
        self.rates: dict[str, LaneRate] = {}
        self.live: Live | None = None
        self.interval = interval
        self.last_line = 0.0
        self.last_text = ""
        self.notes: list[str] = []

    def __enter__(self) -> Progress:
        if self.live_mode:
            self.live = Live(console=self.console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)
            self.live = None

    def note(self, text: str) -> None:
        """A one-off message (worker restarted, job paused) shown above the table / as a line."""
        self.notes = (self.notes + [text])[-4:]
        if self.live is None:
            self.console.print(text, highlight=False, soft_wrap=True)

    def update(self, status: JobStatus, *, restarts: int = 0, recoveries: int = 0) -> None:
        now = time.monotonic()
        rows = {lane: lane_row(status.lanes.get(lane, {})) for lane in status.lane_order}
        rates = {ln: self.rates.setdefault(ln, LaneRate()).add(now, r["done"]) for ln, r in rows.items()}
        if self.live is not None:
            self.live.update(self._table(status, rows, rates, restarts, recoveries))
            return
        text = "; ".join(
            f"{lane} {r['done']}/{r['total']} done ({r['failed']} failed, {r['running']} running)"
            for lane, r in rows.items()
        )
        if text != self.last_text and now - self.last_line >= self.interval:
            self.console.print(
                f"job {status.job_id} {status.state}: {text}; restarts {restarts}, recoveries {recoveries}",
                highlight=False,
                soft_wrap=True,
            )
            self.last_text, self.last_line = text, now

    def _table(
        self,
        status: JobStatus,
        rows: dict[str, dict[str, int]],
        rates: dict[str, float],
        restarts: int,
        recoveries: int,
    ) -> Table:
        table = Table(
            title=f"photojobs job {status.job_id}: {status.state}",
            caption=" | ".join([f"worker restarts {restarts}", f"recoveries {recoveries}", *self.notes]),
        )
        for col in ("lane", "done", "running", "failed", "remaining", "photos/s", "ETA"):
            table.add_column(col, justify="left" if col == "lane" else "right")
        for lane, r in rows.items():
            bar_width = 20
            filled = int(bar_width * r["done"] / r["total"]) if r["total"] else bar_width
            bar = "█" * filled + "░" * (bar_width - filled)
            table.add_row(
                lane,
                f"{bar} {r['done']}/{r['total']}",
                str(r["running"]),
                str(r["failed"]),
                str(r["remaining"]),
                f"{rates[lane]:.1f}",
                _eta(r["remaining"], rates[lane]),
            )
        return table
