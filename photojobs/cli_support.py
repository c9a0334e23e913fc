"""Building blocks shared by ``photojobs worker`` and ``photojobs run``, and the one way every CLI
printer shows text from the store (:func:`shown`, :func:`echo`)."""

from __future__ import annotations

import os
import re
import sys

import click

from store.lanes import all_lanes, usable_cores


def worker_command(lanes: list[str], threads: int, watch: str | None = None) -> list[str]:
    """One ``dramatiq actors`` worker process serving ``lanes`` (through :mod:`photojobs.dramatiq_worker`,
    which adds the lifeline to the supervisor); ``watch``: reload when a ``*.py`` under it changes."""
    specs = all_lanes()
    queues = [q for n in lanes for q in specs[n].queues]
    return [
        sys.executable,
        "-m",
        "photojobs.dramatiq_worker",
        "actors",
        "--processes",
        "1",
        "--threads",
        str(threads),
        "--queues",
        *queues,
        # Dramatiq's main process waits up to this long for its worker process to finish booting
        # before it starts watching it (default 30 s). A worker that dies while booting — or is
        # killed right after it began taking messages, its boot hooks still running — would go
        # unnoticed that long and its slot would not be restarted. We fork no extra processes, so
        # there is nothing to wait for.
        "--worker-fork-timeout",
        "10",
        # dramatiq's default pattern "**.py" matches no absolute path under watchdog 7 (full_match)
        *(["--watch", watch, "--watch-include", "**/*.py"] if watch else []),
    ]


def worker_env(threads: int, base: dict[str, str] | None = None, *, processes: int = 1) -> dict[str, str]:
    """The environment of the ``processes`` worker processes of one ``photojobs worker``/``run``."""
    env = dict(os.environ if base is None else base)
    # This host's cores shared out between its worker processes: the CPU-bound lanes' slots in each
    # (``middleware.cpu_slots``), so a 2-core host with 2 processes decodes one photo per core.
    env.setdefault("PHOTOJOBS_CPU_SLOTS", str(max(1, usable_cores() // max(1, processes))))
    # Each process holds as many messages again as it has threads, so a thread that finishes an item
    # takes the next from memory instead of waiting for the consumer's next Redis poll. A dead
    # worker strands nothing: the sweeper publishes again whatever is only in the ack set of a worker
    # whose Dramatiq heartbeat stopped (``RedisPublisher.held``), within seconds.
    env.setdefault("dramatiq_queue_prefetch", str(2 * threads))
    env.setdefault("dramatiq_worker_timeout", "250")  # an idle worker looks at Redis 4x a second
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


# C0 and C1 controls (newline and ESC included), DEL, lone surrogates (a file name that is not
# UTF-8, surrogate-escaped), and the invisible bidi controls that reorder what a terminal shows.
_UNSHOWABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    code = ord(ch)
    if ch in _NAMED:
        return _NAMED[ch]
    if 0xDC80 <= code <= 0xDCFF:  # the byte of a surrogate escape, as the file system has it
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: object, *, keep_newlines: bool = False) -> str:
    """``text`` safe for a terminal: every control character (a newline that would forge a line,
    ESC that would drive the terminal), bidi control and lone surrogate written as an escape
    (``\\n``, ``\\x1b``, ``\\u202e``, ``\\xff`` for a byte that is not UTF-8). ``keep_newlines``:
    for our own multi-line messages."""
    value = str(text)
    if keep_newlines:
        return "\n".join(_UNSHOWABLE.sub(_escape, line) for line in value.split("\n"))
    return _UNSHOWABLE.sub(_escape, value)


def echo(text: object = "", *, err: bool = False) -> None:
    """``click.echo`` of :func:`shown` text: what every CLI printer uses for a line it prints."""
    click.echo(shown(text), err=err)
