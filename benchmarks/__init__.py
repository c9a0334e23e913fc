"""Benchmarks of photojobs: ``python -m benchmarks`` (``make bench``).

Each benchmark is a function registered in :mod:`benchmarks.registry` that returns rows of figures;
``python -m benchmarks --list`` names them. This package is imported by the plain-Dramatiq baseline
worker (``dramatiq benchmarks.plain_actors``) too, so it imports nothing here.
"""
