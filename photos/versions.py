"""Lane versions: which code and which parameters produced a lane's result (issue 38).

A lane's version is ``LANE/CODE:PARAMS``: ``CODE`` is the lane's code version below (raise it when a
change of the lane's code changes what it produces for the same photo, e.g. a new analysis fact),
``PARAMS`` the first 12 hex digits of the SHA-256 of the lane's own parameters (``exif.keywords``,
``rename.pattern``, …) as the job has them, defaults filled in. ``photojobs sync --outdated`` runs a
lane again on a photo whose recorded version differs from the current one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from photos.params import lane_params

#: The code version of each lane: raise one when that lane's results for the same photo and
#: parameters would differ from what the released code produced.
CODE_VERSIONS: dict[str, int] = {
    "analysis": 1,
    "exif": 1,
    "rename": 1,
    "upload": 1,
    "archive": 1,
    "noop": 1,
}


def lane_version(lane: str, params: Mapping[str, Any]) -> str:
    """``"analysis/1:3f2a9c0b1d4e"``: the lane's code version and a hash of its parameters."""
    own = json.dumps(lane_params(params, lane), sort_keys=True, default=str)
    return f"{lane}/{CODE_VERSIONS.get(lane, 0)}:{hashlib.sha256(own.encode()).hexdigest()[:12]}"
