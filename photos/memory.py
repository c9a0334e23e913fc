"""How a worker process's C allocator treats the big buffers of image work.

Decoding a photo allocates a few large buffers (megabytes each) and frees them a few milliseconds
later. glibc serves an allocation above its mmap threshold with a fresh ``mmap`` and returns it to
the system at ``free``, and in a thread other than the main one (every Dramatiq worker thread) its
arena gives freed memory back above the trim threshold too, so each photo faulted its buffers in
again: ~930 minor page faults and ~3 ms of CPU per 1600x1200 photo, 17 ms against 14 ms for the same
``analyze`` in a main thread (README, Benchmarks). Fixed thresholds (32 MiB mmap, 64 MiB trim)
keep those buffers in the arena for the next photo; larger ones (a 100-megapixel decode) are still
mapped and unmapped as before, and an idle process keeps at most the trim threshold per arena.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

log = logging.getLogger("photojobs.memory")

M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 64 * 1024 * 1024


def keep_image_buffers(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Set glibc's mmap and trim thresholds for this process (call before the worker threads
    start). Returns whether they were set: False on a C library other than glibc."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        mallopt.restype = ctypes.c_int
        mmap_set = bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold))
        ok = mmap_set and bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))
    except (OSError, AttributeError) as exc:
        log.debug("mallopt unavailable: %s", exc)
        return False
    return ok
