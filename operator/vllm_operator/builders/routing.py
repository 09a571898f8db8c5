"""spec.routing's objects (docs/routing.md): the InferencePool, its endpoint picker (Deployment, Service, RBAC,
configuration) and the HTTPRoute."""

from __future__ import annotations

import json
from typing import Any, Optional

from .. import api
from ..planner import Plan
from .names import POOL_LABEL, metadata


# --------------------------------------------------------------------------- routing (docs/routing.md)
POOL_API_VERSION = "inference.networking.k8s.io/v1"
OBJECTIVE_GROUP = "inference.networking.x-k8s.io"
ROUTE_API_VERSION = "gateway.networking.k8s.io/v1"
PICKER_CONFIG_API_VERSION = "inference.networking.x-k8s.io/v1alpha1"
PICKER_GRPC_PORT = 9002
PICKER_HEALTH_PORT = 9003
PICKER_METRICS_PORT = 9090
#: The header the extension's body-based router sets from the request's "model" field (HTTPRoute matches on it).
MODEL_NAME_HEADER = "X-Gateway-Model-Name"
#: vLLM's metric names the picker reads. The KV cache gauge was gpu_cache_usage_perc before vLLM 0.10.
PICKER_METRICS = {"total-queued-requests-metric": "vllm:num_requests_waiting",
                  "kv-cache-usage-percentage-metric": "vllm:kv_cache_usage_perc",
                  "lora-info-metric": "vllm:lora_requests_info",
                  "cache-info-metric": "vllm:cache_config_info"}
SCORERS = (("queue_depth", "queue-scorer"), ("kv_cache_utilization", "kv-cache-utilization-scorer"),
           ("prefix_cache", "prefix-cache-scorer"), ("lora_affinity", "lora-affinity-scorer"))


def picker_name(pool: str) -> str:
    """The endpoint picker's Deployment, Service, ServiceAccount, Role and RoleBinding."""
    return f"{pool}-epp"


def picker_selector(pool: str) -> dict[str, str]:
    """The picker's pods. Never the server's instance label, nor managed-by: the operator's pod index keys pods
    by instance (informers/cache.index_pod), and a picker pod counted as a server's replica would be scraped."""
    return {"app.kubernetes.io/name": "vllm-epp", "app.kubernetes.io/instance": picker_name(pool)}


def picker_metrics(release: Optional[str]) -> dict[str, str]:
    """The metric flags for the image's vLLM release (None: the operator's own, 0.10 or later)."""
    out = dict(PICKER_METRICS)
    if release is not None and release_before(release, (0, 10)):
        out["kv-cache-usage-percentage-metric"] = "vllm:gpu_cache_usage_perc"
    return out


def release_before(release: str, version: tuple[int, int]) -> bool:
    parts = release.split(".")
    try:
        return (int(parts[0]), int(parts[1])) < version
    except (ValueError, IndexError):
        return False


def picker_config(weights: api.ScorerWeights) -> str:
    """The picker's EndpointPickerConfig: the scorers with a weight (the max-score picker is its default)."""
    used = [(kind, getattr(weights, field)) for field, kind in SCORERS if getattr(weights, field) > 0]
    config = {"apiVersion": PICKER_CONFIG_API_VERSION, "kind": "EndpointPickerConfig",
              "plugins": [{"type": kind} for kind, _ in used],
              "schedulingProfiles": [{"name": "default",
                                      "plugins": [{"pluginRef": kind, "weight": w} for kind, w in used]}]}
    return json.dumps(config, separators=(",", ":"))  # JSON is YAML: the picker reads it with a YAML decoder


def picker_args(plan: Plan) -> list[str]:
    """The endpoint picker's command line (the extension's v1.2.0 flags)."""
    routing = plan.spec.routing
    picker = routing.inference_pool.picker
    args = ["--pool-name", api.pool_name(plan.name, routing), "--pool-namespace", plan.namespace,
            # the config inline (--config-text): no ConfigMap, so the operator needs no right on ConfigMaps
            "--config-text", picker_config(picker.scorers),
            "--grpc-port", str(PICKER_GRPC_PORT), "--grpc-health-port", str(PICKER_HEALTH_PORT),
            "--metrics-port", str(PICKER_METRICS_PORT),
            # Its metrics (what wakes a server at zero) are read by the operator over the cluster network; an
            # authenticated endpoint would need cluster-wide TokenReview and SubjectAccessReview rights.
            "--metrics-endpoint-auth=false", "--tracing=false", "--zap-encoder", "json",
            "--refresh-metrics-interval", f"{picker.refresh_metrics_milliseconds}ms"]
    release = plan.flags.release if plan.flags is not None else None
    for flag, metric in picker_metrics(release).items():
        args += [f"--{flag}", metric]
    return args


def build_picker_rbac(plan: Plan, owner: Optional[dict] = None) -> list[dict[str, Any]]:
    """The picker's ServiceAccount and what it reads in the namespace, nothing cluster-wide: its pool, the pods,
    the InferenceObjectives."""
    name = picker_name(api.pool_name(plan.name, plan.spec.routing))
    meta = lambda: metadata(plan, name, owner, component="endpoint-picker")  # noqa: E731
    read = ["get", "list", "watch"]
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": read},
             {"apiGroups": [POOL_API_VERSION.split("/")[0]], "resources": ["inferencepools"], "verbs": read},
             {"apiGroups": [OBJECTIVE_GROUP], "resources": ["inferenceobjectives"], "verbs": read}]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta()},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(), "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta(),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": plan.namespace}]},
    ]


