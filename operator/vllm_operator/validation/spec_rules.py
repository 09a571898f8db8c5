"""The spec's rule families, one function each, and `check_spec`, which runs them all: names, autoscaling and
scale to zero, routing, network, cache, nodes, credentials, environment, resources, tolerations, requests against
limits, extraArgs."""

from __future__ import annotations

import re
from typing import Any, Optional

from .. import api, vllm_flags
from ..api import VLLMServerSpec, parse_quantity
from ..urlpolicy import URLPolicy
from .extra_args import FlagCheck, check_extra_args, flag_check
from .hardware import attention_problems
from .tables import (
    DEVICE_PLUGIN_ENV, DEVICE_RESOURCE_PREFIX, MAX_NAME_LENGTH, OWNED_ENV, UNSUPPORTED_QUANTIZATION, Problem,
    _CREDENTIAL_NAME, _CREDENTIAL_VALUE, device_env,
)


def credential_problems(spec: VLLMServerSpec) -> list[Problem]:
    """Every string in the spec that looks like a credential, by field path (the spec is readable by anyone
    who can read the VLLMServer, and it is copied into the pod template)."""
    problems: list[Problem] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(key, str) and _CREDENTIAL_VALUE.search(key):
                    problems.append(Problem(path, "a key looks like a credential in plaintext"))
                walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")
        elif isinstance(node, str) and _CREDENTIAL_VALUE.search(node):
            problems.append(Problem(path, "looks like a credential in plaintext; anyone who can read the VLLMServer "
                                    "can read it. Put it in a Secret and reference it: spec.hfTokenSecretRef for the "
                                    "Hugging Face token, engine.env[].valueFrom.secretKeyRef for anything else"))

    dumped = spec.model_dump(by_alias=True, exclude_none=True)
    dumped.get("engine", {}).pop("env", None)  # check_spec words it per variable
    walk(dumped, "spec")
    return problems


def flag_like_values(spec: VLLMServerSpec) -> list[Problem]:
    """Spec values that become vLLM arguments and start with '-': vLLM would read them as flags. The API's
    pattern refuses them already; this holds for a spec built without validation too (model_construct)."""
    values = (("spec.model.name", spec.model.name, "the model"),
              ("spec.model.servedName", spec.model.served_name, "--served-model-name's value"),
              ("spec.model.revision", spec.model.revision, "--revision's value"))
    return [Problem(where, f"{value!r} starts with '-': vLLM would read it as a flag, not as {what}")
            for where, value, what in values if value and value.startswith("-")]


def check_spec(name: str, spec: VLLMServerSpec, *, default_prometheus_url: Optional[str] = None,
               allow_unsafe_args: bool = False, urls: Optional[URLPolicy] = None,
               checked: Optional[FlagCheck] = None) -> list[Problem]:
    """Semantic checks the CRD schema cannot express, every rule family in turn. Pure. `urls`: the operator's URL
    settings (urlpolicy.py; spec.model.configURL is checked before it is fetched, in pipeline.plan_server);
    `checked`: the spec's flag_check when the caller has it already (the planner's Plan.flags)."""
    checked = checked or flag_check(spec)
    return [
        *name_problems(name),
        *autoscaling_problems(spec, default_prometheus_url, urls),
        *network_problems(spec),
        *cache_problems(spec),
        *node_problems(spec),
        *credential_problems(spec),
        *flag_like_values(spec),
        *env_problems(spec),
        *unsupported_quantization(spec, checked.snapshot),
        *attention_problems(spec, checked.snapshot, checked.exact),
        *resource_problems(spec),
        *toleration_problems(spec),
        *request_limit_problems(spec),
        *routing_problems(spec),
        *check_extra_args(spec.engine.extra_args, allow_unsafe=allow_unsafe_args, loose=not checked.exact,
                          snapshot=checked.snapshot),
    ]


def name_problems(name: str) -> list[Problem]:
    """metadata.name: the children's names and labels derive from it."""
    out = []
    if name[:1].isdigit():
        out.append(Problem("metadata.name", f"{name!r} starts with a digit; the client Service is named after the "
                           "server and Service names must start with a letter (DNS-1035)"))
    if len(name) > MAX_NAME_LENGTH:
        out.append(Problem("metadata.name", f"{len(name)} characters is too long: at most {MAX_NAME_LENGTH}, because "
                           "pod labels derived from it are limited to 63 characters"))
    return out


