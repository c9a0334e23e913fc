"""Settings are checked with the variable named; an outage is logged once per retry period."""

from __future__ import annotations

import logging
import sys

import pytest
import redis

from photojobs.config import Settings
from photojobs.errors import ConfigError
from photojobs.quiet import OutageFilter

BASE = {"PHOTOJOBS_DATABASE_URL": "sqlite:////tmp/x.db"}
CONSUMER_ERROR = "Consumer encountered a connection error: %s"


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("PHOTOJOBS_LEASE_TTL", "-1", "must be a positive number, not '-1'"),
        ("PHOTOJOBS_LEASE_TTL", "0", "must be a positive number, not '0'"),
        ("PHOTOJOBS_SWEEP_INTERVAL", "soon", "'soon' is not a number"),
        ("PHOTOJOBS_MAX_ATTEMPTS", "2.5", "'2.5' is not a whole number"),
        ("PHOTOJOBS_LANE_ANALYSIS_BACKLOG", "abc", "'abc' is not a whole number"),
        ("PHOTOJOBS_LANE_EXIF_BOUND", "-3", "must be a whole number >= 0, not '-3'"),
        ("PHOTOJOBS_LANE_RENAME_LEASE_TTL", "0", "must be greater than 0"),
        ("PHOTOJOBS_CPU_SLOTS", "0", "must be a whole number >= 1, not '0'"),
        ("PHOTOJOBS_CPU_SLOTS", "many", "'many' is not a whole number"),
        ("PHOTOJOBS_DATABASE_URL", "nonsense", "cannot parse 'nonsense'"),
        ("PHOTOJOBS_DATABASE_URL", "mysql://u:pw@h/db", "unsupported database 'mysql' in 'mysql://u:***@h/db'"),
        ("PHOTOJOBS_REDIS_URL", "http://h:6379", "'http://h:6379' is not a Redis URL"),
    ],
)
def test_a_bad_setting_names_the_variable_and_the_problem(variable: str, value: str, problem: str) -> None:
    # Given an environment with one bad value
    env = {**BASE, variable: value}
    # When the settings are read
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(env)
    # Then the error names that variable and says what is wrong
    assert caught.value.setting == variable
    assert problem in caught.value.problem, caught.value.problem
    assert str(caught.value).startswith(f"{variable}: ")


def test_good_settings_pass() -> None:
    # Given sensible values / When read / Then they are taken as given
    s = Settings.from_env({**BASE, "PHOTOJOBS_LEASE_TTL": "4", "PHOTOJOBS_REDIS_URL": "unix:///tmp/r.sock"})
    assert s.lease_ttl == 4 and s.heartbeat_interval == 1 and s.redis_url == "unix:///tmp/r.sock"


def record(name: str, msg: str, args: tuple = (), exc: BaseException | None = None) -> logging.LogRecord:  # type: ignore[type-arg]
    exc_info = None
    if exc is not None:
        try:
            raise exc
        except BaseException:  # noqa: BLE001
            exc_info = sys.exc_info()
    return logging.LogRecord(name, logging.CRITICAL, __file__, 1, msg, args, exc_info)


def test_an_outage_is_one_line_per_retry_period_without_traceback() -> None:
    # Given the filter and an outage: every consumer thread of a process reports it at once
    f = OutageFilter(period=3600)
    lost = redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")
    consumers = [
        record(f"dramatiq.worker.ConsumerThread(q{i})", CONSUMER_ERROR, (lost,))
        for i in range(24)
    ]
    restarts = [record("dramatiq.worker.ConsumerThread(q)", "Restarting consumer in %0.2f seconds.", (3.0,))]
    sweeper = record("photojobs.sweeper", "re-publishing lost messages failed", exc=lost)
    other = record("photojobs.lease", "something else broke", exc=KeyError("x"))
    skip = record(
        "apscheduler.scheduler", 'Job "x" skipped: maximum number of running instances reached (1)'
    )
    skipped = record("dramatiq.worker.WorkerThread", "Message %s was skipped.", ("m",))
    # When they are filtered
    passed = [r for r in [*consumers, *restarts, sweeper, other, skip, skipped] if f.filter(r)]
    # Then one outage line passes, naming the service, the error and the next retry, no traceback;
    # the sweeper's repeat within the period is dropped; an unrelated error is untouched
    assert passed[0].levelname == "WARNING" and passed[0].exc_info is None
    text = passed[0].getMessage()
    assert text.startswith("Redis unreachable (Error 111 connecting to 127.0.0.1:1") and "next at " in text
    assert passed[1:] == [other] and other.exc_info is not None


def test_the_database_is_gated_apart_from_redis() -> None:
    # Given an outage line for Redis already let through
    from sqlalchemy.exc import OperationalError

    f = OutageFilter(period=3600)
    assert f.filter(record("photojobs.sweeper", "a", exc=redis.ConnectionError("down")))
    # When the database fails too
    gone = OperationalError("x", {}, Exception("gone"))
    db = record("photojobs.heartbeat", "renewing leases failed", exc=gone)
    # Then its first line passes too, as one line naming the database
    assert f.filter(db) and db.exc_info is None
    assert db.getMessage().startswith("Database unreachable (gone): renewing leases failed")
    # And an error passed as an argument (no traceback) of the same outage is gated as well
    claim = record("photojobs.lease", "could not claim item %s (%s)", (7, gone))
    assert not f.filter(claim)


def test_default_broker_bound_is_twice_the_fleets_threads_but_never_below_the_floor() -> None:
    from store.lanes import MIN_BOUND, lane_spec

    # Given the analysis lane (2 declared threads) in fleets of 2 and of 16 worker processes
    small = lane_spec("analysis", env={"PHOTOJOBS_FLEET_PROCESSES": "2"})
    large = lane_spec("analysis", env={"PHOTOJOBS_FLEET_PROCESSES": "16"})
    explicit = lane_spec("analysis", env={"PHOTOJOBS_LANE_ANALYSIS_BOUND": "4"})
    # Then a small fleet gets the floor (a dispatch batch worth a transaction), a large one
    # 2 x threads x processes, and an explicit bound is kept as given
    assert small.effective_bound == MIN_BOUND == 32
    assert large.effective_bound == 2 * 2 * 16
    assert explicit.effective_bound == 4
