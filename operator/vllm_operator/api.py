"""The VLLMServer API: typed spec and status models, the single source of truth.

The CRD in ``crds/`` is generated from these models by :mod:`vllm_operator.crd`.
Field docstrings become the CRD's descriptions, so they are written for users.
Static defaults live here (and therefore in the CRD schema); defaults that need
arithmetic (flags derived from the model and the GPU) live in the planner.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any, Literal, Optional, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel

from . import vllm_flags

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


#: The API server's schema for a quantity: a number or a string of Kubernetes' quantity grammar, as in a pod's
#: resources; an object, a list or "24 GiB" are refused at admission, naming the field.
_QUANTITY_SCHEMA = {"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN, "maxLength": 64}

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
#: API server's request limit and then by the operator (smp.MAX_PATCH_BYTES, smp.MAX_DEPTH).
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


# --------------------------------------------------------------------------- model
class ModelArchitecture(_Model):
    """Facts about a model's architecture that size its weights and KV cache.

    Any field given here wins over the built-in catalog and the model's config.json.
    """

    num_layers: Optional[int] = Field(None, ge=1, le=1024, alias="numLayers")
    """Number of transformer layers (config.json: num_hidden_layers)."""
    num_attention_heads: Optional[int] = Field(None, ge=1, le=1024, alias="numAttentionHeads")
    """Number of query attention heads (config.json: num_attention_heads)."""
    num_kv_heads: Optional[int] = Field(None, ge=1, le=1024, alias="numKVHeads")
    """Number of key/value heads; fewer than attention heads for GQA (config.json: num_key_value_heads)."""
    head_dim: Optional[int] = Field(None, ge=1, le=4096, alias="headDim")
    """Dimension of one attention head (config.json: head_dim, else hidden_size / num_attention_heads)."""
    hidden_size: Optional[int] = Field(None, ge=1, le=1_000_000, alias="hiddenSize")
    """Model (embedding) dimension (config.json: hidden_size)."""
    intermediate_size: Optional[int] = Field(None, ge=1, le=10_000_000, alias="intermediateSize")
    """MLP inner dimension (config.json: intermediate_size)."""
    vocab_size: Optional[int] = Field(None, ge=1, le=10_000_000, alias="vocabSize")
    """Vocabulary size (config.json: vocab_size)."""
    max_position_embeddings: Optional[int] = Field(None, ge=1, le=100_000_000, alias="maxPositionEmbeddings")
    """Longest context the model supports, in tokens (config.json: max_position_embeddings)."""
    parameter_count: Optional[int] = Field(None, ge=1, le=100_000_000_000_000, alias="parameterCount")
    """Total number of parameters (all experts for a mixture of experts), e.g. 8030261248."""
    num_experts: Optional[int] = Field(None, ge=1, le=4096, alias="numExperts")
    """Routed experts per MoE layer (config.json: num_local_experts / num_experts); omit for dense models."""
    sliding_window: Optional[int] = Field(None, ge=1, le=100_000_000, alias="slidingWindow")
    """Tokens a sliding-window attention layer attends to (config.json: sliding_window, where the model uses it:
    layer_types, Gemma 2/3's pattern, Mistral's all-layer window); vLLM keeps only the window's KV for those
    layers (SlidingWindowSpec). Omit for all-global attention."""
    sliding_window_layers: Optional[int] = Field(None, ge=0, le=1024, alias="slidingWindowLayers")
    """How many of the layers use slidingWindow (config.json: layer_types' sliding_attention entries, Gemma 3's
    sliding_window_pattern); the rest attend to the whole context. Omitted with slidingWindow: every layer."""
    kv_lora_rank: Optional[int] = Field(None, ge=1, le=65536, alias="kvLoraRank")
    """Multi-head latent attention (DeepSeek V2/V3, Kimi K2): the latent KV width per token per layer
    (config.json: kv_lora_rank). vLLM caches kvLoraRank + qkRopeHeadDim values per token and layer, the same on
    every GPU (MLAAttentionSpec), instead of K and V per head."""
    qk_rope_head_dim: Optional[int] = Field(None, ge=0, le=65536, alias="qkRopeHeadDim")
    """Multi-head latent attention: the rotary key part cached beside the latent (config.json: qk_rope_head_dim)."""
    encoder_only: Optional[bool] = Field(None, alias="encoderOnly")
    """The model attends bidirectionally: an encoder-only pooling model (BERT, RoBERTa, XLM-RoBERTa, ModernBERT:
    embedding, classification, reranking). vLLM keeps no KV cache for it (EncoderOnlyAttention has no KV cache
    spec) and runs no sampler, so the plan sizes the weights and the forward pass only (config.json: model_type)."""
    pooling: Optional[bool] = Field(None)
    """A decoder served as a pooling model (embedding, classification, reward: Qwen3-Embedding, gte-Qwen2,
    e5-mistral). vLLM keeps a KV cache for its prompts but never decodes: its profiling run pools instead of
    sampling (no logits over the vocabulary) and vLLM 0.32 schedules it without async scheduling, so the plan
    sizes no sampler and passes --runner pooling (config.json: an architecture vLLM serves as pooling by its name,
    *Model, *ForSequenceClassification, *EmbeddingModel, ...). Encoder-only models are pooling models already."""
    vision_tokens_per_item: Optional[int] = Field(None, ge=1, le=10_000_000, alias="visionTokensPerItem")
    """Multimodal models: the most embeddings one image gives the language model (vLLM's max tokens per multimodal
    item; Gemma 3: config.json mm_tokens_per_image, 256; Qwen2.5-VL: the image processor's max_pixels / 28^2,
    16384). vLLM profiles its vision tower with a batch of such items before it sizes the KV cache and keeps their
    embeddings through the language model's profiling run."""
    vision_patches_per_item: Optional[int] = Field(None, ge=1, le=100_000_000, alias="visionPatchesPerItem")
    """Multimodal models: the patches the vision tower attends over for one such item (Gemma 3's SigLIP: (896 /
    14)^2 = 4096; Qwen2.5-VL: 4 per embedding, the 2 x 2 spatial merge)."""
    vision_video_frame_groups: Optional[int] = Field(None, ge=1, le=4096, alias="visionVideoFrameGroups")
    """Multimodal models with video: how many image-sized groups of frames one video item holds at most (Qwen2-VL,
    Qwen2.5-VL: 7, vLLM's 14 frames per video merged in pairs). vLLM profiles a video as long as max_model_len
    allows, up to this many groups, when it is larger than an image."""
    vision_hidden_size: Optional[int] = Field(None, ge=1, le=1_000_000, alias="visionHiddenSize")
    """Multimodal models: the vision tower's width (config.json: vision_config.hidden_size)."""
    vision_intermediate_size: Optional[int] = Field(None, ge=1, le=10_000_000, alias="visionIntermediateSize")
    """Multimodal models: the vision tower's MLP width (config.json: vision_config.intermediate_size)."""
    tie_word_embeddings: Optional[bool] = Field(None, alias="tieWordEmbeddings")
    """Whether the output projection shares the embedding matrix (config.json: tie_word_embeddings)."""
    torch_dtype: Optional[Literal["bfloat16", "float16", "float32"]] = Field(None, alias="torchDtype")
    """The dtype the checkpoint is stored in (config.json: torch_dtype); used for dtype: auto."""
    quantization: Optional[Literal["none", "awq", "gptq", "fp8", "compressed-tensors", "bitsandbytes", "gguf",
                                   "other"]] = None
    """How the checkpoint's weights are quantized (config.json: quantization_config.quant_method; none: a checkpoint
    without one). It decides over model.quantization: a contradicting method is refused, and with model.quantization
    none the weights are sized as the checkpoint stores them."""