def autoscaling_problems(spec: VLLMServerSpec, default_prometheus_url: Optional[str],
                         urls: Optional[URLPolicy]) -> list[Problem]:
    """spec.autoscaling: bounds, the workload it needs, and the Prometheus it may query."""
    out = []
    add = lambda f, m: out.append(Problem(f, m))  # noqa: E731
    a = spec.autoscaling
    if a.max_replicas is not None and a.max_replicas < a.min_replicas:  # as the CRD's rule: enabled or not
        add("spec.autoscaling.maxReplicas", f"{a.max_replicas} is below minReplicas {a.min_replicas}")
    if not a.enabled:
        return out
    if spec.workload == "DaemonSet":
        add("spec.autoscaling.enabled", "autoscaling needs workload: StatefulSet; a DaemonSet runs one server per "
            "matching node, so its size follows the nodes (set autoscaling.enabled: false or workload: StatefulSet)")
    if a.max_replicas is None:
        add("spec.autoscaling.maxReplicas", "required when autoscaling is enabled")
    if a.source == "Prometheus" and a.mode == "Operator" and not (a.prometheus_url or default_prometheus_url):
        add("spec.autoscaling.prometheusURL", "source: Prometheus needs prometheusURL (or the operator's "
            "--prometheus-url default)")
    if a.prometheus_url and urls is not None and (why := urls.prometheus_problem(a.prometheus_url)):
        add("spec.autoscaling.prometheusURL", why)
    if a.mode == "KEDA" and not (a.prometheus_url or default_prometheus_url):
        add("spec.autoscaling.prometheusURL", "mode: KEDA needs prometheusURL (or the operator's "
            "--prometheus-url default): the ScaledObject's Prometheus trigger queries it")
    if a.min_replicas == 0:
        out += scale_to_zero_problems(spec)
    return out


def scale_to_zero_problems(spec: VLLMServerSpec) -> list[Problem]:
    """autoscaling.minReplicas 0 (as the CRD's rules): something must wake the server while no pod runs."""
    a = spec.autoscaling
    if a.max_replicas is not None and a.max_replicas < 1:
        return [Problem("spec.autoscaling.maxReplicas", "must be at least 1")]
    if a.mode == "HPA":
        return [Problem("spec.autoscaling.minReplicas", "a HorizontalPodAutoscaler cannot scale to zero "
                        "(Kubernetes' HPAScaleToZero gate is alpha): use mode Operator or KEDA for minReplicas 0")]
    if a.mode == "Operator" and not spec.routing.inference_pool.enabled:
        return [Problem("spec.autoscaling.minReplicas", "minReplicas 0 with mode Operator needs "
                        "routing.inferencePool.enabled: the endpoint picker's count of requests that found no pod "
                        "is what wakes a server at zero")]
    return []


def routing_problems(spec: VLLMServerSpec) -> list[Problem]:
    """spec.routing (as the CRD's rules): a route needs the pool it routes to, and a Gateway to attach to."""
    r, out = spec.routing, []
    if r.http_route.enabled and not r.inference_pool.enabled:
        out.append(Problem("spec.routing.httpRoute.enabled", "an HTTPRoute routes to the InferencePool: set "
                           "inferencePool.enabled"))
    if r.http_route.enabled and not r.http_route.gateway_name:
        out.append(Problem("spec.routing.httpRoute.gatewayName", "required when the route is enabled"))
    if r.inference_pool.enabled and spec.nodes > 1:
        out.append(Problem("spec.routing.inferencePool.enabled", "not with spec.nodes > 1 yet: the pool would select "
                           "a group's worker pods too, and only its leader serves requests (route to the server's "
                           "Service instead)"))
    return out


def network_problems(spec: VLLMServerSpec) -> list[Problem]:
    """spec.hostNetwork: only where one server runs per node."""
    if spec.host_network and spec.workload != "DaemonSet":
        return [Problem("spec.hostNetwork", "only a DaemonSet may use the node's network (replicas of a StatefulSet "
                        "would collide on port 8000)")]
    return []


