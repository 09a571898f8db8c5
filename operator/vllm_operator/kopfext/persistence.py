"""Where kopf keeps what it has handled: the diff base in memory, progress annotations only while they matter.

With kopf's annotation storages every VLLMServer costs two kopf patches before it is left
alone: the finalizer, then, after the first reconcile, the last handled spec (a copy of the
whole spec, `<prefix>/last-handled-configuration`) plus a `<prefix>/kopf-managed` marker.
bench/scale.py counted 1,999 such patches for 1,000 servers, beside 3,200 child applies; a
write to a custom resource is among the costliest for the API server. Here:

- the diff base (what kopf compares an event with to tell create/update/resume/no-op) is
  kept in this process's memory, as compact JSON, keyed by uid. After a restart an object
  that carries the operator's finalizer was seen by an earlier process (the finalizer is
  added before the first handling), so its first sighting is its diff base: kopf resumes
  it, as it did when the annotation matched. An annotation left by an earlier version is
  still read, and removed with the next change kopf stores;
- the progress annotations are kopf's own (same prefix); only the marker that flags them
  for other kopf-based operators is left out of a patch that, once the handler succeeded,
  carries no progress annotation at all (it is written with a handler's retry state).

The reconcile itself is level-based (reconcile.py), so a cause that kopf names differently
after a restart (create, resume, update) ends in the same call.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import kopf

#: kopf's marker annotation name (its conventions module), under the progress prefix.
MARKER_NAME = "kopf-managed"


def _pack(essence: Any) -> bytes:
    return json.dumps(essence, separators=(",", ":")).encode()


class MemoryDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff base in memory; the annotation of the same name is read (left by earlier versions), not written."""

    def __init__(self, *, prefix: str, key: str, finalizer: str) -> None:
        super().__init__(prefix=prefix, key=key)
        self.finalizer = finalizer
        #: uid -> the last handled essence as compact JSON; None: seen before kopf added the finalizer.
        self._bases: dict[str, Optional[bytes]] = {}

    def __len__(self) -> int:
        return len(self._bases)

    def fetch(self, *, body: Any) -> Optional[Any]:
        meta = body.get("metadata") or {}
        uid = meta.get("uid") or ""
        if meta.get("deletionTimestamp"):
            self._bases.pop(uid, None)  # going away: kopf handles deletion without a diff base
            return super().fetch(body=body)
        if uid in self._bases:
            packed = self._bases[uid]
            return None if packed is None else json.loads(packed)
        stale = super().fetch(body=body)
        if stale is not None:
            return stale  # stored by an earlier version of the operator
        if self.finalizer in (meta.get("finalizers") or []):
            # Handled by an earlier process: what it saw is unknown, what is here now is the base.
            essence = self.build(body=body)
            self._bases[uid] = _pack(essence)
            return essence
        self._bases[uid] = None  # new: kopf adds the finalizer, then creates
        return None

    def store(self, *, body: Any, patch: Any, essence: Any) -> None:
        meta = body.get("metadata") or {}
        self._bases[meta.get("uid") or ""] = _pack(essence)
        annotations = meta.get("annotations") or {}
        for full_key in self.make_keys(self.key, body=body):
            if full_key in annotations:
                patch.metadata.annotations[full_key] = None  # an earlier version's copy: now stale


class ProgressAnnotationsStorage(kopf.AnnotationsProgressStorage):
    """kopf's progress annotations, minus the marker in a patch that ends with no progress annotation."""

    def purge(self, *, key: Any, body: Any, patch: Any) -> None:
        super().purge(key=key, body=body, patch=patch)
        annotations = (patch.get("metadata") or {}).get("annotations")
        marker = f"{self.prefix}/{MARKER_NAME}"
        if not annotations or marker not in annotations:
            return
        ours = [k for k, v in annotations.items() if k != marker and k.startswith(f"{self.prefix}/") and v is not None]
        if not ours:
            del annotations[marker]
            if not annotations:
                del patch["metadata"]["annotations"]
                if not patch["metadata"]:
                    del patch["metadata"]
