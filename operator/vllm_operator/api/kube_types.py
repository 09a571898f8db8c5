"""The Kubernetes sub-types a VLLMServer carries, as the CRD accepts them: env and Secret references,
tolerations, resources, and the escape hatches' volumes, mounts and containers."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
)

from .names import (
    ByteSize, DNSSubdomain, LabelValue, Quantity, _Model, _check_qualified_name, _check_resource_names, _rules, cel,
)


class SecretKeySelector(_Model):
    """A key in a Secret in the same namespace."""

    name: DNSSubdomain
    """Secret name."""
    key: str = Field(..., min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    """Key within the Secret."""


class EnvVarSource(_Model):
    """Where a variable's value comes from instead of the spec."""

    secret_key_ref: SecretKeySelector = Field(..., alias="secretKeyRef")
    """A key of a Secret (API keys, tokens): the value never appears in the VLLMServer."""


#: Environment the operator sets (HF_HOME, the token), or the NVIDIA device plugin owns (which GPUs the container
#: sees): engine.env may not set it.
OWNED_ENV = ("HOME", "HF_HOME", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")


class EnvVar(_Model):
    """An environment variable for the vLLM container: a plain value, or a Secret reference for credentials."""

    model_config = ConfigDict(json_schema_extra=_rules(
        cel("!(self.name in " + repr(list(OWNED_ENV)) + ") && !self.name.startsWith('NVIDIA_')",
            "this variable is set by the operator (HOME, HF_HOME, HF_TOKEN: use spec.cache and spec.hfTokenSecretRef) or "
            "by the NVIDIA device plugin and container toolkit (CUDA_VISIBLE_DEVICES, NVIDIA_*: use spec.gpu)", ".name"),
        cel("!has(self.valueFrom) || !has(self.value) || self.value == ''",
            "set value or valueFrom, not both", ".value"),
    ))

    name: str = Field(..., min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    """Variable name."""
    value: str = Field("", max_length=16384)
    """Plain value. Never put credentials here: the spec is readable by anyone who can read the resource."""
    value_from: Optional[EnvVarSource] = Field(None, alias="valueFrom")
    """Take the value from a Secret instead (e.g. VLLM_API_KEY); then value must be empty."""


class SecretKeyRef(_Model):
    """A key in a Secret in the same namespace. The operator only references it; it never reads it."""

    name: DNSSubdomain
    """Secret name."""
    key: str = Field("token", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    """Key within the Secret."""


# --------------------------------------------------------------------------- pod overrides
class Toleration(_Model):
    """A Kubernetes toleration."""

    model_config = ConfigDict(json_schema_extra=_rules(
        cel("!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
            "must be empty with operator: Exists", ".value"),
        cel("(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
            "must be Exists when key is empty (a toleration of every taint)", ".operator"),
        cel("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "applies to effect: NoExecute only", ".tolerationSeconds"),
    ))

    key: Optional[Annotated[str, Field(max_length=317), AfterValidator(_check_qualified_name)]] = None
    """Taint key."""
    operator: Optional[Literal["Exists", "Equal"]] = None
    """Exists or Equal."""
    value: Optional[LabelValue] = None
    """Taint value for Equal."""
    effect: Optional[Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]] = None
    """Taint effect; all effects when empty."""
    toleration_seconds: Optional[int] = Field(None, ge=0, le=100_000_000, alias="tolerationSeconds")
    """For NoExecute: how long the pod stays bound after the taint appears."""


_MAX_RESOURCES = 16


class ResourceOverrides(_Model):
    """Host CPU/memory for the vLLM container; the GPU count always comes from gpu.count."""

    model_config = ConfigDict(json_schema_extra=_rules(
        # Every NVIDIA device resource (nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-...): only spec.gpu asks.
        cel("!has(self.requests) || self.requests.all(k, !k.startsWith('nvidia.com/'))",
            "nvidia.com/ device resources come from spec.gpu (count, migProfile, resourceName); remove them from "
            "resources", ".requests"),
        cel("!has(self.limits) || self.limits.all(k, !k.startsWith('nvidia.com/'))",
            "nvidia.com/ device resources come from spec.gpu (count, migProfile, resourceName); remove them from "
            "resources", ".limits"),
        # Requests above limits are the operator's to refuse (validation.request_limit_problems, SpecValid=False):
        # a CEL rule comparing quantity(string(...)) of int-or-string values costs Kubernetes 1.30's estimator the
        # whole 3 MB request per value, and the CRD no longer fit its cost budget.
    ))

    requests: Annotated[dict[str, Quantity], AfterValidator(_check_resource_names)] = Field(
        default_factory=dict, max_length=_MAX_RESOURCES)
    """Resource requests, e.g. {cpu: "8", memory: 64Gi}."""
    limits: Annotated[dict[str, Quantity], AfterValidator(_check_resource_names)] = Field(
        default_factory=dict, max_length=_MAX_RESOURCES)
    """Resource limits."""


# --------------------------------------------------------------------------- escape hatches
#: Names of the operator's own containers and volumes in the pod: spec.volumes, spec.initContainers and
#: spec.sidecars may not take them.
OPERATOR_CONTAINERS = ("vllm", "download")
OPERATOR_VOLUMES = ("cache", "home", "dshm")
#: Where the operator mounts its volumes in the vLLM container (builders.CACHE_MOUNT, HOME, /dev/shm).
OPERATOR_MOUNT_PATHS = ("/cache", "/home/vllm", "/dev/shm")
MAX_EXTRA_VOLUMES = 16
MAX_EXTRA_CONTAINERS = 4
#: A DNS label (container, volume and port names).
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNSLabel = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]
_FILE_MODE = Field(None, ge=0, le=0o777)


def _list_map(*keys: str) -> dict[str, Any]:
    """A list the API server keeps unique by `keys` (x-kubernetes-list-type: map)."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}


class KeyToPath(_Model):
    """One key of a Secret or ConfigMap, as a file of the volume."""

    key: str = Field(..., min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    """The key."""
    path: str = Field(..., min_length=1, max_length=1024, pattern=r"^[^/]")
    """Relative path of the file in the volume."""
    mode: Optional[int] = _FILE_MODE
    """File mode (0-0777); the volume's defaultMode when omitted."""


class SecretVolumeSource(_Model):
    """A Secret of the namespace as files (the admission policy asks that the requester may get it)."""

    secret_name: DNSSubdomain = Field(..., alias="secretName")
    """The Secret."""
    items: list[KeyToPath] = Field(default_factory=list, max_length=32)
    """Only these keys, at these paths; every key when empty."""
    default_mode: Optional[int] = Field(None, ge=0, le=0o777, alias="defaultMode")
    """Mode of the files (0-0777)."""
    optional: Optional[bool] = None
    """Start the pod even if the Secret does not exist."""


class ConfigMapVolumeSource(_Model):
    """A ConfigMap of the namespace as files (the admission policy asks that the requester may get it)."""

    name: DNSSubdomain
    """The ConfigMap."""
    items: list[KeyToPath] = Field(default_factory=list, max_length=32)
    """Only these keys, at these paths; every key when empty."""
    default_mode: Optional[int] = Field(None, ge=0, le=0o777, alias="defaultMode")
    """Mode of the files (0-0777)."""
    optional: Optional[bool] = None
    """Start the pod even if the ConfigMap does not exist."""


class ClaimVolumeSource(_Model):
    """An existing PersistentVolumeClaim of the namespace (the admission policy asks that the requester may get it)."""

    claim_name: DNSSubdomain = Field(..., alias="claimName")
    """The claim."""
    read_only: Optional[bool] = Field(None, alias="readOnly")
    """Mount it read-only."""


class EmptyDirVolumeSource(_Model):
    """A scratch directory that lives as long as the pod."""

    medium: Optional[Literal["", "Memory"]] = None
    """"Memory" for a tmpfs (counted against the container's memory), else the node's disk."""
    size_limit: Optional[ByteSize] = Field(None, alias="sizeLimit")
    """Most it may hold."""


class Volume(_Model):
    """A volume of the pod, beside the operator's own (cache, home, dshm): a Secret, ConfigMap, existing claim or
    scratch directory. Other kinds (hostPath, nfs, csi, ...) are not offered: what a pod may mount on a node is
    the cluster's to grant, not a VLLMServer's."""

    model_config = ConfigDict(json_schema_extra=_rules(
        cel("[has(self.emptyDir), has(self.secret), has(self.configMap), has(self.persistentVolumeClaim)]"
            ".filter(x, x).size() == 1",
            "set exactly one of emptyDir, secret, configMap, persistentVolumeClaim"),
        cel("!(self.name in " + repr(list(OPERATOR_VOLUMES)) + ")",
            "cache, home and dshm are the operator's own volumes; pick another name", ".name"),
    ))

    name: DNSLabel
    """Volume name, for volumeMounts."""
    empty_dir: Optional[EmptyDirVolumeSource] = Field(None, alias="emptyDir")
    """A scratch directory."""
    secret: Optional[SecretVolumeSource] = None
    """A Secret's keys as files."""
    config_map: Optional[ConfigMapVolumeSource] = Field(None, alias="configMap")
    """A ConfigMap's keys as files."""
    persistent_volume_claim: Optional[ClaimVolumeSource] = Field(None, alias="persistentVolumeClaim")
    """An existing claim."""


class VolumeMount(_Model):
    """Where a container sees a volume (one of spec.volumes, or the operator's cache)."""

    name: DNSLabel
    """The volume (spec.volumes[].name, or cache: the Hugging Face cache)."""
    mount_path: str = Field(..., min_length=2, max_length=1024, pattern=r"^/[^:]*$", alias="mountPath")
    """Absolute path in the container."""
    sub_path: Optional[str] = Field(None, min_length=1, max_length=1024, pattern=r"^[^/]", alias="subPath")
    """A path inside the volume to mount instead of its root."""
    read_only: Optional[bool] = Field(None, alias="readOnly")
    """Mount it read-only."""


class ContainerPort(_Model):
    """A port a container listens on."""

    name: Optional[Annotated[str, Field(min_length=1, max_length=15, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]] = None
    """Port name (at most 15 characters)."""
    container_port: int = Field(..., ge=1, le=65535, alias="containerPort")
    """Port number."""
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"
    """Protocol."""


class Container(_Model):
    """An extra container of the pod. It runs as the pod's non-root user with the vLLM container's security
    context (no privilege escalation, every capability dropped); adjust more through spec.podTemplatePatch."""

    model_config = ConfigDict(json_schema_extra=_rules(
        cel("!(self.name in " + repr(list(OPERATOR_CONTAINERS)) + ")",
            "vllm and download are the operator's own containers; pick another name", ".name"),
    ))

    name: DNSLabel
    """Container name."""
    image: str = Field(..., min_length=1, max_length=1024)
    """Container image."""
    image_pull_policy: Optional[Literal["Always", "IfNotPresent", "Never"]] = Field(None, alias="imagePullPolicy")
    """Image pull policy."""
    command: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, max_length=64)
    """Entrypoint; the image's when empty."""
    args: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, max_length=128)
    """Arguments."""
    env: list[EnvVar] = Field(default_factory=list, max_length=32, json_schema_extra=_list_map("name"))
    """Environment variables: a value, or a Secret key (the admission policy asks that the requester may get it)."""
    ports: list[ContainerPort] = Field(default_factory=list, max_length=8,
                                       json_schema_extra=_list_map("containerPort", "protocol"))
    """Ports it listens on."""
    resources: ResourceOverrides = Field(default_factory=ResourceOverrides)
    """CPU and memory (no GPUs: those are the vLLM container's, from spec.gpu)."""
    volume_mounts: list[VolumeMount] = Field(default_factory=list, max_length=16, alias="volumeMounts",
                                             json_schema_extra=_list_map("mountPath"))
    """Volumes it mounts (spec.volumes, or cache)."""
