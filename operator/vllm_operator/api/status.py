"""The status the operator writes (conditions, the plan, autoscaling, the KV capacity): every status is
built from these models, so a misspelt key fails where it is built."""

from __future__ import annotations

from typing import Any, Literal, Optional, Self

from pydantic import (
    Field,
    ValidationInfo,
    model_validator,
)

from .names import _Model


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
    PlanOutdated, ExtraArgsUnchecked, AdaptersReady (the reconciler's); AutoscalingActive, AutoscalingLimited (the autoscaler's)."""
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
    pipeline_parallel_size: Optional[int] = Field(None, alias="pipelineParallelSize")
    """Pipeline stages of a server across nodes (one per node)."""
    nodes: Optional[int] = Field(None)
    """Nodes one server (a group) spans, when more than one."""
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
    lora_bytes_per_gpu: Optional[int] = Field(None, alias="loraBytesPerGpu")
    """The LoRA adapters' GPU slots (--max-loras x --max-lora-rank over every adapted layer), taken from the KV
    cache's share of the budget."""


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


class ChatTemplateStatus(_Status):
    """The last spec.engine.chatTemplate the operator checked (chattemplate.py), so that a restart checks it not
    again: written by the operator only (the status subresource), so a tenant cannot vouch for its own template."""

    digest: str = Field(max_length=80)
    """sha256 of the checker's version and the template."""
    problem: Optional[str] = Field(None, max_length=1024)
    """Why vLLM could not use it; absent when it can."""


class AdapterStatus(_Status):
    """One adapter of spec.adapters on the replicas whose vLLM answers."""

    name: str
    """The adapter's served model name."""
    loaded: int = 0
    """Replicas whose vLLM lists the adapter in /v1/models (it serves requests naming it there)."""
    replicas: int = 0
    """Replicas whose vLLM the operator reached: Ready, or held back by the adapters' readiness gate until their
    adapters are loaded."""
    last_error: Optional[str] = Field(None, alias="lastError")
    """The last failure to load it, as a category (the pod, the call, the HTTP status): never the answer's bytes."""


class VLLMServerStatus(_Status):
    """Observed state of a vLLM server."""

    observed_generation: Optional[int] = Field(None, alias="observedGeneration")
    """The spec generation the operator last acted on."""
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """SpecValid, Ready, Progressing, Degraded, Stalled, Reconciling, ExternalScaler, PlanOutdated,
    ExtraArgsUnchecked, AdaptersReady, AutoscalingActive, AutoscalingLimited."""
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
    adapters: Optional[list[AdapterStatus]] = Field(None, json_schema_extra={"x-kubernetes-list-type": "map",
                                                                               "x-kubernetes-list-map-keys": ["name"]})
    """spec.adapters on the replicas: loaded on how many, the last error (condition AdaptersReady sums it up)."""
    served_models: Optional[list[str]] = Field(None, alias="servedModels")
    """The model names clients may send in the "model" field: the base model's served name and each adapter's,
    as the replicas in the Service list them in /v1/models (an adapter counts once every one of them serves it)."""
    chat_template: Optional[ChatTemplateStatus] = Field(None, alias="chatTemplate")
    """The digest of the chat template last checked, and its verdict."""
