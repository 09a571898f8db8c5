"""The workload that runs the pods: a StatefulSet, a DaemonSet, or for a server across nodes a LeaderWorkerSet
of a leader and its workers."""

from __future__ import annotations

import copy
from typing import Any, Optional

from .. import api
from ..planner import Plan
from ..planner.plan_types import COORDINATION_PORT
from .names import (
    COORDINATION_PORT_NAME, LWS_API_VERSION, LWS_KIND, ROLE_LABEL, headless_service_name, metadata, selector_labels,
)
from .pod import pod_template


# --------------------------------------------------------------------------- workloads
def owns_replicas(spec: api.VLLMServerSpec) -> bool:
    """Whether the StatefulSet's replicas come from spec.replicas (else an autoscaler owns them)."""
    return not spec.autoscaling.enabled


def build_statefulset(plan: Plan, owner: Optional[dict] = None,
                      template: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """`template`: the pod template, already built (pod_template's)."""
    spec = plan.spec
    sts_spec: dict[str, Any] = {
        "serviceName": headless_service_name(plan.name),
        # Parallel: scale-up starts every new replica at once instead of one model load at a time.
        "podManagementPolicy": "Parallel",
        "selector": {"matchLabels": selector_labels(plan.name)},
        "updateStrategy": {"type": "RollingUpdate"},
        "template": template if template is not None else pod_template(plan),
    }
    if owns_replicas(spec):
        sts_spec["replicas"] = spec.replicas
    if spec.cache is not None and spec.cache.size and not spec.cache.shared:
        claim: dict[str, Any] = {
            "metadata": {"name": "cache"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": spec.cache.size}}},
        }
        if spec.cache.storage_class_name:
            claim["spec"]["storageClassName"] = spec.cache.storage_class_name
        sts_spec["volumeClaimTemplates"] = [claim]
        retention = spec.cache.persistent_volume_claim_retention_policy
        sts_spec["persistentVolumeClaimRetentionPolicy"] = {"whenDeleted": retention.when_deleted,
                                                            "whenScaled": retention.when_scaled}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": metadata(plan, plan.name, owner),
            "spec": sts_spec}


def build_daemonset(plan: Plan, owner: Optional[dict] = None,
                    template: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": metadata(plan, plan.name, owner),
        "spec": {
            "selector": {"matchLabels": selector_labels(plan.name)},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": template if template is not None else pod_template(plan),
        },
    }


def is_group(spec: api.VLLMServerSpec) -> bool:
    """The server spans nodes: a LeaderWorkerSet of groups instead of a StatefulSet of pods."""
    return spec.nodes > 1


def leader_template(plan: Plan, pod: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """A group's leader: the single-node pod (probes, Services, drain) with the coordination port. `pod`: the pod
    template, already built (copied here)."""
    template = copy.deepcopy(pod) if pod is not None else pod_template(plan)
    template["metadata"]["labels"][ROLE_LABEL] = "leader"
    vllm = template["spec"]["containers"][0]
    vllm["ports"] = list(vllm.get("ports") or []) + [
        {"name": COORDINATION_PORT_NAME, "containerPort": COORDINATION_PORT, "protocol": "TCP"}]
    return template


def worker_template(plan: Plan, pod: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """A group's worker: the same pod running vLLM --headless (no API server, so no probes and no HTTP port; the
    kubelet restarts it on exit and the LeaderWorkerSet then recreates the whole group). `pod`: the pod template,
    already built (copied here)."""
    template = copy.deepcopy(pod) if pod is not None else pod_template(plan)
    template["metadata"]["labels"][ROLE_LABEL] = "worker"
    vllm = template["spec"]["containers"][0]
    vllm["args"] = list(vllm["args"]) + ["--headless"]
    vllm.pop("ports", None)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        vllm.pop(probe, None)
    return template


def build_leaderworkerset(plan: Plan, owner: Optional[dict] = None,
                          template: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """spec.nodes > 1: one LeaderWorkerSet group of `nodes` pods per replica. The leader serves the API, the
    workers join it (vLLM's --nnodes/--node-rank/--master-addr from the LWS variables). LeaderCreated: the workers
    start with the leader, since the leader's vLLM is ready only once every worker has joined (LeaderReady would
    wait forever). A pod that fails recreates its whole group (a vLLM engine cannot lose a rank). `template`: the
    pod template, already built; built here once otherwise, for the leader and the worker."""
    spec = plan.spec
    pod = template if template is not None else pod_template(plan)
    lws_spec: dict[str, Any] = {
        "startupPolicy": "LeaderCreated",
        "rolloutStrategy": {"type": "RollingUpdate",
                            "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0}},
        "leaderWorkerTemplate": {
            "size": spec.nodes,
            "restartPolicy": "RecreateGroupOnPodRestart",
            "leaderTemplate": leader_template(plan, pod),
            "workerTemplate": worker_template(plan, pod),
        },
    }
    if owns_replicas(spec):
        lws_spec["replicas"] = spec.replicas
    return {"apiVersion": LWS_API_VERSION, "kind": LWS_KIND, "metadata": metadata(plan, plan.name, owner),
            "spec": lws_spec}
