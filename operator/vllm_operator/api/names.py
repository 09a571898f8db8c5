"""Names, versions, ports and quantities of the VLLMServer API, and what its models share: validators of
Kubernetes names, labels and quantities, CEL rules, the base model."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any, Optional

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel

from .. import vllm_flags


GROUP = "vllm-operator.io"
VERSION = "v1alpha1"
KIND = "VLLMServer"
PLURAL = "vllmservers"
SINGULAR = "vllmserver"
SHORT_NAMES = ["vllms"]
API_VERSION = f"{GROUP}/{VERSION}"

#: Metadata annotation that lets engine.extraArgs set --host/--port, which the pod otherwise fixes
#: (probes and Services depend on them): the escape hatch of docs/security.md. Value "true".
ALLOW_UNSAFE_ARGS_ANNOTATION = f"{GROUP}/allow-unsafe-args"


def allows_unsafe_args(metadata: Any) -> bool:
    """Whether a VLLMServer's metadata (a dict or ObjectMeta) carries the escape-hatch annotation."""
    if metadata is None:
        return False
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else getattr(metadata, "annotations", None)
    return isinstance(annotations, dict) and str(annotations.get(ALLOW_UNSAFE_ARGS_ANNOTATION, "")).lower() == "true"


#: Why a spec cannot be deployed: the reason of SpecValid=False, of Ready and Stalled while it is so, and so the
#: Reason column of `kubectl get vllms` (docs/failures.md#invalid-spec). The first problem the planner finds decides.
REASON_INVALID_SPEC = "InvalidSpec"
REASON_DOES_NOT_FIT = "DoesNotFit"
REASON_MODEL_UNKNOWN = "ModelUnknown"
REASON_GPU_UNKNOWN = "GPUUnknown"
SPEC_REASONS = (REASON_INVALID_SPEC, REASON_DOES_NOT_FIT, REASON_MODEL_UNKNOWN, REASON_GPU_UNKNOWN)


#: The oldest Kubernetes the operator runs on (README, the chart's kubeVersion, checked at start): CRD validation
#: rules with fieldPath and the quantity library, ValidatingAdmissionPolicy v1 (1.30), policy/v1, autoscaling/v2.
#: The tests run on the release tools/testbed/kube/go.mod pins.
MIN_KUBERNETES_VERSION = (1, 30)


def parse_kube_version(version: dict[str, Any]) -> tuple[int, int]:
    """(major, minor) of a /version answer; providers write the minor as "30+" or the like."""
    def digits(text: Any) -> int:
        found = re.match(r"\d+", str(text))
        if found is None:
            raise ValueError(f"no version number in {str(text)[:20]!r}")
        return int(found.group(0))

    return digits(version["major"]), digits(version["minor"])


#: Longest VLLMServer name: StatefulSet pods carry controller-revision-hash=<name>-<10 chars>, a 63-char label.
MAX_NAME_LENGTH = 52

#: The non-root user the vLLM container runs as unless spec.runAsUser says otherwise.
DEFAULT_RUN_AS_USER = 1000

#: The vLLM release the default image pins (vllm_flags.VERSION: its snapshot, vllm_releases/<release>.json, is the default).
VLLM_VERSION = vllm_flags.VERSION
DEFAULT_IMAGE = f"vllm/vllm-openai:v{VLLM_VERSION}"
#: The port vLLM serves on in every pod (the Services, probes and scrapes use it).
VLLM_PORT = 8000

# Kubernetes' own quantity grammar (apimachinery resource.Quantity), without a sign: no size here is negative.
QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)
_SUFFIX: dict[str, int | Decimal] = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}


#: The largest magnitude a quantity may have: Kubernetes' own are int64 (2^63 - 1, about 9.2e18: 8 EiB).
MAX_QUANTITY = Decimal(2**63 - 1)
#: The largest exponent, either way: Kubernetes' suffixes span 1e-9 to 1e18. Beyond this a quantity is only
#: rounding to 0 or an overflow downstream ("1e400" bytes of GPU memory raised OverflowError in the planner).
MAX_EXPONENT = 30


