"""The desired state: VLLMServerSpec and its parts (model, gpu, workload profile, engine, cache,
autoscaling), and the VLLMServer document the CLI reads."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)

from .names import (
    Annotations, ByteSize, DEFAULT_IMAGE, DEFAULT_RUN_AS_USER, DNSSubdomain, FreeForm, Labels, PodTemplatePatch,
    _Model, _rules, cel,
)
from .routing import RoutingSpec
from .kube_types import (
    Container, EnvVar, MAX_EXTRA_CONTAINERS, MAX_EXTRA_VOLUMES, ResourceOverrides, SecretKeyRef, Toleration, Volume,
    VolumeMount, _list_map,
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
    layer_types, Gemma 2/3's pattern, Mistral's all-layer window), or Llama 4's attention_chunk_size for its
    chunked local attention layers; vLLM's hybrid KV cache manager keeps only the window's (the chunk's) KV for those
    layers (SlidingWindowSpec, ChunkedLocalAttentionSpec). Omit for all-global attention."""
    sliding_window_layers: Optional[int] = Field(None, ge=0, le=1024, alias="slidingWindowLayers")
    """How many of the layers use slidingWindow (config.json: layer_types' sliding_attention entries, Gemma 3's
    sliding_window_pattern, Llama 4's no_rope_layers); the rest attend to the whole context. Omitted with
    slidingWindow: every layer."""
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
                                   "mxfp4", "other"]] = None
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


# --------------------------------------------------------------------------- adapters
#: Most adapters one server serves (spec.adapters): each is a served model name, a load call on every replica and
#: a row of status.adapters.
MAX_ADAPTERS = 32
#: An adapter's name: a served model name clients put in the OpenAI API's "model" field (vLLM takes any string;
#: these characters keep it one path segment, one URL-safe token and one line in status and Events).
ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
#: An adapter's source: a Hugging Face repo id (org/name) or an absolute path in the pod (no '..', no control
#: characters).
ADAPTER_SOURCE_PATTERN = r"^(/[^\x00-\x1f\x7f]*|[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)$"


class AdapterSpec(_Model):
    """A LoRA adapter of the served model, loaded on every replica at runtime (docs/adapters.md)."""

    model_config = ConfigDict(json_schema_extra=_rules(
        cel("!has(self.revision) || !self.source.startsWith('/')",
            "a revision names a commit of a Hub repo; a path has none", ".revision"),
        cel("!self.source.contains('/../') && !self.source.endsWith('/..')", "a path without '..'", ".source"),
    ))

    @model_validator(mode="after")
    def _no_parent_segments(self) -> "AdapterSpec":
        if "/../" in self.source or self.source.endswith("/.."):
            raise ValueError("source: a path without '..'")
        if self.revision is not None and self.source.startswith("/"):
            raise ValueError("revision: names a commit of a Hub repo; a path has none")
        return self

    name: str = Field(..., min_length=1, max_length=64, pattern=ADAPTER_NAME_PATTERN)
    """The served model name clients use in the OpenAI API's "model" field for this adapter; letters, digits, '.',
    '_' and '-', unique in the server and not the base model's served name."""
    source: str = Field(..., min_length=3, max_length=512, pattern=ADAPTER_SOURCE_PATTERN)
    """Where the adapter is: a Hugging Face repo id (org/name; vLLM downloads it into the model cache) or an
    absolute path in the pod, a directory holding adapter_config.json and the weights: in the model cache volume
    (/cache/...) or a volume of spec.volumes (an existing claim, a ConfigMap). No '..'."""
    revision: Optional[str] = Field(None, min_length=1, max_length=256, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
    """Hub source only: the branch, tag or commit the planner reads adapter_config.json at (default: main)."""
    rank: Optional[int] = Field(None, ge=1, le=512)
    """The adapter's LoRA rank (adapter_config.json's r). Read from the Hub when omitted; required for a path in
    the cache, which the planner cannot read. A larger rank in adapter_config.json wins."""


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
    """GPUs per server (nvidia.com/gpu), per node with nodes > 1; also the tensor-parallel size (times nodes with
    crossNodeParallelism: Tensor). 1 with migProfile."""
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
    max_loras: Optional[int] = Field(None, ge=1, le=32, alias="maxLoras")
    """With spec.adapters: adapters one batch may use at once, each in a GPU slot of maxLoraRank (--max-loras);
    default 4, whatever the number of adapters (a changed flag restarts the pods). Each slot costs GPU memory
    (status.plan.estimates.loraBytesPerGpu)."""
    max_lora_rank: Optional[int] = Field(None, ge=1, le=512, alias="maxLoraRank")
    """With spec.adapters: the rank every slot is sized for (--max-lora-rank), one of the image's vLLM release's
    choices and at least the largest adapter's rank; default: the smallest such choice, at least 16."""
    extra_args: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, alias="extraArgs", max_length=128)
    """More vLLM flags, passed verbatim after the derived ones; a flag the operator derives is refused here."""
    env: list[EnvVar] = Field(default_factory=list, max_length=128)
    """Environment variables for the vLLM container."""


