"""Issue 41: metrics an on-call person alerts on, on both stores.

- ``photojobs_sweeper_last_pass_age_seconds{duty}`` (and the duty's interval): a real sweeper's pass
  records the duties that ran fine; a duty that fails is not recorded, so its age grows;
- ``photojobs_worker_restarts_total{reason}``: a real supervisor's worker processes that crash
  (exit 3), are killed (SIGKILL) or end cleanly unasked (exit 0) are counted by reason.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, update
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.supervisor import Supervisor, store_recorder
from photojobs.sweeper_service import Sweeper
from photojobs.web import metrics
from store import sweeper_passes
from store.events import assign_cursors
from store.models import Counter
from tests.alert_rules import evaluate, readme_rules
from tests.metrics_support import parse_scrape, sample
from tests.support import wait_for

EXITS = {
    "crashed": "import sys; sys.exit(3)",
    "killed": "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
    "recycled": "import sys; sys.exit(0)",
}


@pytest.fixture
def client(engine: Engine, redis_url: str) -> Client:
    env = {"PHOTOJOBS_DATABASE_URL": str(engine.url), "PHOTOJOBS_REDIS_URL": redis_url}
    return Client(Settings.from_env(env), engine, migrate=False)


@pytest.fixture
def sweeper(client: Client) -> Iterator[Sweeper]:
    sw = Sweeper(client.settings)
    yield sw
    sw.engine.dispose()


def _scrape(client: Client) -> dict[Any, float]:
    assign_cursors(client.engine)
    return parse_scrape(metrics.render(client).decode())


def test_each_sweeper_duty_reports_the_age_of_its_last_good_pass_and_a_failing_one_is_left_out(
    client: Client, sweeper: Sweeper
) -> None:
    """Given a real sweeper whose forget-workers duty fails on every pass
    When it makes one pass and the metrics are scraped
    Then every other duty has an age (≥ 0) and its interval, and the failing duty has none (its
    age is that of its last good pass: here never), so an alert on the age catches it."""
    before = _scrape(client)
    assert not [k for k in before if k[0] == "photojobs_sweeper_last_pass_age_seconds"]
    failing = sweeper.maintenance.service("workers")

    def broken() -> Any:
        raise RuntimeError("forgetting workers is broken")

    failing.run_once = broken  # type: ignore[method-assign]
    report = sweeper.once()
    assert report.errors and "forgetting workers is broken" in report.errors[0]
    scrape = _scrape(client)
    age_of = "photojobs_sweeper_last_pass_age_seconds"
    ages = {dict(labels)["duty"]: v for (name, labels), v in scrape.items() if name == age_of}
    duties = {svc.name for svc in sweeper.maintenance.services}
    assert set(ages) == duties - {"workers"}
    assert all(age >= 0 for age in ages.values())
    # And the README's PhotojobsSweeperStalled is quiet now, and fires for the every-pass duties
    # once their last good pass is 10 minutes old (a sweeper that stopped then)
    rule = {r["alert"]: r["expr"] for r in readme_rules()}["PhotojobsSweeperStalled"]
    assert evaluate(rule, scrape) == set()
    with Session(client.engine) as s, s.begin():
        older = update(Counter).where(Counter.name == sweeper_passes.PASS).values(value=Counter.value - 600)
        s.execute(older)
    fired = {duty for (duty,) in evaluate(rule, _scrape(client))}
    every_pass = {svc.name for svc in sweeper.maintenance.services if svc.interval < 30} - {"workers"}
    assert fired == every_pass and "events" in fired and "keys" not in fired
    for svc in sweeper.maintenance.services:
        if svc.name != "workers":
            every = sample(scrape, "photojobs_sweeper_duty_interval_seconds", duty=svc.name)
            assert every == round(svc.interval), svc.name


def test_worker_restarts_are_counted_by_reason(client: Client) -> None:
    """Given a real supervisor of three worker processes: one crashes (exit 3), one is SIGKILLed,
    one ends cleanly unasked (exit 0), each restarted once before the supervisor gives up
    When the metrics are scraped
    Then ``photojobs_worker_restarts_total`` reads 2 for each reason (two ends of each slot)."""
    commands = [[sys.executable, "-c", code] for code in EXITS.values()]
    sup = Supervisor(
        commands,
        backoff_initial=0.01,
        max_restarts=1,
        on_event=store_recorder(client.engine),
        orphan_grace=1.0,
    )
    sup.start()
    try:
        wait_for(lambda: len(sup.gave_up_slots) == len(commands), 60, what="every slot to give up")
    finally:
        sup.stop(timeout=5)
    scrape = _scrape(client)
    for reason in EXITS:
        assert sample(scrape, "photojobs_worker_restarts_total", reason=reason) == 2, reason
