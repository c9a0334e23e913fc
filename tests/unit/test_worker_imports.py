"""A worker process boots without the libraries only some lanes use (boto3, numpy, imagehash).

Every test that starts a worker pays for its imports, and the suite starts hundreds: importing
``actors`` (what a ``dramatiq actors`` worker process does at boot) took 1.12 s of CPU with boto3
and numpy, 0.82 s without (5 runs each, A-B-A, 2-core machine). The S3 target imports boto3 when it
makes its client, the analysis lane numpy and imagehash when it measures a photo.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import ROOT

LAZY = ("boto3", "botocore.config", "numpy", "imagehash")


def test_importing_the_actors_leaves_boto3_numpy_and_imagehash_unimported() -> None:
    # Given a fresh interpreter
    # When it imports the actors, as a worker process does when it boots
    code = f"import sys, json, actors; print(json.dumps([m for m in {LAZY!r} if m in sys.modules]))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    # Then none of the lane-only libraries was imported
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