# --------------------------------------------------------------------------- storage / secrets
class ClaimRetentionPolicy(_Model):
    """What happens to the per-replica cache claims (cache.size without shared): the StatefulSet's
    persistentVolumeClaimRetentionPolicy. The default deletes them with the server and keeps them when it scales
    down, so a replica that comes back finds its model already downloaded."""

    when_deleted: Literal["Retain", "Delete"] = Field("Delete", alias="whenDeleted")
    """Delete (the default): deleting the server deletes its cache claims (and so, with a Delete reclaim policy,
    their volumes). Retain: they stay, with the downloaded model, until deleted by hand (docs/storage.md)."""
    when_scaled: Literal["Retain", "Delete"] = Field("Retain", alias="whenScaled")
    """Retain (the default): a replica removed by a scale-down keeps its claim for when it comes back. Delete: its
    claim is deleted with it."""


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
    persistent_volume_claim_retention_policy: ClaimRetentionPolicy = Field(
        default_factory=ClaimRetentionPolicy, alias="persistentVolumeClaimRetentionPolicy")
    """What happens to the per-replica claims (size, not shared) when the server is deleted or scaled down; the
    default is whenDeleted: Delete, whenScaled: Retain. The shared claim is always deleted with the server, and a
    claimName is never touched."""


# --------------------------------------------------------------------------- autoscaling
#: The autoscaler's tolerance, the HPA's: no change while the ratio of the queue to its target is within 10% of 1
#: (autoscaler/policy.py decides with it; the planner sizes --max-num-queued-reqs above it).
AUTOSCALING_TOLERANCE = 0.1


class ScaleToZeroSpec(_Model):
    """When a server with minReplicas 0 goes to zero (docs/scale-to-zero.md)."""

    idle_seconds: int = Field(300, ge=10, le=86400, alias="idleSeconds")
    """Scale to zero once no request has been running or waiting on any replica for this long (the same vLLM
    gauges the autoscaler reads, every read of the window). The first request at zero wakes one replica."""


class AutoscalingSpec(_Model):
    """Scale replicas on vLLM's own queue (vllm:num_requests_waiting)."""

    model_config = ConfigDict(json_schema_extra=_rules(
        cel("!self.enabled || has(self.maxReplicas)", "required when autoscaling is enabled", ".maxReplicas"),
        cel("!has(self.maxReplicas) || self.maxReplicas >= self.minReplicas",
            "must be at least minReplicas", ".maxReplicas"),
        cel("!has(self.maxReplicas) || self.maxReplicas >= 1", "must be at least 1", ".maxReplicas"),
        cel("!has(self.minReplicas) || self.minReplicas > 0 || self.mode != 'HPA'",
            "a HorizontalPodAutoscaler cannot scale to zero (Kubernetes' HPAScaleToZero gate is alpha): use mode "
            "Operator or KEDA for minReplicas 0", ".minReplicas"),
    ))

    enabled: bool = False
    """Turn queue-based autoscaling on; when on, replicas is ignored and the autoscaler owns the count."""
    mode: Literal["Operator", "HPA", "KEDA"] = "Operator"
    """Who scales: the operator's own loop (default), an emitted HorizontalPodAutoscaler, or a KEDA ScaledObject."""
    min_replicas: int = Field(1, ge=0, le=1000, alias="minReplicas")
    """Fewest replicas. 0: scale to zero after scaleToZero.idleSeconds without a request, and back to one on
    the next request (mode Operator: the endpoint picker's count of requests it had no pod for, so it needs
    routing.inferencePool; mode KEDA: KEDA's activation); docs/scale-to-zero.md."""
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
    scale_to_zero: ScaleToZeroSpec = Field(default_factory=ScaleToZeroSpec, alias="scaleToZero")
    """How long a server with minReplicas 0 stays up without a request."""


