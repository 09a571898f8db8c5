"""Build the Kubernetes objects of one VLLMServer from its spec and plan: one pure function per kind.

Each builder returns a plain dict holding only the fields the operator owns (it is
sent as a server-side apply patch), with the shared labels and owner reference.

The package, along the kinds: ``names`` (ports, mount paths, labels, owner references, metadata), ``pod`` (the pod
template), ``workloads`` (StatefulSet, DaemonSet, LeaderWorkerSet), ``services`` (the Services, the shared cache
claim, the PodDisruptionBudget), ``routing`` (InferencePool, endpoint picker, HTTPRoute), ``scalers`` (HPA, KEDA
ScaledObject), ``all_objects`` (`build_all` and `oversized`). Every name is importable from
``vllm_operator.builders``.
"""

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
from .routing import (
    MODEL_NAME_HEADER, OBJECTIVE_GROUP, PICKER_CONFIG_API_VERSION, PICKER_GRPC_PORT, PICKER_HEALTH_PORT,
    PICKER_METRICS, PICKER_METRICS_PORT, POOL_API_VERSION, ROUTE_API_VERSION, SCORERS, build_http_route,
    build_inference_pool, build_picker_deployment, build_picker_rbac, build_picker_service, build_routing,
    picker_args, picker_config, picker_container, picker_metrics, picker_name, picker_selector, release_before,
)
from .scalers import (
    ACTIVATION_ONLY_THRESHOLD, QUEUE_METRIC, SCALE_UP_POLICIES, build_hpa, build_scaled_object,
    scale_to_zero_triggers, scaled_object_query, scaler_quantity, scaling_behavior,
)
from .all_objects import (
    MAX_OBJECT_BYTES, build_all, oversized,
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
    "build_shared_cache_claim", "build_pdb", "POOL_API_VERSION", "OBJECTIVE_GROUP", "ROUTE_API_VERSION",
    "PICKER_CONFIG_API_VERSION", "PICKER_GRPC_PORT", "PICKER_HEALTH_PORT", "PICKER_METRICS_PORT",
    "MODEL_NAME_HEADER", "PICKER_METRICS", "SCORERS", "picker_name", "picker_selector", "picker_metrics",
    "release_before", "picker_config", "picker_args", "build_picker_rbac", "picker_container",
    "build_picker_deployment", "build_picker_service", "build_inference_pool", "build_http_route", "build_routing",
    "QUEUE_METRIC", "SCALE_UP_POLICIES", "scaler_quantity", "scaling_behavior", "build_hpa", "scaled_object_query",
    "build_scaled_object", "ACTIVATION_ONLY_THRESHOLD", "scale_to_zero_triggers", "MAX_OBJECT_BYTES", "oversized",
    "build_all",
]
