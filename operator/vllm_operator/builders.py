"""Build the Kubernetes objects of one VLLMServer from its spec and plan: one pure function per kind.

Each builder returns a plain dict holding only the fields the operator owns (it is
sent as a server-side apply patch), with the shared labels and owner reference.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any, Optional

from . import adapters, api, strategic_merge
from .catalog import gpus
from .planner import GiB, Plan

PORT = api.VLLM_PORT
PORT_NAME = "http"
CACHE_MOUNT = "/cache"
HF_HOME = f"{CACHE_MOUNT}/huggingface"
#: HOME of the non-root vLLM user: an emptyDir, since the image's /root is not writable by it (vLLM, torch.compile,
#: Triton and FlashInfer keep caches and settings under ~/.cache and ~/.config).
HOME = "/home/vllm"
PRESTOP_SECONDS = 10
GPU_RESOURCE = gpus.GPU_RESOURCE
GPU_PRODUCT_LABEL = gpus.GFD_PRODUCT_LABEL
MANAGED_BY = "vllm-operator"
SERVER_LABEL = f"{api.GROUP}/server"


# --------------------------------------------------------------------------- shared helpers
def selector_labels(name: str) -> dict[str, str]:
    """Labels that select one server's pods; never change them (selectors are immutable)."""
    return {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": name}


def labels(name: str, component: str = "server") -> dict[str, str]:
    return {
        **selector_labels(name),
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        SERVER_LABEL: name,
    }


def selector_string(name: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector_labels(name).items())


def owner_reference(owner: dict[str, Any]) -> dict[str, Any]:
    """Controller owner reference to the VLLMServer, so garbage collection removes children."""
    meta = owner["metadata"]
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(plan: Plan, name: str, owner: Optional[dict], component: str = "server") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": plan.namespace, "labels": labels(plan.name, component)}
    if owner is not None:
        meta["ownerReferences"] = [owner_reference(owner)]
    return meta


def quantity(n: int) -> str:
    """Bytes as a whole number of Gi (or Mi below 1 Gi), the way people write them."""
    if n % GiB == 0 or n >= 16 * GiB:
        return f"{math.ceil(n / GiB)}Gi"
    return f"{math.ceil(n / 2**20)}Mi"


def headless_service_name(name: str) -> str:
    return f"{name}-headless"


# --------------------------------------------------------------------------- pod
def _probe(path: str, period: int, timeout: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": PORT_NAME},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def container_resources(plan: Plan) -> dict[str, Any]:
    spec = plan.spec
    count, resource = str(spec.gpu.count), plan.gpu.resource  # nvidia.com/gpu, or nvidia.com/mig-<profile>
    requests = {"cpu": str(plan.cpu_request), "memory": quantity(plan.host_memory_bytes), resource: count}
    limits = {"memory": quantity(plan.host_memory_bytes + plan.shm_bytes), resource: count}
    requests.update(spec.resources.requests)
    limits.update(spec.resources.limits)
    # The API server refuses a request above its limit. Where only one side was set in the spec, the derived
    # other side gives way (both set and crossed: the planner refuses the spec).
    for name in set(requests) & set(limits):
        if api.parse_quantity(requests[name]) > api.parse_quantity(limits[name]):
            if name in spec.resources.limits:
                requests[name] = limits[name]
            else:
                limits[name] = requests[name]
    return {"requests": requests, "limits": limits}


def container_env(plan: Plan) -> list[dict[str, Any]]:
    spec = plan.spec
    env: list[dict[str, Any]] = [{"name": "HOME", "value": HOME}, {"name": "HF_HOME", "value": HF_HOME}]
    if spec.hf_token_secret_ref is not None:
        ref = spec.hf_token_secret_ref
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    if spec.adapters:  # vLLM's runtime load/unload endpoints, only where the operator loads adapters
        env.append({"name": adapters.RUNTIME_ENV, "value": "True"})
    env += [env_var(e) for e in spec.engine.env]
    return env


def env_var(e: api.EnvVar) -> dict[str, Any]:
    if e.value_from is not None:
        ref = e.value_from.secret_key_ref
        return {"name": e.name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
    return {"name": e.name, "value": e.value}


#: What the download init container runs: huggingface_hub (in every vLLM image) fetches the files vLLM reads
#: (weights as safetensors, config, tokenizer, chat template) into HF_HOME; vLLM then finds them in the cache.
#: Arguments: the repo id and the revision ("" for the default branch).
DOWNLOAD_SCRIPT = (
    "import sys\n"
    "from huggingface_hub import snapshot_download\n"
    "path = snapshot_download(sys.argv[1], revision=sys.argv[2] or None, allow_patterns=["
    "'*.safetensors', '*.json', '*.model', '*.tiktoken', '*.txt', '*.jinja', 'tokenizer*'])\n"
    "print('downloaded', sys.argv[1], 'to', path)\n"
)
DOWNLOAD_CONTAINER = "download"
#: The variables of the vLLM container the download also gets: the Hub's own (HF_HOME, HF_TOKEN, HF_ENDPOINT,
#: HF_HUB_*), the proxies and CA bundles a download goes through, HOME. Nothing else: engine.env may be large.
_DOWNLOAD_ENV_PREFIXES = ("HF_", "HUGGING_FACE_")
_DOWNLOAD_ENV_NAMES = frozenset({"HOME", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy",
                                 "no_proxy", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR",
                                 "CURL_CA_BUNDLE"})


def download_env(plan: Plan) -> list[dict[str, Any]]:
    return [e for e in container_env(plan)
            if e["name"] in _DOWNLOAD_ENV_NAMES or e["name"].startswith(_DOWNLOAD_ENV_PREFIXES)]


def download_container(plan: Plan, mounts: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The init container that fills the cache before vLLM starts (spec.model.download: InitContainer)."""
    spec = plan.spec
    if not api.downloads_in_init_container(spec.model):
        return None
    container: dict[str, Any] = {
        "name": DOWNLOAD_CONTAINER,
        "image": spec.image,
        "command": ["python3", "-c", DOWNLOAD_SCRIPT, spec.model.name, spec.model.revision or ""],
        "env": download_env(plan),
        # A download needs no GPU; a few hundred MiB for the client and its buffers.
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "4Gi"}},
        "volumeMounts": [m for m in mounts if m["name"] in ("cache", "home")],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
    }
    if spec.image_pull_policy:
        container["imagePullPolicy"] = spec.image_pull_policy
    return container


def pod_security_context(spec: api.VLLMServerSpec) -> dict[str, Any]:
    """Non-root with the runtime's default seccomp profile: what Pod Security "restricted" asks of a pod (the
    container adds no privilege escalation and drops every capability). fsGroup makes the model cache's claim
    writable by that user."""
    uid = spec.run_as_user
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid,
            "seccompProfile": {"type": "RuntimeDefault"}}


def node_placement(plan: Plan) -> tuple[dict[str, str], Optional[dict[str, Any]]]:
    """The pod's nodeSelector and affinity: the spec's own, plus the GPU's node requirements.

    A requirement with one value goes into the nodeSelector; one with several (gpu.product: H100 is any of
    three products) into node affinity as `In`, added to every required term of the spec's affinity (terms
    are ORed, so each must carry it). A key the spec's nodeSelector already sets is left to the spec.
    """
    spec = plan.spec
    node_selector = dict(spec.node_selector)
    expressions = []
    for requirement in plan.gpu.requirements:
        if requirement.key in node_selector:
            continue
        if len(requirement.values) == 1:
            node_selector[requirement.key] = requirement.values[0]
        else:
            expressions.append({"key": requirement.key, "operator": "In", "values": list(requirement.values)})
    affinity = copy.deepcopy(spec.affinity) if spec.affinity else None
    if expressions:
        affinity = affinity or {}
        required = affinity.setdefault("nodeAffinity", {}).setdefault(
            "requiredDuringSchedulingIgnoredDuringExecution", {})
        terms = required.setdefault("nodeSelectorTerms", [])
        if not terms:
            terms.append({})
        for term in terms:
            term["matchExpressions"] = list(term.get("matchExpressions") or []) + copy.deepcopy(expressions)
    return node_selector, affinity


def node_requirements_text(pod_spec: dict[str, Any]) -> str:
    """A pod's nodeSelector and required node affinity `In` expressions, for messages: k=v, k in (a, b)."""
    parts = [f"{k}={v}" for k, v in sorted((pod_spec.get("nodeSelector") or {}).items())]
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}
    for term in required.get("nodeSelectorTerms") or []:
        for e in term.get("matchExpressions") or []:
            if e.get("operator") == "In":
                parts.append(f"{e['key']} in ({', '.join(e.get('values') or [])})")
    return ", ".join(dict.fromkeys(parts))


#: The security context of every container the operator writes (vLLM, the download, spec.initContainers and
#: spec.sidecars): what Pod Security "restricted" asks of a container, with the pod's non-root user.
CONTAINER_SECURITY_CONTEXT = {"allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]}}


def extra_container(container: api.Container, native_sidecar: bool = False) -> dict[str, Any]:
    """One of spec.initContainers or spec.sidecars as a pod's container; a sidecar is a native one (an init
    container with restartPolicy: Always, Kubernetes 1.29+): it starts before the next init container and vLLM,
    and the kubelet stops it only after vLLM has exited, so it outlives vLLM's drain."""
    out: dict[str, Any] = {"name": container.name, "image": container.image}
    if native_sidecar:
        out["restartPolicy"] = "Always"
    if container.image_pull_policy:
        out["imagePullPolicy"] = container.image_pull_policy
    if container.command:
        out["command"] = list(container.command)
    if container.args:
        out["args"] = list(container.args)
    if container.env:
        out["env"] = [env_var(e) for e in container.env]
    if container.ports:
        out["ports"] = [p.model_dump(by_alias=True, exclude_none=True) for p in container.ports]
    resources = {k: dict(v) for k, v in (("requests", container.resources.requests),
                                          ("limits", container.resources.limits)) if v}
    if resources:
        out["resources"] = resources
    if container.volume_mounts:
        out["volumeMounts"] = [m.model_dump(by_alias=True, exclude_none=True) for m in container.volume_mounts]
    out["terminationMessagePolicy"] = "FallbackToLogsOnError"
    out["securityContext"] = copy.deepcopy(CONTAINER_SECURITY_CONTEXT)
    return out


def pod_template(plan: Plan) -> dict[str, Any]:
    """The pod template, with spec.podTemplatePatch applied last (escape_hatches.problems checks the result before a
    plan with a patch can be built)."""
    base = base_pod_template(plan)
    patch = plan.spec.pod_template_patch
    return strategic_merge.apply(base, patch) if patch else base


def base_pod_template(plan: Plan) -> dict[str, Any]:
    """The vLLM pod: image, derived args, GPUs, shared memory, cache, probes that never kill a loading model;
    the spec's extra volumes and containers."""
    spec = plan.spec
    mounts = [{"name": "cache", "mountPath": CACHE_MOUNT}, {"name": "home", "mountPath": HOME}]
    volumes: list[dict[str, Any]] = [{"name": "home", "emptyDir": {}}]
    if spec.cache is None:
        volumes.append({"name": "cache", "emptyDir": {}})
    elif spec.cache.claim_name or spec.cache.shared:
        claim = spec.cache.claim_name or shared_cache_claim_name(plan.name)
        volumes.append({"name": "cache", "persistentVolumeClaim": {"claimName": claim}})
    # else: the StatefulSet's volumeClaimTemplates provides "cache"
    if spec.ipc == "SharedMemory":
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": quantity(plan.shm_bytes)}})
    volumes += [{"name": v.name} | v.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True)
                for v in spec.volumes]
    extra_mounts = [m.model_dump(by_alias=True, exclude_none=True) for m in spec.volume_mounts]

    container: dict[str, Any] = {
        "name": "vllm",
        "image": spec.image,
        "args": list(plan.args),
        "ports": [{"name": PORT_NAME, "containerPort": plan.port, "protocol": "TCP"}],
        "env": container_env(plan),
        "resources": container_resources(plan),
        "volumeMounts": mounts + extra_mounts,
        # A container that exits with an error leaves its last log lines (vLLM's traceback) in
        # lastState.terminated.message, which the reconciler quotes in the Degraded condition.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # /health refuses connections while the model loads: the startup probe waits for the whole
        # load, and liveness only starts after it succeeds, so a loading server is never killed.
        "startupProbe": _probe("/health", 10, 5, max(1, math.ceil(plan.startup_seconds / 10))),
        "readinessProbe": _probe("/health", 5, 5, 3),
        "livenessProbe": _probe("/health", 20, 10, 6),
        # Let the endpoint leave the Services before vLLM stops taking requests (SIGTERM after the sleep).
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(plan.prestop_seconds)]}}},
        "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
    }
    if spec.image_pull_policy:
        container["imagePullPolicy"] = spec.image_pull_policy

    node_selector, affinity = node_placement(plan)
    tolerations = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    tolerations += [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations]

    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "tolerations": tolerations,
        # preStop sleep + --shutdown-timeout + vLLM's teardown (planner.plan_shutdown): no SIGKILL mid-drain.
        "terminationGracePeriodSeconds": plan.termination_grace_seconds,
        # vLLM reads VLLM_* variables; a Service named "vllm" would inject VLLM_PORT=tcp://... and break it.
        "enableServiceLinks": False,
        # vLLM never talks to the Kubernetes API.
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(spec),
    }
    # The spec's init containers first (they may prepare what the rest needs), then the native sidecars (a proxy
    # the download goes through), then the download; vLLM after all of them.
    init_containers = [extra_container(c) for c in spec.init_containers]
    init_containers += [extra_container(c, native_sidecar=True) for c in spec.sidecars]
    download = download_container(plan, mounts)
    if download is not None:
        init_containers.append(download)
    if init_containers:
        pod_spec["initContainers"] = init_containers
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    if spec.ipc == "Host":
        pod_spec["hostIPC"] = True
    if spec.host_network:
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    if affinity:
        pod_spec["affinity"] = affinity
    if spec.service_account_name:
        pod_spec["serviceAccountName"] = spec.service_account_name
    if spec.priority_class_name:
        pod_spec["priorityClassName"] = spec.priority_class_name
    if spec.runtime_class_name:
        pod_spec["runtimeClassName"] = spec.runtime_class_name
    if spec.topology_spread_constraints:
        pod_spec["topologySpreadConstraints"] = [dict(c) for c in spec.topology_spread_constraints]

    pod_labels = {**spec.pod_labels, **labels(plan.name)}
    template_meta: dict[str, Any] = {"labels": pod_labels}
    if spec.pod_annotations:
        template_meta["annotations"] = dict(spec.pod_annotations)
    return {"metadata": template_meta, "spec": pod_spec}


