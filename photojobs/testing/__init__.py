"""Helpers for your own tests and demos: sample photos (:mod:`.samples`) and a store at scale (:mod:`.scale`).

Nothing in the runtime imports this package: ``photojobs run``, the workers and the web console work
without it. Use it the way Procrastinate's ``testing`` module is used::

    from photojobs.testing.samples import generate_samples   # realistic JPEGs, near-duplicates, corrupt files
    from photojobs.testing.samples import make_png, make_tiff, make_heic  # small lossless images
    from photojobs.testing import scale                      # seed_pending(engine, 1_000_000), hot_path_plans
"""
