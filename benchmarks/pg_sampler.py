"""Where PostgreSQL's backends spend their time: ``pg_stat_activity`` sampled every few ms.

``python -m benchmarks.pg_sampler ADMIN_URL DB_PREFIX SECONDS`` prints, for the databases whose name
starts with DB_PREFIX, how often a backend was seen active on each statement (its first words),
apart by wait event (none: on a CPU or runnable) and by backend type (autovacuum included): a
statistical profile whose proportions the machine's load does not change much. Used by the
``million`` analysis in docs/benchmarks.md.
"""

from __future__ import annotations

import sys
import time
from collections import Counter

import psycopg

SQL = """
SELECT backend_type, coalesce(wait_event_type || ':' || wait_event, 'cpu'), query
FROM pg_stat_activity WHERE datname LIKE %s AND state = 'active' AND pid <> pg_backend_pid()
"""


def main(url: str, prefix: str, seconds: float, interval: float = 0.005) -> None:
    seen: Counter[tuple[str, str, str]] = Counter()
    samples = 0
    with psycopg.connect(url, autocommit=True) as conn:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for kind, wait, query in conn.execute(SQL, (prefix + "%",)).fetchall():
                seen[(kind, wait, " ".join((query or "").split())[:140])] += 1
            samples += 1
            time.sleep(interval)
    total = sum(seen.values()) or 1
    per = total / max(samples, 1)
    print(f"{samples} samples, {total} active-backend sightings ({per:.2f} active per sample)")
    for (kind, wait, query), n in seen.most_common(40):
        print(f"{100 * n / total:5.1f}%  {kind[:18]:18} {wait[:28]:28} {query}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
