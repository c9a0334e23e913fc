"""The broker setup ``dramatiq actors`` imports, and one module per lane.

Run workers with ``photojobs worker`` or directly: ``dramatiq actors --queues photojobs.noop``.
"""

from photojobs.runtime import setup_worker_broker

broker = setup_worker_broker()

from . import analysis, archive, exif, noop, rename, upload  # noqa: E402,F401  (register with the broker)
