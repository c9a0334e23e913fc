"""Webhooks: ``job_finished`` POSTed to ``PHOTOJOBS_WEBHOOK_URL`` by the sweeper service, at least once.

``PHOTOJOBS_WEBHOOK_URL`` (http or https) and ``PHOTOJOBS_WEBHOOK_SECRET`` (required with it): each
``job_finished`` event is POSTed as ``{"event", "job", "state", "counts", "cursor"}`` with
``X-Photojobs-Signature: sha256=<hex HMAC-SHA256 of the raw body keyed by the secret>``.

The SSRF rule (design rule 11, remote targets only from the operator's configuration): a URL whose
host is a loopback or private address (or ``localhost``) is accepted as is; any other host — a
name, a public or link-local address (cloud metadata) — only when the operator also names it in
``PHOTOJOBS_WEBHOOK_HOSTS`` (space- or comma-separated host names). Redirects are never followed
(a 3xx is a failed attempt), timeouts are short. A refused setting is a :class:`ConfigError`
naming the variable, at startup (``Settings.from_env``).

:class:`WebhookDuty` is the sweeper service's duty (``photojobs.sweeper_service``): every run it
claims the target's row (``store.webhooks.claim``: one deliverer across fleets), then delivers the
events after its cursor in order until one fails (the backoff then decides the next attempt) or
the run's budget is spent. The cursor moves only after a 2xx, so a crash between the answer and
the record sends that event again: receivers de-duplicate by ``cursor``.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from sqlalchemy import Engine

from photojobs.errors import ConfigError
from store import webhooks as state

if TYPE_CHECKING:
    from apscheduler.schedulers.base import BaseScheduler

    from photojobs.config import Settings

# urllib3 and APScheduler are imported where a delivery or the sweeper's duty needs them: every
# process reads its settings through ``webhook_config`` (photojobs.config), and a worker, CLI or
# server process that delivers nothing paid ~0.1 s of CPU for them at each start.

log = logging.getLogger("photojobs.webhooks")

URL_ENV = "PHOTOJOBS_WEBHOOK_URL"
SECRET_ENV = "PHOTOJOBS_WEBHOOK_SECRET"  # noqa: S105 - the variable's name, not a secret
HOSTS_ENV = "PHOTOJOBS_WEBHOOK_HOSTS"
BACKOFF_MAX_ENV = "PHOTOJOBS_WEBHOOK_BACKOFF_MAX"
SIGNATURE = "X-Photojobs-Signature"
BACKOFF_BASE = 1.0
BACKOFF_MAX = 300.0
LEASE_MIN = 10.0  # a deliverer holds a target max(10 s, 10 runs) unrenewed (each run and delivery renews)
BATCH = 100  # events delivered per run at most
TIMEOUT = (3.0, 5.0)  # connect, read (seconds)


@dataclass(frozen=True)
class WebhookConfig:
    url: str
    host: str
    secret: bytes = field(repr=False)
    backoff_max: float = BACKOFF_MAX

    @property
    def target(self) -> str:
        return state.target_of(self.url)


def _inside(host: str) -> bool:
    """A loopback or private address (not link-local, not unspecified), or ``localhost``."""
    if host.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if ip.is_link_local or ip.is_unspecified or ip.is_multicast:
        return False
    return ip.is_loopback or ip.is_private


def webhook_config(env: Mapping[str, str]) -> WebhookConfig | None:
    """The webhook the environment configures, or None; :class:`ConfigError` naming the variable
    for a URL that is not http(s), has credentials or no host, a host outside without
    ``PHOTOJOBS_WEBHOOK_HOSTS`` naming it, a missing secret or a bad backoff."""
    url = (env.get(URL_ENV) or "").strip()
    if not url:
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(URL_ENV, f"{url!r} is not a URL ({exc})") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ConfigError(URL_ENV, f"{url!r}: only http:// and https:// URLs are delivered to")
    if not parts.hostname:
        raise ConfigError(URL_ENV, f"{url!r} names no host")
    if parts.username is not None or parts.password is not None:
        raise ConfigError(URL_ENV, "credentials in the URL are refused; the receiver checks the signature")
    if any(c in url for c in "\x00\r\n\t "):
        raise ConfigError(URL_ENV, f"{url!r} contains a blank or control character")
    host = parts.hostname
    named = {
        h.strip().lower().strip("[]") for h in re.split(r"[\s,]+", env.get(HOSTS_ENV) or "") if h.strip()
    }
    if not _inside(host) and host.lower() not in named:
        raise ConfigError(
            URL_ENV,
            f"the host {host!r} is outside (not a loopback or private address); deliver to it only by "
            f"naming it in {HOSTS_ENV} as well",
        )
    secret = env.get(SECRET_ENV) or ""
    if not secret.strip():
        raise ConfigError(SECRET_ENV, f"must be set when {URL_ENV} is (the key of {SIGNATURE})")
    raw_max = env.get(BACKOFF_MAX_ENV) or ""
    try:
        backoff_max = float(raw_max) if raw_max.strip() else BACKOFF_MAX
    except ValueError:
        raise ConfigError(BACKOFF_MAX_ENV, f"{raw_max!r} is not a number of seconds") from None
    if not 0 < backoff_max < float("inf"):
        raise ConfigError(BACKOFF_MAX_ENV, f"must be a positive number of seconds, not {raw_max!r}")
    bracketed = f"[{host}]" if ":" in host else host  # an IPv6 address
    shown = f"{bracketed}:{port}" if port else bracketed
    return WebhookConfig(url=url, host=shown, secret=secret.encode(), backoff_max=backoff_max)


def sign(secret: bytes, body: bytes) -> str:
    """The ``X-Photojobs-Signature`` value of ``body``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def encode(body: Mapping[str, object]) -> bytes:
    """The raw body sent (compact JSON, keys sorted): what the signature covers."""
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