def cache_problems(spec: VLLMServerSpec) -> list[Problem]:
    """spec.cache: an existing claim or a new one, per replica or shared, as the workload allows."""
    c = spec.cache
    if c is None:
        return []
    if c.claim_name and (c.size or c.storage_class_name):
        return [Problem("spec.cache", "set either claimName (an existing claim) or size/storageClassName (a new "
                        "claim per replica), not both")]
    if not c.claim_name and not c.size:
        return [Problem("spec.cache", "set size (a new claim per replica) or claimName (an existing claim)")]
    if c.shared and not c.size:
        return [Problem("spec.cache.shared", "shared needs size (the claim the operator creates for every replica); "
                        "a claimName is shared as it is")]
    if c.size and not c.shared and spec.workload == "DaemonSet":
        return [Problem("spec.cache.size", "a DaemonSet cannot create a claim per pod; set cache.shared (one "
                        "ReadWriteMany claim for every node) or use cache.claimName (ReadWriteMany or ReadOnlyMany)")]
    return []


def node_problems(spec: VLLMServerSpec) -> list[Problem]:
    """spec.nodes: a group of nodes is a LeaderWorkerSet of whole GPUs with no claim per pod (the CRD's rules)."""
    out = max_nodes_problems(spec)
    if spec.nodes == 1:
        return out
    return out + _group_problems(spec, "spec.nodes", is_group="a server across nodes is", instead="nodes: 1",
                                 claims="a group of nodes")


def max_nodes_problems(spec: VLLMServerSpec) -> list[Problem]:
    """spec.maxNodes: the planner may choose a group, so what a group may not be is refused up front (the CRD's
    rules), and it excludes a fixed node count."""
    if spec.max_nodes is None:
        return []
    out = []
    if spec.nodes > 1:
        out.append(Problem("spec.maxNodes", "nodes and maxNodes exclude each other: nodes fixes the count, maxNodes "
                           "lets the planner choose the fewest nodes that fit, up to it"))
    return out + _group_problems(spec, "spec.maxNodes", is_group="maxNodes may make the server",
                                 instead="leave maxNodes out", claims="maxNodes may choose a group of nodes, which")


def _group_problems(spec: VLLMServerSpec, field: str, *, is_group: str, instead: str, claims: str) -> list[Problem]:
    """What a LeaderWorkerSet group may not be, named on `field` (spec.nodes, or spec.maxNodes, which may choose
    one): a DaemonSet, MIG slices, a claim per pod."""
    out = []
    if spec.workload != "StatefulSet":
        out.append(Problem(field, f"{is_group} a LeaderWorkerSet of groups (workload: StatefulSet); a DaemonSet runs "
                           "one single-node server per matching node"))
    if spec.gpu.mig_profile:
        out.append(Problem(field, "vLLM cannot run across nodes on MIG slices: use whole GPUs (gpu.count) or "
                           f"{instead}"))
    if spec.cache is not None and spec.cache.size and not spec.cache.shared:
        out.append(Problem("spec.cache.size", f"{claims} gets no claim per pod: set cache.shared (one ReadWriteMany "
                           "claim every node mounts) or cache.claimName"))
    return out


def env_problems(spec: VLLMServerSpec) -> list[Problem]:
    """spec.engine.env: nothing the device plugin or the operator owns, no credential in plaintext."""
    out = []
    for i, env in enumerate(spec.engine.env):
        where = f"spec.engine.env[{i}]"
        if device_env(env.name):
            why = DEVICE_PLUGIN_ENV.get(env.name, DEVICE_PLUGIN_ENV["NVIDIA_VISIBLE_DEVICES"])
            out.append(Problem(where, f"{env.name} may not be set: {why}. Choose the GPUs "
                               "with spec.gpu (count, product)"))
        elif env.name in OWNED_ENV:
            out.append(Problem(where, f"{env.name} is set by the operator; use hfTokenSecretRef for tokens and cache "
                               "for HF_HOME"))
        elif env.value_from is not None and env.value:
            out.append(Problem(where, f"{env.name}: set value or valueFrom, not both"))
        elif _CREDENTIAL_VALUE.search(env.value) or (_CREDENTIAL_NAME.search(env.name) and env.value):
            out.append(Problem(where, f"{env.name} looks like a credential in plaintext; anyone who can read the "
                               "VLLMServer can read it. Put it in a Secret and reference it with spec.hfTokenSecretRef "
                               "(the Hugging Face token) or valueFrom.secretKeyRef"))
    return out


