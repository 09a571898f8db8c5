"""The scalers other than the operator's own loop: a HorizontalPodAutoscaler or a KEDA ScaledObject on vLLM's
queue, with the triggers that wake a server at zero."""

from __future__ import annotations

from typing import Any, Optional

from .. import api
from ..planner import Plan
from .names import LWS_API_VERSION, LWS_KIND, metadata
from .routing import picker_name
from .workloads import is_group


# --------------------------------------------------------------------------- other scalers
#: The metric every scaler reads: requests queued inside vLLM, per pod.
QUEUE_METRIC = "vllm:num_requests_waiting"
#: The HPA's own default scale-up limits, written out: max(4 pods, 100%) per 15 s (as the operator's loop).
SCALE_UP_POLICIES = [{"type": "Pods", "value": 4, "periodSeconds": 15},
                     {"type": "Percent", "value": 100, "periodSeconds": 15}]


def scaler_quantity(value: float) -> str:
    """A target as a Kubernetes quantity: 2.0 -> "2", 0.5 -> "500m"."""
    milli = round(value * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def scaling_behavior(spec: api.VLLMServerSpec) -> dict[str, Any]:
    """The HPA behavior matching the spec's stabilization windows."""
    a = spec.autoscaling
    return {
        "scaleUp": {"stabilizationWindowSeconds": a.scale_up_stabilization_seconds, "selectPolicy": "Max",
                    "policies": [dict(p) for p in SCALE_UP_POLICIES]},
        "scaleDown": {"stabilizationWindowSeconds": a.scale_down_stabilization_seconds,
                      "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]},
    }


def _scale_target(plan: Plan) -> dict[str, Any]:
    """The scale subresource the HPA or KEDA drives: the StatefulSet's, or the LeaderWorkerSet's (groups; its
    status.hpaPodSelector selects the leaders, so the queue is read where the requests wait)."""
    if is_group(plan.spec):
        return {"apiVersion": LWS_API_VERSION, "kind": LWS_KIND, "name": plan.name}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": plan.name}


def build_hpa(plan: Plan, owner: Optional[dict] = None) -> dict[str, Any]:
    """autoscaling.mode HPA: a HorizontalPodAutoscaler on the Pods metric vllm:num_requests_waiting
    (served by prometheus-adapter), averageValue targetWaitingPerReplica."""
    a = plan.spec.autoscaling
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(plan, plan.name, owner, component="autoscaler"),
        "spec": {
            "scaleTargetRef": _scale_target(plan),
            "minReplicas": a.min_replicas,
            "maxReplicas": max(a.min_replicas, a.max_replicas or a.min_replicas),
            "metrics": [{"type": "Pods", "pods": {
                "metric": {"name": QUEUE_METRIC},
                "target": {"type": "AverageValue", "averageValue": scaler_quantity(a.target_waiting_per_replica)},
            }}],
            "behavior": scaling_behavior(plan.spec),
        },
    }


def scaled_object_query(plan: Plan) -> str:
    """All requests waiting in this server's pods (KEDA divides by the replica count: AverageValue). A group's
    leaders are named <name>-<group> like a StatefulSet's pods (its workers <name>-<group>-<index>), so the same
    pattern reads the leaders' queues only."""
    return f'sum({QUEUE_METRIC}{{namespace="{plan.namespace}",pod=~"{plan.name}-[0-9]+"}})'


def build_scaled_object(plan: Plan, owner: Optional[dict] = None) -> dict[str, Any]:
    """autoscaling.mode KEDA: a ScaledObject with a Prometheus trigger on the same queue and target."""
    a = plan.spec.autoscaling
    body: dict[str, Any] = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": metadata(plan, plan.name, owner, component="autoscaler"),
        "spec": {
            "scaleTargetRef": _scale_target(plan),
            "pollingInterval": a.interval_seconds,
            "minReplicaCount": a.min_replicas,
            "maxReplicaCount": max(a.min_replicas, a.max_replicas or a.min_replicas),
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": scaling_behavior(plan.spec)}},
            "triggers": [{"type": "prometheus", "metadata": {
                "serverAddress": plan.prometheus_url or "",
                "query": scaled_object_query(plan),
                "threshold": f"{a.target_waiting_per_replica:g}",  # KEDA parses a float string
                "metricType": "AverageValue",
            }}],
        },
    }
    if a.min_replicas == 0:
        scale_to_zero_triggers(plan, body["spec"])
    return body


#: A threshold no trigger reaches: a trigger that only activates (wakes from zero) and never asks for replicas.
ACTIVATION_ONLY_THRESHOLD = "1000000"


def scale_to_zero_triggers(plan: Plan, spec: dict[str, Any]) -> None:
    """minReplicas 0 in KEDA mode: KEDA goes to zero once every trigger is inactive (value at or below its
    activationThreshold, 0) for cooldownPeriod (scaleToZero.idleSeconds), and back to one when one activates:
    the queue, the running requests, and (with a pool) the picker's count of requests it had no pod for, which
    Prometheus must scrape from the picker's Service (port metrics)."""
    a, ns = plan.spec.autoscaling, plan.namespace
    spec["cooldownPeriod"] = a.scale_to_zero.idle_seconds
    spec["triggers"][0]["metadata"]["activationThreshold"] = "0"
    pods = f'namespace="{ns}",pod=~"{plan.name}-[0-9]+"'
    queries = [f"sum(vllm:num_requests_running{{{pods}}})"]
    routing = plan.spec.routing
    if routing.inference_pool.enabled:
        picker = picker_name(api.pool_name(plan.name, routing))
        queries.append(f'sum(increase(inference_objective_request_error_total{{namespace="{ns}",'
                       f'service="{picker}",error_code="ServiceUnavailable"}}[1m]))')
    for query in queries:
        spec["triggers"].append({"type": "prometheus", "metadata": {
            "serverAddress": plan.prometheus_url or "", "query": query, "threshold": ACTIVATION_ONLY_THRESHOLD,
            "activationThreshold": "0", "metricType": "AverageValue"}})
