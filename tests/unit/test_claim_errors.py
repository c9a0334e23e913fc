"""A claim that raises: store unavailable (left to the sweeper) vs an error that counts as an attempt.

Uses the StubBroker harness of ``test_lease_middleware`` (a real SQLite store, Dramatiq's worker)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import exc as sa_exc

from store import items as store_items
from store.dispatch import take_for_dispatch
from store.engine import make_engine
from store.errors import DETERMINISTIC, TRANSIENT, UNAVAILABLE, classify_store_error, error_text
from store.schema import upgrade
from tests.unit.test_lease_middleware import SPEC, Harness


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    engine = make_engine(f"sqlite:///{tmp_path / 'unit.db'}")
    upgrade(engine)
    h = Harness(engine)
    yield h
    h.close()
    engine.dispose()


def _dbapi(cls: type[sa_exc.DBAPIError], orig: Exception) -> sa_exc.DBAPIError:
    return cls("SELECT … (70,000 parameters)", {}, orig)


def test_errors_are_classified() -> None:
    # Given the errors a claim meets in practice
    too_many = _dbapi(
        sa_exc.OperationalError,
        psycopg.OperationalError(
            "sending query and params failed: number of parameters must be between 0 and 65535"
        ),
    )
    sqlite_vars = _dbapi(sa_exc.OperationalError, sqlite3.OperationalError("too many SQL variables"))
    locked = _dbapi(sa_exc.OperationalError, sqlite3.OperationalError("database is locked"))
    refused = _dbapi(
        sa_exc.OperationalError, psycopg.OperationalError("connection failed: Connection refused")
    )
    programming = _dbapi(sa_exc.ProgrammingError, psycopg.ProgrammingError("column x does not exist"))
    other = _dbapi(sa_exc.OperationalError, sqlite3.OperationalError("something odd"))
    # When they are classified / Then deterministic ones count at once, connection ones never,
    # and the rest count when they repeat
    assert classify_store_error(too_many) == DETERMINISTIC
    assert classify_store_error(sqlite_vars) == DETERMINISTIC
    assert classify_store_error(programming) == DETERMINISTIC
    assert classify_store_error(TypeError("bug")) == DETERMINISTIC
    assert classify_store_error(locked) == TRANSIENT
    assert classify_store_error(other) == TRANSIENT
    assert classify_store_error(refused) == UNAVAILABLE
    assert classify_store_error(sa_exc.TimeoutError("pool exhausted")) == UNAVAILABLE
    # And the recorded text is the driver's message, without the statement
    assert error_text(too_many) == (
        "OperationalError: sending query and params failed: number of parameters must be between 0 and 65535"
    )


def _raise(exc: Exception):  # type: ignore[no-untyped-def]
    def claim(*args: object, **kwargs: object) -> None:
        raise exc

    return claim


def test_deterministic_claim_error_counts_as_attempt_and_fails_the_item(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an item whose claim fails the same way every time (a lane of 2 attempts)
    [item] = harness.submit()
    error = _dbapi(sa_exc.ProgrammingError, psycopg.ProgrammingError("bind message has 70000 parameters"))
    monkeypatch.setattr(store_items, "claim", _raise(error))
    [pub] = take_for_dispatch(harness.engine, SPEC)
    # When its message is delivered
    harness.deliver(pub.item_id, pub.token)
    # Then the failed claim counted as attempt 1: back to pending with backoff, token moved on
    first = harness.item(item)
    assert first.state == "pending" and first.attempt == 1 and first.fencing_token == pub.token + 1
    assert "bind message has 70000 parameters" in (first.error or "") and harness.calls == 0
    # When it is delivered again (the last attempt)
    harness.deliver(item, first.fencing_token)
    # Then the item ends failed with the error, not re-published forever
    last = harness.item(item)
    assert last.state == "failed" and last.attempt == 2
    assert last.error == "claim failed: ProgrammingError: bind message has 70000 parameters"
    assert [e.detail["state"] for e in harness.events("item_claim_failed")] == ["pending", "failed"]  # type: ignore[index]
    assert len(harness.events("item_failed")) == 1


def test_transient_claim_error_counts_only_when_it_repeats(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an item whose claim meets an operational error
    [item] = harness.submit()
    error = _dbapi(sa_exc.OperationalError, sqlite3.OperationalError("disk quota exceeded"))
    monkeypatch.setattr(store_items, "claim", _raise(error))
    [pub] = take_for_dispatch(harness.engine, SPEC)
    # When it happens once
    harness.deliver(pub.item_id, pub.token)
    # Then the item is deferred without using an attempt, the error noted
    first = harness.item(item)
    assert first.state == "pending" and first.attempt == 0 and first.fencing_token == pub.token
    assert len(harness.events("item_deferred")) == 1
    # When the identical error comes back
    harness.deliver(item, first.fencing_token)
    # Then it counts as an attempt
    second = harness.item(item)
    assert second.attempt == 1 and second.fencing_token == pub.token + 1 and second.state == "pending"


def test_unreachable_store_leaves_the_item_to_the_sweeper(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a claim that cannot reach the store
    [item] = harness.submit()
    error = _dbapi(sa_exc.OperationalError, psycopg.OperationalError("connection failed: Connection refused"))
    monkeypatch.setattr(store_items, "claim", _raise(error))
    [pub] = take_for_dispatch(harness.engine, SPEC)
    # When its message is delivered
    harness.deliver(pub.item_id, pub.token)
    # Then nothing is recorded: the item stays queued for the sweeper to re-publish, no attempt used
    row = harness.item(item)
    assert row.state == "queued" and row.attempt == 0 and row.fencing_token == pub.token and row.error is None
