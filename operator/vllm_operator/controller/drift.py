"""Whether a live child holds what the operator sent: the hash of the desired object in an annotation (so a
removed field is noticed too), and the subset check that ignores what the API server defaulted. Pure."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Optional

from .. import api

HASH_ANNOTATION = f"{api.GROUP}/desired-hash"


def desired_hash(obj: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:20]


def with_hash(obj: dict[str, Any]) -> dict[str, Any]:
    """The object plus an annotation naming the hash of what we sent, so removals are noticed too."""
    digest = desired_hash(obj)
    out = json.loads(json.dumps(obj))
    out["metadata"].setdefault("annotations", {})[HASH_ANNOTATION] = digest
    return out


def is_subset(want: Any, have: Any) -> bool:
    """Every field in `want` is in `have` with the same value (server defaults may add more)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and is_subset(v, have[k]) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(map(is_subset, want, have))
    return want == have or (isinstance(want, (int, float)) and isinstance(have, str) and str(want) == have)


def up_to_date(want: dict[str, Any], live: Optional[dict[str, Any]]) -> bool:
    if live is None:
        return False
    digest = want["metadata"]["annotations"][HASH_ANNOTATION]
    if live.get("metadata", {}).get("annotations", {}).get(HASH_ANNOTATION) != digest:
        return False
    return is_subset(want, live)
