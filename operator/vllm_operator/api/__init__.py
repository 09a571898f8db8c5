"""The VLLMServer API: typed spec and status models, the single source of truth.

The CRD in ``crds/`` is generated from these models by :mod:`vllm_operator.crd`.
Field docstrings become the CRD's descriptions, so they are written for users.
Static defaults live here (and therefore in the CRD schema); defaults that need
arithmetic (flags derived from the model and the GPU) live in the planner.

The package is split along the API's seams (kubebuilder's <kind>_types): ``names`` (group, versions, ports,
quantities, the shared validators and the base model), ``kube_types`` (the Kubernetes sub-types), ``spec``
(the spec and the VLLMServer document), ``status``. Every name is importable from ``vllm_operator.api``.
"""

from .names import (
    ALLOW_UNSAFE_ARGS_ANNOTATION, API_VERSION, Annotations, ByteSize, DEFAULT_IMAGE, DEFAULT_RUN_AS_USER,
    DNSSubdomain, DNS_SUBDOMAIN_PATTERN, FreeForm, GROUP, KIND, LABEL_VALUE_PATTERN, LabelValue, Labels,
    MAX_ANNOTATION_VALUE, MAX_EXPONENT, MAX_MAP_ENTRIES, MAX_NAME_LENGTH, MAX_QUANTITY, MIN_KUBERNETES_VERSION,
    PLURAL, PodTemplatePatch, QUANTITY_PATTERN, Quantity, REASON_DOES_NOT_FIT, REASON_GPU_UNKNOWN,
    REASON_INVALID_SPEC, REASON_MODEL_UNKNOWN, SHORT_NAMES, SINGULAR, SPEC_REASONS, VERSION, VLLM_PORT,
    VLLM_VERSION, _Model, _SUFFIX, allows_unsafe_args, cel, parse_kube_version, parse_quantity,
)
from .kube_types import (
    ClaimVolumeSource, ConfigMapVolumeSource, Container, ContainerPort, DNSLabel, DNS_LABEL_PATTERN,
    EmptyDirVolumeSource, EnvVar, EnvVarSource, KeyToPath, MAX_EXTRA_CONTAINERS, MAX_EXTRA_VOLUMES,
    OPERATOR_CONTAINERS, OPERATOR_MOUNT_PATHS, OPERATOR_VOLUMES, OWNED_ENV, ResourceOverrides, SecretKeyRef,
    SecretKeySelector, SecretVolumeSource, Toleration, Volume, VolumeMount,
)
from .spec import (
    AUTOSCALING_TOLERANCE, AdapterSpec, ADAPTER_NAME_PATTERN, AutoscalingSpec, ScaleToZeroSpec, CacheSpec, ClaimRetentionPolicy,
    EngineSpec, GPUSpec, ModelArchitecture, ModelSpec, MAX_ADAPTERS, NOT_A_FLAG_PATTERN, ObjectMeta, Quantization,
    VLLMServer, VLLMServerSpec, WorkloadProfile,
    downloads_in_init_container, is_hub_model,
)
from .routing import (
    DEFAULT_PICKER_IMAGE, HTTPRouteSpec, InferencePoolSpec, MAX_POOL_NAME, PickerSpec, RoutingSpec, ScorerWeights,
    owns_pool, pool_name,
)
from .status import (
    AdapterStatus, AutoscalingStatus, ChatTemplateStatus, Condition, KVCapacityStatus, PlanEstimates, PlanStatus, VLLMServerStatus,
)

__all__ = [
    "ALLOW_UNSAFE_ARGS_ANNOTATION", "API_VERSION", "Annotations", "ByteSize", "DEFAULT_IMAGE",
    "DEFAULT_RUN_AS_USER", "DNSSubdomain", "DNS_SUBDOMAIN_PATTERN", "FreeForm", "GROUP", "KIND",
    "LABEL_VALUE_PATTERN", "LabelValue", "Labels", "MAX_ANNOTATION_VALUE", "MAX_EXPONENT", "MAX_MAP_ENTRIES",
    "MAX_NAME_LENGTH", "MAX_QUANTITY", "MIN_KUBERNETES_VERSION", "PLURAL", "PodTemplatePatch",
    "QUANTITY_PATTERN", "Quantity", "REASON_DOES_NOT_FIT", "REASON_GPU_UNKNOWN", "REASON_INVALID_SPEC",
    "REASON_MODEL_UNKNOWN", "SPEC_REASONS", "SHORT_NAMES", "SINGULAR", "VERSION", "VLLM_PORT", "VLLM_VERSION", "_Model",
    "_SUFFIX", "allows_unsafe_args", "cel", "parse_kube_version", "parse_quantity", "ClaimVolumeSource",
    "ConfigMapVolumeSource", "Container", "ContainerPort", "DNSLabel", "DNS_LABEL_PATTERN",
    "EmptyDirVolumeSource", "EnvVar", "EnvVarSource", "KeyToPath", "MAX_EXTRA_CONTAINERS", "MAX_EXTRA_VOLUMES",
    "OPERATOR_CONTAINERS", "OPERATOR_MOUNT_PATHS", "OPERATOR_VOLUMES", "OWNED_ENV", "ResourceOverrides",
    "SecretKeyRef", "SecretKeySelector", "SecretVolumeSource", "Toleration", "Volume", "VolumeMount",
    "AUTOSCALING_TOLERANCE", "AdapterSpec", "ADAPTER_NAME_PATTERN", "MAX_ADAPTERS", "AutoscalingSpec", "CacheSpec",
    "ClaimRetentionPolicy", "EngineSpec", "GPUSpec", "ModelArchitecture",
    "ModelSpec", "NOT_A_FLAG_PATTERN", "ObjectMeta", "Quantization", "VLLMServer", "VLLMServerSpec",
    "WorkloadProfile", "downloads_in_init_container", "is_hub_model", "AdapterStatus", "AutoscalingStatus", "Condition",
    "ChatTemplateStatus", "KVCapacityStatus", "PlanEstimates", "PlanStatus", "VLLMServerStatus",
    "DEFAULT_PICKER_IMAGE", "HTTPRouteSpec", "InferencePoolSpec", "MAX_POOL_NAME", "PickerSpec", "RoutingSpec",
    "ScaleToZeroSpec", "ScorerWeights", "owns_pool", "pool_name",
]
