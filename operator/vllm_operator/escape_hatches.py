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

import json
import unicodedata
from typing import Any, Callable, Iterable, Iterator, Optional

from . import api, builders, podsecurity, strategic_merge, validation
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
            # The CRD's rule on every EnvVar (api.EnvVar), for `plan`: engine.env's is validation.env_problems.
            out += [Problem(f"{where}.env[{j}].name", "this variable is set by the operator (HOME, HF_HOME, HF_TOKEN: "
                            "use spec.cache and spec.hfTokenSecretRef) or by the NVIDIA device plugin and container "
                            "toolkit (CUDA_VISIBLE_DEVICES, NVIDIA_*: use spec.gpu)")
                    for j, e in enumerate(c.env) if e.name in api.OWNED_ENV or validation.device_env(e.name)]
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
def final_template(plan: Plan, base: dict[str, Any]) -> tuple[Optional[dict[str, Any]], list[Problem]]:
    """The pod template after spec.podTemplatePatch over `base` (builders.base_pod_template), and what the rules
    of the module's docstring find in it; the template is None when the patch makes none (past its bounds, a
    metadata or spec that is not a map)."""
    spec = plan.spec
    if spec.pod_template_patch is None:
        final = base
    else:
        try:
            strategic_merge.check_bounds(spec.pod_template_patch, PATCH_FIELD)
            final = strategic_merge.apply(base, spec.pod_template_patch)
        except strategic_merge.PatchError as exc:
            path = exc.path if exc.path.startswith(PATCH_FIELD) else f"{PATCH_FIELD}.{exc.path}"
            return None, _bounded([Problem(path, exc.message)])
    if not isinstance(final.get("spec"), dict) or not isinstance(final.get("metadata"), dict):
        return None, [Problem(PATCH_FIELD, "its metadata and spec must be maps")]
    return final, _final_problems(plan, base, final)


def _final_problems(plan: Plan, base: dict[str, Any], final: dict[str, Any]) -> list[Problem]:
    spec = plan.spec
    shape = _shape_problems(final["spec"])
    if shape:
        return _bounded(shape)
    try:
        out = _derived_fields(plan, base, final) + _volume_kinds(final["spec"]) + _grants(base, final)
        out += _gpus(plan, base, final) + _metadata(final) + _allowlist(plan, base, final)
        found = podsecurity.beyond_the_spec(final["spec"], host_ipc=spec.ipc == "Host",
                                            host_network=spec.host_network,
                                            annotations=final["metadata"].get("annotations"))
    except (AttributeError, TypeError, KeyError, ValueError):
        # A field of the wrong kind (a string where the pod template has a map or a list): the API server would
        # refuse the workload; say so here instead.
        return [Problem(PATCH_FIELD, "does not make a valid pod template: a field holds a value of the wrong "
                                     "type (a string where a map or list belongs, or the reverse)")]
    out += _pod_security(spec, base, final, found)
    return _bounded(_first_per_field(out))


#: At most this many problems of the final template are reported (a patch of a thousand unknown keys is one
#: finding, not a thousand lines of status), each field and message cut to these lengths.
MAX_PROBLEMS = 12
MAX_FIELD_CHARS = 256
MAX_MESSAGE_CHARS = 512


