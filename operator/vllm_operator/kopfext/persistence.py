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

Both are kopf's supported extension point (`settings.persistence.diffbase_storage` and
`progress_storage`: storages of one's own, nolar/kopf#702), subclasses of kopf's public
annotation storages, written against kopf 1.45.2. What they take from kopf beyond the
documented interface is checked by `self_test()` when the operator starts; on a failure
kopf's own storage is used for that part, with a warning (more patches, same behaviour).

The marker (`<prefix>/kopf-managed`, nolar/kopf#539 after zalando-incubator/kopf#372) is
kopf's protection against a ping-pong between two kopf-based operators handling the same
object: an operator ignores, in what it compares, the annotations under any prefix that
carries the marker, so the other's progress and diff-base writes never look like a change
to react to (and to store, growing the object each round). It matters only while an
annotation of ours is on the object; it is still written with every patch that writes one
(a retry's progress record), and kopf never removes it. Left out is only the marker alone, in
the patch that ends a successful handling and that would otherwise carry nothing at all;
the operator itself never reads it (its own prefix is cleared from what it compares by
kopf's progress storage either way).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        """kopf's essence, from the body without the parts kopf's build deep-copies only to drop them: the
        status and metadata.managedFields (most of a server's body; kopf builds the essence on every event of
        every server). With extra fields (a handler on a status field; the operator has none) kopf's own."""
        fields = list(extra_fields or [])
        if fields:
            return super().build(body=body, extra_fields=fields)
        return super().build(body=_without_status(body), extra_fields=fields)

    def store(self, *, body: Any, patch: Any, essence: Any) -> None:
        meta = body.get("metadata") or {}
        self._bases[meta.get("uid") or ""] = _pack(essence)
        annotations = meta.get("annotations") or {}
        for full_key in self.make_keys(self.key, body=body):
            if full_key in annotations:
                patch.metadata.annotations[full_key] = None  # an earlier version's copy: now stale


def _without_status(body: Any) -> kopf.Body:
    """The body (shallow) minus the status and metadata.managedFields: nothing of the essence."""
    raw: Any = {k: v for k, v in body.items() if k != "status"}
    if isinstance(raw.get("metadata"), Mapping):
        raw["metadata"] = {k: v for k, v in raw["metadata"].items() if k != "managedFields"}
    return kopf.Body(raw)


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


# --------------------------------------------------------------------------- self-test
_SELF_TEST_PREFIX = "self-test.invalid"


def _body(*, finalizer: Optional[str] = None, annotations: Optional[dict] = None) -> kopf.Body:
    meta: dict[str, Any] = {"name": "s", "namespace": "ns", "uid": "self-test"}
    if finalizer:
        meta["finalizers"] = [finalizer]
    if annotations:
        meta["annotations"] = annotations
    raw: Any = {"apiVersion": "example.invalid/v1", "kind": "X", "metadata": meta, "spec": {"a": 1},
                "status": {"b": 2}}
    return kopf.Body(raw)


def self_test_progress() -> Optional[str]:
    """None when ProgressAnnotationsStorage drops exactly kopf's lone marker; else what differs."""
    marker = f"{_SELF_TEST_PREFIX}/{MARKER_NAME}"
    record: Any = {"started": "2026-01-01T00:00:00", "retries": 1}
    key: Any = "h"
    outcomes = {}
    for cls in (kopf.AnnotationsProgressStorage, ProgressAnnotationsStorage):
        storage = cls(prefix=_SELF_TEST_PREFIX)
        retried, succeeded = kopf.Patch(), kopf.Patch()
        storage.store(key=key, record=record, body=_body(), patch=retried)
        storage.store(key=key, record={**record, "success": True}, body=_body(), patch=succeeded)
        storage.purge(key=key, body=_body(), patch=succeeded)
        outcomes[cls] = (retried, succeeded)
    kopf_retried, kopf_succeeded = outcomes[kopf.AnnotationsProgressStorage]
    ours_retried, ours_succeeded = outcomes[ProgressAnnotationsStorage]
    if kopf_succeeded != {"metadata": {"annotations": {marker: "yes"}}}:
        return f"kopf's progress storage no longer ends a successful handling with the lone marker ({kopf_succeeded})"
    if marker not in ((kopf_retried.get("metadata") or {}).get("annotations") or {}):
        return "kopf's progress storage no longer writes its marker with a retry record"
    if ours_retried != kopf_retried or ours_succeeded != {}:
        return f"the subclass wrote {ours_retried} and {ours_succeeded}, not kopf's record and nothing"
    return None


def self_test_diffbase(finalizer: str = f"{_SELF_TEST_PREFIX}/finalizer") -> Optional[str]:
    """None when MemoryDiffBaseStorage reads kopf's annotation and keeps its own bases in memory; else what differs."""
    key = "last-handled-configuration"
    kopf_storage = kopf.AnnotationsDiffBaseStorage(prefix=_SELF_TEST_PREFIX, key=key)
    plain = _body(finalizer=finalizer)
    essence = kopf_storage.build(body=plain)
    if essence != {"spec": {"a": 1}}:
        return f"kopf's diff base of a plain object is {essence}, not its spec"
    written = kopf.Patch()
    kopf_storage.store(body=plain, patch=written, essence=essence)
    annotations = dict((written.get("metadata") or {}).get("annotations") or {})
    annotations.pop(f"{_SELF_TEST_PREFIX}/{MARKER_NAME}", None)
    earlier = _body(finalizer=finalizer, annotations=annotations)
    ours = MemoryDiffBaseStorage(prefix=_SELF_TEST_PREFIX, key=key, finalizer=finalizer)
    if kopf_storage.fetch(body=earlier) != essence or ours.fetch(body=earlier) != essence:
        return "kopf's last-handled-configuration annotation is no longer read back as the essence"
    if ours.build(body=earlier) != essence:
        return "kopf's diff base no longer leaves its own annotation out of the essence"
    raw: Any = {"apiVersion": "example.invalid/v1", "kind": "X", "spec": {"a": 1}, "status": {"b": 2},
                "other": {"c": [1, {"d": 2}]},
                "metadata": {"name": "s", "namespace": "ns", "uid": "self-test", "finalizers": [finalizer],
                             "labels": {"a": "b"}, "annotations": {**annotations, "note": "kept"},
                             "managedFields": [{"manager": "m", "fieldsV1": {"f:spec": {}}}]}}
    full = kopf.Body(raw)
    if ours.build(body=full) != kopf_storage.build(body=full):
        return "the essence built without the status and managedFields differs from kopf's"
    fresh = MemoryDiffBaseStorage(prefix=_SELF_TEST_PREFIX, key=key, finalizer=finalizer)
    if fresh.fetch(body=_body()) is not None or fresh.fetch(body=plain) is not None:
        return "a new object does not read as new"
    patch = kopf.Patch()
    fresh.store(body=plain, patch=patch, essence=essence)
    if patch or fresh.fetch(body=plain) != essence:
        return "the diff base is not kept in memory"
    if MemoryDiffBaseStorage(prefix=_SELF_TEST_PREFIX, key=key, finalizer=finalizer).fetch(body=plain) != essence:
        return "an object finalized by an earlier process does not read as unchanged"
    return None
