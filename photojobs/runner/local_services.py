"""What ``photojobs run`` starts besides its workers: embedded Redis, the SQLite default, the sweeper."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from rich.console import Console

from photojobs.config import Settings
from photojobs.embedded_redis import EmbeddedRedis
from photojobs.runner.state_folder import make_private_sqlite, stop_leftover_workers
from photojobs.sweeper_service import Sweeper


class LocalServices:
    """``with LocalServices(state_dir, workers, console) as local:`` the environment of the run
    (``local.env``, ``local.settings``): the store defaults to SQLite in the state folder (0600),
    Redis to an embedded server in it, unless ``PHOTOJOBS_DATABASE_URL`` / ``PHOTOJOBS_REDIS_URL``
    say otherwise; the workers a killed run left behind are stopped first. ``start_sweeper``
    starts the sweeper; leaving the block stops the sweeper, then the embedded Redis."""

    def __init__(
        self, state_dir: Path, workers: int, console: Console, environ: Mapping[str, str] | None = None
    ) -> None:
        self.state_dir, self.workers, self.console = state_dir, workers, console
        self.env: dict[str, str] = dict(os.environ if environ is None else environ)
        self.embedded: EmbeddedRedis | None = None
        self.sweeper: Sweeper | None = None
        self.settings: Settings  # read from ``env`` on entering the block

    def __enter__(self) -> LocalServices:
        env = self.env
        env.setdefault("PHOTOJOBS_DATABASE_URL", f"sqlite:///{self.state_dir / 'photojobs.db'}")
        stop_leftover_workers(self.state_dir, self.console)
        make_private_sqlite(env["PHOTOJOBS_DATABASE_URL"], self.state_dir)
        if not env.get("PHOTOJOBS_REDIS_URL"):
            self.embedded = EmbeddedRedis(self.state_dir)
            env["PHOTOJOBS_REDIS_URL"] = self.embedded.start()
            if self.embedded.adopted:
                self.console.print("reusing the embedded Redis left by an earlier run", highlight=False)
        env.setdefault("PHOTOJOBS_FLEET_PROCESSES", str(self.workers))
        try:
            self.settings = Settings.from_env(env)
        except BaseException:
            self.close()
            raise
        return self

    def start_sweeper(self) -> Sweeper:
        self.sweeper = Sweeper(self.settings)
        self.sweeper.start()
        return self.sweeper

    def close(self) -> None:
        if self.sweeper is not None:
            self.sweeper.stop()
            self.sweeper = None
        if self.embedded is not None:
            self.embedded.stop()
            self.embedded = None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
