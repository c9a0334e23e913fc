"""Test support for the web API: a real ``photojobs serve`` process, an SSE reader, a cuttable TCP proxy."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import fork_server
from tests.support import ROOT, free_port, unavailable, wait_for

TOKEN = "test-token-0123456789"


@contextmanager
def uvicorn_in_thread(app: Any) -> Iterator[str]:
    """``app`` on a real uvicorn server in a thread of this process, on a free loopback port: its
    base URL; stopped at the end."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    wait_for(lambda: srv.started, 30, what="uvicorn to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(30)


FINAL = {"succeeded", "failed", "partial", "cancelled"}  # a job's terminal states in the API
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
TIMEOUT_MS = 120_000  # a browser test's Playwright timeouts


class WebServer:
    """``python -m photojobs serve`` on a free loopback port, restartable on the same port."""

    def __init__(
        self, env: dict[str, str], logdir: Path, *, roots: list[Path], extra: dict[str, str] | None = None
    ):
        self.port = free_port()
        self.logdir = logdir
        self.env = {
            **env,
            "PHOTOJOBS_API_TOKEN": TOKEN,
            "PHOTOJOBS_PHOTO_ROOTS": ":".join(str(r) for r in roots),
            "PHOTOJOBS_SSE_KEEPALIVE": "0.5",
            "PHOTOJOBS_SSE_POLL": "0.1",
            "PHOTOJOBS_DIAGNOSTICS": "1",  # the tests send the noop lane's fault parameters
            **(extra or {}),
        }
        self.proc: subprocess.Popen[bytes] | fork_server.Forked | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *args: str) -> WebServer:
        self.starts += 1
        log = open(self.logdir / f"serve-{self.starts}.log", "ab")  # noqa: SIM115
        with log:
            self.proc = fork_server.popen(
                [sys.executable, "-m", "photojobs", "serve", "--port", str(self.port), *args],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        wait_for(self._healthy, 60, what=f"photojobs serve on port {self.port}")
        return self

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"photojobs serve exited {self.proc.returncode}: {self.logs()}")
        try:
            # Up and serving: /healthz answers (503 while Redis or the database is down).
            return httpx.get(self.url + "/healthz", timeout=5).status_code in (200, 503)
        except httpx.HTTPError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def logs(self) -> str:
        return "\n".join(
            f.read_text(errors="replace")[-3000:] for f in sorted(self.logdir.glob("serve-*.log"))
        )

    def client(self, token: str | None = TOKEN, timeout: float = 30) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)


@contextmanager
def serving(env: dict[str, str], tmp_path: Path, roots: list[Path], **extra: str) -> Iterator[WebServer]:
    """A started ``photojobs serve`` (logs in ``tmp_path/web-logs``), stopped at the end."""
    logdir = tmp_path / "web-logs"
    logdir.mkdir()
    srv = WebServer(env, logdir, roots=roots, extra=extra)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def _chromium() -> str | None:
    return (
        os.environ.get("PHOTOJOBS_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    )


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium (Debian's, driven by Playwright for Python); the test is skipped (or
    fails in CI) where either is missing. A browser test module imports this fixture."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:  # pragma: no cover - depends on the machine
        unavailable(f"playwright not installed: {exc}")
    executable = _chromium()
    if executable is None:
        unavailable("chromium not installed (apt-get install chromium; .ci/run installs it)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield b
        b.close()


def wait_job(http: httpx.Client, job: int, states: set[str] = FINAL, timeout: float = 120) -> dict[str, Any]:
    """Poll ``GET /api/jobs/{job}`` until the job is in one of ``states``; its status."""

    def done() -> dict[str, Any] | None:
        st = http.get(f"/api/jobs/{job}").json()
        return st if st["state"] in states else None

    return wait_for(done, timeout, 0.2, what=f"job {job} in {states}")


@dataclass
class SseMessage:
    id: str | None
    event: str
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


def sse_messages(lines: Iterator[str], comments: list[str] | None = None) -> Iterator[SseMessage]:
    """Parse an SSE stream: a message is dispatched only at its blank line (as browsers do)."""
    ident: str | None = None
    event = "message"
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                yield SseMessage(ident, event, "\n".join(data))
            ident, event, data = None, "message", []
            continue
        if line.startswith(":"):
            if comments is not None:
                comments.append(line)
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id":
            ident = value
        elif name == "event":
            event = value
        elif name == "data":
            data.append(value)


class TcpProxy:
    """A TCP forwarder on a free loopback port to ``target`` (host, port) that a test can cut and
    restore: ``cut()`` closes the listener and every connection (the far side is unreachable:
    connections are refused), ``restore()`` listens again on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []

    def restore(self) -> TcpProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        if listener is not None:
            listener.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
