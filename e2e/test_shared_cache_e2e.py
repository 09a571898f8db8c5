"""cache.shared on the real API server, with the operator process: one ReadWriteMany claim, owned by the server,
mounted by every replica the real StatefulSet controller creates, and garbage-collected with the server."""

from __future__ import annotations

import pytest

from e2e.testbed.controlplane import wait_for
from e2e.testbed.operator_install import condition, get_server, kubectl_apply, load_example

pytestmark = [pytest.mark.apiserver]


def test_replicas_share_one_claim_that_goes_with_the_server(control_plane, operator, kube, namespace):
    doc = load_example("shared", namespace, replicas=2,
                       cache={"size": "100Gi", "shared": True, "storageClassName": "nfs"})
    kubectl_apply(control_plane, doc)
    claim = wait_for(lambda: kube.get("v1", "PersistentVolumeClaim", namespace, "shared-cache"), 60,
                     "the shared claim")
    server = get_server(control_plane, namespace, "shared")
    [owner] = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("VLLMServer", server["metadata"]["uid"], True)
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"] and claim["spec"]["storageClassName"] == "nfs"
    # The real StatefulSet controller creates both replicas, each mounting that one claim (and no claim of its own).
    pods = wait_for(lambda: (lambda p: p if len(p) == 2 else None)(
        kube.list("v1", "Pod", namespace, label_selector="app.kubernetes.io/instance=shared")), 60, "two pods")
    for pod in pods:
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["cache"]["persistentVolumeClaim"] == {"claimName": "shared-cache"}, pod["metadata"]["name"]
    assert [c["metadata"]["name"] for c in kube.list("v1", "PersistentVolumeClaim", namespace)] == ["shared-cache"]
    assert condition(server, "SpecValid")["status"] == "True"

    control_plane.kubectl("delete", "vllms", "shared", "-n", namespace, "--wait=true")
    # The garbage collector deletes what the server owned; the claim goes once no pod uses it (pvc-protection).
    wait_for(lambda: not kube.list("v1", "PersistentVolumeClaim", namespace), 120, "the claim gone with the server")
