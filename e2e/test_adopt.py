"""Safe in a shared cluster, against a real kube-apiserver: the operator never adopts an object it did not
create, and an apply the API server refuses becomes a condition instead of a silent retry loop.

One operator process for the module (resync every 3 s), a fresh namespace per test, polling with deadlines.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from e2e.testbed.controlplane import wait_for
from e2e.testbed.convergence import get_server
from e2e.testbed.operator_install import condition as cond
from e2e.testbed.operator_install import events_for
from e2e.testbed.operator_install import kubectl_apply as apply_server
from e2e.testbed.operator_install import load_example as example
from e2e.testbed.operator_install import wait_status
from vllm_operator import builders
from vllm_operator.kube.client import Kube

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[1]

#: Reconciles to sit through before checking that something did *not* happen (the resync is 3 s).
QUIET_SECONDS = 8


def create(kube: Kube, obj: dict) -> dict:
    """An object made by "someone else" (Helm here): a plain create, not our field manager."""
    meta = obj["metadata"]
    plural = {"Service": "services", "StatefulSet": "statefulsets"}[obj["kind"]]
    base = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
    return kube.request("POST", f"{base}/namespaces/{meta['namespace']}/{plural}", body=obj)


def helm_service(namespace: str, name: str, labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": labels or {"app.kubernetes.io/managed-by": "Helm", "app": "helm-web"}},
            "spec": {"selector": {"app": "helm-web"}, "ports": [{"name": "web", "port": 80, "targetPort": 8080}]}}


def helm_statefulset(namespace: str, name: str) -> dict:
    labels = {"app": "helm-web"}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "Helm", **labels}},
            "spec": {"replicas": 0, "serviceName": name, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}}}


def snapshot(kube: Kube, namespace: str, kinds: list[tuple[str, str, str]]) -> dict:
    return {(kind, name): kube.get(api_version, kind, namespace, name) for api_version, kind, name in kinds}


def test_never_adopts_a_foreign_service_or_statefulset_and_renaming_resolves(
        control_plane, operator, kube, namespace):
    create(kube, helm_service(namespace, "web"))
    create(kube, helm_statefulset(namespace, "web"))
    # The StatefulSet controller writes its status once; after that nobody but us could change these objects.
    wait_for(lambda: (kube.get("apps/v1", "StatefulSet", namespace, "web").get("status") or {})
             .get("observedGeneration") == 1, 30, "the StatefulSet controller's status")
    foreign = [("v1", "Service", "web"), ("apps/v1", "StatefulSet", "web")]
    before = snapshot(kube, namespace, foreign)

    apply_server(control_plane, example("web", namespace))
    server = wait_status(kube, namespace, "web", lambda s: cond(s, "Degraded").get("reason") == "NameConflict",
                         "Degraded=True/NameConflict")
    degraded = cond(server, "Degraded")
    assert degraded["status"] == "True"
    assert "Service web" in degraded["message"] and "StatefulSet web" in degraded["message"]
    assert "rename" in degraded["message"]
    assert cond(server, "Ready")["status"] == "False" and cond(server, "Ready")["reason"] == "NameConflict"
    assert cond(server, "SpecValid")["status"] == "True", "the spec itself is fine"
    wait_for(lambda: [e for e in events_for(kube, namespace, "web")
                      if e["reason"] == "NameConflict" and e["type"] == "Warning"], 30, "a NameConflict Warning")

    time.sleep(QUIET_SECONDS)  # several resyncs: none of them may touch the foreign objects
    assert snapshot(kube, namespace, foreign) == before, "the foreign objects are byte-for-byte unchanged"
    # All or nothing: none of the server's other children was made either (no half-deployed server).
    assert kube.get("v1", "Service", namespace, "web-headless") is None
    assert kube.get("policy/v1", "PodDisruptionBudget", namespace, "web") is None
    warnings = [e for e in events_for(kube, namespace, "web") if e["reason"] == "NameConflict"]
    assert len(warnings) == 1 and warnings[0].get("count", 1) == 1, "one Warning per transition, not per resync"

    control_plane.kubectl("delete", "vllms", "web", "-n", namespace, "--wait=true", "--timeout=60s")
    time.sleep(QUIET_SECONDS)  # the garbage collector had time to act on an owner reference, had we set one
    assert snapshot(kube, namespace, foreign) == before, "deleting the VLLMServer leaves the foreign objects"

    apply_server(control_plane, example("web-llm", namespace))  # renamed: no conflict
    server = wait_status(kube, namespace, "web-llm", lambda s: cond(s, "SpecValid").get("status") == "True"
                         and s["status"].get("observedGeneration") == s["metadata"]["generation"]
                         and cond(s, "Degraded").get("reason") != "NameConflict", "the renamed server applied")
    for api_version, kind, name in (("v1", "Service", "web-llm"), ("apps/v1", "StatefulSet", "web-llm")):
        live = wait_for(lambda: kube.get(api_version, kind, namespace, name), 30, f"{kind}/{name}")
        assert live["metadata"]["ownerReferences"][0]["uid"] == server["metadata"]["uid"]
    assert snapshot(kube, namespace, foreign) == before


def test_prune_and_deletion_touch_only_objects_controlled_by_the_server(control_plane, operator, kube, namespace):
    # A copy that carries our labels (as a kubectl get -o yaml | kubectl apply would) but no owner reference:
    # the watch cache sees it under the server, the reconciler must not take it for its own.
    lookalike = helm_service(namespace, "per-node-headless", labels={
        **builders.labels("per-node"), "app.kubernetes.io/managed-by": builders.MANAGED_BY,
        builders.SERVER_LABEL: "per-node"})
    doc = example("per-node", namespace)
    doc["spec"]["workload"] = "DaemonSet"  # wants no headless Service: the lookalike is a prune candidate
    doc["spec"].pop("cache")
    apply_server(control_plane, doc)
    wait_for(lambda: kube.get("apps/v1", "DaemonSet", namespace, "per-node"), 30, "DaemonSet")
    create(kube, lookalike)
    before = kube.get("v1", "Service", namespace, "per-node-headless")
    doc["spec"]["model"]["servedName"] = "renamed"  # a spec change: a reconcile that applies and prunes
    apply_server(control_plane, doc)
    wait_for(lambda: "renamed" in kube.get("apps/v1", "DaemonSet", namespace, "per-node")["spec"]["template"]
             ["spec"]["containers"][0]["args"], 30, "the change applied")
    time.sleep(QUIET_SECONDS)
    assert kube.get("v1", "Service", namespace, "per-node-headless") == before, "not pruned, not patched"
    control_plane.kubectl("delete", "vllms", "per-node", "-n", namespace, "--wait=true", "--timeout=60s")
    wait_for(lambda: kube.get("apps/v1", "DaemonSet", namespace, "per-node") is None, 60, "DaemonSet collected")
    assert kube.get("v1", "Service", namespace, "per-node-headless") == before, "not collected"


def test_an_apply_the_api_server_refuses_is_a_condition_and_a_fixed_spec_recovers(
        control_plane, operator, kube, namespace):
    # Affinity is passed through as written; this one the API server refuses (In needs values), ours does not.
    doc = example("rej", namespace)
    doc["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": []}]}]}}}
    apply_server(control_plane, doc)
    server = wait_status(kube, namespace, "rej", lambda s: cond(s, "Degraded").get("reason") == "ApiRejected",
                         "Degraded=True/ApiRejected")
    degraded = cond(server, "Degraded")
    assert degraded["status"] == "True" and degraded["observedGeneration"] == server["metadata"]["generation"]
    assert "StatefulSet rej" in degraded["message"] and "422" in degraded["message"]
    # the API server's own words about the tenant's object
    assert "matchExpressions[0].values" in degraded["message"] and "Required value" in degraded["message"]
    assert len(degraded["message"]) <= 1024
    assert cond(server, "SpecValid")["status"] == "True"
    wait_for(lambda: [e for e in events_for(kube, namespace, "rej")
                      if e["reason"] == "ApiRejected" and e["type"] == "Warning"], 30, "an ApiRejected Warning")
    assert kube.get("apps/v1", "StatefulSet", namespace, "rej") is None

    doc["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"][0]["values"] = ["a"]
    started = time.monotonic()
    apply_server(control_plane, doc)
    wait_for(lambda: kube.get("apps/v1", "StatefulSet", namespace, "rej"), 30, "StatefulSet after the fix")
    assert time.monotonic() - started < 30, "a spec change retries at once, not after the slow back-off"
    server = wait_status(kube, namespace, "rej", lambda s: cond(s, "Degraded").get("reason") != "ApiRejected",
                         "ApiRejected cleared")
    assert server["status"]["observedGeneration"] == server["metadata"]["generation"]
    assert "ApiRejected" not in json.dumps(get_server(kube, namespace, "rej")["status"])


@pytest.mark.parametrize("change", ["size", "removed"])
def test_a_cache_change_recreates_the_statefulset_keeping_its_pods(control_plane, operator, kube, namespace, change):
    """spec.cache becomes the StatefulSet's volumeClaimTemplates, which the API server keeps immutable (Kubernetes
    1.37 says "field is immutable"; older releases "Forbidden: updates to statefulset spec"): the operator deletes
    its own StatefulSet with the pods orphaned and creates it anew, instead of holding the change back as a
    refused apply (the crash tests lost such a change)."""
    name = f"cache-{change}"
    doc = example(name, namespace)
    assert doc["spec"].get("cache", {}).get("size"), "the example claims a cache per replica"
    apply_server(control_plane, doc)
    first = wait_for(lambda: kube.get("apps/v1", "StatefulSet", namespace, name), 30, "StatefulSet")
    assert first["spec"].get("volumeClaimTemplates")
    if change == "size":
        doc["spec"]["cache"]["size"] = "77Gi"
    else:
        doc["spec"].pop("cache")

    def renewed():
        sts = kube.get("apps/v1", "StatefulSet", namespace, name)
        if sts is None or sts["metadata"]["uid"] == first["metadata"]["uid"]:
            return None
        return sts

    apply_server(control_plane, doc)
    sts = wait_for(renewed, 60, "the StatefulSet created anew")
    claims = sts["spec"].get("volumeClaimTemplates") or []
    if change == "size":
        assert claims[0]["spec"]["resources"]["requests"]["storage"] == "77Gi"
    else:
        assert not claims
    server = wait_status(kube, namespace, name, lambda s: s.get("status", {}).get("observedGeneration")
                         == s["metadata"]["generation"] and cond(s, "Degraded").get("reason") != "ApiRejected",
                         "converged without ApiRejected")
    assert cond(server, "SpecValid")["status"] == "True"
    wait_for(lambda: [e for e in events_for(kube, namespace, name) if e["reason"] == "Recreating"], 30,
             "a Recreating event")
