"""Configuration from the environment (every variable has a default; see README "Configuration").

Every setting is checked when it is read: a malformed or out-of-range value raises
:class:`~photojobs.errors.ConfigError` naming the variable and the problem (the command prints it as
one line and exits 64).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from photojobs.errors import ConfigError, ServiceUnavailable

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
REDIS_SCHEMES = ("redis", "rediss", "unix")
DATABASE_DRIVERS = ("sqlite", "postgresql", "postgres")


def _float_or_off(env: dict[str, str], key: str, default: float) -> float:
    """A positive number of seconds, or ``0`` (off)."""
    if re.fullmatch(r"\s*0+(\.0*)?\s*", env.get(key) or ""):
        return 0.0
    return _float(env, key, default)


def _float(env: dict[str, str], key: str, default: float) -> float:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(key, f"{raw!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise ConfigError(key, f"must be a positive number, not {raw!r}")
    return value


def _switch(env: dict[str, str], key: str, default: bool) -> bool:
    raw = (env.get(key) or "").strip().lower()
    if raw == "":
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(key, f"must be 1/true/on or 0/false/off, not {env[key]!r}")


def _int(env: dict[str, str], key: str, default: int) -> int:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(key, f"{raw!r} is not a whole number") from None
    if value < 1:
        raise ConfigError(key, f"must be at least 1, not {raw!r}")
    return value


def masked(url: str) -> str:
    """``url`` with its password hidden (for messages and logs)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        if "@" in url and "://" in url:
            scheme, rest = url.split("://", 1)
            return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
        return url


