"""The cache claims' retention (docs/storage.md) with the real StatefulSet controller and garbage collector of the
test bed's kube-controller-manager: the reconciler runs in-process and applies the server's StatefulSet; the
controller creates the per-replica claim; deleting the server deletes it (whenDeleted: Delete, the default) or
keeps it (Retain). No pod runs (no scheduler): the claims are created before the pods are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from e2e.testbed.controlplane import wait_for
from vllm_operator.controller.reconcile import Reconciler

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[2]


def _claims(control_plane, namespace: str) -> dict[str, dict]:
    out = control_plane.kubectl("get", "pvc", "-n", namespace, "-l", "app.kubernetes.io/instance=srv", "-o", "json")
    return {c["metadata"]["name"]: c for c in json.loads(out.stdout)["items"]}


@pytest.mark.parametrize("when_deleted", ["Delete", "Retain"])
def test_deleting_a_server_deletes_or_keeps_its_cache_claims(control_plane, crd_installed, namespace, kube,
                                                             when_deleted):
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["metadata"] = {"name": "srv", "namespace": namespace}
    doc["spec"]["cache"] = {"size": "1Gi"}
    if when_deleted == "Retain":
        doc["spec"]["cache"]["persistentVolumeClaimRetentionPolicy"] = {"whenDeleted": "Retain"}
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(doc))
    Reconciler(kube).reconcile(namespace, "srv")
    sts = json.loads(control_plane.kubectl("get", "statefulset", "srv", "-n", namespace, "-o", "json").stdout)
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": when_deleted,
                                                                   "whenScaled": "Retain"}
    claims = wait_for(lambda: _claims(control_plane, namespace), 120, "the StatefulSet controller's claim")
    assert list(claims) == ["cache-srv-0"]

    control_plane.kubectl("delete", "vllms", "srv", "-n", namespace, "--wait=true")
    wait_for(lambda: control_plane.kubectl("get", "statefulset", "srv", "-n", namespace, check=False).returncode,
             120, "garbage collection of the StatefulSet")
    if when_deleted == "Delete":
        # the claim is owned by the StatefulSet: the garbage collector deletes it (a finalizer protects a claim
        # in use; none is here)
        wait_for(lambda: not _claims(control_plane, namespace)
                 or all(c["metadata"].get("deletionTimestamp") for c in _claims(control_plane, namespace).values()),
                 120, "the claim deleted with the server")
    else:
        claim = _claims(control_plane, namespace)["cache-srv-0"]
        assert not claim["metadata"].get("deletionTimestamp")
        assert not any(r["kind"] == "StatefulSet" for r in claim["metadata"].get("ownerReferences", []))
        # docs/storage.md: a server created again with the same name and size mounts them again (the StatefulSet
        # controller's pod srv-0 names the kept claim; no new claim is made)
        control_plane.kubectl("apply", "-f", "-", input=json.dumps(doc))
        Reconciler(kube).reconcile(namespace, "srv")
        sts = json.loads(control_plane.kubectl("get", "statefulset", "srv", "-n", namespace, "-o", "json").stdout)

        def new_pod():
            p = control_plane.kubectl("get", "pod", "srv-0", "-n", namespace, "-o", "json", check=False)
            pod = json.loads(p.stdout) if p.returncode == 0 else {}
            owners = (pod.get("metadata") or {}).get("ownerReferences") or []
            return pod if any(o["uid"] == sts["metadata"]["uid"] for o in owners) else None
        pod = wait_for(new_pod, 120, "the new StatefulSet's pod srv-0")
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["cache"]["persistentVolumeClaim"]["claimName"] == "cache-srv-0"
        again = _claims(control_plane, namespace)
        assert list(again) == ["cache-srv-0"] and again["cache-srv-0"]["metadata"]["uid"] == claim["metadata"]["uid"]


@pytest.mark.parametrize("when_scaled", ["Retain", "Delete"])
def test_a_scale_down_keeps_or_deletes_the_removed_replicas_claim(control_plane, crd_installed, namespace, kube,
                                                                  when_scaled):
    """docs/storage.md: by default (whenScaled: Retain) a replica removed by a scale-down keeps its claim;
    `whenScaled: Delete` deletes it. The pods are never scheduled here (no scheduler), so the StatefulSet controller
    removes srv-1 at once."""
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["metadata"] = {"name": "srv", "namespace": namespace}
    doc["spec"]["replicas"] = 2
    doc["spec"]["cache"] = {"size": "1Gi"}
    if when_scaled == "Delete":
        doc["spec"]["cache"]["persistentVolumeClaimRetentionPolicy"] = {"whenScaled": "Delete"}
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(doc))
    Reconciler(kube).reconcile(namespace, "srv")
    wait_for(lambda: sorted(_claims(control_plane, namespace)) == ["cache-srv-0", "cache-srv-1"], 120,
             "a claim per replica")

    doc["spec"]["replicas"] = 1
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(doc))
    Reconciler(kube).reconcile(namespace, "srv")
    wait_for(lambda: control_plane.kubectl("get", "pod", "srv-1", "-n", namespace, check=False).returncode != 0,
             120, "the scale-down's pod srv-1 removed")
    if when_scaled == "Delete":
        wait_for(lambda: all(c["metadata"].get("deletionTimestamp") or name != "cache-srv-1"
                             for name, c in _claims(control_plane, namespace).items()), 120,
                 "the removed replica's claim deleted")
        assert "cache-srv-0" in _claims(control_plane, namespace)
    else:
        claims = _claims(control_plane, namespace)
        assert sorted(claims) == ["cache-srv-0", "cache-srv-1"]
        assert not claims["cache-srv-1"]["metadata"].get("deletionTimestamp")


@pytest.mark.parametrize("change", ["size", "shared"])
def test_a_cache_change_recreates_the_statefulset_and_what_becomes_of_the_claims(control_plane, crd_installed,
                                                                                namespace, kube, change):
    """docs/storage.md "Changing spec.cache": the claim templates cannot change in place, so the operator deletes its
    StatefulSet (pods orphaned) and creates it anew. A new size: the existing claims, named as before, are mounted
    again as they are (the StatefulSet controller never resizes a claim). Switching to one shared claim: the
    per-replica claims are left, owned by nothing, for you to delete."""
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["metadata"] = {"name": "srv", "namespace": namespace}
    doc["spec"]["cache"] = {"size": "1Gi"}
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(doc))
    Reconciler(kube).reconcile(namespace, "srv")
    first = json.loads(control_plane.kubectl("get", "statefulset", "srv", "-n", namespace, "-o", "json").stdout)
    claim = wait_for(lambda: _claims(control_plane, namespace).get("cache-srv-0"), 120, "the per-replica claim")

    doc["spec"]["cache"] = {"size": "2Gi"} if change == "size" else {"size": "2Gi", "shared": True}
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(doc))

    def renewed():
        try:
            Reconciler(kube).reconcile(namespace, "srv")
        except Exception:  # noqa: BLE001 - the reconcile that deletes the StatefulSet raises to be retried
            return None
        p = control_plane.kubectl("get", "statefulset", "srv", "-n", namespace, "-o", "json", check=False)
        sts = json.loads(p.stdout) if p.returncode == 0 else None
        return sts if sts and sts["metadata"]["uid"] != first["metadata"]["uid"] else None
    sts = wait_for(renewed, 120, "the StatefulSet created anew", interval=1)
    kept = _claims(control_plane, namespace)["cache-srv-0"]
    assert kept["metadata"]["uid"] == claim["metadata"]["uid"]
    assert kept["spec"]["resources"]["requests"]["storage"] == "1Gi", "a claim is never resized by the template"
    owners = [o["uid"] for o in kept["metadata"].get("ownerReferences") or []]
    if change == "size":  # mounted again: the new StatefulSet owns it (whenDeleted: Delete)
        wait_for(lambda: [o["uid"] for o in _claims(control_plane, namespace)["cache-srv-0"]["metadata"].get(
            "ownerReferences") or []] == [sts["metadata"]["uid"]], 60, "the kept claim owned by the new StatefulSet")
        assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "2Gi"
    else:  # left behind, owned by nothing; the shared claim is the server's
        assert owners == [] and not sts["spec"].get("volumeClaimTemplates")
        shared = _claims(control_plane, namespace)["srv-cache"]
        assert [o["kind"] for o in shared["metadata"]["ownerReferences"]] == ["VLLMServer"]