# --------------------------------------------------------------------------- workloads
def owns_replicas(spec: api.VLLMServerSpec) -> bool:
    """Whether the StatefulSet's replicas come from spec.replicas (else an autoscaler owns them)."""
    return not spec.autoscaling.enabled


def build_statefulset(plan: Plan, owner: Optional[dict] = None) -> dict[str, Any]:
    spec = plan.spec
    sts_spec: dict[str, Any] = {
        "serviceName": headless_service_name(plan.name),
        # Parallel: scale-up starts every new replica at once instead of one model load at a time.
        "podManagementPolicy": "Parallel",
        "selector": {"matchLabels": selector_labels(plan.name)},
        "updateStrategy": {"type": "RollingUpdate"},
        "template": pod_template(plan),
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
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": metadata(plan, plan.name, owner),
            "spec": sts_spec}


def build_daemonset(plan: Plan, owner: Optional[dict] = None) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": metadata(plan, plan.name, owner),
        "spec": {
            "selector": {"matchLabels": selector_labels(plan.name)},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": pod_template(plan),
        },
    }


# --------------------------------------------------------------------------- services, PDB
def build_service(plan: Plan, owner: Optional[dict] = None) -> dict[str, Any]:
    """The client Service: the OpenAI-compatible API on port 8000, named http.

    A DaemonSet's gets internalTrafficPolicy: Local: a client pod reaches the server on its own node, never
    another node's. A client on a node without a server pod gets no endpoint at all (kube-proxy drops the
    connection)."""
    spec: dict[str, Any] = {
        "type": "ClusterIP",
        "selector": selector_labels(plan.name),
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


def shared_cache_claim_name(name: str) -> str:
    return f"{name}-cache"


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
    """At most one replica down at a time through voluntary disruptions (drains, upgrades)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(plan, plan.name, owner),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(plan.name)}},
    }


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
    """All requests waiting in this server's pods (KEDA divides by the replica count: AverageValue)."""
    return f'sum({QUEUE_METRIC}{{namespace="{plan.namespace}",pod=~"{plan.name}-[0-9]+"}})'


def build_scaled_object(plan: Plan, owner: Optional[dict] = None) -> dict[str, Any]:
    """autoscaling.mode KEDA: a ScaledObject with a Prometheus trigger on the same queue and target."""
    a = plan.spec.autoscaling
    return {
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


def build_all(plan: Plan, owner: Optional[dict] = None) -> list[dict[str, Any]]:
    """Every object one VLLMServer wants, in apply order. The plan must fit."""
    if not plan.fits:
        raise ValueError("cannot build objects for a plan with problems: " + "; ".join(map(str, plan.problems)))
    spec = plan.spec
    objects: list[dict[str, Any]] = [build_service(plan, owner)]
    if spec.cache is not None and spec.cache.shared:
        objects.append(build_shared_cache_claim(plan, owner))  # before the pods that mount it
    if spec.workload == "StatefulSet":
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
    return objects
