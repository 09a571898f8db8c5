"""The objects around the workload: the client Service, the headless Service, the shared cache claim and the
PodDisruptionBudget."""

from __future__ import annotations

from typing import Any, Optional

from .. import api
from ..planner import Plan
from .names import (
    PORT, PORT_NAME, ROLE_LABEL, headless_service_name, metadata, selector_labels, shared_cache_claim_name,
)
from .workloads import is_group


# --------------------------------------------------------------------------- services, PDB
def build_service(plan: Plan, owner: Optional[dict] = None) -> dict[str, Any]:
    """The client Service: the OpenAI-compatible API on port 8000, named http.

    A DaemonSet's gets internalTrafficPolicy: Local: a client pod reaches the server on its own node, never
    another node's. A client on a node without a server pod gets no endpoint at all (kube-proxy drops the
    connection)."""
    selector = selector_labels(plan.name)
    if is_group(plan.spec):  # only a group's leader serves the API
        selector[ROLE_LABEL] = "leader"
    spec: dict[str, Any] = {
        "type": "ClusterIP",
        "selector": selector,
        "ports": [{"name": PORT_NAME, "port": PORT, "targetPort": PORT_NAME, "protocol": "TCP"}],
    }
    if plan.spec.workload == "DaemonSet":
        spec["internalTrafficPolicy"] = "Local"
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata(plan, plan.name, owner), "spec": spec}


def build_headless_service(plan: Plan, owner: Optional[dict] = None) -> dict[str, Any]:
    """Stable DNS names per StatefulSet pod (the StatefulSet's serviceName)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(plan, headless_service_name(plan.name), owner),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(plan.name),
            "ports": [{"name": PORT_NAME, "port": PORT, "targetPort": PORT_NAME, "protocol": "TCP"}],
        },
    }


def wants_pdb(spec: api.VLLMServerSpec) -> bool:
    if spec.workload != "StatefulSet":
        return False
    if spec.autoscaling.enabled:
        return (spec.autoscaling.max_replicas or 1) > 1
    return spec.replicas > 1


def build_shared_cache_claim(plan: Plan, owner: Optional[dict] = None) -> dict[str, Any]:
    """cache.shared: one ReadWriteMany claim every replica mounts, so the model is downloaded once. Only its size
    may change later (Kubernetes expands a claim when its storage class allows; it never shrinks one)."""
    cache = plan.spec.cache
    assert cache is not None and cache.size and cache.shared
    spec: dict[str, Any] = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": cache.size}}}
    if cache.storage_class_name:
        spec["storageClassName"] = cache.storage_class_name
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": metadata(plan, shared_cache_claim_name(plan.name), owner, component="cache"), "spec": spec}


def build_pdb(plan: Plan, owner: Optional[dict] = None) -> dict[str, Any]:
    """At most one replica down at a time through voluntary disruptions (drains, upgrades). For groups it covers
    every pod of every group: one evicted pod takes its whole group down (the group is recreated), so at most
    one pod at a time means at most one group at a time."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(plan, plan.name, owner),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(plan.name)}},
    }
