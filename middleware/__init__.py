"""Dramatiq middleware: leases + heartbeats + fencing, photo locks, typed lanes, cancellation."""

from .context import ItemContext, Stopped, current
from .lease import LeaseMiddleware

__all__ = ["ItemContext", "LeaseMiddleware", "Stopped", "current"]