def picker_container(plan: Plan) -> dict[str, Any]:
    picker = plan.spec.routing.inference_pool.picker
    probe = {"grpc": {"port": PICKER_HEALTH_PORT, "service": "inference-extension"}, "periodSeconds": 10}
    return {
        "name": "epp", "image": picker.image, "args": picker_args(plan),
        "env": [{"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [{"name": "grpc", "containerPort": PICKER_GRPC_PORT, "protocol": "TCP"},
                  {"name": "grpc-health", "containerPort": PICKER_HEALTH_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": PICKER_METRICS_PORT, "protocol": "TCP"}],
        "readinessProbe": probe, "livenessProbe": {**probe, "initialDelaySeconds": 5},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
    }


def build_picker_deployment(plan: Plan, owner: Optional[dict] = None) -> dict[str, Any]:
    """The endpoint picker: one replica (its prefix index lives in memory), replaced at once on a change."""
    pool = api.pool_name(plan.name, plan.spec.routing)
    name = picker_name(pool)
    template = {"metadata": {"labels": {**picker_selector(pool), "app.kubernetes.io/component": "endpoint-picker"}},
                "spec": {"serviceAccountName": name, "terminationGracePeriodSeconds": 30,
                         "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                         "containers": [picker_container(plan)]}}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": metadata(plan, name, owner, component="endpoint-picker"),
            "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                     "selector": {"matchLabels": picker_selector(pool)}, "template": template}}


def build_picker_service(plan: Plan, owner: Optional[dict] = None) -> dict[str, Any]:
    """What the gateway's ext_proc filter (the pool's endpointPickerRef) and the operator (its metrics) reach."""
    pool = api.pool_name(plan.name, plan.spec.routing)
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": metadata(plan, picker_name(pool), owner, component="endpoint-picker"),
            "spec": {"type": "ClusterIP", "selector": picker_selector(pool),
                     "ports": [{"name": "grpc", "port": PICKER_GRPC_PORT, "targetPort": "grpc",
                                "protocol": "TCP", "appProtocol": "http2"},
                               {"name": "metrics", "port": PICKER_METRICS_PORT, "targetPort": "metrics",
                                "protocol": "TCP"}]}}


def build_inference_pool(plan: Plan, owner: Optional[dict] = None) -> dict[str, Any]:
    """The InferencePool: every pod labelled with this pool (this server's, and those of the servers that join
    it), their port 8000, and the picker that chooses among them."""
    pool = api.pool_name(plan.name, plan.spec.routing)
    return {"apiVersion": POOL_API_VERSION, "kind": "InferencePool",
            "metadata": metadata(plan, pool, owner, component="inference-pool"),
            "spec": {"selector": {"matchLabels": {POOL_LABEL: pool}},
                     "targetPorts": [{"number": plan.port}],
                     "endpointPickerRef": {"kind": "Service", "name": picker_name(pool),
                                           "port": {"number": PICKER_GRPC_PORT}, "failureMode": "FailClose"}}}


def build_http_route(plan: Plan, owner: Optional[dict] = None) -> dict[str, Any]:
    """An HTTPRoute from the named Gateway of the server's namespace to its pool; with matchModelName only the
    requests for its model (served name) match, so servers of several models share one hostname and path."""
    spec = plan.spec
    route = spec.routing.http_route
    parent: dict[str, Any] = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": route.gateway_name}
    if route.section_name:
        parent["sectionName"] = route.section_name
    match: dict[str, Any] = {"path": {"type": "PathPrefix", "value": route.path}}
    if route.match_model_name:
        match["headers"] = [{"type": "Exact", "name": MODEL_NAME_HEADER,
                             "value": spec.model.served_name or spec.model.name}]
    body: dict[str, Any] = {"parentRefs": [parent],
                            "rules": [{"matches": [match],
                                       "backendRefs": [{"group": POOL_API_VERSION.split("/")[0],
                                                        "kind": "InferencePool",
                                                        "name": api.pool_name(plan.name, spec.routing)}]}]}
    if route.hostnames:
        body["hostnames"] = list(route.hostnames)
    return {"apiVersion": ROUTE_API_VERSION, "kind": "HTTPRoute",
            "metadata": metadata(plan, plan.name, owner, component="route"), "spec": body}


def build_routing(plan: Plan, owner: Optional[dict] = None) -> list[dict[str, Any]]:
    """spec.routing's objects: the pool, its picker and its RBAC where this server owns the pool; its route."""
    routing = plan.spec.routing
    objects: list[dict[str, Any]] = []
    if api.owns_pool(plan.name, routing):
        objects += [*build_picker_rbac(plan, owner),
                    build_picker_service(plan, owner), build_picker_deployment(plan, owner),
                    build_inference_pool(plan, owner)]
    if routing.inference_pool.enabled and routing.http_route.enabled:
        objects.append(build_http_route(plan, owner))
    return objects
