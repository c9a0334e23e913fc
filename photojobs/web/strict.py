"""Unknown query parameters are a 400 on every API route: ``GET /api/events?photo=345`` names a filter
the route does not have, and answering as if it had worked would mislead the caller."""

from __future__ import annotations

from fastapi import Request
from fastapi.dependencies.models import Dependant

from .errors import ApiError


def _query_names(dependant: Dependant) -> set[str]:
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


def known_query_only(request: Request) -> None:
    """A router dependency: 400 ``invalid_request`` naming each query parameter the matched route
    does not declare (and the ones it does)."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    known = _query_names(dependant)
    unknown = sorted({k for k in request.query_params if k not in known})
    if unknown:
        accepted = ", ".join(sorted(known)) or "none"
        raise ApiError(
            400,
            "invalid_request",
            f"unknown query parameter(s): {', '.join(unknown)} (this endpoint takes: {accepted})",
            {"unknown": unknown, "accepted": sorted(known)},
        )
