"""The broker setup ``dramatiq actors`` imports, and one module per lane.

Run workers with ``photojobs worker`` or directly: ``dramatiq actors --queues photojobs.noop``.
"""

from photojobs.runtime import setup_worker_broker
from photos.memory import keep_image_buffers

broker = setup_worker_broker()
# Before Dramatiq starts the worker threads: their photos' buffers are reused, not faulted in anew.
keep_image_buffers()

from . import analysis, archive, exif, noop, rename, upload  # noqa: E402,F401  (register with the broker)
