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
from .planner.plan_types import COORDINATION_PORT

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
#: A group's pods (spec.nodes > 1): "leader" (serves the API) or "worker" (vLLM --headless).
ROLE_LABEL = f"{api.GROUP}/role"
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
COORDINATION_PORT_NAME = "coordination"


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
    writable by that user; OnRootMismatch has the kubelet change the ownership of the volume only when its root does
    not have it yet, not of every file of a cached model at every mount."""
    uid = spec.run_as_user
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid,
            "fsGroupChangePolicy": "OnRootMismatch", "seccompProfile": {"type": "RuntimeDefault"}}


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
    """The pod template, with spec.podTemplatePatch applied last (the operator and the CLI build it once and check
    it before the workload takes it: postbuild.build_and_check)."""
    base = base_pod_template(plan)
    patch = plan.spec.pod_template_patch
    return strategic_merge.apply(base, patch) if patch else base


def base_pod_template(plan: Plan) -> dict[str, Any]:
    """The vLLM pod: image, derived args, GPUs, shared memory, cache, probes that never kill a loading model;
    the spec's extra volumes and containers."""
    mounts, volumes = _pod_volumes(plan)
    pod_spec = _pod_spec(plan, _vllm_container(plan, mounts), volumes, mounts)
    return {"metadata": _template_metadata(plan), "spec": pod_spec}


def _pod_volumes(plan: Plan) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The volumes: the mounts vLLM shares with the download (home, cache, shared memory), and the pod's volumes
    (the operator's, then the spec's)."""
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
    return mounts, volumes


def _vllm_container(plan: Plan, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """The vLLM container: image, derived args, port, env, GPUs, the volumes' `mounts` then the spec's, probes,
    the preStop sleep and the container's security context."""
    spec = plan.spec
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
        **_probes_and_lifecycle(plan),
        "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
    }
    if spec.image_pull_policy:
        container["imagePullPolicy"] = spec.image_pull_policy
    return container


def _probes_and_lifecycle(plan: Plan) -> dict[str, Any]:
    """The vLLM container's probes, which never kill a loading model, and its preStop sleep."""
    return {
        # /health refuses connections while the model loads: the startup probe waits for the whole
        # load, and liveness only starts after it succeeds, so a loading server is never killed.
        "startupProbe": _probe("/health", 10, 5, max(1, math.ceil(plan.startup_seconds / 10))),
        "readinessProbe": _probe("/health", 5, 5, 3),
        "livenessProbe": _probe("/health", 20, 10, 6),
        # Let the endpoint leave the Services before vLLM stops taking requests (SIGTERM after the sleep).
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(plan.prestop_seconds)]}}},
    }


def _pod_spec(plan: Plan, container: dict[str, Any], volumes: list[dict[str, Any]],
              mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """The pod's spec: the vLLM container and its init containers, volumes, tolerations, the pod's security and
    shutdown, then the placement and the options the spec sets."""
    spec = plan.spec
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
    init_containers = _init_containers(plan, mounts)
    if init_containers:
        pod_spec["initContainers"] = init_containers
    pod_spec.update(_pod_options(spec, node_selector, affinity))
    return pod_spec


def _init_containers(plan: Plan, mounts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The init containers in start order: the spec's init containers first (they may prepare what the rest
    needs), then the native sidecars (a proxy the download goes through), then the download; vLLM after all."""
    spec = plan.spec
    init_containers = [extra_container(c) for c in spec.init_containers]
    init_containers += [extra_container(c, native_sidecar=True) for c in spec.sidecars]
    download = download_container(plan, mounts)
    if download is not None:
        init_containers.append(download)
    return init_containers


def _pod_options(spec: api.VLLMServerSpec, node_selector: dict[str, str],
                 affinity: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The pod spec's fields set only when there is something to set: placement, host namespaces, service
    account, priority, runtime class, topology spread, in a fixed order (the rendered bytes follow it)."""
    options: dict[str, Any] = {}
    if node_selector:
        options["nodeSelector"] = node_selector
    if spec.ipc == "Host":
        options["hostIPC"] = True
    if spec.host_network:
        options["hostNetwork"] = True
        options["dnsPolicy"] = "ClusterFirstWithHostNet"
    if affinity:
        options["affinity"] = affinity
    if spec.service_account_name:
        options["serviceAccountName"] = spec.service_account_name
    if spec.priority_class_name:
        options["priorityClassName"] = spec.priority_class_name
    if spec.runtime_class_name:
        options["runtimeClassName"] = spec.runtime_class_name
    if spec.topology_spread_constraints:
        options["topologySpreadConstraints"] = [dict(c) for c in spec.topology_spread_constraints]
    return options


def _template_metadata(plan: Plan) -> dict[str, Any]:
    """The pod template's metadata: the spec's pod labels under the operator's, the InferencePool's member label,
    the spec's pod annotations."""
    spec = plan.spec
    pod_labels = {**spec.pod_labels, **labels(plan.name)}
    if spec.routing.inference_pool.enabled:  # the InferencePool selects its members by this label
        pod_labels[POOL_LABEL] = api.pool_name(plan.name, spec.routing)
    template_meta: dict[str, Any] = {"labels": pod_labels}
    if spec.pod_annotations:
        template_meta["annotations"] = dict(spec.pod_annotations)
    return template_meta


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
    """At most one replica down at a time through voluntary disruptions (drains, upgrades). For groups it covers
    every pod of every group: one evicted pod takes its whole group down (the group is recreated), so at most
    one pod at a time means at most one group at a time."""
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
#: The pod label an InferencePool selects its members by (the servers of one pool share it).
POOL_LABEL = f"{api.GROUP}/inference-pool"
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


def build_all(plan: Plan, owner: Optional[dict] = None,
              template: Optional[dict[str, Any]] = None) -> list[dict[str, Any]]:
    """Every object one VLLMServer wants, in apply order. The plan must fit. `template`: the workload's pod template,
    already built and checked (postbuild.build_and_check); pod_template(plan) otherwise."""
    if not plan.fits:
        raise ValueError("cannot build objects for a plan with problems: " + "; ".join(map(str, plan.problems)))
    spec = plan.spec
    objects: list[dict[str, Any]] = [build_service(plan, owner)]
    if spec.cache is not None and spec.cache.shared:
        objects.append(build_shared_cache_claim(plan, owner))  # before the pods that mount it
    if is_group(spec):
        objects.append(build_leaderworkerset(plan, owner, template))  # LWS makes the group's headless Service itself
    elif spec.workload == "StatefulSet":
        objects.append(build_headless_service(plan, owner))
        objects.append(build_statefulset(plan, owner, template))
    else:
        objects.append(build_daemonset(plan, owner, template))
    if wants_pdb(spec):
        objects.append(build_pdb(plan, owner))
    if spec.autoscaling.enabled and spec.workload == "StatefulSet":
        if spec.autoscaling.mode == "HPA":
            objects.append(build_hpa(plan, owner))
        elif spec.autoscaling.mode == "KEDA":
            objects.append(build_scaled_object(plan, owner))
    objects += build_routing(plan, owner)
    return objects