#: Values that become vLLM arguments (the model, --served-model-name, --revision): one starting with '-'
#: would be read as a flag ("--api-key=..." as a model name set vLLM's API key).
NOT_A_FLAG_PATTERN = r"^[^-]"

Quantization = Literal[
    "none", "awq", "awq_marlin", "gptq", "gptq_marlin", "fp8", "bitsandbytes",
    "compressed-tensors", "gguf",
]


class ModelSpec(_Model):
    """The model to serve."""

    name: str = Field(..., min_length=1, max_length=512, pattern=NOT_A_FLAG_PATTERN)
    """Hugging Face model id (e.g. meta-llama/Llama-3.1-8B-Instruct) or a path in the cache volume; not starting with '-'."""
    served_name: Optional[str] = Field(None, min_length=1, max_length=256, alias="servedName",
                                       pattern=NOT_A_FLAG_PATTERN)
    """Name clients use in the OpenAI API's "model" field (--served-model-name); defaults to name; not starting with '-'."""
    revision: Optional[str] = Field(None, min_length=1, max_length=256, pattern=NOT_A_FLAG_PATTERN)
    """Model revision (branch, tag or commit) to load (--revision), not starting with '-'."""
    quantization: Quantization = "none"
    """Weight quantization method (--quantization); none serves the checkpoint as stored."""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """Activation and weight dtype (--dtype); auto uses the checkpoint's dtype."""
    architecture: Optional[ModelArchitecture] = None
    """Architecture facts; required for models that are neither in the catalog nor reachable via config.json."""
    config_url: Optional[str] = Field(None, min_length=1, max_length=2048, alias="configURL")
    """Where to fetch the model's config.json (http(s) URL), when the model is not in the catalog."""
    download: Literal["InitContainer", "Engine"] = "InitContainer"
    """Who downloads a Hugging Face model into the cache: an init container before vLLM starts (default: the
    download has no probe deadline, so a slow link is never killed by the startup probe, which then covers the
    load alone), or vLLM itself at start (its startup probe then covers the download too). A name that is a
    path is never downloaded."""


