"""photojobs: the durable job runtime of a photo-management app."""

__version__ = "0.1.0"
