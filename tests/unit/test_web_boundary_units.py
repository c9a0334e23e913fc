"""Unit tests of the web boundary's pure parts: the login limiter, the loopback Host/Origin checks,
the submission model's path rules."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from photojobs.web.auth import loopback_origin, loopback_target
from photojobs.web.limits import LoginLimiter
from photojobs.web.routes import MAX_PATHS, JobRequest


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_login_limiter_refuses_an_address_after_its_failures_until_the_window_passes() -> None:
    # Given a limit of 3 failures per 60 s
    clock = Clock()
    limiter = LoginLimiter(3, 60, clock=clock)
    # When one address fails three times, 10 s apart
    for _ in range(3):
        assert limiter.retry_after("10.0.0.1") == 0
        limiter.failed("10.0.0.1")
        clock.now += 10
    # Then it must wait until its first failure is 60 s old; another address is not affected
    assert limiter.retry_after("10.0.0.1") == 30
    assert limiter.retry_after("10.0.0.2") == 0
    clock.now += 29.5
    assert limiter.retry_after("10.0.0.1") == 1
    clock.now += 0.5
    assert limiter.retry_after("10.0.0.1") == 0
    # And bad limits are refused with a clear error
    with pytest.raises(ValueError, match="failures >= 1"):
        LoginLimiter(0, 60)


def test_loopback_hosts_and_origins_with_the_servers_port_only() -> None:
    # Given a server on port 8765
    port = 8765
    # Then loopback names and addresses with its port pass, anything else does not
    for host in ("127.0.0.1:8765", "localhost:8765", "LOCALHOST:8765", "[::1]:8765", "127.9.9.9:8765"):
        assert loopback_target(host, port, 80), host
    for host in ("evil.example:8765", "127.0.0.1:8766", "localhost", "", "127.0.0.1:x", "[::2]:8765",
                 "localhost.evil.example:8765", "127.0.0.1.nip.io:8765", "0.0.0.0:8765"):
        assert not loopback_target(host, port, 80), host
    assert loopback_origin("http://127.0.0.1:8765", port)
    assert loopback_origin("http://localhost:8765/", port)
    for origin in ("null", "https://evil.example", "http://127.0.0.1:9999", "http://127.0.0.1",
                   "file://", "http://user@127.0.0.1:8765", "http://127.0.0.1:8765/page"):
        assert not loopback_origin(origin, port), origin


def test_a_submission_names_each_path_once_and_refuses_over_long_ones() -> None:
    # Given a request naming one folder 20,000 times and another once
    body = JobRequest(lanes=["noop"], paths=["album"] * 20_000 + ["other", "album"])
    # Then the model keeps each path once, in first-seen order (the plan walks each folder once)
    assert body.paths == ["album", "other"]
    # And over-long paths, components, NULs and too many distinct paths are refused
    for paths, words in (
        (["a/" * 2049], "4096"),
        (["x" * 256], "at most 255"),
        (["a\x00b"], "NUL"),
        ([f"p{i}" for i in range(MAX_PATHS + 1)], f"at most {MAX_PATHS} distinct"),
    ):
        with pytest.raises(ValidationError, match=words):
            JobRequest(lanes=["noop"], paths=paths)
