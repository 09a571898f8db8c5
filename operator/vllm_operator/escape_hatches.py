"""The escape hatches' rules: extra volumes and containers, and spec.podTemplatePatch, checked on the final pod
template. Pure.

The typed fields (spec.volumes, spec.volumeMounts, spec.initContainers, spec.sidecars) are what the chart's
admission policy checks against the requester's RBAC (each Secret, ConfigMap and claim they name). The patch is
free-form, so it may only adjust: the final template, after the patch, must

1. reference no Secret, ConfigMap or claim and run no image the template had not before the patch (so every
   grant went through the typed fields, and the admission policy);
2. leave what the operator derives as it was: the vLLM container's image, command, args, ports, probes,
   preStop hook and GPUs, the owned variables (HOME, HF_HOME, HF_TOKEN), the download container, the operator's
   volumes, the selector labels, and the pod fields the spec has its own field for (PROTECTED_POD_FIELDS);
3. pass Pod Security "restricted" except the host namespaces the spec asks for (podsecurity.beyond_the_spec);
4. request GPUs only in the vLLM container, only as spec.gpu says, and never name which GPUs a container sees
   (NVIDIA_VISIBLE_DEVICES=all would hand a container every GPU of the node, past the device plugin).

Each rule is a Problem naming the field (spec.podTemplatePatch.spec.containers[vllm].args, ...) and what to set
instead. Every walk is linear in the template's size, which the patch's bounds (strategic_merge) and the CRD bound.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from . import api, builders, podsecurity, strategic_merge
from .planner import Plan
from .validation import Problem, above_limit_problems

PATCH_FIELD = "spec.podTemplatePatch"
#: Pod fields the spec sets through fields of its own (or the operator derives): the patch may not change them.
PROTECTED_POD_FIELDS = {
    "serviceAccountName": "use spec.serviceAccountName",
    "serviceAccount": "use spec.serviceAccountName",
    "automountServiceAccountToken": "vLLM never calls the Kubernetes API, so the pods get no token",
    "priorityClassName": "use spec.priorityClassName",
    "priority": "use spec.priorityClassName",
    "runtimeClassName": "use spec.runtimeClassName",
    "hostNetwork": "use spec.hostNetwork",
    "hostIPC": "use spec.ipc",
    "hostPID": "the pods never share the node's process namespace",
    "hostUsers": "the pods never share the node's user namespace",
    "nodeName": "use spec.nodeSelector or spec.affinity",
    "terminationGracePeriodSeconds": "it covers the drain; use spec.engine.shutdownTimeoutSeconds",
    "enableServiceLinks": "a Service's variables would override vLLM's VLLM_* settings",
    "resourceClaims": "the GPUs come from spec.gpu",
}
#: Fields of the vLLM container the operator derives, and what to do instead.
PROTECTED_VLLM_FIELDS = {
    "image": "use spec.image",
    "command": "the image's entrypoint is `vllm serve`",
    "args": "use spec.engine (or spec.engine.extraArgs)",
    "ports": "the Services and probes use port http",
    "startupProbe": "use spec.startupSeconds",
    "readinessProbe": "the probes ask /health on port http",
    "livenessProbe": "the probes ask /health on port http",
    "lifecycle": "the preStop sleep is part of the drain",
}
#: Variables that name the GPUs a container sees: the device plugin sets them to the allocated ones.
GPU_VISIBILITY_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
GPU_RESOURCE_PREFIX = "nvidia.com/"


# --------------------------------------------------------------------------- the typed fields
def spec_problems(spec: api.VLLMServerSpec) -> list[Problem]:
    """What the CRD's rules refuse at the API server (names, one volume source), again for the CLI, and what needs
    the whole spec: mounts of volumes that exist, names unique over initContainers and sidecars."""
    out: list[Problem] = []
    volumes = {v.name for v in spec.volumes}
    for i, v in enumerate(spec.volumes):
        sources = [v.empty_dir, v.secret, v.config_map, v.persistent_volume_claim]
        if sum(s is not None for s in sources) != 1:
            out.append(Problem(f"spec.volumes[{i}]", "set exactly one of emptyDir, secret, configMap, "
                                                     "persistentVolumeClaim"))
        if v.name in api.OPERATOR_VOLUMES:
            out.append(Problem(f"spec.volumes[{i}].name", f"{v.name} is the operator's own volume; pick another name"))
    if len(volumes) != len(spec.volumes):
        out.append(Problem("spec.volumes", "volume names must be unique"))
    out += _mount_problems("spec.volumeMounts", spec.volume_mounts, volumes, vllm=True)
    seen: set[str] = set()
    for key, containers in (("initContainers", spec.init_containers), ("sidecars", spec.sidecars)):
        for i, c in enumerate(containers):
            where = f"spec.{key}[{i}]"
            if c.name in api.OPERATOR_CONTAINERS or c.name in seen:
                out.append(Problem(f"{where}.name", f"{c.name} is taken (vllm and download are the operator's; names "
                                                    "are unique over initContainers and sidecars)"))
            seen.add(c.name)
            out += _mount_problems(f"{where}.volumeMounts", c.volume_mounts, volumes, vllm=False)
            out += above_limit_problems(f"{where}.resources", c.resources)
            for side in ("requests", "limits"):
                for name in getattr(c.resources, side):
                    if name.startswith(GPU_RESOURCE_PREFIX):
                        out.append(Problem(f"{where}.resources.{side}", f"{name}: GPUs are the vLLM container's, "
                                                                        "from spec.gpu"))
    patch = spec.pod_template_patch
    if patch is not None and set(patch) - {"metadata", "spec"}:
        out.append(Problem(PATCH_FIELD, "a pod template patch holds metadata and spec only"))
    return out


def _mount_problems(where: str, mounts: list[api.VolumeMount], volumes: set[str], *, vllm: bool) -> list[Problem]:
    out = []
    known = volumes | {"cache"}
    for i, m in enumerate(mounts):
        if m.name not in known:
            out.append(Problem(f"{where}[{i}].name", f"no volume {m.name}: name one of spec.volumes "
                                                     f"({', '.join(sorted(volumes)) or 'none'}) or cache"))
        if vllm and (m.name == "cache" or any(m.mount_path == p or m.mount_path.startswith(p + "/")
                                              for p in api.OPERATOR_MOUNT_PATHS)):
            out.append(Problem(f"{where}[{i}]", "the vLLM container already mounts cache at /cache, and /home/vllm "
                                                "and /dev/shm are the operator's; mount elsewhere"))
    return out


# --------------------------------------------------------------------------- the final template
def template_problems(plan: Plan) -> list[Problem]:
    """The final pod template (after spec.podTemplatePatch) against the rules of the module's docstring.
    Call on a plan without other problems (the template needs its numbers)."""
    spec = plan.spec
    base = builders.base_pod_template(plan)
    if spec.pod_template_patch is None:
        final = base
    else:
        try:
            strategic_merge.check_bounds(spec.pod_template_patch, PATCH_FIELD)
            final = strategic_merge.apply(base, spec.pod_template_patch)
        except strategic_merge.PatchError as exc:
            path = exc.path if exc.path.startswith(PATCH_FIELD) else f"{PATCH_FIELD}.{exc.path}"
            return [Problem(path, exc.message)]
    if not isinstance(final.get("spec"), dict) or not isinstance(final.get("metadata"), dict):
        return [Problem(PATCH_FIELD, "its metadata and spec must be maps")]
    shape = _shape_problems(final["spec"])
    if shape:
        return shape
    try:
        out = _derived_fields(plan, base, final) + _grants(base, final) + _gpus(plan, final)
        found = podsecurity.beyond_the_spec(final["spec"], host_ipc=spec.ipc == "Host",
                                            host_network=spec.host_network)
    except (AttributeError, TypeError):
        # A field of the wrong kind (a string where the pod template has a map or a list): the API server would
        # refuse the workload; say so here instead.
        return [Problem(PATCH_FIELD, "does not make a valid pod template: a field holds a value of the wrong "
                                     "type (a string where a map or list belongs, or the reverse)")]
    reported = {p.field for p in out}
    out += [Problem(f"{PATCH_FIELD}.spec.{v.path}", f"{v.what}: the operator's pods pass Pod Security "
                                                     "\"restricted\" (docs/security.md)")
            for v in found if f"{PATCH_FIELD}.spec.{v.path}" not in reported]
    return out


#: The lists of maps and the maps of a pod spec and its containers the rules read: a patch that gives one of
#: them another type is refused by name, before the rules look into it.
_POD_LISTS = ("initContainers", "containers", "volumes", "imagePullSecrets")
_CONTAINER_LISTS = ("env", "envFrom", "ports", "volumeMounts")
_CONTAINER_MAPS = ("securityContext", "resources")


def _shape_problems(pod_spec: dict[str, Any]) -> list[Problem]:
    out = []
    for key in _POD_LISTS:
        items = pod_spec.get(key)
        if items is not None and not (isinstance(items, list) and all(isinstance(i, dict) for i in items)):
            out.append(Problem(f"{PATCH_FIELD}.spec.{key}", "must be a list of maps"))
    if out:
        return out
    for at, c in _containers(pod_spec):
        for key in _CONTAINER_LISTS:
            items = c.get(key)
            if items is not None and not (isinstance(items, list) and all(isinstance(i, dict) for i in items)):
                out.append(Problem(f"{PATCH_FIELD}.spec.{at}.{key}", "must be a list of maps"))
        out += [Problem(f"{PATCH_FIELD}.spec.{at}.{key}", "must be a map") for key in _CONTAINER_MAPS
                if c.get(key) is not None and not isinstance(c.get(key), dict)]
    if pod_spec.get("securityContext") is not None and not isinstance(pod_spec["securityContext"], dict):
        out.append(Problem(f"{PATCH_FIELD}.spec.securityContext", "must be a map"))
    return out


def _changed(base: dict[str, Any], final: dict[str, Any], keys: Iterable[str]) -> list[str]:
    """The keys whose value the patch changed (added, removed or altered), in the order given."""
    return [key for key in keys if final.get(key) != base.get(key)]


def _by_name(items: Any) -> dict[str, dict[str, Any]]:
    return {str(i.get("name")): i for i in items or [] if isinstance(i, dict)}


def _derived_fields(plan: Plan, base: dict[str, Any], final: dict[str, Any]) -> list[Problem]:
    out = []
    base_spec, final_spec = base["spec"], final.get("spec") or {}
    labels = (final.get("metadata") or {}).get("labels") or {}
    for key, value in builders.labels(plan.name).items():
        if labels.get(key) != value:
            out.append(Problem(f"{PATCH_FIELD}.metadata.labels[{key}]", "the operator's label (the workload's "
                                                                        "selector and the Services use it)"))
    for key in _changed(base_spec, final_spec, PROTECTED_POD_FIELDS):
        out.append(Problem(f"{PATCH_FIELD}.spec.{key}", f"set by the operator: {PROTECTED_POD_FIELDS[key]}"))
    volumes = _by_name(base_spec.get("volumes")), _by_name(final_spec.get("volumes"))
    for name in _changed(*volumes, api.OPERATOR_VOLUMES):
        out.append(Problem(f"{PATCH_FIELD}.spec.volumes[{name}]", "the operator's volume; use spec.cache, "
                                                                   "spec.ipc or spec.shmSize"))
    vllm = _by_name(final_spec.get("containers")).get("vllm")
    base_vllm = _by_name(base_spec.get("containers"))["vllm"]
    where = f"{PATCH_FIELD}.spec.containers[vllm]"
    if vllm is None:
        return out + [Problem(where, "the vLLM container may not be removed")]
    for key in _changed(base_vllm, vllm, PROTECTED_VLLM_FIELDS):
        out.append(Problem(f"{where}.{key}", f"derived by the operator: {PROTECTED_VLLM_FIELDS[key]}"))
    for name in _changed(_by_name(base_vllm.get("env")), _by_name(vllm.get("env")), api.OWNED_ENV):
        out.append(Problem(f"{where}.env[{name}]", "set by the operator; use spec.cache or spec.hfTokenSecretRef"))
    base_download = _by_name(base_spec.get("initContainers")).get(builders.DOWNLOAD_CONTAINER)
    download = _by_name(final_spec.get("initContainers")).get(builders.DOWNLOAD_CONTAINER)
    if download != base_download:
        out.append(Problem(f"{PATCH_FIELD}.spec.initContainers[{builders.DOWNLOAD_CONTAINER}]",
                           "the operator's model download; use spec.model.download: Engine to have vLLM download"))
    return out


def _containers(pod_spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for key in ("initContainers", "containers"):
        for c in pod_spec.get(key) or []:
            if isinstance(c, dict):
                yield f"{key}[{c.get('name')}]", c


def references(pod_spec: dict[str, Any]) -> dict[tuple[str, str], str]:
    """Every Secret, ConfigMap and claim a pod spec names, (kind, name) -> the first field naming it."""
    out: dict[tuple[str, str], str] = {}

    def add(kind: str, name: Any, where: str) -> None:
        if isinstance(name, str):
            out.setdefault((kind, name), where)

    def get(obj: Any, *keys: str) -> Any:
        for key in keys:
            obj = obj.get(key) if isinstance(obj, dict) else None
        return obj

    for s in pod_spec.get("imagePullSecrets") or []:
        add("Secret", get(s, "name"), "imagePullSecrets")
    for v in pod_spec.get("volumes") or []:
        at = f"volumes[{get(v, 'name')}]"
        add("Secret", get(v, "secret", "secretName"), f"{at}.secret.secretName")
        add("ConfigMap", get(v, "configMap", "name"), f"{at}.configMap.name")
        add("PersistentVolumeClaim", get(v, "persistentVolumeClaim", "claimName"), f"{at}.persistentVolumeClaim.claimName")
        add("Secret", get(v, "csi", "nodePublishSecretRef", "name"), f"{at}.csi.nodePublishSecretRef.name")
        for i, source in enumerate(get(v, "projected", "sources") or []):
            add("Secret", get(source, "secret", "name"), f"{at}.projected.sources[{i}].secret.name")
            add("ConfigMap", get(source, "configMap", "name"), f"{at}.projected.sources[{i}].configMap.name")
    for at, c in _containers(pod_spec):
        for e in c.get("env") or []:
            where = f"{at}.env[{get(e, 'name')}].valueFrom"
            add("Secret", get(e, "valueFrom", "secretKeyRef", "name"), f"{where}.secretKeyRef.name")
            add("ConfigMap", get(e, "valueFrom", "configMapKeyRef", "name"), f"{where}.configMapKeyRef.name")
        for i, e in enumerate(c.get("envFrom") or []):
            add("Secret", get(e, "secretRef", "name"), f"{at}.envFrom[{i}].secretRef.name")
            add("ConfigMap", get(e, "configMapRef", "name"), f"{at}.envFrom[{i}].configMapRef.name")
    return out


def _grants(base: dict[str, Any], final: dict[str, Any]) -> list[Problem]:
    base_spec, final_spec = base["spec"], final.get("spec") or {}
    declared = references(base_spec)
    out = [Problem(f"{PATCH_FIELD}.spec.{where}", f"{kind} {name} is not named by a typed field: name it in "
                                                   "spec.volumes, spec.engine.env or a container's env, where the "
                                                   "admission policy checks that you may read it")
           for (kind, name), where in references(final_spec).items() if (kind, name) not in declared]
    images = {c.get("image") for _, c in _containers(base_spec)}
    out += [Problem(f"{PATCH_FIELD}.spec.{at}.image", f"{c.get('image')!r} is not an image of spec.image, "
                                                      "spec.initContainers or spec.sidecars: add the container there")
            for at, c in _containers(final_spec) if c.get("image") not in images]
    return out


def _gpus(plan: Plan, final: dict[str, Any]) -> list[Problem]:
    out = []
    for at, c in _containers(final.get("spec") or {}):
        where = f"{PATCH_FIELD}.spec.{at}"
        for e in c.get("env") or []:
            if isinstance(e, dict) and e.get("name") in GPU_VISIBILITY_ENV:
                out.append(Problem(f"{where}.env[{e['name']}]", "the NVIDIA device plugin sets which GPUs a "
                                                                "container sees; use spec.gpu"))
        if at == "containers[vllm]":
            continue
        resources = c.get("resources") or {}
        for side in ("requests", "limits"):
            for name in resources.get(side) or {} if isinstance(resources.get(side), dict) else {}:
                if name.startswith(GPU_RESOURCE_PREFIX):
                    out.append(Problem(f"{where}.resources.{side}", f"{name}: GPUs are the vLLM container's, from "
                                                                    "spec.gpu"))
    vllm = _by_name((final.get("spec") or {}).get("containers")).get("vllm") or {}
    base = builders.container_resources(plan)
    for side in ("requests", "limits"):
        got = {k: v for k, v in ((vllm.get("resources") or {}).get(side) or {}).items()
               if k.startswith(GPU_RESOURCE_PREFIX)}
        want = {k: v for k, v in base[side].items() if k.startswith(GPU_RESOURCE_PREFIX)}
        if got != want:
            out.append(Problem(f"{PATCH_FIELD}.spec.containers[vllm].resources.{side}",
                               "the GPUs come from spec.gpu (count, migProfile)"))
    return out


def problems(plan: Plan) -> list[Problem]:
    """Both checks: the typed fields always, the final template once the rest of the plan fits."""
    found = spec_problems(plan.spec)
    if plan.fits and not found:
        found += template_problems(plan)
    return found