def is_hub_model(name: str) -> bool:
    """A Hugging Face repo id (org/name), not a path in the cache volume or a URL."""
    return name.count("/") == 1 and not name.startswith(("/", ".", "~")) and "://" not in name \
        and all(part.strip() for part in name.split("/"))


def downloads_in_init_container(model: ModelSpec) -> bool:
    """Whether an init container fetches the model before vLLM starts (the pod's initContainers and the plan's
    startup budget note both follow this)."""
    return model.download == "InitContainer" and is_hub_model(model.name)


# --------------------------------------------------------------------------- gpu
class GPUSpec(_Model):
    """The NVIDIA GPUs each server gets."""

    model_config = ConfigDict(json_schema_extra=_rules(
        cel("!has(self.resourceName) || !has(self.migProfile)",
            "set migProfile (the resource is nvidia.com/mig-<profile>) or resourceName, not both", ".resourceName"),
        cel("!has(self.resourceName) || !self.resourceName.startsWith('nvidia.com/mig-')",
            "a MIG slice is requested through migProfile, which also plans with the slice's memory", ".resourceName"),
    ))

    count: int = Field(1, ge=1, le=64)
    """GPUs per server (nvidia.com/gpu); also the tensor-parallel size. 1 with migProfile."""
    product: Optional[str] = Field(None, min_length=1, max_length=128)
    """GPU product: a GPU feature discovery label (nvidia.com/gpu.product, e.g. NVIDIA-L4, with GFD's -SHARED
    or -MIG-<profile> suffix where the nodes have one), an alias (L4, A100-80GB; any case) or a family (H100:
    any of its variants, planned for the one with the least memory). The pod selects the exact label value(s)
    of labelConvention; a product the catalog does not know is selected as written and needs gpu.memory."""
    mig_profile: Optional[str] = Field(None, alias="migProfile", max_length=32, pattern=r"^[1-8]g\.[0-9]+gb$")
    """A MIG slice instead of a whole GPU, e.g. 1g.10gb or 3g.40gb: the pod requests nvidia.com/mig-<profile>
    (the NVIDIA device plugin's mixed strategy; with labelConvention GKE, nvidia.com/gpu on nodes of that
    partition size) and is planned with the slice's memory. One slice per server: count must be 1, vLLM
    cannot run tensor parallelism across MIG slices."""
    resource_name: Optional[str] = Field(None, alias="resourceName", max_length=63,
                                         pattern=r"^nvidia\.com/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    """The extended resource the pod requests instead of nvidia.com/gpu, where the NVIDIA device plugin renames it:
    time-slicing or MPS with renameByDefault advertises nvidia.com/gpu.shared, and its config can rename a shared
    resource to any nvidia.com/ name. The plan is the same (count GPUs of gpu.product's memory); for MIG use
    migProfile."""
    label_convention: Literal["GFD", "GKE", "Karpenter"] = Field("GFD", alias="labelConvention")
    """The node label that selects the product: GFD (nvidia.com/gpu.product, from NVIDIA GPU feature
    discovery), GKE (cloud.google.com/gke-accelerator, also what node auto-provisioning reads) or Karpenter
    (karpenter.k8s.aws/instance-gpu-name on EKS, what Karpenter provisions nodes by)."""
    memory: Optional[ByteSize] = None
    """Memory of one GPU (e.g. 24Gi or 23.58Gi); overrides the catalog's figure for the product."""
    reserved_memory: ByteSize = Field("0", alias="reservedMemory")
    """GPU memory per GPU to leave untouched for other processes (display, MPS, sidecars)."""


# --------------------------------------------------------------------------- profile
class WorkloadProfile(_Model):
    """What the traffic looks like; the planner sizes the engine for it."""

    max_context_tokens: Optional[int] = Field(None, ge=16, le=100_000_000, alias="maxContextTokens")
    """Longest request (prompt + output) the server must accept. Defaults to the model's limit."""
    p95_prompt_tokens: Optional[int] = Field(None, ge=1, le=100_000_000, alias="p95PromptTokens")
    """95th-percentile prompt length in tokens."""
    p95_output_tokens: Optional[int] = Field(None, ge=1, le=100_000_000, alias="p95OutputTokens")
    """95th-percentile output length in tokens."""
    target_concurrency: Optional[int] = Field(None, ge=1, le=65536, alias="targetConcurrency")
    """Requests in flight per replica the server should sustain (sizes --max-num-seqs)."""
    priority: Literal["latency", "balanced", "throughput"] = "balanced"
    """What to favour when sizing batches: per-request latency, or total throughput."""


# --------------------------------------------------------------------------- engine
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
        cel("!(self.name in " + repr(list(OWNED_ENV)) + ")",
            "this variable is set by the operator (HOME, HF_HOME, HF_TOKEN: use spec.cache and spec.hfTokenSecretRef) or "
            "by the NVIDIA device plugin (CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES: use spec.gpu)", ".name"),
        cel("!has(self.valueFrom) || !has(self.value) || self.value == ''",
            "set value or valueFrom, not both", ".value"),
    ))

    name: str = Field(..., min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    """Variable name."""
    value: str = Field("", max_length=16384)
    """Plain value. Never put credentials here: the spec is readable by anyone who can read the resource."""
    value_from: Optional[EnvVarSource] = Field(None, alias="valueFrom")
    """Take the value from a Secret instead (e.g. VLLM_API_KEY); then value must be empty."""


class EngineSpec(_Model):
    """vLLM engine settings. Any value set here is pinned: it wins over the derived one, and is still checked."""

    model_config = ConfigDict(json_schema_extra=_rules(
        cel("!has(self.maxNumSeqs) || !has(self.maxNumBatchedTokens) || self.maxNumBatchedTokens >= self.maxNumSeqs",
            "must be at least maxNumSeqs: vLLM requires max-num-batched-tokens >= max-num-seqs",
            ".maxNumBatchedTokens"),
    ))

    gpu_memory_utilization: Optional[float] = Field(None, gt=0.0, le=1.0, alias="gpuMemoryUtilization")
    """Fraction of each GPU's total memory vLLM may use (--gpu-memory-utilization)."""
    max_model_len: Optional[int] = Field(None, ge=16, le=100_000_000, alias="maxModelLen")
    """Longest request in tokens (--max-model-len); must fit one full request in the KV cache."""
    max_num_seqs: Optional[int] = Field(None, ge=1, le=65536, alias="maxNumSeqs")
    """Most sequences batched per step (--max-num-seqs)."""
    max_num_batched_tokens: Optional[int] = Field(None, ge=1, le=10_000_000, alias="maxNumBatchedTokens")
    """Token budget per scheduler step (--max-num-batched-tokens); at least maxNumSeqs."""
    kv_cache_dtype: Optional[Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]] = Field(None, alias="kvCacheDtype")
    """KV cache dtype (--kv-cache-dtype); fp8 halves KV memory per token. Refused where no attention backend of the
    image's vLLM release stores it on the GPU (an fp8 KV cache needs compute capability 8.0 or newer: docs/gpus.md)."""
    enable_prefix_caching: Optional[bool] = Field(None, alias="enablePrefixCaching")
    """Reuse KV blocks of shared prompt prefixes (--enable-prefix-caching / --no-enable-prefix-caching)."""
    enforce_eager: Optional[bool] = Field(None, alias="enforceEager")
    """Disable CUDA graphs (--enforce-eager): less memory and faster start, slower decoding."""
    shutdown_timeout_seconds: Optional[int] = Field(None, ge=0, le=3600, alias="shutdownTimeoutSeconds")
    """Seconds in-flight requests may finish after SIGTERM (--shutdown-timeout; 0 aborts them at once).
    Derived from workloadProfile.p95OutputTokens when omitted.
    The pod's terminationGracePeriodSeconds is the preStop sleep, this, and a margin for vLLM's teardown."""
    max_num_queued_reqs: Optional[int] = Field(None, ge=1, le=1_000_000, alias="maxNumQueuedReqs")
    """Most requests one server holds, running and waiting (--max-num-queued-reqs); past it vLLM answers 503.
    Unlimited when omitted.
    With autoscaling it must leave room above maxNumSeqs for more than targetWaitingPerReplica waiting requests."""
    chat_template: Optional[str] = Field(None, min_length=1, max_length=65536, alias="chatTemplate")
    """A Jinja2 chat template (--chat-template) instead of the model's own; rendered with a sample conversation in
    the sandbox vLLM uses before anything is applied, so one that does not parse or raises is refused here."""
    extra_args: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, alias="extraArgs", max_length=128)
    """More vLLM flags, passed verbatim after the derived ones; a flag the operator derives is refused here."""
    env: list[EnvVar] = Field(default_factory=list, max_length=128)
    """Environment variables for the vLLM container."""


