"""Errors every floor may raise for the operator: a bad setting, a service out of reach.

Dependency-free on purpose (like :mod:`photojobs.lanes`, which middleware/ already imports): the
command maps them to one line and an exit status (README "Exit statuses"), so a mistake in the
environment never ends in a traceback.
"""

from __future__ import annotations

EX_USAGE = 64  # a bad command line or setting (sysexits.h EX_USAGE)
EX_UNAVAILABLE = 69  # a service (Redis, the database) cannot be reached (EX_UNAVAILABLE)
EX_TEMPFAIL = 75  # try again later: a lane is full, the state folder is in use (EX_TEMPFAIL)


class ConfigError(ValueError):
    """A setting is malformed or out of range: ``setting`` names it (an environment variable or an
    option), ``problem`` says what is wrong with it.  Exit status 64."""

    def __init__(self, setting: str, problem: str) -> None:
        self.setting = setting
        self.problem = problem
        super().__init__(f"{setting}: {problem}")


class ServiceUnavailable(RuntimeError):
    """A service the command needs (``service``: "Redis", "the database") cannot be reached at
    ``where``; ``problem`` is the reason.  Exit status 69."""

    def __init__(self, service: str, where: str, problem: str) -> None:
        self.service = service
        self.where = where
        self.problem = problem
        super().__init__(f"{service} at {where} is unavailable: {problem}")