def _clean(text: str, limit: int) -> str:
    """One line for a condition: control and format characters (newlines, ANSI escapes, bidi overrides) made '?',
    cut to `limit` characters. The patch's keys are the tenant's and end up in field paths."""
    out = "".join("?" if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") else ch for ch in text)
    return out if len(out) <= limit else out[:limit - 1] + "…"


def _bounded(found: list[Problem]) -> list[Problem]:
    out = [Problem(_clean(p.field, MAX_FIELD_CHARS), _clean(p.message, MAX_MESSAGE_CHARS))
           for p in found[:MAX_PROBLEMS]]
    if len(found) > MAX_PROBLEMS:
        out.append(Problem(PATCH_FIELD, f"and {len(found) - MAX_PROBLEMS} more problems like these"))
    return out


def _pod_security(spec: api.VLLMServerSpec, base: dict[str, Any], final: dict[str, Any],
                  found: list[podsecurity.Violation]) -> list[Problem]:
    """The final template's Pod Security violations, each at the field that made it: an annotation spec.podAnnotations
    set (as it is in the template without the patch) is that field's, everything else the patch's."""
    out = []
    base_annotations = base["metadata"].get("annotations") or {}
    for v in found:
        key = v.path[len("metadata.annotations["):-1] if v.path.startswith("metadata.annotations[") else None
        if key is not None and key in spec.pod_annotations and base_annotations.get(key) == spec.pod_annotations[key] \
                and (final["metadata"].get("annotations") or {}).get(key) == base_annotations.get(key):
            field = f"spec.podAnnotations[{key}]"
        else:
            field = f"{PATCH_FIELD}.{v.path}" if key is not None else f"{PATCH_FIELD}.spec.{v.path}"
        out.append(Problem(field, f"{v.what}: the operator's pods pass Pod Security \"restricted\" "
                                  "(docs/security.md)"))
    return out


def _first_per_field(found: list[Problem]) -> list[Problem]:
    """One problem per field: the first (the most specific rules run first), and none under or above a field
    already reported (containers[miner] after containers[miner].image)."""
    out: list[Problem] = []
    for p in found:
        if not any(_nested(p.field, q.field) or _nested(q.field, p.field) for q in out):
            out.append(p)
    return out


def _nested(inner: str, outer: str) -> bool:
    return inner == outer or (inner.startswith(outer) and inner[len(outer)] in ".[")


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
    """Every Secret, ConfigMap, claim, token, certificate and volume source a pod spec lets a container see, (kind,
    name) -> the first field naming it: env valueFrom, envFrom (with or without prefix), every volume kind (a kind
    not offered as (kind + " volume", its name)), projected sources, ephemeral claims, imagePullSecrets."""
    out: dict[tuple[str, str], str] = {}

    def add(kind: str, name: Any, where: str) -> None:
        if name is not None:
            out.setdefault((kind, name if isinstance(name, str) else json.dumps(name, sort_keys=True)), where)

    for s in _items(pod_spec.get("imagePullSecrets")):
        add("Secret", _get(s, "name"), "imagePullSecrets")
    for v in _items(pod_spec.get("volumes")):
        _volume_references(v, f"volumes[{_get(v, 'name')}]", add)
    for at, c in _containers(pod_spec):
        for e in _items(c.get("env")):
            where = f"{at}.env[{_get(e, 'name')}].valueFrom"
            add("Secret", _get(e, "valueFrom", "secretKeyRef", "name"), f"{where}.secretKeyRef.name")
            add("ConfigMap", _get(e, "valueFrom", "configMapKeyRef", "name"), f"{where}.configMapKeyRef.name")
        for i, e in enumerate(_items(c.get("envFrom"))):
            add("Secret", _get(e, "secretRef", "name"), f"{at}.envFrom[{i}].secretRef.name")
            add("ConfigMap", _get(e, "configMapRef", "name"), f"{at}.envFrom[{i}].configMapRef.name")
        for i, claim in enumerate(_items(_get(c, "resources", "claims"))):
            add("ResourceClaim", _get(claim, "name"), f"{at}.resources.claims[{i}]")
    for claim in _items(pod_spec.get("resourceClaims")):
        add("ResourceClaim", _get(claim, "name"), f"resourceClaims[{_get(claim, 'name')}]")
    return out


def _items(value: Any) -> list[dict[str, Any]]:
    return [i for i in value if isinstance(i, dict)] if isinstance(value, list) else []


def _get(obj: Any, *keys: str) -> Any:
    for key in keys:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def _volume_references(v: dict[str, Any], at: str, add: Callable[[str, Any, str], None]) -> None:
    add("Secret", _get(v, "secret", "secretName"), f"{at}.secret.secretName")
    add("ConfigMap", _get(v, "configMap", "name"), f"{at}.configMap.name")
    add("PersistentVolumeClaim", _get(v, "persistentVolumeClaim", "claimName"), f"{at}.persistentVolumeClaim.claimName")
    for i, source in enumerate(_items(_get(v, "projected", "sources"))):
        where = f"{at}.projected.sources[{i}]"
        add("Secret", _get(source, "secret", "name"), f"{where}.secret.name")
        add("ConfigMap", _get(source, "configMap", "name"), f"{where}.configMap.name")
        # a token (by its audience), a certificate (by its signer), a trust bundle: what the pod gets is named there
        for kind, key, name in (("ServiceAccountToken", "serviceAccountToken", "audience"),
                                ("PodCertificate", "podCertificate", "signerName"),
                                ("ClusterTrustBundle", "clusterTrustBundle", "signerName"),
                                ("ClusterTrustBundle", "clusterTrustBundle", "name")):
            if key in source:
                add(kind, _get(source, key, name) or "", f"{where}.{key}")
    template = _get(v, "ephemeral", "volumeClaimTemplate", "spec")
    if template is not None:
        add("PersistentVolume", _get(template, "volumeName") or "", f"{at}.ephemeral.volumeClaimTemplate")
        for ref in ("dataSource", "dataSourceRef"):
            add(str(_get(template, ref, "kind") or "PersistentVolumeClaim"), _get(template, ref, "name"),
                f"{at}.ephemeral.volumeClaimTemplate.spec.{ref}")
    for kind in set(v) - {"name", "secret", "configMap", "persistentVolumeClaim", "projected", "emptyDir",
                          "downwardAPI"}:
        # csi, hostPath, nfs, image, ephemeral, ... and the Secrets their secretRef names
        add(f"{kind} volume", json.dumps(v.get(kind), sort_keys=True), f"{at}.{kind}")
        add("Secret", _get(v, kind, "secretRef", "name") or _get(v, kind, "nodePublishSecretRef", "name"),
            f"{at}.{kind}.secretRef.name")


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


def _gpus(plan: Plan, base: dict[str, Any], final: dict[str, Any]) -> list[Problem]:
    """No container names or requests devices past spec.gpu: no NVIDIA_* or CUDA_VISIBLE_DEVICES variable (by env,
    or by envFrom whose prefix could make one), no nvidia.com/ resource outside the vLLM container, the vLLM
    container's exactly as derived."""
    out = []
    base_env = {(at, e.get("name")) for at, c in _containers(base["spec"]) for e in c.get("env") or []}
    for at, c in _containers(final.get("spec") or {}):
        where = f"{PATCH_FIELD}.spec.{at}"
        for e in c.get("env") or []:
            name = e.get("name")
            if isinstance(name, str) and validation.device_env(name) and (at, name) not in base_env:
                out.append(Problem(f"{where}.env[{name}]", "the NVIDIA device plugin and container toolkit decide "
                                                           "which GPUs a container sees; use spec.gpu"))
        for i, e in enumerate(c.get("envFrom") or []):
            prefix = e.get("prefix") or ""
            if not isinstance(prefix, str) or validation.device_env_prefix(prefix):
                out.append(Problem(f"{where}.envFrom[{i}].prefix", f"{prefix!r} could make NVIDIA_* or "
                                   "CUDA_VISIBLE_DEVICES from a key of the ConfigMap or Secret (the GPUs a container "
                                   "sees are the device plugin's): give a prefix that cannot, such as APP_"))
        if at == "containers[vllm]":
            continue
        resources = c.get("resources") or {}
        for side in ("requests", "limits"):
            for name in resources.get(side) or {} if isinstance(resources.get(side), dict) else {}:
                if name.startswith(GPU_RESOURCE_PREFIX):
                    out.append(Problem(f"{where}.resources.{side}", f"{name}: GPUs are the vLLM container's, from "
                                                                    "spec.gpu"))
    vllm = _by_name((final.get("spec") or {}).get("containers")).get("vllm") or {}
    derived = builders.container_resources(plan)
    for side in ("requests", "limits"):
        got = {k: v for k, v in ((vllm.get("resources") or {}).get(side) or {}).items()
               if k.startswith(GPU_RESOURCE_PREFIX)}
        want = {k: v for k, v in derived[side].items() if k.startswith(GPU_RESOURCE_PREFIX)}
        if got != want:
            out.append(Problem(f"{PATCH_FIELD}.spec.containers[vllm].resources.{side}",
                               "the GPUs come from spec.gpu (count, migProfile)"))
    return out


# --------------------------------------------------------------------------- the allowlist
#: The volume kinds a pod of the operator may have: those spec.volumes offers (each named Secret, ConfigMap and claim
#: checked by the admission policy), and projected volumes of those (and of the pod's own downward API).
TYPED_VOLUME_KINDS = ("emptyDir", "secret", "configMap", "persistentVolumeClaim", "downwardAPI", "projected")
TYPED_PROJECTED_SOURCES = ("secret", "configMap", "downwardAPI")
#: What a patch may change, as paths into the pod template; a change at or under one is allowed (the other rules
#: still judge the values). Everything else a patch changes is refused naming the field.
POD_ALLOWLIST: tuple[tuple[str, ...], ...] = (
    ("metadata", "labels"), ("metadata", "annotations"),
    ("spec", "tolerations"), ("spec", "affinity"), ("spec", "topologySpreadConstraints"), ("spec", "nodeSelector"),
    ("spec", "dnsConfig"), ("spec", "dnsPolicy"), ("spec", "hostAliases"), ("spec", "readinessGates"),
    *(("spec", "securityContext", key) for key in ("fsGroup", "fsGroupChangePolicy", "supplementalGroups",
                                                   "runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile")),
)
#: ... of the vLLM container (its derived fields are PROTECTED_VLLM_FIELDS; GPUs, owned variables: the rules).
_SECURITY_CONTEXT = tuple(("securityContext", key) for key in (
    "allowPrivilegeEscalation", "capabilities", "readOnlyRootFilesystem", "runAsUser", "runAsGroup", "runAsNonRoot",
    "seccompProfile"))
VLLM_ALLOWLIST: tuple[tuple[str, ...], ...] = (("env",), ("envFrom",), ("resources",), ("volumeMounts",),
                                               *_SECURITY_CONTEXT)
#: ... of the containers of spec.initContainers and spec.sidecars (their image: one of the typed fields' images).
EXTRA_ALLOWLIST: tuple[tuple[str, ...], ...] = VLLM_ALLOWLIST + tuple((key,) for key in (
    "image", "imagePullPolicy", "command", "args", "workingDir", "ports", "startupProbe", "readinessProbe",
    "livenessProbe", "lifecycle", "terminationMessagePolicy"))


class _Key(str):
    """A list element's merge key in a path (printed as [key])."""


def _differences(base: Any, final: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The paths where `final` differs from `base`: into maps key by key, into the lists Kubernetes merges by
    a key element by element, every other value whole."""
    if base == final:
        return
    if isinstance(base, dict) and isinstance(final, dict):
        for key in [*final, *(k for k in base if k not in final)]:
            if key not in base or key not in final:
                yield path + (key,)
            else:
                yield from _differences(base[key], final[key], path + (key,))
        return
    merge_key = strategic_merge.MERGE_KEYS.get(path[-1]) if path else None
    if merge_key and isinstance(base, list) and isinstance(final, list):
        keyed = [_keyed(items, merge_key) for items in (base, final)]
        if keyed[0] is not None and keyed[1] is not None:
            yield from _differences(keyed[0], keyed[1], path)
            return
    yield path


def _keyed(items: list[Any], key: str) -> Optional[dict[str, Any]]:
    """A merged list as a map by its key (None when an element has none, or two the same)."""
    out: dict[str, Any] = {}
    for item in items:
        name = item.get(key) if isinstance(item, dict) else None
        if name is None or isinstance(name, (dict, list)) or _Key(str(name)) in out:
            return None
        out[_Key(str(name))] = item
    return out


def _field(path: tuple[str, ...]) -> str:
    """spec.podTemplatePatch.spec.containers[vllm].env[A] for ("spec", "containers", "vllm", "env", "A")."""
    out = PATCH_FIELD
    for part in path:
        out += f"[{part}]" if isinstance(part, _Key) else f".{part}"
    return out


def _allowed(path: tuple[str, ...], extra: set[str]) -> bool:
    def under(rules: tuple[tuple[str, ...], ...], rest: tuple[str, ...]) -> bool:
        return any(rest[:len(rule)] == rule for rule in rules)

    if under(POD_ALLOWLIST, path):
        return True
    if path[:2] == ("spec", "volumes") and len(path) > 2:
        return path[2] not in api.OPERATOR_VOLUMES
    if path[:3] == ("spec", "containers", "vllm"):
        return under(VLLM_ALLOWLIST, path[3:])
    if path[:2] == ("spec", "initContainers") and len(path) > 2 and path[2] in extra:
        return under(EXTRA_ALLOWLIST, path[3:])
    return False


def _allowlist(plan: Plan, base: dict[str, Any], final: dict[str, Any]) -> list[Problem]:
    """Every change of the patch outside the allowlist, by field."""
    extra = {c.name for c in [*plan.spec.init_containers, *plan.spec.sidecars]}
    out = []
    for path in _differences(base, final):
        if not _allowed(path, extra):
            what = "add it as spec.sidecars or spec.initContainers" if path[1:2] in (("containers",), (
                "initContainers",)) and len(path) == 3 else "see docs/escape-hatches.md for what a patch may change"
            out.append(Problem(_field(path), f"not a field the pod template patch may change: {what}"))
    return out


def _volume_kinds(pod_spec: dict[str, Any]) -> list[Problem]:
    """Only the typed volume kinds: no hostPath, csi, generic ephemeral, image, ...; projected only of Secrets,
    ConfigMaps and the downward API (no serviceAccountToken, podCertificate, clusterTrustBundle)."""
    out = []
    for v in pod_spec.get("volumes") or []:
        at = f"{PATCH_FIELD}.spec.volumes[{v.get('name')}]"
        for kind in sorted(set(v) - {"name"} - set(TYPED_VOLUME_KINDS)):
            out.append(Problem(f"{at}.{kind}", f"{kind} volumes are not offered: only "
                                               f"{', '.join(TYPED_VOLUME_KINDS)} (docs/escape-hatches.md)"))
        sources = (v.get("projected") or {}).get("sources") if isinstance(v.get("projected"), dict) else None
        for i, source in enumerate(sources if isinstance(sources, list) else []):
            for kind in sorted(set(source if isinstance(source, dict) else {}) - set(TYPED_PROJECTED_SOURCES)):
                out.append(Problem(f"{at}.projected.sources[{i}].{kind}",
                                   f"a projected {kind} is not offered: only {', '.join(TYPED_PROJECTED_SOURCES)}"))
    return out


def _metadata(final: dict[str, Any]) -> list[Problem]:
    """Labels and annotations are maps of strings (the API server would refuse the workload otherwise)."""
    meta = final["metadata"]
    return [Problem(f"{PATCH_FIELD}.metadata.{key}", "must be a map of strings") for key in ("labels", "annotations")
            if meta.get(key) is not None and not (isinstance(meta[key], dict)
                                                  and all(isinstance(v, str) for v in meta[key].values()))]
