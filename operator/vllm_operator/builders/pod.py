"""The pod template: the vLLM container, the download init container, the extra containers, volumes, probes,
placement and security context, then podTemplatePatch over them."""

from __future__ import annotations

import copy
import math
from typing import Any, Optional

from .. import adapters, api, strategic_merge
from ..planner import Plan
from .names import (
    CACHE_MOUNT, GPU_RESOURCE, HF_HOME, HOME, POOL_LABEL, PORT_NAME, labels, quantity, shared_cache_claim_name,
)


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
    # Ready only once the operator loaded the adapters on the pod's vLLM (docs/adapters.md); not on the node's
    # network, where the operator never calls a pod (the gate would never open).
    if spec.adapters and not spec.host_network:
        pod_spec["readinessGates"] = [{"conditionType": adapters.GATE}]
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