# --------------------------------------------------------------------------- storage / secrets
class CacheSpec(_Model):
    """The Hugging Face cache volume (HF_HOME): a new claim per replica (size), one new claim every replica shares
    (size and shared: ReadWriteMany, the model downloaded once), or an existing claim (claimName)."""

    model_config = ConfigDict(json_schema_extra=_rules(
        cel("!has(self.shared) || !self.shared || has(self.size)",
            "shared needs size (the claim the operator creates for every replica); a claimName is shared as it is",
            ".shared"),
        cel("!has(self.claimName) || !(has(self.size) || has(self.storageClassName))",
            "set either claimName (an existing claim) or size/storageClassName (a new claim per replica), not both",
            ".claimName"),
        cel("has(self.claimName) || has(self.size)",
            "set size (a new claim per replica) or claimName (an existing claim)"),
    ))

    size: Optional[ByteSize] = None
    """Size of a new PersistentVolumeClaim per replica (StatefulSet volumeClaimTemplates), or of the one shared
    claim with shared: true."""
    shared: bool = False
    """One ReadWriteMany claim, <name>-cache, created and owned by the server, that every replica (every node of a
    DaemonSet) mounts: the model is downloaded once, not once per replica. Needs a storage class that offers
    ReadWriteMany (NFS, CephFS, EFS, Filestore, ...); deleting the server deletes the claim."""
    storage_class_name: Optional[DNSSubdomain] = Field(None, alias="storageClassName")
    """Storage class of the new claim; the cluster default when omitted."""
    claim_name: Optional[DNSSubdomain] = Field(None, alias="claimName")
    """An existing PersistentVolumeClaim to mount instead (ReadWriteMany or ReadOnlyMany for several replicas)."""