def parse_quantity(value: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity ("24Gi", "23.58Gi", "500M", 1e9) into a Decimal.

    ValueError for anything else, and for what is out of range: a whole-number exponent within
    +-MAX_EXPONENT, a magnitude of at most MAX_QUANTITY."""
    text = str(value).strip()
    if not _QUANTITY_RE.match(text):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (for example 24Gi, 23.58Gi or 500M)")
    m = re.match(r"^([+-]?[0-9.]+)(?:[eE]([+-]?[0-9.]+))?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?$", text)
    if m is None:  # pragma: no cover - the pattern above already matched
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    mantissa, exponent, suffix = m.groups()
    if exponent is not None and not (re.fullmatch(r"[+-]?[0-9]{1,3}", exponent) and abs(int(exponent)) <= MAX_EXPONENT):
        raise ValueError(f"{value!r} is out of range: a quantity's exponent is a whole number within "
                         f"+-{MAX_EXPONENT}")
    number = Decimal(f"{mantissa}e{exponent or 0}") * Decimal(_SUFFIX[suffix or ""])
    if abs(number) > MAX_QUANTITY:
        raise ValueError(f"{value!r} is out of range: a quantity is at most 2^63 - 1 (about 9.2e18)")
    return number


def _check_quantity(value: str) -> str:
    parse_quantity(value)
    return value


def _int_to_str(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return str(value)
    return value


def _size_with_unit(value: Any) -> Any:
    """A memory size given as a bare number means bytes, which is never what was meant (`memory: 24`)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value != 0:
        raise ValueError(f"{value!r} has no unit: write a size such as 24Gi or 512Mi (a bare number means bytes)")
    return _int_to_str(value)


#: The integer-or-string union of a Kubernetes quantity: the one anyOf a structural schema allows (beside
#: x-kubernetes-int-or-string), as controller-gen declares resource.Quantity in CRDs.
INT_OR_STRING_ANY_OF = ({"type": "integer"}, {"type": "string"})

#: The API server's schema for a quantity: a number or a string of Kubernetes' quantity grammar, as in a pod's
#: resources; an object, a list or "24 GiB" are refused at admission, naming the field. The models' JSON schema
#: carries it whole (crd.py copies it into the CRD as it is).
_QUANTITY_SCHEMA = {"x-kubernetes-int-or-string": True, "anyOf": [dict(t) for t in INT_OR_STRING_ANY_OF],
                    "pattern": QUANTITY_PATTERN, "maxLength": 64}

#: A Kubernetes quantity: "8", 8, "500m", "64Gi" (resources).
Quantity = Annotated[str, BeforeValidator(_int_to_str), AfterValidator(_check_quantity),
                     WithJsonSchema(_QUANTITY_SCHEMA)]

#: A memory size: a quantity with a unit ("24Gi", "23.58Gi", "500M"; 0 alone is allowed). The API server refuses
#: a bare number other than 0 through the CEL rule, the operator through the validator.
ByteSize = Annotated[str, BeforeValidator(_size_with_unit), AfterValidator(_check_quantity), WithJsonSchema({
    **_QUANTITY_SCHEMA,
    "x-kubernetes-validations": [{"rule": "type(self) == string || self == 0",
                                  "message": "a memory size needs a unit, such as 24Gi or 512Mi (a bare number "
                                             "means bytes)"}],
})]

# Kubernetes' own name grammars (apimachinery validation): the API server refuses a child built from
# anything else, so the spec is refused first, with the field's path.
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_QUALIFIED_NAME_RE = re.compile(r"^(?:([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/)?"
                                r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")


def _check_qualified_name(key: str) -> str:
    """A label or annotation key: an optional DNS-subdomain prefix and '/', then a name of at most 63 characters."""
    m = _QUALIFIED_NAME_RE.match(key)
    if m is None or len(m.group(5)) > 63 or (m.group(1) and len(m.group(1)) > 253):
        raise ValueError(f"{key!r} is not a valid label or annotation key: an optional DNS prefix and '/', then at "
                         "most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
    return key


def _check_label_keys(value: dict[str, Any]) -> dict[str, Any]:
    for key in value:
        _check_qualified_name(key)
    return value


def _check_resource_names(value: dict[str, Any]) -> dict[str, Any]:
    for key in value:
        if key in _STANDARD_RESOURCES or key.startswith("hugepages-"):
            continue
        if "/" not in key or _QUALIFIED_NAME_RE.match(key) is None:
            raise ValueError(f"{key!r} is not a resource name: use cpu, memory, ephemeral-storage, hugepages-<size> "
                             "or a fully qualified name such as example.com/device")
    return value


def cel(rule: str, message: str, field_path: Optional[str] = None) -> dict[str, str]:
    """One CEL validation rule of the CRD (x-kubernetes-validations): the API server refuses a spec breaking it
    at admission, with `message` under `field_path` (relative to the object holding the rule)."""
    out = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


def _rules(*rules: dict[str, str]) -> dict[str, Any]:
    return {"x-kubernetes-validations": list(rules)}


#: Bounds on maps and lists: every object a tenant writes stays small, and the API server can bound the cost
#: of the CEL rules that walk them.
MAX_MAP_ENTRIES = 64
MAX_ANNOTATION_VALUE = 4096

#: A DNS subdomain (names of Secrets, ServiceAccounts, PriorityClasses, StorageClasses, claims).
DNSSubdomain = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]
#: A label value (at most 63 characters).
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]
#: Labels (or a node selector): qualified-name keys, label values.
Labels = Annotated[
    dict[str, LabelValue],
    AfterValidator(_check_label_keys),
    WithJsonSchema({"type": "object", "maxProperties": MAX_MAP_ENTRIES,
                    "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE_PATTERN}}),
]
#: Annotations: qualified-name keys, any string values.
Annotations = Annotated[
    dict[str, str],
    AfterValidator(_check_label_keys),
    WithJsonSchema({"type": "object", "maxProperties": MAX_MAP_ENTRIES,
                    "additionalProperties": {"type": "string", "maxLength": MAX_ANNOTATION_VALUE}}),
]

#: A free-form Kubernetes object we pass through verbatim (e.g. affinity).
FreeForm = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


#: spec.podTemplatePatch: a partial pod template (metadata, spec), kept as written. Its size is bounded by the
#: API server's request limit and then by the operator (strategic_merge.MAX_PATCH_BYTES, strategic_merge.MAX_DEPTH).
PodTemplatePatch = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "properties": {
        "metadata": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                     "description": "Labels and annotations to merge into the pods' metadata."},
        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                 "description": "A partial pod spec, merged as kubectl patch --type=strategic would."}}}),
]


class _Model(BaseModel):
    """Base: camelCase field names on the wire, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        validate_default=False,
    )