def check_database_url(url: str, key: str = "PHOTOJOBS_DATABASE_URL") -> str:
    """A parsable SQLite or PostgreSQL URL, else :class:`ConfigError`."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise ConfigError(key, f"cannot parse {masked(url)!r} as a database URL "
                               "(e.g. sqlite:////abs/path.db or postgresql://user:pw@host/db)") from None
    if parsed.get_backend_name() not in DATABASE_DRIVERS:
        raise ConfigError(key, f"unsupported database {parsed.get_backend_name()!r} in {masked(url)!r}; "
                               "use sqlite:/// or postgresql://")
    if parsed.get_backend_name() == "sqlite" and not parsed.database:
        raise ConfigError(key, f"{masked(url)!r} names no database file")
    return url


def check_redis_url(url: str, key: str = "PHOTOJOBS_REDIS_URL") -> str:
    """A URL redis-py accepts (redis://, rediss://, unix://), else :class:`ConfigError`."""
    from redis.connection import parse_url

    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in REDIS_SCHEMES:
        raise ConfigError(key, f"{masked(url)!r} is not a Redis URL (redis://host:port/db, rediss://, unix://path)")
    try:
        parse_url(url)
    except ValueError as exc:
        raise ConfigError(key, f"cannot parse {masked(url)!r}: {exc}") from None
    return url


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else exc.__class__.__name__


def service_error(exc: BaseException, settings: Settings | None) -> ServiceUnavailable | None:
    """The :class:`ServiceUnavailable` an exception stands for (Redis or the database out of reach),
    or None when it is something else."""
    import redis
    from sqlalchemy.exc import InterfaceError, OperationalError

    if isinstance(exc, ServiceUnavailable):
        return exc
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        where = masked(settings.redis_url) if settings else "PHOTOJOBS_REDIS_URL"
        return ServiceUnavailable("Redis", where, first_line(exc))
    if isinstance(exc, OperationalError | InterfaceError):
        where = masked(settings.database_url) if settings else "PHOTOJOBS_DATABASE_URL"
        return ServiceUnavailable("the database", where, first_line(exc.orig or exc))
    return None


def describe_outage(exc: BaseException, settings: Settings | None) -> str:
    """One line for a failure in a retry loop: which service is out of reach and why."""
    err = service_error(exc, settings)
    return str(err) if err is not None else f"{exc.__class__.__name__}: {first_line(exc)}"


@dataclass(frozen=True)
class Settings:
    database_url: str
    redis_url: str
    lease_ttl: float = 10.0
    heartbeat_interval: float = 2.5
    sweep_interval: float = 1.0
    republish_after: float = 5.0
    max_attempts: int = 3
    forget_workers_after: float = 3600.0  # the sweeper forgets a worker not heard from for this long
    submit_abandoned_after: float = 600.0  # the sweeper ends a submission with no chunk for this long
    chain_claims: bool = True  # PHOTOJOBS_CHAIN_CLAIMS: a finish claims the worker's next message
    vacuum_every: float = 15.0  # PHOTOJOBS_VACUUM_EVERY: the sweeper's check of the hot tables (0: never)
    idempotency_keep: float = 86400.0  # PHOTOJOBS_IDEMPOTENCY_KEEP: seconds an Idempotency-Key is kept
    env: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def heartbeat_explicit(self) -> float | None:
        """``PHOTOJOBS_HEARTBEAT_INTERVAL`` when set; unset, each worker derives its interval from
        the shortest lease TTL of the lanes it serves (``middleware.heartbeat``)."""
        return self.heartbeat_interval if self.env.get("PHOTOJOBS_HEARTBEAT_INTERVAL") else None

    def check_leases(self) -> None:
        """Lease TTLs positive, an explicit heartbeat interval below half of every lane's TTL
        (``store.errors.ConfigError`` naming the variable otherwise)."""
        from middleware.heartbeat import check_heartbeat
        from store.lanes import all_lanes

        check_heartbeat(all_lanes(self.env), self.heartbeat_explicit, self.env)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, state_dir: Path | None = None) -> Settings:
        """The settings, every one checked (:class:`ConfigError` names the first bad one),
        including the per-lane ``PHOTOJOBS_LANE_<LANE>_<FIELD>`` overrides."""
        from photojobs.webhooks import webhook_config
        from store.engine import database_url
        from store.lanes import all_lanes, cpu_slots

        env = dict(os.environ) if env is None else env
        ttl = _float(env, "PHOTOJOBS_LEASE_TTL", 10.0)
        if env.get("PHOTOJOBS_DATABASE_URL"):
            db = check_database_url(env["PHOTOJOBS_DATABASE_URL"])
        elif "PHOTOJOBS_DATABASE_URL" in env:
            raise ConfigError("PHOTOJOBS_DATABASE_URL", "is set but empty")
        else:
            db = database_url(state_dir)
        settings = cls(
            database_url=db,
            redis_url=check_redis_url(env.get("PHOTOJOBS_REDIS_URL") or DEFAULT_REDIS_URL),
            lease_ttl=ttl,
            heartbeat_interval=_float(env, "PHOTOJOBS_HEARTBEAT_INTERVAL", ttl / 4),
            sweep_interval=_float(env, "PHOTOJOBS_SWEEP_INTERVAL", 1.0),
            republish_after=_float(env, "PHOTOJOBS_REPUBLISH_AFTER", 5.0),
            max_attempts=_int(env, "PHOTOJOBS_MAX_ATTEMPTS", 3),
            forget_workers_after=_float(env, "PHOTOJOBS_FORGET_WORKERS_AFTER", 3600.0),
            submit_abandoned_after=_float(env, "PHOTOJOBS_SUBMIT_ABANDONED", 600.0),
            chain_claims=_switch(env, "PHOTOJOBS_CHAIN_CLAIMS", True),
            vacuum_every=_float_or_off(env, "PHOTOJOBS_VACUUM_EVERY", 15.0),
            idempotency_keep=_float(env, "PHOTOJOBS_IDEMPOTENCY_KEEP", 86400.0),
            env=env,
        )
        all_lanes(env)  # the lane overrides: ConfigError naming the variable
        _int(env, "PHOTOJOBS_FLEET_PROCESSES", 2)
        cpu_slots(env)  # read again by each worker process's slots (middleware.cpu_slots)
        settings.check_leases()
        webhook_config(env)  # PHOTOJOBS_WEBHOOK_URL's SSRF rule: refused at startup, naming the variable
        return settings
