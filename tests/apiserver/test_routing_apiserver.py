"""spec.routing against a real kube-apiserver with the Gateway API Inference Extension's CRDs (v1.2.0) and the
Gateway API's standard CRDs (the version the extension requires), both from their Go modules (tools/epp-build.sh):
the reconciler applies each server's pool, picker, namespaced RBAC and route, the API server validates them with
the CRDs' own schemas and rules, and servers of two models share one Gateway, hostname and path by model name.
No gateway serves these routes here (docs/routing.md says why); the objects are what a gateway would read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from e2e.testbed import epp
from vllm_operator import builders
from vllm_operator.conditions import condition
from vllm_operator.controller.reconcile import Reconciler
from vllm_operator.kube.client import Kube

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[2]
GROUP_PATH = "/apis/vllm-operator.io/v1alpha1"
ROUTE = {"enabled": True, "gatewayName": "inference-gateway", "hostnames": ["llm.example.com"]}


@pytest.fixture(scope="module")
def routing_crds(control_plane, crd_installed):
    epp.install_crds(control_plane)
    epp.install_gateway_crds(control_plane)
    return True


def server(cp, namespace: str, name: str, served: str, routing: dict) -> None:
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": namespace}
    doc["spec"]["model"]["servedName"] = served
    doc["spec"]["routing"] = routing
    cp.kubectl("apply", "-f", "-", input=json.dumps(doc))


def test_two_models_share_one_route_by_model_name_and_a_third_server_joins_a_pool(
        control_plane, kube: Kube, routing_crds, namespace):
    gateway = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
               "metadata": {"name": "inference-gateway", "namespace": namespace},
               "spec": {"gatewayClassName": "example",
                        "listeners": [{"name": "http", "protocol": "HTTP", "port": 80}]}}
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(gateway))
    server(control_plane, namespace, "llama", "llama", {"inferencePool": {"enabled": True}, "httpRoute": ROUTE})
    server(control_plane, namespace, "qwen", "qwen", {"inferencePool": {"enabled": True}, "httpRoute": ROUTE})
    server(control_plane, namespace, "llama-b", "llama", {"inferencePool": {"enabled": True, "poolName": "llama"}})
    reconciler = Reconciler(kube)
    for name in ("llama", "qwen", "llama-b"):
        for _ in range(2):
            reconciler.reconcile(namespace, name)
    statuses = {n: kube.request("GET", f"{GROUP_PATH}/namespaces/{namespace}/vllmservers/{n}")["status"]
                for n in ("llama", "qwen", "llama-b")}
    for name, status in statuses.items():
        assert condition(status, "Degraded")["status"] == "False", (name, status["conditions"])
    assert condition(statuses["llama"], "Routing")["reason"] == "PoolApplied"
    assert condition(statuses["llama-b"], "Routing")["reason"] == "JoinedPool"

    routes = {r["metadata"]["name"]: r for r in kube.list("gateway.networking.k8s.io/v1", "HTTPRoute", namespace)}
    assert sorted(routes) == ["llama", "qwen"], "the joining server makes no route of its own"
    matches = {n: r["spec"]["rules"][0]["matches"][0] for n, r in routes.items()}
    assert {n: m["headers"][0]["value"] for n, m in matches.items()} == {"llama": "llama", "qwen": "qwen"}
    assert {json.dumps(m["path"]) for m in matches.values()} == {json.dumps({"type": "PathPrefix", "value": "/"})}
    assert {r["spec"]["hostnames"][0] for r in routes.values()} == {"llm.example.com"}
    assert {r["spec"]["rules"][0]["backendRefs"][0]["name"] for r in routes.values()} == {"llama", "qwen"}

    pools = {p["metadata"]["name"]: p for p in kube.list("inference.networking.k8s.io/v1", "InferencePool",
                                                         namespace)}
    assert sorted(pools) == ["llama", "qwen"], "one pool per owner: the joining server makes none"
    llama_b = kube.get("apps/v1", "StatefulSet", namespace, "llama-b")
    assert llama_b["spec"]["template"]["metadata"]["labels"][builders.POOL_LABEL] == "llama"
    assert pools["llama"]["spec"]["selector"]["matchLabels"] == {builders.POOL_LABEL: "llama"}
    role = kube.get("rbac.authorization.k8s.io/v1", "Role", namespace, "llama-epp")
    assert role is not None and kube.get("apps/v1", "Deployment", namespace, "llama-b-epp") is None

    # switched off: the pool, the picker, its RBAC and the route are pruned
    control_plane.kubectl("patch", "vllmserver", "qwen", "-n", namespace, "--type=merge", "-p",
                          json.dumps({"spec": {"routing": {"inferencePool": {"enabled": False},
                                                           "httpRoute": {"enabled": False}}}}))
    reconciler.reconcile(namespace, "qwen")
    assert kube.get("inference.networking.k8s.io/v1", "InferencePool", namespace, "qwen") is None
    assert kube.get("gateway.networking.k8s.io/v1", "HTTPRoute", namespace, "qwen") is None
    assert kube.get("apps/v1", "Deployment", namespace, "qwen-epp") is None
    assert kube.get("rbac.authorization.k8s.io/v1", "Role", namespace, "qwen-epp") is None