@dataclass
class Outcome:
    ok: bool
    status: int | None
    error: str


class WebhookDuty:
    """The sweeper's webhook duty (module doc). ``run_once`` returns how many events it delivered.
    Counts for tests and logs: ``delivered``, ``failed``."""

    def __init__(self, engine: Engine, config: WebhookConfig, lease: float = LEASE_MIN) -> None:
        self.engine = engine
        self.config = config
        self.lease = lease
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        import urllib3

        self.http = urllib3.PoolManager(
            retries=False,
            timeout=urllib3.Timeout(connect=TIMEOUT[0], read=TIMEOUT[1]),
            num_pools=1,
            maxsize=1,
        )
        self.delivered = 0
        self.failed = 0
        self._ensured = False

    def run_once(self) -> int:
        cfg = self.config
        if not self._ensured:
            state.ensure(self.engine, cfg.target, cfg.host)
            self._ensured = True
        if not state.claim(self.engine, cfg.target, self.owner, self.lease):
            return 0  # another fleet's sweeper delivers
        sent = 0
        deadline = time.monotonic() + self.lease / 2
        while sent < BATCH and time.monotonic() < deadline:
            d = state.next_delivery(self.engine, cfg.target)
            if d is None:
                break
            outcome = self.post(d.body())
            if not outcome.ok:
                delay = state.failed(
                    self.engine,
                    d,
                    self.owner,
                    outcome.status,
                    outcome.error,
                    base=BACKOFF_BASE,
                    cap=cfg.backoff_max,
                )
                self.failed += 1
                log.warning(
                    "webhook to %s: job %d (cursor %d) not delivered (%s); next attempt in %.0f s",
                    cfg.host,
                    d.job,
                    d.cursor,
                    outcome.error,
                    delay,
                )
                break
            if not state.delivered(self.engine, d, self.owner, outcome.status or 200, self.lease):
                break  # the lease was lost: the new owner sends it again
            self.delivered += 1
            sent += 1
        return sent

    def post(self, body: Mapping[str, object]) -> Outcome:
        import urllib3

        raw = encode(body)
        headers = {
            "Content-Type": "application/json",
            SIGNATURE: sign(self.config.secret, raw),
            "User-Agent": "photojobs-webhook",
        }
        try:
            r = self.http.request(
                "POST",
                self.config.url,
                body=raw,
                headers=headers,
                redirect=False,
                retries=False,
                preload_content=True,
            )
        except urllib3.exceptions.HTTPError as exc:
            return Outcome(False, None, f"no answer: {type(exc).__name__}: {str(exc)[:200]}")
        if 200 <= r.status < 300:
            return Outcome(True, r.status, "")
        if 300 <= r.status < 400:
            return Outcome(False, r.status, f"HTTP {r.status}: a redirect, not followed")
        return Outcome(False, r.status, f"HTTP {r.status}")

    def release(self) -> None:
        """A clean stop gives the delivery up (another fleet's sweeper takes it at once)."""
        try:
            state.release(self.engine, self.config.target, self.owner)
        except Exception:  # noqa: BLE001 - the lease expires anyway
            log.debug("webhook release failed", exc_info=True)
        self.http.clear()


def schedule(scheduler: BaseScheduler, engine: Engine, settings: Settings) -> WebhookDuty | None:
    """The sweeper service's registration: with ``PHOTOJOBS_WEBHOOK_URL`` set, run the duty every
    ``PHOTOJOBS_SWEEP_INTERVAL`` seconds as its own APScheduler job (a receiver that is slow or
    down never delays the sweep's passes), the first run now, and give the delivery up when the
    scheduler shuts down."""
    config = webhook_config(settings.env)
    interval = settings.sweep_interval
    if config is None:
        return None
    duty = WebhookDuty(engine, config, lease=max(LEASE_MIN, 10 * interval))

    def run() -> None:
        try:
            duty.run_once()
        except Exception as exc:  # noqa: BLE001 - a store blip: the next run tries again
            log.warning(
                "webhook delivery run failed (%s: %s); next run in %.0f s", type(exc).__name__, exc, interval
            )
            log.debug("webhook run failure", exc_info=True)

    scheduler.add_job(
        run,
        "interval",
        seconds=interval,
        max_instances=1,
        coalesce=True,
        id="photojobs-webhooks",
        next_run_time=datetime.now(UTC),
    )
    from apscheduler.events import EVENT_SCHEDULER_SHUTDOWN

    scheduler.add_listener(lambda _event: duty.release(), EVENT_SCHEDULER_SHUTDOWN)
    log.info("webhooks: job_finished is delivered to %s", config.host)
    return duty
