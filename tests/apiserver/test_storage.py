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
