"""CPU time of process groups and of named server processes, from ``/proc`` (Linux).

Used to split a throughput run's CPU between workers, the sweeper, Redis and PostgreSQL: take a
:func:`snapshot` before and after the measured window and subtract.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stats() -> list[tuple[int, str, int, float]]:
    """(pid, comm, process group, user+system CPU seconds) of every process we can read."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        rest = raw[raw.rindex(")") + 2 :].split()
        pgrp = int(rest[2])
        cpu = (int(rest[11]) + int(rest[12])) / _TICKS
        out.append((int(entry.name), comm, pgrp, cpu))
    return out


def snapshot(
    groups: Mapping[str, Sequence[int]],
    servers: Mapping[str, str] | None = None,
    pids: Mapping[str, Iterable[int]] | None = None,
) -> dict[str, float]:
    """CPU seconds so far per label: ``groups`` maps a label to process-group ids, ``servers`` a label
    to a process name (``comm``) whose every process counts, ``pids`` a label to single processes."""
    totals = dict.fromkeys([*groups, *(servers or {}), *(pids or {})], 0.0)
    by_group = {pgid: label for label, pgids in groups.items() for pgid in pgids}
    by_comm = {comm: label for label, comm in (servers or {}).items()}
    by_pid = {pid: label for label, ps in (pids or {}).items() for pid in ps}
    for pid, comm, pgrp, cpu in _stats():
        if pid in by_pid:
            totals[by_pid[pid]] += cpu
        elif pgrp in by_group:
            totals[by_group[pgrp]] += cpu
        elif comm in by_comm:
            totals[by_comm[comm]] += cpu
    return totals


def tree(root: int) -> list[int]:
    """``root`` and every descendant of it alive now (from /proc ppid links; Linux)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(raw[raw.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def loadavg() -> float:
    """The 1-minute load average (nan where unknown)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def machine_busy() -> float:
    """CPU seconds every core of the machine spent busy (not idle or waiting for I/O) since boot."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(x) for x in fields[:8]]
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICKS


def delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """``after - before`` per label."""
    return {k: max(0.0, after.get(k, 0.0) - before.get(k, 0.0)) for k in after}


def self_cpu() -> float:
    """CPU seconds of this process so far."""
    t = os.times()
    return t.user + t.system
