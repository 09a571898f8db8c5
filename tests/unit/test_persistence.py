"""kopf's bookkeeping (persistence.py): the diff base in memory, no lone marker annotation."""

from __future__ import annotations

import json

import kopf

from vllm_operator.kopfext import persistence
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


# --------------------------------------------------------------------------- the self-tests run at start-up
def test_the_self_tests_pass_on_the_installed_kopf():
    assert persistence.self_test_progress() is None
    assert persistence.self_test_diffbase(FINALIZER) is None


def test_a_kopf_that_no_longer_writes_the_lone_marker_fails_the_progress_self_test(monkeypatch):
    """Our subclass would be unneeded: kopf's own storage is used (and the warning says why)."""
    purge = kopf.AnnotationsProgressStorage.purge

    def purge_without_lone_marker(self, *, key, body, patch):
        purge(self, key=key, body=body, patch=patch)
        annotations = patch.get("metadata", {}).get("annotations", {})
        if list(annotations) == [f"{self.prefix}/kopf-managed"]:
            del patch["metadata"]

    monkeypatch.setattr(kopf.AnnotationsProgressStorage, "purge", purge_without_lone_marker)
    assert "lone marker" in persistence.self_test_progress()


def test_a_kopf_whose_marker_is_renamed_fails_the_progress_self_test(monkeypatch):
    store_marker = kopf.AnnotationsProgressStorage._store_marker

    def renamed(self, prefix, patch, body):
        store_marker(self, prefix, patch, body)
        annotations = patch.get("metadata", {}).get("annotations", {})
        if f"{prefix}/kopf-managed" in annotations:
            annotations[f"{prefix}/kopf-operator"] = annotations.pop(f"{prefix}/kopf-managed")

    monkeypatch.setattr(kopf.AnnotationsProgressStorage, "_store_marker", renamed)
    assert persistence.self_test_progress() is not None


def test_a_kopf_whose_diff_base_keeps_more_than_the_spec_fails_the_diffbase_self_test(monkeypatch):
    build = kopf.AnnotationsDiffBaseStorage.build

    def with_status(self, *, body, extra_fields=None):
        return {**build(self, body=body, extra_fields=extra_fields), "status": dict(body.get("status") or {})}

    monkeypatch.setattr(kopf.AnnotationsDiffBaseStorage, "build", with_status)
    assert "not its spec" in persistence.self_test_diffbase(FINALIZER)


def test_a_kopf_that_no_longer_reads_its_annotation_back_fails_the_diffbase_self_test(monkeypatch):
    """An earlier version's annotation would be ignored: every server would read as new after an upgrade."""
    monkeypatch.setattr(kopf.AnnotationsDiffBaseStorage, "fetch", lambda self, *, body: None)
    assert "read back" in persistence.self_test_diffbase(FINALIZER)


def test_the_essence_is_kopfs_without_copying_the_status_and_managed_fields():
    """The diff base is built from the body without its status and managedFields (kopf deep-copies them only
    to drop them): the same essence as kopf's own build, for a server as the API server sends it."""
    example = json.loads(json.dumps(dict(server({"model": "a", "gpu": {"count": 2}}, annotations={
        "note": "kept", "kubectl.kubernetes.io/last-applied-configuration": "{}"}, labels={"team": "x"}))))
    example["status"] = {"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "False"}],
                         "plan": {"args": ["--x"]}}
    example["metadata"]["managedFields"] = [{"manager": "kubectl", "operation": "Apply",
                                             "fieldsV1": {"f:spec": {"f:model": {}}}}]
    body = kopf.Body(example)
    kopfs = kopf.AnnotationsDiffBaseStorage(prefix=PREFIX, key="last-handled-configuration").build(body=body)
    assert storage().build(body=body) == kopfs
    assert kopfs["metadata"]["labels"] == {"team": "x"} and "status" not in kopfs
    # a handler on a status field (extra fields): kopf's own build, status kept where asked
    assert storage().build(body=body, extra_fields=[("status", "observedGeneration")]) == kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration").build(body=body, extra_fields=[("status", "observedGeneration")])


def test_a_lighter_build_that_loses_part_of_the_essence_fails_the_diffbase_self_test(monkeypatch):
    monkeypatch.setattr(persistence, "_without_status",
                        lambda body: kopf.Body({k: v for k, v in body.items() if k not in ("status", "other")}))
    assert "differs from kopf's" in persistence.self_test_diffbase()