# --------------------------------------------------------------------------- spec
class VLLMServerSpec(_Model):
    """Desired state of a vLLM server."""

    model_config = ConfigDict(json_schema_extra=_rules(
        cel("!has(self.autoscaling) || !self.autoscaling.enabled || self.workload == 'StatefulSet'",
            "autoscaling needs workload: StatefulSet; a DaemonSet runs one server per matching node, so its size "
            "follows the nodes (set autoscaling.enabled: false or workload: StatefulSet)", ".autoscaling.enabled"),
        cel("!has(self.autoscaling) || !self.autoscaling.enabled || !has(self.autoscaling.minReplicas) "
            "|| self.autoscaling.minReplicas > 0 || (has(self.autoscaling.mode) && self.autoscaling.mode != 'Operator') "
            "|| (has(self.routing) && has(self.routing.inferencePool) && self.routing.inferencePool.enabled)",
            "minReplicas 0 with mode Operator needs routing.inferencePool.enabled: the endpoint picker's count of "
            "requests that found no pod is what wakes a server at zero", ".autoscaling.minReplicas"),
        cel("!self.hostNetwork || self.workload == 'DaemonSet'",
            "only a DaemonSet may use the node's network (replicas of a StatefulSet would collide on port 8000)",
            ".hostNetwork"),
        cel("!has(self.cache) || !has(self.cache.size) || self.workload != 'DaemonSet' "
            "|| (has(self.cache.shared) && self.cache.shared)",
            "a DaemonSet cannot create a claim per pod; set cache.shared (one ReadWriteMany claim for every node) "
            "or use cache.claimName (ReadWriteMany or ReadOnlyMany)",
            ".cache.size"),
        cel("self.nodes == 1 || self.workload == 'StatefulSet'",
            "a server across nodes is a LeaderWorkerSet of groups (workload: StatefulSet); a DaemonSet runs one "
            "single-node server per matching node", ".nodes"),
        cel("self.nodes == 1 || !has(self.gpu) || !has(self.gpu.migProfile)",
            "vLLM cannot run across nodes on MIG slices: use whole GPUs (gpu.count) or nodes: 1", ".nodes"),
        cel("self.nodes == 1 || !has(self.cache) || !has(self.cache.size) "
            "|| (has(self.cache.shared) && self.cache.shared)",
            "a group of nodes gets no claim per pod: set cache.shared (one ReadWriteMany claim every node mounts) "
            "or cache.claimName", ".cache.size"),
        cel("!has(self.maxNodes) || self.nodes == 1",
            "nodes and maxNodes exclude each other: nodes fixes the count, maxNodes lets the planner choose the "
            "fewest nodes that fit, up to it", ".maxNodes"),
        cel("!has(self.maxNodes) || self.workload == 'StatefulSet'",
            "maxNodes may make the server a LeaderWorkerSet of groups (workload: StatefulSet); a DaemonSet runs one "
            "single-node server per matching node", ".maxNodes"),
        cel("!has(self.maxNodes) || !has(self.gpu) || !has(self.gpu.migProfile)",
            "vLLM cannot run across nodes on MIG slices: use whole GPUs (gpu.count) or leave maxNodes out",
            ".maxNodes"),
        cel("!has(self.maxNodes) || !has(self.cache) || !has(self.cache.size) "
            "|| (has(self.cache.shared) && self.cache.shared)",
            "maxNodes may choose a group of nodes, which gets no claim per pod: set cache.shared (one ReadWriteMany "
            "claim every node mounts) or cache.claimName", ".cache.size"),
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
    """GPUs per server (per node of the server with nodes > 1)."""
    nodes: int = Field(1, ge=1, le=64)
    """Nodes one server spans, each with gpu.count GPUs (docs/multi-node.md). Above 1 the server is a group: a
    LeaderWorkerSet (sigs.k8s.io/lws, installed in the cluster) whose leader serves the API and whose workers run
    vLLM headless; replicas and autoscaling count groups. The model is split across the nodes as crossNodeParallelism
    says. Leave it at 1 with maxNodes."""
    max_nodes: Optional[int] = Field(None, ge=2, le=64, alias="maxNodes")
    """Let the planner choose the node count: the fewest nodes, from 1 up to maxNodes, of gpu.count GPUs each on
    which the model and its KV cache fit (status.plan.estimates.nodes and the plan's first note say which and why;
    docs/multi-node.md). Refused (DoesNotFit) with the reason when even maxNodes nodes cannot hold it. Excludes
    nodes > 1; one node is a StatefulSet pod, more a LeaderWorkerSet group, as with nodes."""
    cross_node_parallelism: Literal["Pipeline", "Tensor"] = Field("Pipeline", alias="crossNodeParallelism")
    """How a server with nodes > 1 splits the model across its nodes: Pipeline (default: the layers in one stage
    per node, --pipeline-parallel-size nodes, tensor parallelism over gpu.count inside each node), or Tensor
    (--tensor-parallel-size gpu.count x nodes: every layer sharded over every GPU of the group, which needs a fast
    interconnect between the nodes, InfiniBand or RoCE; the plan warns)."""
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
    adapters: list[AdapterSpec] = Field(default_factory=list, max_length=MAX_ADAPTERS,
                                        json_schema_extra=_list_map("name"))
    """LoRA adapters of the model, served under their own names beside it: planned (rank, memory), loaded and
    unloaded on every ready replica at runtime without a restart, their state in status.adapters
    (docs/adapters.md)."""
    cache: Optional[CacheSpec] = None
    """Hugging Face cache volume; an emptyDir when omitted (the model is downloaded at every start)."""
    hf_token_secret_ref: Optional[SecretKeyRef] = Field(None, alias="hfTokenSecretRef")
    """Secret key holding a Hugging Face token, exposed to vLLM as HF_TOKEN."""
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    """Queue-based autoscaling."""
    routing: RoutingSpec = Field(default_factory=RoutingSpec)
    """Routing through the Gateway API Inference Extension (an InferencePool and its endpoint picker, an
    HTTPRoute); off by default: the ClusterIP Service's round robin (docs/routing.md)."""
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
