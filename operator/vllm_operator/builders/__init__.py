"""Build the Kubernetes objects of one VLLMServer from its spec and plan: one pure function per kind.

Each builder returns a plain dict holding only the fields the operator owns (it is
sent as a server-side apply patch), with the shared labels and owner reference.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from .. import api
from ..planner import Plan
from .names import (
    CACHE_MOUNT, COORDINATION_PORT_NAME, GPU_PRODUCT_LABEL, GPU_RESOURCE, HF_HOME, HOME, LWS_API_VERSION, LWS_KIND,
    MANAGED_BY, POOL_LABEL, PORT, PORT_NAME, PRESTOP_SECONDS, ROLE_LABEL, SERVER_LABEL, headless_service_name,
    labels, metadata, owner_reference, quantity, selector_labels, selector_string, shared_cache_claim_name,
)
from .pod import (
    CONTAINER_SECURITY_CONTEXT, DOWNLOAD_CONTAINER, DOWNLOAD_SCRIPT, base_pod_template, container_env,
    container_resources, download_container, download_env, env_var, extra_container, node_placement,
    node_requirements_text, pod_security_context, pod_template,
)
from .workloads import (
    build_daemonset, build_leaderworkerset, build_statefulset, is_group, leader_template, owns_replicas,
    worker_template,
)
from .services import (
    build_headless_service, build_pdb, build_service, build_shared_cache_claim, wants_pdb,
)

__all__ = [
    "PORT", "PORT_NAME", "CACHE_MOUNT", "HF_HOME", "HOME", "PRESTOP_SECONDS", "GPU_RESOURCE", "GPU_PRODUCT_LABEL",
    "MANAGED_BY", "SERVER_LABEL", "ROLE_LABEL", "LWS_API_VERSION", "LWS_KIND", "COORDINATION_PORT_NAME",
    "POOL_LABEL", "selector_labels", "labels", "selector_string", "owner_reference", "metadata", "quantity",
    "headless_service_name", "shared_cache_claim_name", "container_resources", "container_env", "env_var",
    "DOWNLOAD_SCRIPT", "DOWNLOAD_CONTAINER", "download_env", "download_container", "pod_security_context",
    "node_placement", "node_requirements_text", "CONTAINER_SECURITY_CONTEXT", "extra_container", "pod_template",
    "base_pod_template", "owns_replicas", "build_statefulset", "build_daemonset", "is_group", "leader_template",
    "worker_template", "build_leaderworkerset", "build_service", "build_headless_service", "wants_pdb",
    "build_shared_cache_claim", "build_pdb", "QUEUE_METRIC", "SCALE_UP_POLICIES", "scaler_quantity",
    "scaling_behavior", "build_hpa", "scaled_object_query", "build_scaled_object", "ACTIVATION_ONLY_THRESHOLD",
    "scale_to_zero_triggers", "MAX_OBJECT_BYTES", "oversized", "POOL_API_VERSION", "OBJECTIVE_GROUP",
    "ROUTE_API_VERSION", "PICKER_CONFIG_API_VERSION", "PICKER_GRPC_PORT", "PICKER_HEALTH_PORT",
    "PICKER_METRICS_PORT", "MODEL_NAME_HEADER", "PICKER_METRICS", "SCORERS", "picker_name", "picker_selector",
    "picker_metrics", "release_before", "picker_config", "picker_args", "build_picker_rbac", "picker_container",
    "build_picker_deployment", "build_picker_service", "build_inference_pool", "build_http_route", "build_routing",
    "build_all",
]


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


#: The largest object the operator applies, as JSON. etcd stores at most 1.5 MiB per object and the API server
#: refuses a request above 2 MiB with a gRPC error (a 500 it would be retried on forever); a pod template copies
#: engine.env and extraArgs (and the extra containers and the patch), so a spec within the CRD's bounds can still
#: build a workload past them.
MAX_OBJECT_BYTES = 1_400_000


def oversized(objects: list[dict[str, Any]]) -> list[str]:
    """A problem for each object too large for the API server to store, naming what makes it large."""
    out = []
    for obj in objects:
        size = len(json.dumps(obj, separators=(",", ":")))
        if size > MAX_OBJECT_BYTES:
            out.append(f"spec: the {obj['kind']} {obj['metadata']['name']} would be {size:,} bytes, more than the "
                       f"{MAX_OBJECT_BYTES:,} the operator applies (etcd keeps at most 1.5 MiB per object): "
                       "shorten spec.engine.env, spec.engine.extraArgs, spec.engine.chatTemplate, the extra "
                       "containers or spec.podTemplatePatch")
    return out


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


def build_all(plan: Plan, owner: Optional[dict] = None) -> list[dict[str, Any]]:
    """Every object one VLLMServer wants, in apply order. The plan must fit."""
    if not plan.fits:
        raise ValueError("cannot build objects for a plan with problems: " + "; ".join(map(str, plan.problems)))
    spec = plan.spec
    objects: list[dict[str, Any]] = [build_service(plan, owner)]
    if spec.cache is not None and spec.cache.shared:
        objects.append(build_shared_cache_claim(plan, owner))  # before the pods that mount it
    if is_group(spec):
        objects.append(build_leaderworkerset(plan, owner))  # LWS makes the group's headless Service itself
    elif spec.workload == "StatefulSet":
        objects.append(build_headless_service(plan, owner))
        objects.append(build_statefulset(plan, owner))
    else:
        objects.append(build_daemonset(plan, owner))
    if wants_pdb(spec):
        objects.append(build_pdb(plan, owner))
    if spec.autoscaling.enabled and spec.workload == "StatefulSet":
        if spec.autoscaling.mode == "HPA":
            objects.append(build_hpa(plan, owner))
        elif spec.autoscaling.mode == "KEDA":
            objects.append(build_scaled_object(plan, owner))
    objects += build_routing(plan, owner)
    return objects