def unsupported_quantization(spec: VLLMServerSpec, snap: vllm_flags.Snapshot) -> list[Problem]:
    """spec.model.quantization values the API accepts but the image's vLLM does not have."""
    method = spec.model.quantization
    if method in UNSUPPORTED_QUANTIZATION:
        return [Problem("spec.model.quantization", f"vLLM {snap.version} has no quantization method "
                        f"{method!r} and would exit at start: {UNSUPPORTED_QUANTIZATION[method]}")]
    return []


def resource_problems(spec: VLLMServerSpec) -> list[Problem]:
    """spec.resources and the sizes elsewhere: no GPU resource by hand, no negative quantity."""
    out = []
    # Every NVIDIA device resource, not only the one spec.gpu names: nvidia.com/gpu.shared beside gpu.count would
    # hand the pod devices the plan, the quota's reading of spec.gpu and the admission policy never saw.
    gpu_resources = {k for k in [*spec.resources.requests, *spec.resources.limits]
                     if k.startswith(DEVICE_RESOURCE_PREFIX) or k == spec.gpu.resource_name}
    for key in sorted(gpu_resources):
        out.append(Problem("spec.resources", f"{key} comes from spec.gpu (count, migProfile, resourceName); remove it "
                           "from resources"))
    sizes = [("spec.gpu.memory", spec.gpu.memory), ("spec.gpu.reservedMemory", spec.gpu.reserved_memory),
             ("spec.shmSize", spec.shm_size), ("spec.cache.size", spec.cache.size if spec.cache else None)]
    sizes += [(f"spec.resources.{side}.{k}", v) for side, values in (("requests", spec.resources.requests),
                                                                     ("limits", spec.resources.limits))
              for k, v in values.items()]
    for where, value in sizes:
        if value is not None and parse_quantity(value) < 0:
            out.append(Problem(where, f"{value} is negative"))
    return out


def toleration_problems(spec: VLLMServerSpec) -> list[Problem]:
    """spec.tolerations: what the API server would refuse in the pod template."""
    out = []
    for i, t in enumerate(spec.tolerations):
        where = f"spec.tolerations[{i}]"
        if t.operator == "Exists" and t.value:
            out.append(Problem(f"{where}.value", "must be empty with operator: Exists"))
        if not t.key and t.operator != "Exists":
            out.append(Problem(f"{where}.operator", "must be Exists when key is empty (a toleration of every taint)"))
        if t.toleration_seconds is not None and t.effect != "NoExecute":
            out.append(Problem(f"{where}.tolerationSeconds", "applies to effect: NoExecute only"))
        if t.value and not re.match(api.LABEL_VALUE_PATTERN, t.value) or (t.value and len(t.value) > 63):
            out.append(Problem(f"{where}.value", f"{t.value!r} is not a label value (at most 63 letters, digits, "
                               "'-', '_' or '.')"))
    return out


def above_limit_problems(where: str, resources: api.ResourceOverrides) -> list[Problem]:
    """Requests above their limits in one container's resources (`where`: the field path of the resources)."""
    requests, limits = resources.requests, resources.limits
    return [Problem(f"{where}.requests.{key}", f"{requests[key]} is above the limit {limits[key]}; Kubernetes refuses "
                    "a request above its limit")
            for key in sorted(set(requests) & set(limits)) if parse_quantity(requests[key]) > parse_quantity(limits[key])]


def request_limit_problems(spec: VLLMServerSpec) -> list[Problem]:
    """spec.resources requests against limits, as Kubernetes checks them."""
    out = above_limit_problems("spec.resources", spec.resources)
    requests, limits = spec.resources.requests, spec.resources.limits
    for key, request in requests.items():
        if overcommittable(key):
            continue
        limit = limits.get(key)
        if limit is None:
            out.append(Problem(f"spec.resources.requests.{key}", f"{key} cannot be overcommitted, so Kubernetes needs "
                               f"a limit equal to the request: set spec.resources.limits.{key} to {request} (or only "
                               "the limit)"))
        elif parse_quantity(request) != parse_quantity(limit):
            out.append(Problem(f"spec.resources.requests.{key}", f"{request} differs from the limit {limit}; {key} "
                               "cannot be overcommitted, so Kubernetes refuses a request other than the limit"))
    return out


def overcommittable(resource: str) -> bool:
    """Whether Kubernetes lets a request be below the limit: native resources (cpu, memory, ephemeral-storage,
    any *kubernetes.io/ name) but hugepages; extended resources (example.com/foo, devices) must be equal."""
    native = "/" not in resource or "kubernetes.io/" in resource
    return native and not resource.startswith("hugepages-")
