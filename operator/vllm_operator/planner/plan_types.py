"""What the planner returns: the `Plan` (args, each flag decision and why, memory, estimates, problems),
and `Sizing`, what one step of `plan` hands the next."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .. import api
from ..api import VLLMServerSpec
from ..catalog import Architecture, ResolvedModel
from ..catalog.gpus import GPUSelection
from ..validation import FlagCheck, Problem
from .assumptions import ProfileTerms
from .memory import KVLayout


DEFAULT_PORT = api.VLLM_PORT
#: The port a group's leader coordinates its nodes on (vLLM's --master-port: torch.distributed's TCP store).
COORDINATION_PORT = 29500
#: The variables the LeaderWorkerSet controller puts into every pod of a group; the kubelet expands $(NAME) in
#: the container's args from them.
LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
WORKER_INDEX_ENV = "LWS_WORKER_INDEX"


@dataclass(frozen=True)
class FlagDecision:
    """One derived (or pinned) flag and why it has its value."""

    flag: str
    value: str
    why: str
    pinned: bool = False


@dataclass
class Memory:
    """Per-GPU memory breakdown, in bytes."""

    total: int
    reserved: int
    budget: int
    weights: int
    activation: int
    non_torch: int
    kv_cache: int
    cuda_graphs: int
    lora: int = 0
    """The LoRA adapters' GPU slots (adapters.LoRALayout), allocated before the KV cache is sized."""

    @property
    def free_after(self) -> int:
        """Memory outside vLLM's budget and the reservation (its CUDA context lives here)."""
        return self.total - self.budget - self.reserved


@dataclass
class Plan:
    """Everything derived for one VLLMServer."""

    name: str
    namespace: str
    spec: VLLMServerSpec
    model: Optional[ResolvedModel] = None
    gpu: GPUSelection = field(default_factory=GPUSelection)
    """spec.gpu resolved: the node requirements, the resource to request, the GPUs the pod can land on."""
    gpu_memory: Optional[int] = None
    gpu_source: str = ""
    tensor_parallel_size: int = 1
    nodes: int = 1
    """Nodes one server (a group, above 1) spans: spec.nodes (with spec.maxNodes, the count the planner chose)."""
    max_nodes: Optional[int] = None
    """spec.maxNodes: the bound the node count was chosen under (None: spec.nodes fixed it)."""
    layout: str = ""
    """With spec.maxNodes: the layout chosen and why (also the first note), or empty."""
    pipeline_parallel_size: int = 1
    """Pipeline stages, one per node with crossNodeParallelism Pipeline."""
    stage_layers: int = 0
    """The most layers one pipeline stage holds (with nodes > 1)."""
    args: list[str] = field(default_factory=list)
    decisions: list[FlagDecision] = field(default_factory=list)
    memory: Optional[Memory] = None
    kv_bytes_per_token: int = 0
    kv_cache_tokens: int = 0
    max_model_len: int = 0
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    gpu_memory_utilization: float = 0.0
    weight_bytes_total: int = 0
    stage_weight_bytes: int = 0
    """The weights one node loads: all of them on one node, its stage's share across nodes."""
    shm_bytes: int = 0
    host_memory_bytes: int = 0
    cpu_request: int = 0
    startup_seconds: int = 0
    drain_seconds: int = 0
    """--shutdown-timeout: how long in-flight requests may finish after SIGTERM."""
    prestop_seconds: int = 0
    """The preStop sleep before SIGTERM, while the pod leaves the Services' endpoints."""
    termination_grace_seconds: int = 0
    """terminationGracePeriodSeconds: preStop sleep + shutdown timeout + teardown margin."""
    prometheus_url: Optional[str] = None
    """The Prometheus the autoscaler (source: Prometheus) or a KEDA ScaledObject queries."""
    port: int = DEFAULT_PORT
    """The port vLLM listens on in the pod: 8000 unless extraArgs sets --port under the escape hatch."""
    notes: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    flags: Optional[FlagCheck] = None
    """The vLLM release whose flags the args were checked against and emitted for."""

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def max_concurrency(self) -> float:
        return self.kv_cache_tokens / self.max_model_len if self.max_model_len else 0.0

    def problem(self, field_path: str, message: str, reason: str = api.REASON_INVALID_SPEC) -> None:
        self.problems.append(Problem(field_path, message, reason))

    def problem_kinds(self) -> list[str]:
        """The kinds of the plan's problems (api.SPEC_REASONS: InvalidSpec, DoesNotFit, ...), each once, the first
        found first."""
        return list(dict.fromkeys(problem.reason for problem in self.problems))

    def estimates(self) -> dict[str, Any]:
        """The estimates in the API's camelCase shape (status.plan.estimates, plan -o json)."""
        m = self.memory
        return {
            "tensorParallelSize": self.tensor_parallel_size,
            "pipelineParallelSize": self.pipeline_parallel_size if self.nodes > 1 else None,
            "nodes": self.nodes if self.nodes > 1 or self.max_nodes else None,
            "gpuMemoryBytes": self.gpu_memory,
            "weightBytesPerGpu": m.weights if m else None,
            "activationBytesPerGpu": m.activation if m else None,
            "overheadBytesPerGpu": (m.non_torch + m.cuda_graphs) if m else None,
            "kvCacheBytesPerGpu": m.kv_cache if m else None,
            "kvBytesPerToken": self.kv_bytes_per_token or None,
            "kvCacheTokens": self.kv_cache_tokens or None,
            "maxModelLen": self.max_model_len or None,
            "maxConcurrency": round(self.max_concurrency, 2) if self.max_model_len else None,
            "gpuMemoryUtilization": self.gpu_memory_utilization or None,
            "startupSeconds": self.startup_seconds or None,
            "loraBytesPerGpu": (m.lora or None) if m else None,
        }

    def status(self) -> dict[str, Any]:
        """status.plan: args, estimates and the reasons, for `kubectl get -o yaml`."""
        return {
            "args": list(self.args),
            "estimates": {k: v for k, v in self.estimates().items() if v is not None},
            "notes": [f"{d.flag} {d.value}".strip() + f": {d.why}" for d in self.decisions] + list(self.notes),
            "modelSource": self.model.source if self.model else None,
        }


@dataclass
class Sizing:
    """What one step of `plan` hands the next: the model's facts and the per-GPU figures sized so far."""

    arch: Architecture
    #: bytes per element in the compute dtype
    elem: int
    #: the memory profile of the image's vLLM release
    terms: ProfileTerms
    budget: int = 0
    graphs: int = 0
    weights: int = 0
    seqs: int = 0
    seqs_why: str = ""
    batched: int = 0
    batched_why: str = ""
    kv: int = 0
    #: the LoRA adapters' slots per GPU (adapters.LoRALayout; 0 without spec.adapters)
    lora: int = 0
    kv_dtype: str = "auto"
    layout: Optional[KVLayout] = None
    #: tokens a sliding window keeps beside it (scheduled, not yet settled)
    in_flight: int = 0
    #: the longest --max-model-len the KV cache holds with the headroom
    fit_limit: int = 0
