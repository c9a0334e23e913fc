"""Run a clean-up when this process ends, however it ends normally: at interpreter exit
(``atexit``) and at the end of a ``multiprocessing`` child (Dramatiq's worker processes are forked
children: they end through ``os._exit``, which runs no ``atexit`` handler, only multiprocessing's
finalizers). Each clean-up runs once, and only in the process that registered it (a forked child
inherits its parent's registrations but never runs them). A process killed outright runs nothing:
what it leaves is swept by the next process (:mod:`photos.containment`, :mod:`photos.exiftool`)."""

from __future__ import annotations

import atexit
import multiprocessing.util
import os
import threading
from collections.abc import Callable
from typing import Any

_done: set[int] = set()
_lock = threading.Lock()
_ids = iter(range(1, 1 << 62))


def at_exit(fn: Callable[..., Any], *args: Any) -> None:
    """Call ``fn(*args)`` once when this process ends (exceptions it raises are swallowed)."""
    pid = os.getpid()
    with _lock:
        key = next(_ids)

    def once() -> None:
        with _lock:
            if os.getpid() != pid or key in _done:
                return
            _done.add(key)
        try:
            fn(*args)
        except Exception:  # noqa: BLE001, S110 - a clean-up at exit never raises
            pass

    atexit.register(once)
    multiprocessing.util.Finalize(None, once, exitpriority=0)
