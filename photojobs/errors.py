"""Errors every floor may raise for the operator: a bad setting, a service out of reach.

Nearly dependency-free (``ConfigError`` itself lives in :mod:`store.errors`, below every floor): the
command maps them to one line and an exit status (README "Exit statuses"), so a mistake in the
environment never ends in a traceback.
"""

from __future__ import annotations

from store.errors import ConfigError  # one class on every floor (the store validates lease settings)

__all__ = ["ConfigError", "ServiceUnavailable", "EX_USAGE", "EX_UNAVAILABLE", "EX_TEMPFAIL"]

EX_USAGE = 64  # a bad command line or setting (sysexits.h EX_USAGE)
EX_UNAVAILABLE = 69  # a service (Redis, the database) cannot be reached (EX_UNAVAILABLE)
EX_TEMPFAIL = 75  # try again later: a lane is full, the state folder is in use (EX_TEMPFAIL)


class ServiceUnavailable(RuntimeError):
    """A service the command needs (``service``: "Redis", "the database") cannot be reached at
    ``where``; ``problem`` is the reason.  Exit status 69."""

    def __init__(self, service: str, where: str, problem: str) -> None:
        self.service = service
        self.where = where
        self.problem = problem
        super().__init__(f"{service} at {where} is unavailable: {problem}")
