"""kopf's bookkeeping (persistence.py): the diff base in memory, no lone marker annotation."""

from __future__ import annotations

import json

import kopf

from vllm_operator.kopfext.persistence import MemoryDiffBaseStorage, ProgressAnnotationsStorage

PREFIX = "vllm-operator.io"
FINALIZER = f"{PREFIX}/finalizer"
ANNOTATION = f"{PREFIX}/last-handled-configuration"


def storage() -> MemoryDiffBaseStorage:
    return MemoryDiffBaseStorage(prefix=PREFIX, key="last-handled-configuration", finalizer=FINALIZER)


def server(spec: dict, *, finalizer: bool = True, annotations: dict | None = None, **meta) -> kopf.Body:
    metadata = {"name": "s", "namespace": "ns", "uid": "u1", **meta}
    if finalizer:
        metadata["finalizers"] = [FINALIZER]
    if annotations:
        metadata["annotations"] = annotations
    return kopf.Body({"apiVersion": "vllm-operator.io/v1alpha1", "kind": "VLLMServer", "metadata": metadata,
                      "spec": spec, "status": {"observedGeneration": 1}})


def test_a_new_server_is_created_once_then_only_changes_count():
    s = storage()
    assert s.fetch(body=server({"model": "a"}, finalizer=False)) is None  # kopf adds the finalizer first
    body = server({"model": "a"})
    assert s.fetch(body=body) is None  # then creates it
    patch = kopf.Patch()
    s.store(body=body, patch=patch, essence=s.build(body=body))
    assert not patch  # no write: the diff base stays in memory
    assert s.fetch(body=body) == s.build(body=body)  # a status write is no change
    changed = server({"model": "b"})
    assert s.fetch(body=changed) != s.build(body=changed)  # an update


def test_after_a_restart_a_finalized_server_is_resumed_and_later_changes_are_seen():
    s = storage()  # a new process
    body = server({"model": "a"})
    assert s.fetch(body=body) == s.build(body=body)  # no difference: kopf resumes it
    changed = server({"model": "b"})
    assert s.fetch(body=changed) == s.build(body=body)  # the base is the first sighting, not the latest


def test_an_earlier_versions_annotation_is_read_then_removed_with_the_next_change():
    s = storage()
    old_essence = {"spec": {"model": "a"}}
    body = server({"model": "b"}, annotations={ANNOTATION: json.dumps(old_essence) + "\n"})
    assert s.fetch(body=body) == old_essence  # an update, as before
    assert ANNOTATION not in s.build(body=body).get("metadata", {}).get("annotations", {})
    patch = kopf.Patch()
    s.store(body=body, patch=patch, essence=s.build(body=body))
    assert patch == {"metadata": {"annotations": {ANNOTATION: None}}}
    assert s.fetch(body=body) == s.build(body=body)


def test_a_deleted_server_is_forgotten():
    s = storage()
    body = server({"model": "a"})
    s.store(body=body, patch=kopf.Patch(), essence=s.build(body=body))
    assert len(s) == 1
    s.fetch(body=server({"model": "a"}, deletionTimestamp="2026-01-01T00:00:00Z"))
    assert len(s) == 0


def test_the_marker_is_written_with_a_retry_record_only():
    progress = ProgressAnnotationsStorage(prefix=PREFIX)
    body = server({"model": "a"})
    record = {"started": "2026-01-01T00:00:00", "retries": 1}
    retried = kopf.Patch()
    progress.store(key="on_change", record=record, body=body, patch=retried)
    assert f"{PREFIX}/kopf-managed" in retried["metadata"]["annotations"]  # kept: the record stays

    succeeded = kopf.Patch()
    progress.store(key="on_change", record={**record, "success": True}, body=body, patch=succeeded)
    progress.purge(key="on_change", body=body, patch=succeeded)
    assert succeeded == {}  # nothing to write once the handler succeeded at once

    other = kopf.Patch({"metadata": {"labels": {"x": "y"}}})
    progress.store(key="on_change", record=record, body=body, patch=other)
    progress.purge(key="on_change", body=body, patch=other)
    assert other == {"metadata": {"labels": {"x": "y"}}}
