"""Configuration from the environment (every variable has a default; see README "Configuration")."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def _float(env: dict[str, str], key: str, default: float) -> float:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{key}={raw!r} is not a number") from None
    if value <= 0:
        raise ValueError(f"{key}={raw!r} must be positive")
    return value


@dataclass(frozen=True)
class Settings:
    database_url: str
    redis_url: str
    lease_ttl: float = 10.0
    heartbeat_interval: float = 2.5
    sweep_interval: float = 1.0
    republish_after: float = 5.0
    max_attempts: int = 3
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
        from photojobs.lanes import all_lanes

        check_heartbeat(all_lanes(self.env), self.heartbeat_explicit, self.env)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, state_dir: Path | None = None) -> Settings:
        from store.engine import database_url

        env = dict(os.environ) if env is None else env
        ttl = _float(env, "PHOTOJOBS_LEASE_TTL", 10.0)
        if "PHOTOJOBS_DATABASE_URL" in env:
            db = env["PHOTOJOBS_DATABASE_URL"]
        else:
            db = database_url(state_dir)
        settings = cls(
            database_url=db,
            redis_url=env.get("PHOTOJOBS_REDIS_URL") or DEFAULT_REDIS_URL,
            lease_ttl=ttl,
            heartbeat_interval=_float(env, "PHOTOJOBS_HEARTBEAT_INTERVAL", ttl / 4),
            sweep_interval=_float(env, "PHOTOJOBS_SWEEP_INTERVAL", 1.0),
            republish_after=_float(env, "PHOTOJOBS_REPUBLISH_AFTER", 5.0),
            max_attempts=int(_float(env, "PHOTOJOBS_MAX_ATTEMPTS", 3)),
            env=env,
        )
        settings.check_leases()
        return settings