class SecretKeyRef(_Model):
    """A key in a Secret in the same namespace. The operator only references it; it never reads it."""

    name: DNSSubdomain
    """Secret name."""
    key: str = Field("token", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    """Key within the Secret."""


# --------------------------------------------------------------------------- autoscaling
#: The autoscaler's tolerance, the HPA's: no change while the ratio of the queue to its target is within 10% of 1
#: (autoscaler/policy.py decides with it; the planner sizes --max-num-queued-reqs above it).
AUTOSCALING_TOLERANCE = 0.1


class AutoscalingSpec(_Model):
    """Scale replicas on vLLM's own queue (vllm:num_requests_waiting)."""

    model_config = ConfigDict(json_schema_extra=_rules(
        cel("!self.enabled || has(self.maxReplicas)", "required when autoscaling is enabled", ".maxReplicas"),
        cel("!has(self.maxReplicas) || self.maxReplicas >= self.minReplicas",
            "must be at least minReplicas", ".maxReplicas"),
    ))

    enabled: bool = False
    """Turn queue-based autoscaling on; when on, replicas is ignored and the autoscaler owns the count."""
    mode: Literal["Operator", "HPA", "KEDA"] = "Operator"
    """Who scales: the operator's own loop (default), an emitted HorizontalPodAutoscaler, or a KEDA ScaledObject."""
    min_replicas: int = Field(1, ge=1, le=1000, alias="minReplicas")
    """Fewest replicas."""
    max_replicas: Optional[int] = Field(None, ge=1, le=1000, alias="maxReplicas")
    """Most replicas; required when enabled."""
    target_waiting_per_replica: float = Field(2.0, gt=0.0, le=10000.0, alias="targetWaitingPerReplica")
    """Average queued requests per ready replica to aim for."""
    source: Literal["Pods", "Prometheus"] = "Pods"
    """Where metrics come from: scrape the pods' /metrics directly, or query Prometheus."""
    prometheus_url: Optional[str] = Field(None, min_length=1, max_length=2048, alias="prometheusURL")
    """Prometheus base URL for source: Prometheus (defaults to the operator's --prometheus-url)."""
    interval_seconds: int = Field(5, ge=1, le=600, alias="intervalSeconds")
    """How often to read metrics and decide."""
    scale_up_stabilization_seconds: int = Field(0, ge=0, le=3600, alias="scaleUpStabilizationSeconds")
    """Scale up only on the lowest recommendation over this window (0: at once)."""
    scale_down_stabilization_seconds: int = Field(120, ge=0, le=3600, alias="scaleDownStabilizationSeconds")
    """Scale down only on the highest recommendation over this window."""


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
        cel("!has(self.requests) || !('nvidia.com/gpu' in self.requests)",
            "nvidia.com/gpu comes from spec.gpu.count; remove it from resources", ".requests"),
        cel("!has(self.limits) || !('nvidia.com/gpu' in self.limits)",
            "nvidia.com/gpu comes from spec.gpu.count; remove it from resources", ".limits"),
        cel("!has(self.requests) || !has(self.limits) || self.requests.all(k, !(k in self.limits) || "
            "!quantity(string(self.requests[k])).isGreaterThan(quantity(string(self.limits[k]))))",
            "a request is above its limit; Kubernetes refuses a request above its limit", ".requests"),
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


# --------------------------------------------------------------------------- spec
class VLLMServerSpec(_Model):
    """Desired state of a vLLM server."""

    model_config = ConfigDict(json_schema_extra=_rules(
        cel("!has(self.autoscaling) || !self.autoscaling.enabled || self.workload == 'StatefulSet'",
            "autoscaling needs workload: StatefulSet; a DaemonSet runs one server per matching node, so its size "
            "follows the nodes (set autoscaling.enabled: false or workload: StatefulSet)", ".autoscaling.enabled"),
        cel("!self.hostNetwork || self.workload == 'DaemonSet'",
            "only a DaemonSet may use the node's network (replicas of a StatefulSet would collide on port 8000)",
            ".hostNetwork"),
        cel("!has(self.cache) || !has(self.cache.size) || self.workload != 'DaemonSet' "
            "|| (has(self.cache.shared) && self.cache.shared)",
            "a DaemonSet cannot create a claim per pod; set cache.shared (one ReadWriteMany claim for every node) "
            "or use cache.claimName (ReadWriteMany or ReadOnlyMany)",
            ".cache.size"),
    ))

    model: ModelSpec
    """The model to serve."""
    image: str = Field(DEFAULT_IMAGE, min_length=1, max_length=1024)
    """vLLM container image; its entrypoint must be `vllm serve` (the official vllm/vllm-openai images). The vLLM
    release its tag names (v0.31.0, also before a digest) chooses the flags extraArgs are checked against and the
    derived flags emitted; a release the operator has no flag snapshot of, or a tag naming none, is checked
    loosely (condition ExtraArgsUnchecked)."""
    image_pull_policy: Optional[Literal["Always", "IfNotPresent", "Never"]] = Field(None, alias="imagePullPolicy")
    """Image pull policy."""
    workload: Literal["StatefulSet", "DaemonSet"] = "StatefulSet"
    """StatefulSet (replicas) or DaemonSet (one server per matching GPU node)."""
    replicas: int = Field(1, ge=0, le=1000)
    """Replicas of a StatefulSet when autoscaling is off."""
    gpu: GPUSpec = Field(default_factory=GPUSpec)
    """GPUs per server."""
    ipc: Literal["Host", "SharedMemory"] = "SharedMemory"
    """Shared memory for tensor parallelism: the host's IPC namespace, or an in-memory /dev/shm volume."""
    shm_size: Optional[ByteSize] = Field(None, alias="shmSize")
    """Size of /dev/shm for ipc: SharedMemory; derived from the tensor-parallel size when omitted."""
    host_network: bool = Field(False, alias="hostNetwork")
    """DaemonSet only: serve on the node's network (port 8000 on each GPU node)."""
    workload_profile: WorkloadProfile = Field(default_factory=WorkloadProfile, alias="workloadProfile")
    """The traffic to size the engine for."""
    engine: EngineSpec = Field(default_factory=EngineSpec)
    """Engine settings that override derived ones."""
    cache: Optional[CacheSpec] = None
    """Hugging Face cache volume; an emptyDir when omitted (the model is downloaded at every start)."""
    hf_token_secret_ref: Optional[SecretKeyRef] = Field(None, alias="hfTokenSecretRef")
    """Secret key holding a Hugging Face token, exposed to vLLM as HF_TOKEN."""
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    """Queue-based autoscaling."""
    node_selector: Labels = Field(default_factory=dict, alias="nodeSelector")
    """Extra node selector labels."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    """Extra tolerations (the nvidia.com/gpu taint is always tolerated)."""
    affinity: Optional[FreeForm] = None
    """Pod affinity, as in a Pod spec."""
    topology_spread_constraints: list[FreeForm] = Field(default_factory=list, max_length=8,
                                                        alias="topologySpreadConstraints")
    """How the replicas spread over zones or nodes, as in a Pod spec (the API server checks them when the
    workload is applied)."""
    runtime_class_name: Optional[DNSSubdomain] = Field(None, alias="runtimeClassName")
    """RuntimeClass of the pods (e.g. "nvidia" where the NVIDIA container runtime is not the node's default)."""
    volumes: list[Volume] = Field(default_factory=list, max_length=MAX_EXTRA_VOLUMES,
                                  json_schema_extra=_list_map("name"))
    """Extra volumes of the pods: Secrets, ConfigMaps, existing claims, scratch directories (docs/escape-hatches.md)."""
    volume_mounts: list[VolumeMount] = Field(default_factory=list, max_length=16, alias="volumeMounts",
                                             json_schema_extra=_list_map("mountPath"))
    """Extra mounts of spec.volumes in the vLLM container (not at /cache, /home/vllm or /dev/shm)."""
    init_containers: list[Container] = Field(default_factory=list, max_length=MAX_EXTRA_CONTAINERS,
                                             alias="initContainers", json_schema_extra=_list_map("name"))
    """Containers that run to completion, in order, before vLLM starts (and before the model download)."""
    sidecars: list[Container] = Field(default_factory=list, max_length=MAX_EXTRA_CONTAINERS,
                                      json_schema_extra=_list_map("name"))
    """Containers that run beside vLLM for the pod's whole life, as native sidecars (initContainers with
    restartPolicy: Always): started before the model download and vLLM, stopped only after vLLM has drained."""
    pod_template_patch: Optional[PodTemplatePatch] = Field(None, alias="podTemplatePatch")
    """A strategic-merge patch of the pod template, applied after everything else and then checked like it
    (docs/escape-hatches.md says what it may change)."""
    startup_seconds: Optional[int] = Field(None, ge=60, le=86400, alias="startupSeconds")
    """How long the startup probe waits for vLLM to load, instead of the time derived from the weights' size
    (for slow disks, or a torch.compile that takes longer here)."""
    resources: ResourceOverrides = Field(default_factory=ResourceOverrides)
    """Host CPU and memory for the vLLM container; derived from the model when omitted."""
    pod_annotations: Annotations = Field(default_factory=dict, alias="podAnnotations")
    """Annotations for the pods."""
    pod_labels: Labels = Field(default_factory=dict, alias="podLabels")
    """Extra labels for the pods (the operator's selector labels cannot be overridden)."""
    service_account_name: Optional[DNSSubdomain] = Field(None, alias="serviceAccountName")
    """ServiceAccount the vLLM pods run as."""
    priority_class_name: Optional[DNSSubdomain] = Field(None, alias="priorityClassName")
    """PriorityClass of the pods."""
    run_as_user: int = Field(DEFAULT_RUN_AS_USER, ge=1, le=2**31 - 1, alias="runAsUser")
    """User (and group) ID the vLLM container runs as; never root, so the pods pass Pod Security "restricted".
    The official vllm/vllm-openai image runs as root and has no user of its own: any non-zero ID works (HOME is
    an emptyDir the pod can write, the model cache gets this group)."""


# --------------------------------------------------------------------------- status
class _Status(_Model):
    """Base of the status models. The operator builds every status it writes from them and sends their `wire`
    form, so a key they do not declare fails where the status is built (and in tests/unit/test_status.py) instead of
    being dropped by the API server. What a cluster holds is read with `from_live`, which keeps the declared keys
    only: a status another version of the operator wrote may hold others."""

    @model_validator(mode="before")
    @classmethod
    def _declared_keys_of_live(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, dict) and info.context and info.context.get("live"):
            declared = {f.alias or n for n, f in cls.model_fields.items()}
            return {k: v for k, v in data.items() if k in declared}
        return data

    @classmethod
    def from_live(cls, data: dict[str, Any]) -> Self:
        """The model of a status (or part of one) read from the API server."""
        return cls.model_validate(data, context={"live": True})

    def wire(self) -> dict[str, Any]:
        """As the API server has it: camelCase keys, unset fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True)


class Condition(_Status):
    """A status condition (Kubernetes metav1.Condition)."""

    type: str
    """Condition type: SpecValid, Ready, Progressing, Degraded, Stalled, Reconciling, ExternalScaler,
    PlanOutdated, ExtraArgsUnchecked (the reconciler's); AutoscalingActive, AutoscalingLimited (the autoscaler's)."""
    status: Literal["True", "False", "Unknown"]
    """True, False or Unknown."""
    reason: str = ""
    """One-word CamelCase reason."""
    message: str = ""
    """What happened, for people."""
    last_transition_time: Optional[str] = Field(None, alias="lastTransitionTime")
    """When the status last changed."""
    observed_generation: Optional[int] = Field(None, alias="observedGeneration")
    """The spec generation this condition was computed from."""


class PlanEstimates(_Status):
    """The planner's estimates, per GPU unless said otherwise."""

    tensor_parallel_size: Optional[int] = Field(None, alias="tensorParallelSize")
    """GPUs one server shards the model over."""
    gpu_memory_bytes: Optional[int] = Field(None, alias="gpuMemoryBytes")
    """Memory of one GPU."""
    weight_bytes_per_gpu: Optional[int] = Field(None, alias="weightBytesPerGpu")
    """Model weights per GPU."""
    activation_bytes_per_gpu: Optional[int] = Field(None, alias="activationBytesPerGpu")
    """Peak activation memory per GPU during profiling."""
    overhead_bytes_per_gpu: Optional[int] = Field(None, alias="overheadBytesPerGpu")
    """CUDA context, CUDA graphs, NCCL and allocator overheads per GPU."""
    kv_cache_bytes_per_gpu: Optional[int] = Field(None, alias="kvCacheBytesPerGpu")
    """KV cache per GPU."""
    kv_bytes_per_token: Optional[int] = Field(None, alias="kvBytesPerToken")
    """KV cache bytes per token per GPU."""
    kv_cache_tokens: Optional[int] = Field(None, alias="kvCacheTokens")
    """Tokens the KV cache holds."""
    max_model_len: Optional[int] = Field(None, alias="maxModelLen")
    """Longest request, in tokens."""
    max_concurrency: Optional[float] = Field(None, alias="maxConcurrency")
    """Full-length requests the KV cache holds at once."""
    gpu_memory_utilization: Optional[float] = Field(None, alias="gpuMemoryUtilization")
    """Fraction of GPU memory vLLM may use."""
    startup_seconds: Optional[int] = Field(None, alias="startupSeconds")
    """Time allowed for the model to load before the startup probe gives up."""


class PlanStatus(_Status):
    """What the planner derived, and why."""

    args: list[str] = Field(default_factory=list)
    """The vLLM container args (after `vllm serve`)."""
    estimates: PlanEstimates = Field(default_factory=PlanEstimates)
    """Memory and capacity estimates."""
    notes: list[str] = Field(default_factory=list)
    """Why each value was chosen."""
    model_source: Optional[str] = Field(None, alias="modelSource")
    """Where the model architecture came from (catalog, config.json, spec)."""


class AutoscalingStatus(_Status):
    """The autoscaler's last decision."""

    metric_value: Optional[float] = Field(None, alias="metricValue")
    """Average vllm:num_requests_waiting per ready replica at the last decision."""
    waiting: Optional[float] = None
    """Total requests waiting over all ready replicas."""
    running: Optional[float] = None
    """Total requests running over all ready replicas."""
    kv_cache_usage: Optional[float] = Field(None, alias="kvCacheUsage")
    """Mean vllm:kv_cache_usage_perc over ready replicas (0..1)."""
    desired_replicas: Optional[int] = Field(None, alias="desiredReplicas")
    """Replicas the autoscaler wants."""
    last_scale_time: Optional[str] = Field(None, alias="lastScaleTime")
    """When the autoscaler last changed the replica count."""
    reason: Optional[str] = None
    """Why the autoscaler decided what it did."""


class KVCapacityStatus(_Status):
    """Plan vs reality: the KV cache the plan expected per replica beside what vLLM allocated."""

    planned: Optional[int] = None
    """KV cache tokens per replica the plan estimated (status.plan.estimates.kvCacheTokens)."""
    measured: Optional[int] = None
    """KV cache tokens vLLM allocated (num_gpu_blocks x block_size of vllm:cache_config_info), smallest over the ready pods."""
    ratio: Optional[float] = None
    """measured / planned; below 0.9 the plan was optimistic and a KVCapacityBelowPlan Warning event is posted."""
    pods: Optional[int] = None
    """Ready pods whose /metrics reported their KV cache."""
    ready_pods: Optional[int] = Field(None, alias="readyPods")
    """Ready pods when it was measured."""


class VLLMServerStatus(_Status):
    """Observed state of a vLLM server."""

    observed_generation: Optional[int] = Field(None, alias="observedGeneration")
    """The spec generation the operator last acted on."""
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """SpecValid, Ready, Progressing, Degraded, Stalled, Reconciling, ExternalScaler, PlanOutdated,
    ExtraArgsUnchecked, AutoscalingActive, AutoscalingLimited."""
    replicas: Optional[int] = None
    """Pods the workload wants."""
    ready_replicas: Optional[int] = Field(None, alias="readyReplicas")
    """Pods serving."""
    selector: Optional[str] = None
    """Label selector of the pods (for the scale subresource)."""
    endpoint: Optional[str] = None
    """URL of the OpenAI-compatible client Service."""
    plan: Optional[PlanStatus] = None
    """What was derived and why."""
    autoscaling: Optional[AutoscalingStatus] = None
    """The autoscaler's last decision."""
    kv_capacity: Optional[KVCapacityStatus] = Field(None, alias="kvCapacity")
    """The plan's KV cache tokens per replica beside what vLLM allocated on the ready pods."""


class ObjectMeta(BaseModel):
    """The subset of metadata the operator and CLI read."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(..., min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    namespace: str = "default"


class VLLMServer(BaseModel):
    """A VLLMServer document (for files the CLI reads)."""

    model_config = ConfigDict(extra="forbid")
    apiVersion: Literal["vllm-operator.io/v1alpha1"]
    kind: Literal["VLLMServer"]
    metadata: ObjectMeta
    spec: VLLMServerSpec
    status: Optional[dict[str, Any]] = None
