"""Derive vLLM's flags from the model, the GPU and the workload, and explain each one.

Pure: spec + resolved model + GPU facts in, a `Plan` out; no I/O. The memory model
mirrors how vLLM sizes its KV cache (vllm/v1/worker/gpu_worker.py,
determine_available_memory): the budget is `gpu_memory_utilization x total memory`;
from it come the weights, the activation peak of a profiling forward pass over
`max_num_batched_tokens` tokens, non-torch memory (cuBLAS, NCCL) and, since vLLM 0.21,
the CUDA graphs it profiles before sizing the KV cache
(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, on by default); the rest is KV cache. vLLM
refuses to start when the GPU's free memory, taken after its own CUDA context exists,
is below the budget, so the derived utilization leaves that context, a margin and
gpu.reservedMemory outside. Every constant is in `ASSUMPTIONS`, with its source.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from . import api, vllm_flags
from .api import AUTOSCALING_TOLERANCE, VLLMServerSpec, parse_quantity
from .catalog import Architecture, ResolvedModel
from .gpus import GPUSelection, select_gpu
from .urlpolicy import URLPolicy
from .validation import (OWNED_FLAGS, PREQUANTIZED, UNSAFE_FLAGS, check_spec, flag_check, FlagCheck,
                         hardware_problems, image_vllm_version, Problem, quantization_problems)

GiB = 2**30
MiB = 2**20

#: The planner's assumptions in one place (values in bytes unless said otherwise).
ASSUMPTIONS: dict[str, tuple[float, str]] = {
    "block_size": (16, "vLLM's default KV block size; KV capacity is counted in whole blocks"),
    "default_utilization": (0.92, "vLLM's default --gpu-memory-utilization (0.9 before 0.11)"),
    "cuda_graph_per_gpu": (
        0.75 * GiB,
        "CUDA graph pool per GPU; vLLM >= 0.21 profiles it and takes it from the KV cache, inside the "
        "utilization budget (gpu_worker.determine_available_memory, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1)",
    ),
    "cuda_context": (
        0.5 * GiB,
        "vLLM's own CUDA context, already allocated when it compares free memory with the budget at start "
        "(gpu_worker.init_device -> request_memory): it must fit outside the budget",
    ),
    "safety_margin": (0.25 * GiB, "slack per GPU between vLLM's budget and what the GPU has free"),
    "activation_hidden_factor": (
        7,
        "activation peak per batched token = (2 x intermediate / TP + 7 x hidden) x dtype bytes; fitted to vLLM's "
        "peak_torch_memory for Llama-3.1-8B at 20k and 29k batched tokens (vllm issue 10517: 2.07 and 2.99 GiB "
        "above the weights, i.e. ~6.4 x hidden), rounded up",
    ),
    "context_headroom": (0.90, "derived --max-model-len stays within 90% of the estimated KV tokens"),
    "quant_overhead": (1.03, "scales and zero points of 4-bit group quantization (group size 128)"),
    "load_bandwidth": (200e6, "conservative bytes/s to download or read weights at start"),
    "engine_init_seconds": (240, "engine start after weights: profiling, torch.compile, CUDA graphs"),
    "startup_floor_seconds": (600, "never give a model less than this to start"),
    "drain_tokens_per_second": (
        20,
        "decode speed of one request assumed when sizing --shutdown-timeout: a slow stream (a loaded GPU, a long "
        "context), so a p95 answer started just before SIGTERM still finishes",
    ),
    "drain_floor_seconds": (30, "never give in-flight requests less than this after SIGTERM (derived)"),
    "drain_ceiling_seconds": (600, "never hold a stopping pod (and a rollout) longer than this (derived)"),
    "prestop_seconds": (
        10,
        "the preStop sleep: the endpoints controller, kube-proxy and ingress controllers drop a terminating pod "
        "from the Services within a few seconds; vLLM keeps serving meanwhile and gets SIGTERM only after it",
    ),
    "shutdown_margin_seconds": (
        10,
        "after the drain vLLM stops its engine processes and frees GPU memory; the grace period leaves this long "
        "for it before the kubelet's SIGKILL",
    ),
}


def _a(name: str) -> float:
    return ASSUMPTIONS[name][0]


@dataclass(frozen=True)
class ProfileTerms:
    """What one range of vLLM releases takes from the memory budget besides the weights and the KV cache
    (gpu_worker.determine_available_memory), and how its sliding windows count tokens in flight. Each figure
    is read off vLLM's own logs (the source says which); a release uses the entry with the latest `since` not
    after it."""

    since: tuple[int, int]
    logits_bytes: float
    """Peak bytes per logit of the sampler's dummy run over max_num_seqs rows x vocabulary: it dominates the
    activation peak whenever max_num_seqs x vocab is large (1024 rows on >=70 GiB GPUs)."""
    non_torch: float
    """Non-torch memory at TP=1 (CUDA context growth, cuBLAS workspaces), bytes per GPU."""
    tp_overhead: float
    """What TP >= 2 adds to non-torch memory per GPU (NCCL buffers, custom all-reduce IPC buffers), bytes."""
    cuda_graphs_in_budget: bool
    """Whether the CUDA-graph pool is profiled before the KV cache and taken out of it."""
    concurrent_batches: int
    """Batches in flight at once (VllmConfig.max_concurrent_batches): a sliding-window layer keeps their
    tokens beside its window (SlidingWindowSpec.max_admission_blocks_per_request)."""
    source: str
    videos_profiled: bool = True
    """Whether the multimodal profile takes a video as long as max_model_len allows when it is larger than an image
    (MultiModalBudget asks the processor for one item of each modality: 0.32's source). Assumed from 0.10 on (a
    release that profiles an image takes less, never more); vLLM 0.8.2 profiled Qwen2.5-VL with an image
    (QwenLM/Qwen3-VL#1057)."""


#: vLLM's memory profile by release, oldest first.
PROFILE_TERMS: tuple[ProfileTerms, ...] = (
    ProfileTerms(
        since=(0, 0), logits_bytes=40, non_torch=0.35 * GiB, tp_overhead=1.8 * GiB, cuda_graphs_in_budget=False,
        concurrent_batches=1, videos_profiled=False,
        source="V0 engine. vllm#10517 (RTX 3090, Llama-3.1-8B): non_torch_memory 0.35 GiB. vllm PR 10511 (0.6.5, H100, "
               "Meta-Llama-3-8B, max_num_seqs 256): activation peak 1.26 GiB = 41 bytes per logit of 256 x 128256 "
               "(above the forward pass), non_torch 1.79 GiB at TP=1 and 3.58 GiB at TP=2 (+1.79 GiB)"),
    ProfileTerms(
        since=(0, 10), logits_bytes=12, non_torch=0.15 * GiB, tp_overhead=0.45 * GiB, cuda_graphs_in_budget=False,
        concurrent_batches=1,
        source="V1 with FlashInfer's top-k/top-p sampler (vLLM 0.10 logs 'Using FlashInfer for top-p & top-k "
               "sampling'). dennislee22/vLLM-benchmarking logs (0.10.1.1, A100 80GB, Qwen2-7B-Instruct, max_num_seqs "
               "256): budget - weights - KV = 0.53 GiB at TP=1 = 0.44 GiB of 256 x 152064 logits at 12 bytes + non-torch; "
               "0.62 GiB at TP=2 without GPU peer-to-peer (custom all-reduce off); gpt-oss-120b at TP=4: 284.25x "
               "concurrency is exactly one batch of max_num_batched_tokens beside the 128-token window"),
    ProfileTerms(
        since=(0, 11), logits_bytes=39, non_torch=0.15 * GiB, tp_overhead=0.45 * GiB, cuda_graphs_in_budget=False,
        concurrent_batches=1,
        source="V1 sampling without FlashInfer. llm-d/llm-d-benchmark config_explorer/empirical-vllm-memory-results.md "
               "(H100 79.18 GiB, max_num_seqs 1024): activation peak 4.76 (Llama-3.1-8B), 4.84 (Llama-3.3-70B-FP8 at "
               "TP=2), 5.56 (Qwen3-0.6B), 5.64 (Qwen3-32B), 7.38 GiB (gpt-oss-20b) = 38.4-39.6 bytes per logit of 1024 x "
               "vocab, the same at max_model_len 16000 and 32000; non-torch 0.13-0.14 GiB at TP=1, 0.55 GiB at TP=2 "
               "(+0.42); the PyTorch top-k/top-p fallback on A100 in the 0.10.1.1 logs costs the same (1.5 GiB over "
               "256 x 152064 logits)"),
    ProfileTerms(
        since=(0, 21), logits_bytes=39, non_torch=0.15 * GiB, tp_overhead=0.45 * GiB, cuda_graphs_in_budget=True,
        concurrent_batches=1,
        source="vLLM 0.21 profiles the CUDA-graph pool before the KV cache and takes it out of the budget "
               "(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS on by default; eugr/spark-vllm-docker#396 on 0.29: "
               "'the CUDA-graph memory profiling (default since v0.21)')"),
    ProfileTerms(
        since=(0, 32), logits_bytes=39, non_torch=0.15 * GiB, tp_overhead=0.45 * GiB, cuda_graphs_in_budget=True,
        concurrent_batches=2,
        source="vLLM 0.32's source: async scheduling is on by default, so VllmConfig.max_concurrent_batches is 2; "
               "the V1 model runner's _dummy_sampler_run also warms the PyTorch top-k/top-p path (forward_native), "
               "so its peak is the 39-byte one above (Model Runner V2 skips top-k/top-p in its dummy run and peaks "
               "lower: vllm PR 48037, 3.04 GiB on H100; the larger figure is kept)"),
)


def profile_terms(release: Optional[str] = None) -> ProfileTerms:
    """The ProfileTerms of a vLLM release ("0.10.1.1", "v0.32.0"); None or an unreadable one: the pinned
    snapshot's release (vllm_flags.VERSION)."""
    found = re.match(r"v?(\d+)\.(\d+)", release or "") or re.match(r"v?(\d+)\.(\d+)", vllm_flags.VERSION)
    key = (int(found.group(1)), int(found.group(2))) if found else (10**6, 0)
    return [t for t in PROFILE_TERMS if t.since <= key][-1]


BYTES_PER_WEIGHT = {
    "none": None,  # the compute dtype
    "fp8": 1.0,
    "awq": 0.5,
    "awq_marlin": 0.5,
    "gptq": 0.5,
    "gptq_marlin": 0.5,
    "bitsandbytes": 0.5,
    "gguf": 0.6,  # ~4.8 bits for Q4_K_M, the common choice
    "compressed-tensors": 1.0,  # W8A8 is the common case; 4-bit checkpoints are smaller
}

DEFAULT_PORT = api.VLLM_PORT


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

    def problem(self, field_path: str, message: str) -> None:
        self.problems.append(Problem(field_path, message))

    def estimates(self) -> dict[str, Any]:
        """The estimates in the API's camelCase shape (status.plan.estimates, plan -o json)."""
        m = self.memory
        return {
            "tensorParallelSize": self.tensor_parallel_size,
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
        }

    def status(self) -> dict[str, Any]:
        """status.plan: args, estimates and the reasons, for `kubectl get -o yaml`."""
        return {
            "args": list(self.args),
            "estimates": {k: v for k, v in self.estimates().items() if v is not None},
            "notes": [f"{d.flag} {d.value}".strip() + f": {d.why}" for d in self.decisions] + list(self.notes),
            "modelSource": self.model.source if self.model else None,
        }


# --------------------------------------------------------------------------- helpers
def gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def _round_down(n: float, step: int) -> int:
    return int(n // step * step)


def dtype_bytes(spec: VLLMServerSpec, model: ResolvedModel) -> int:
    """Bytes per element of weights/activations in the compute dtype."""
    dtype = spec.model.dtype
    if dtype == "auto":
        # vLLM's auto: the checkpoint's dtype, but float32 checkpoints run in 16-bit.
        return 2
    return 4 if dtype == "float32" else 2


def kv_bytes_per_token_per_layer(arch: Architecture, tp: int, kv_dtype: str, elem_bytes: int) -> int:
    """One token's KV in one layer on one GPU, as vLLM's KV cache specs size a page (vllm/v1/kv_cache_interface.py).

    Attention (FullAttentionSpec, SlidingWindowSpec): 2 (K and V) x max(1, kv_heads // TP) x head_dim x dtype
    bytes. Multi-head latent attention (MLAAttentionSpec, DeepSeek V2/V3, Kimi K2): one latent of kv_lora_rank +
    qk_rope_head_dim values, not per head and not split by TP (every GPU holds it whole)."""
    kv_elem = 1 if kv_dtype.startswith("fp8") else elem_bytes
    if arch.kv_lora_rank:
        return (arch.kv_lora_rank + (arch.qk_rope_head_dim or 0)) * kv_elem
    kv_heads_per_gpu = max(1, arch.num_kv_heads // tp)
    return 2 * kv_heads_per_gpu * arch.head_dim * kv_elem


def kv_bytes_per_token(arch: Architecture, tp: int, kv_dtype: str, elem_bytes: int) -> int:
    """One token's KV in every layer on one GPU (what a token costs while it is inside every window)."""
    return arch.num_layers * kv_bytes_per_token_per_layer(arch, tp, kv_dtype, elem_bytes)


@dataclass(frozen=True)
class KVLayout:
    """How vLLM pools one GPU's KV cache for a model (vllm/v1/core/kv_cache_utils.py).

    Layers are put into groups of one attention type and `group_size` layers each (full attention, sliding
    window; _get_kv_cache_groups_uniform_page_size: the smaller type's count, or the larger when it is under 1.5x
    the smaller, padding the last group). One block of the shared pool holds `block_size` tokens of every layer
    of one group, so it costs group_size pages, and a request takes blocks from every group: cdiv(length,
    block_size) from each full-attention group, and from each sliding group only what its window keeps
    (SlidingWindowSpec.max_admission_blocks_per_request: cdiv(min(window - 1 + tokens in flight, length),
    block_size) + 1). vLLM logs num_blocks / blocks_per_request(max_model_len) x max_model_len as "GPU KV cache
    size: N tokens" (get_kv_cache_capacity)."""

    page_bytes: int
    full_layers: int
    sliding_layers: int = 0
    sliding_window: int = 0
    block_size: int = 16

    @property
    def group_size(self) -> int:
        counts = [n for n in (self.full_layers, self.sliding_layers) if n]
        small, large = min(counts), max(counts)
        return large if large < small * 1.5 else small

    @property
    def groups(self) -> tuple[int, int]:
        """(full-attention groups, sliding-window groups)."""
        size = self.group_size
        return -(-self.full_layers // size), -(-self.sliding_layers // size)

    @property
    def bytes_per_block(self) -> int:
        return self.group_size * self.page_bytes

    def num_blocks(self, available_bytes: float) -> int:
        return max(0, int(available_bytes // self.bytes_per_block))

    def blocks_per_request(self, length: int, in_flight: int) -> int:
        full, sliding = self.groups
        blocks = full * -(-length // self.block_size)
        if sliding:
            kept = min(self.sliding_window - 1 + in_flight, length)
            blocks += sliding * (-(-kept // self.block_size) + 1)
        return blocks

    def tokens(self, available_bytes: float, length: int, in_flight: int) -> int:
        """vLLM's "GPU KV cache size: N tokens" for requests of `length` tokens."""
        return int(self.num_blocks(available_bytes) / self.blocks_per_request(length, in_flight) * length)

    def longest_request(self, available_bytes: float, in_flight: int) -> int:
        """The longest request (a whole number of blocks) whose blocks fit the pool: vLLM refuses a longer
        --max-model-len (check_enough_kv_cache_memory)."""
        blocks = self.num_blocks(available_bytes)
        full, sliding = self.groups
        if not full:  # every layer slides: any length fits once the window's blocks do
            fits = sliding * (-(-(self.sliding_window - 1 + in_flight) // self.block_size) + 1) <= blocks
            return 10**9 if fits else 0
        # The sliding groups' share saturates at the window, so take it at its largest (a length past the window).
        window_blocks = self.blocks_per_request(10**9, in_flight) - full * -(-10**9 // self.block_size)
        longest = (blocks - window_blocks) // full * self.block_size
        if longest <= self.sliding_window - 1 + in_flight:  # shorter than the window: every group grows with it
            longest = blocks // (full + sliding) * self.block_size
            while longest > 0 and self.blocks_per_request(longest, in_flight) > blocks:
                longest -= self.block_size
        return max(0, longest)


def kv_layout(arch: Architecture, tp: int, kv_dtype: str, elem_bytes: int) -> KVLayout:
    """The model's KVLayout on one GPU: sliding-window layers (arch.sliding_window, sliding_window_layers) in
    their own groups, every other layer full attention; MLA pages from the latent width."""
    page = int(_a("block_size")) * kv_bytes_per_token_per_layer(arch, tp, kv_dtype, elem_bytes)
    sliding = 0
    if arch.sliding_window and not arch.kv_lora_rank:
        sliding = min(arch.num_layers, arch.sliding_window_layers if arch.sliding_window_layers is not None
                      else arch.num_layers)
    return KVLayout(page_bytes=page, full_layers=arch.num_layers - sliding, sliding_layers=sliding,
                    sliding_window=(arch.sliding_window or 0) if sliding else 0, block_size=int(_a("block_size")))


def tokens_in_flight(batched_tokens: int, terms: Optional[ProfileTerms] = None, pooling: bool = False) -> int:
    """Tokens scheduled but not yet settled, that a sliding window keeps beside its window
    (VllmConfig.max_in_flight_tokens): max_num_batched_tokens per concurrent batch (ProfileTerms). A pooling model
    has one batch in flight: vLLM 0.32 turns async scheduling off for the pooling runner (VllmConfig.__post_init__)."""
    return (1 if pooling else (terms or profile_terms()).concurrent_batches) * batched_tokens


def is_pooling(arch: Architecture) -> bool:
    """vLLM serves the model with its pooling runner: an encoder-only model, or a decoder marked pooling."""
    return bool(arch.encoder_only or arch.pooling)


def weight_bytes(arch: Architecture, quantization: str, elem_bytes: int) -> int:
    """Bytes of all weights; quantization leaves the embeddings and lm_head in 16-bit."""
    params = arch.parameter_count
    per = BYTES_PER_WEIGHT[quantization]
    if per is None:
        return params * elem_bytes
    embed = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
    embed = min(embed, params)
    overhead = _a("quant_overhead") if per < 1 else 1.0
    return int((params - embed) * per * overhead + embed * elem_bytes)


def rotary_cache_bytes(arch: Architecture, elem_bytes: int) -> int:
    """The rotary embedding's cos/sin cache, max positions x head dim, on every GPU.

    vLLM counts it with the weights: 131072 x 128 x 2 bytes = 0.031 GiB is exactly the gap between
    Llama-3.1-8B's 8.03e9 x 2 bytes (14.957 GiB) and the 14.9888 GiB vLLM logged (vllm issue 10517).
    """
    return arch.max_position_embeddings * arch.head_dim * elem_bytes


def mm_limits(extra_args: list[str]) -> dict[str, int]:
    """--limit-mm-per-prompt from extraArgs, as vLLM 0.32 reads it: a JSON object ('{"image": 2, "video": 0}', a
    modality's value a count or {"count": n, ...}) or one modality per flag (--limit-mm-per-prompt.video 0). Only
    counts are read; what is not a count is left out (vLLM's own default for that modality applies)."""
    out: dict[str, int] = {}
    for i, arg in enumerate(extra_args):
        flag, eq, value = arg.partition("=")
        if not flag.startswith("--limit-mm-per-prompt"):
            continue
        if not eq:
            value = extra_args[i + 1] if i + 1 < len(extra_args) else ""
        modality = flag.removeprefix("--limit-mm-per-prompt")
        try:
            parsed = json.loads(value)
        except ValueError:
            continue
        items = {modality[1:]: parsed} if modality.startswith(".") else parsed if modality == "" else {}
        for name, limit in (items.items() if isinstance(items, dict) else ()):
            count = limit.get("count") if isinstance(limit, dict) else limit
            if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
                out[str(name)] = count
    return out


def vision_item(arch: Architecture, max_model_len: Optional[int], terms: Optional[ProfileTerms] = None,
                limits: Optional[dict[str, int]] = None) -> tuple[int, int]:
    """(embeddings, patches) of the multimodal item vLLM profiles the vision tower with: the largest one item of any
    allowed modality gives (MultiModalBudget.get_modality_with_max_tokens; --limit-mm-per-prompt 0 disallows one).
    An image is vision_tokens_per_item; a video (vision_video_frame_groups) as many image-sized groups of frames as
    max_model_len holds, at least one (Qwen2VLProcessingInfo.get_num_frames_with_most_features). (0, 0) without a
    vision tower's facts, or with every modality disallowed."""
    tokens, patches = arch.vision_tokens_per_item, arch.vision_patches_per_item
    limits = limits or {}
    images, videos = limits.get("image", 1) > 0, limits.get("video", 1) > 0
    groups = arch.vision_video_frame_groups if (terms or profile_terms()).videos_profiled else None
    if not (tokens and patches) or not (images or (groups and videos)):
        return 0, 0
    n = min(groups, max(1, max_model_len // tokens)) if groups and videos and max_model_len else 1
    return tokens * n, patches * n


def vision_profile_bytes(arch: Architecture, tp: int, batched_tokens: int, elem_bytes: int,
                         max_model_len: Optional[int] = None, terms: Optional[ProfileTerms] = None,
                         limits: Optional[dict[str, int]] = None) -> tuple[int, int]:
    """(the vision tower's peak, the embeddings it leaves in the encoder cache) in vLLM 0.32's multimodal profiling
    run (gpu_model_runner.profile_run), which comes before the language model's: 0, 0 for a model without
    ModelArchitecture.vision_* facts.

    vLLM's encoder budget is max(max_num_batched_tokens, embeddings of one item) (SchedulerConfig:
    encoder_cache_size and max_num_encoder_input_tokens are max_num_batched_tokens; compute_mm_encoder_budget), and
    it profiles budget // embeddings items of the largest one (vision_item) at once (MultiModalBudget._get_max_items;
    its other bound, max_num_seqs x items per prompt, only lowers that, so the count here is never below vLLM's). The
    tower's peak is its forward pass over every item's patches, sized per patch as the language model's forward pass
    is per token (ASSUMPTIONS activation_hidden_factor; the MLP split by TP, mm_encoder_tp_mode "weights"); the
    embeddings stay in the encoder cache until the profile ends."""
    tokens, patches = vision_item(arch, max_model_len, terms, limits)
    width, inner = arch.vision_hidden_size, arch.vision_intermediate_size
    if not (tokens and width and inner):
        return 0, 0
    items = max(1, max(batched_tokens, tokens) // tokens)
    per_patch = (2 * inner / tp + _a("activation_hidden_factor") * width) * elem_bytes
    return int(items * patches * per_patch), items * tokens * arch.hidden_size * elem_bytes


def activation_bytes(arch: Architecture, tp: int, batched_tokens: int, max_num_seqs: int, elem_bytes: int,
                     terms: Optional[ProfileTerms] = None, max_model_len: Optional[int] = None,
                     limits: Optional[dict[str, int]] = None) -> int:
    """Peak memory of vLLM's profiling run: the forward pass over `batched_tokens`, or the sampler's
    dummy run over `max_num_seqs` logits rows that follows it (holding only the hidden states), whichever is larger;
    a pooling model (encoder-only, or a decoder marked pooling) runs its pooler instead of a sampler (no logits).
    The logits are the whole vocabulary on every GPU (the LM head's output is gathered before sampling), so TP does
    not divide them: llm-d's H100 logs show 4.84 GiB for Llama-3.3-70B at TP=2 against 4.76 for Llama-3.1-8B.
    A multimodal model's vision tower runs first; its embeddings are held through the rest (vision_profile_bytes; a
    video item grows with max_model_len)."""
    per_token = (2 * arch.intermediate_size / tp + _a("activation_hidden_factor") * arch.hidden_size) * elem_bytes
    forward = batched_tokens * per_token
    language = forward
    if not is_pooling(arch):
        rows = min(max_num_seqs, batched_tokens)
        logits = (terms or profile_terms()).logits_bytes
        sampler = rows * arch.vocab_size * logits + batched_tokens * arch.hidden_size * elem_bytes
        language = max(forward, sampler)
    tower, embeddings = vision_profile_bytes(arch, tp, batched_tokens, elem_bytes, max_model_len, terms, limits)
    return int(max(tower, embeddings + language))


def non_torch_bytes(tp: int, terms: Optional[ProfileTerms] = None) -> int:
    """Non-torch memory per GPU: the release's TP=1 figure, plus its TP overhead from two GPUs on."""
    terms = terms or profile_terms()
    return int(terms.non_torch + (terms.tp_overhead if tp > 1 else 0))


def _divisors(n: int, limit: int = 64) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def tp_shards_evenly(arch: Architecture, tp: int) -> bool:
    """Whether vLLM can shard the model over `tp` GPUs: TP divides the attention heads, and the KV
    heads split evenly (kv % tp) or are replicated evenly (tp % kv) (QKVParallelLinear's divide())."""
    if arch.num_attention_heads % tp:
        return False
    kv = arch.num_kv_heads
    return kv % tp == 0 if kv >= tp else tp % kv == 0


def valid_tp_sizes(arch: Architecture, limit: int = 16) -> list[int]:
    return [d for d in _divisors(arch.num_attention_heads, limit) if tp_shards_evenly(arch, d)]


def weights_quantization(spec: VLLMServerSpec, arch: Architecture) -> str:
    """The quantization the weights are sized with: the spec's, or with none the checkpoint's own."""
    checkpoint = arch.quantization
    if spec.model.quantization == "none" and checkpoint in BYTES_PER_WEIGHT and checkpoint != "none":
        return checkpoint
    return spec.model.quantization


def loads_as_stored(spec: VLLMServerSpec, arch: Architecture) -> bool:
    """vLLM loads a quantized checkpoint's weights as they are stored: with model.quantization none (it reads the
    method from the checkpoint) or the checkpoint's own method. A 16-bit checkpoint is not (fp8 quantizes it as it
    loads; a float32 one runs in 16 bits)."""
    checkpoint, wanted = arch.quantization, spec.model.quantization
    if checkpoint in (None, "none"):
        return False
    return wanted == "none" or PREQUANTIZED.get(wanted, wanted) == checkpoint


# --------------------------------------------------------------------------- planning
def resolve_gpu_memory(spec: VLLMServerSpec, gpu: GPUSelection) -> tuple[Optional[int], str]:
    """One GPU's (or MIG slice's) memory: gpu.memory, else the smallest the selected nodes can have."""
    if spec.gpu.memory is not None:
        return int(parse_quantity(spec.gpu.memory)), f"spec.gpu.memory {spec.gpu.memory}"
    return gpu.memory_bytes, gpu.memory_source


def plan(
    name: str,
    namespace: str,
    spec: VLLMServerSpec,
    model: Optional[ResolvedModel],
    gpu: Optional[GPUSelection] = None,
    *,
    model_error: Optional[str] = None,
    model_error_field: str = "spec.model.architecture",
    default_prometheus_url: Optional[str] = None,
    allow_unsafe_args: bool = False,
    urls: Optional[URLPolicy] = None,
) -> Plan:
    """Derive the vLLM args and estimates for one server. Pure; never raises on bad input.

    `gpu`: spec.gpu resolved by gpus.select_gpu (resolved here when not given).
    `allow_unsafe_args`: the VLLMServer carries api.ALLOW_UNSAFE_ARGS_ANNOTATION, so extraArgs may set
    --host/--port (the container port then follows --port). `urls`: the operator's URL settings (None: the
    offline CLI, which fetches nothing for anyone else).

    The named steps below run in order (numbered in their docstrings); each records its flags (`decisions`),
    notes and problems on the plan, and sizing stops at the first step that finds the server cannot run."""
    p = Plan(name=name, namespace=namespace, spec=spec, model=model,
             prometheus_url=spec.autoscaling.prometheus_url or default_prometheus_url, flags=flag_check(spec))
    check(p, gpu, model_error=model_error, model_error_field=model_error_field,
          default_prometheus_url=default_prometheus_url, allow_unsafe_args=allow_unsafe_args, urls=urls)
    if model is None or p.gpu_memory is None:
        return p
    s = Sizing(arch=model.complete, elem=dtype_bytes(spec, model),
               terms=profile_terms(image_vllm_version(spec.image)))
    plan_tensor_parallel(p, s)
    if not plan_memory_budget(p, s):
        return p
    plan_weights(p, s)
    plan_batch(p, s)
    if not plan_kv_cache(p, s):
        return p
    plan_max_model_len(p, s)
    plan_engine_flags(p, s)
    plan_pod(p)
    plan_shutdown(p)
    release_notes(p)
    p.args = engine_args(p)
    return p


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
    kv_dtype: str = "auto"
    layout: Optional[KVLayout] = None
    #: tokens a sliding window keeps beside it (scheduled, not yet settled)
    in_flight: int = 0
    #: the longest --max-model-len the KV cache holds with the headroom
    fit_limit: int = 0


def check(p: Plan, gpu: Optional[GPUSelection], *, model_error: Optional[str], model_error_field: str,
          default_prometheus_url: Optional[str], allow_unsafe_args: bool, urls: Optional[URLPolicy]) -> None:
    """1. The spec's rules (validation.py), the GPU selection and what its hardware rules out, the GPU memory to
    plan with, and the model's facts."""
    spec = p.spec
    p.problems.extend(check_spec(p.name, spec, default_prometheus_url=default_prometheus_url,
                                 allow_unsafe_args=allow_unsafe_args, urls=urls, checked=p.flags))
    if allow_unsafe_args:
        unsafe_overrides(p)
    p.tensor_parallel_size = spec.gpu.count
    p.gpu = gpu if gpu is not None else select_gpu(spec.gpu)
    p.problems.extend(Problem(where, message) for where, message in p.gpu.problems)
    p.notes.extend(p.gpu.notes)
    p.problems.extend(hardware_problems(spec, p.gpu, p.flags.snapshot if p.flags else None,
                                        mla=bool(p.model is not None and p.model.architecture.kv_lora_rank)))
    p.gpu_memory, p.gpu_source = resolve_gpu_memory(spec, p.gpu)
    if p.model is None:
        p.problem(model_error_field, model_error or f"no architecture for {spec.model.name}")
    if p.gpu_memory is not None and p.gpu_memory < GiB:
        p.problem("spec.gpu.memory", f"{spec.gpu.memory} is less than 1Gi: not a GPU vLLM can serve from")
        p.gpu_memory = None


def plan_tensor_parallel(p: Plan, s: Sizing) -> None:
    """2. --tensor-parallel-size: gpu.count, which must divide the attention heads and share the KV heads."""
    arch, tp = s.arch, p.tensor_parallel_size
    valid = ", ".join(str(d) for d in valid_tp_sizes(arch))
    if arch.num_attention_heads % tp:
        p.problem("spec.gpu.count", f"tensor parallelism over {tp} GPUs must divide the model's "
                  f"{arch.num_attention_heads} attention heads; use one of {valid}")
    elif not tp_shards_evenly(arch, tp):
        p.problem("spec.gpu.count", f"{tp} GPUs cannot share the model's {arch.num_kv_heads} KV heads evenly "
                  f"(vLLM fails loading the weights); use one of {valid}")
    p.decisions.append(FlagDecision("--tensor-parallel-size", str(tp), f"gpu.count: shard the model over {tp} GPU(s) "
                                f"({arch.num_attention_heads} heads / {tp} = {arch.num_attention_heads / tp:g} per GPU)"))


def plan_memory_budget(p: Plan, s: Sizing) -> bool:
    """3. --gpu-memory-utilization: vLLM's budget, leaving its CUDA context, a margin and reservedMemory outside.
    False when nothing is left for vLLM."""
    spec, e = p.spec, p.spec.engine
    assert p.gpu_memory is not None
    total = p.gpu_memory
    reserved = int(parse_quantity(spec.gpu.reserved_memory))
    s.graphs = 0 if e.enforce_eager or not s.terms.cuda_graphs_in_budget else int(_a("cuda_graph_per_gpu"))
    outside = _a("cuda_context") + _a("safety_margin")
    ceiling = (total - reserved - outside) / total
    if e.gpu_memory_utilization is not None:
        util = e.gpu_memory_utilization
        if util > ceiling + 1e-9:
            p.problem("spec.engine.gpuMemoryUtilization", f"{util} asks for {gib(util * total)} of a {gib(total)} GPU, "
                      f"but reservedMemory ({gib(reserved)}), vLLM's CUDA context ({gib(_a('cuda_context'))}) and a "
                      f"{gib(_a('safety_margin'))} margin leave {gib(ceiling * total)}: vLLM would refuse to start "
                      f"(free memory below the budget). Use at most {math.floor(ceiling * 100) / 100:.2f}")
        why = "pinned by engine.gpuMemoryUtilization"
    else:
        util = min(_a("default_utilization"), math.floor(ceiling * 100) / 100)
        why = (f"vLLM's default {_a('default_utilization')}" if util == _a("default_utilization") else
               f"leaves {gib(reserved)} reserved + {gib(outside)} for vLLM's CUDA context and a margin free")
    if util <= 0:
        p.problem("spec.gpu.reservedMemory", f"reserving {gib(reserved)} of a {gib(total)} GPU leaves nothing for vLLM")
        return False
    p.gpu_memory_utilization = util
    p.decisions.append(FlagDecision("--gpu-memory-utilization", repr(float(util)), f"{why}: budget {gib(util * total)} of "
                                f"{gib(total)} per GPU", pinned=e.gpu_memory_utilization is not None))
    s.budget = int(util * total)
    return True


def plan_weights(p: Plan, s: Sizing) -> None:
    """4. The weights per GPU, as the checkpoint stores them (its quantization_config decides)."""
    spec, arch = p.spec, s.arch
    p.problems.extend(quantization_problems(spec, arch))
    sized_as = weights_quantization(spec, arch)
    stored = p.model.stored_weight_bytes if p.model is not None and loads_as_stored(spec, arch) else None
    if stored:
        p.notes.append(f"weights sized as the checkpoint stores them ({arch.quantization}): {gib(stored)} by the Hub's "
                       "safetensors metadata (each dtype's count times its size); vLLM reads the method from the "
                       "checkpoint")
        p.weight_bytes_total = stored
    else:
        if sized_as != spec.model.quantization:
            p.notes.append(f"weights sized as the checkpoint stores them ({sized_as}, config.json "
                           "quantization_config); vLLM reads the method from the checkpoint")
        p.weight_bytes_total = weight_bytes(arch, sized_as, s.elem)
    s.weights = math.ceil(p.weight_bytes_total / p.tensor_parallel_size) + rotary_cache_bytes(arch, s.elem)


def plan_batch(p: Plan, s: Sizing) -> None:
    """5. --max-num-seqs and --max-num-batched-tokens, before the activations: vLLM's profiling run batches
    max_num_batched_tokens tokens."""
    e, prof = p.spec.engine, p.spec.workload_profile
    assert p.gpu_memory is not None
    total = p.gpu_memory
    big_gpu = total >= 70 * GiB and not any("A100" in g.product.upper() for g in p.gpu.products)
    seqs_default, batched_default = (1024, 8192) if big_gpu else (256, 2048)
    if e.max_num_seqs is not None:
        seqs, seqs_why = e.max_num_seqs, "pinned by engine.maxNumSeqs"
    elif prof.target_concurrency:
        factor = {"latency": 1.0, "balanced": 1.25, "throughput": 2.0}[prof.priority]
        seqs = max(1, math.ceil(prof.target_concurrency * factor))
        seqs_why = (f"Little's law: targetConcurrency {prof.target_concurrency} requests in flight x {factor} "
                    f"({prof.priority}) so the target never queues inside vLLM")
    else:
        seqs, seqs_why = seqs_default, f"vLLM's default for a {gib(total)} GPU"
    if e.max_num_batched_tokens is not None:
        batched, batched_why = e.max_num_batched_tokens, "pinned by engine.maxNumBatchedTokens"
    else:
        batched = {"latency": min(batched_default, 1024) if not big_gpu else 2048, "balanced": batched_default,
                   "throughput": batched_default * 2 if big_gpu else 8192}[prof.priority]
        batched_why = {"latency": "small prefill chunks keep decode steps short (latency)",
                       "balanced": "vLLM's default chunked-prefill budget",
                       "throughput": "large prefill chunks for throughput"}[prof.priority]
        if prof.priority == "throughput" and prof.p95_prompt_tokens:
            batched = max(batched, min(prof.p95_prompt_tokens, 16384))
        if batched < seqs:
            batched, batched_why = seqs, f"raised to max-num-seqs ({seqs}): vLLM requires batched tokens >= seqs"
    if batched < seqs:
        p.problem("spec.engine.maxNumBatchedTokens", f"{batched} is below maxNumSeqs {seqs}; vLLM requires "
                  "max-num-batched-tokens >= max-num-seqs")
    longest = longest_model_len(p.spec, s.arch)
    if is_pooling(s.arch) and batched < longest:
        # vLLM chunks a pooling model's prefill only for LAST pooling (ModelConfig.is_chunked_prefill_supported);
        # otherwise it refuses max_num_batched_tokens < max_model_len, and config.json does not say which.
        if e.max_num_batched_tokens is None:
            batched, batched_why = longest, (f"raised to the longest max-model-len ({longest}): a pooling model's "
                                             "prompt is prefilled in one step unless it pools the last token")
        else:
            p.notes.append(f"warning: maxNumBatchedTokens {batched} is below the max-model-len this model may get "
                           f"({longest}); vLLM refuses that for a pooling model that pools by MEAN or CLS (no "
                           "chunked prefill), and accepts it for LAST pooling")
    s.seqs, s.seqs_why, s.batched, s.batched_why = seqs, seqs_why, batched, batched_why



def longest_model_len(spec: VLLMServerSpec, arch: Architecture) -> int:
    """The longest --max-model-len the plan may choose (the pinned one, or the profile's / the model's maximum): what
    sizes a step that comes before the length is chosen, at its largest."""
    limit = arch.max_position_embeddings
    return spec.engine.max_model_len or min(spec.workload_profile.max_context_tokens or limit, limit)


def plan_kv_cache(p: Plan, s: Sizing) -> bool:
    """6. The activation peak, the overheads and what is left for the KV cache, laid out as vLLM pools it
    (KVLayout). False when the model does not fit (with the smallest gpu.count that would)."""
    arch, tp, e, elem, terms = s.arch, p.tensor_parallel_size, p.spec.engine, s.elem, s.terms
    assert p.gpu_memory is not None
    total, reserved = p.gpu_memory, int(parse_quantity(p.spec.gpu.reserved_memory))
    budget, weights, graphs, batched, seqs = s.budget, s.weights, s.graphs, s.batched, s.seqs
    # A multimodal profile's video grows with --max-model-len, which is chosen after the KV cache: size it at the
    # longest length the plan may choose.
    longest = longest_model_len(p.spec, arch)
    limits = mm_limits(list(e.extra_args))
    activation = activation_bytes(arch, tp, batched, seqs, elem, terms, longest, limits)
    non_torch = non_torch_bytes(tp, terms)
    kv = budget - weights - activation - non_torch - graphs
    p.memory = Memory(total=total, reserved=reserved, budget=budget, weights=weights, activation=activation,
                      non_torch=non_torch, kv_cache=max(kv, 0), cuda_graphs=graphs)
    kv_dtype = e.kv_cache_dtype or "auto"
    p.kv_bytes_per_token = kv_bytes_per_token(arch, tp, kv_dtype, elem)
    s.kv, s.kv_dtype = kv, kv_dtype
    if kv <= 0:
        hint = "use a bigger GPU"
        for t in (2, 4, 8, 16, 32, 64):
            if t <= tp or not tp_shards_evenly(arch, t):
                continue
            need = (math.ceil(p.weight_bytes_total / t) + rotary_cache_bytes(arch, elem)
                    + activation_bytes(arch, t, batched, seqs, elem, terms, longest, limits)
                    + non_torch_bytes(t, terms)
                    + graphs)
            if need < budget:
                hint = f"use more GPUs (gpu.count: {t} leaves room for the KV cache)"
                break
        p.problem("spec.gpu", f"the model does not fit: weights {gib(weights)} + activations {gib(activation)} + "
                  f"overheads {gib(non_torch + graphs)} per GPU exceed the {gib(budget)} budget of a {gib(total)} GPU; "
                  f"{hint}, a quantized model (model.quantization), or a smaller maxNumBatchedTokens")
        return False
    block = int(_a("block_size"))
    layout, in_flight = kv_layout(arch, tp, kv_dtype, elem), tokens_in_flight(batched, terms, is_pooling(arch))
    model_limit = arch.max_position_embeddings
    # The longest request the pool holds (for all-global attention: every block's tokens), then, once the
    # length is chosen, what vLLM logs for it (sliding-window layers hold only their window of each request).
    p.kv_cache_tokens = (layout.longest_request(kv, in_flight) if layout.full_layers
                         else layout.tokens(kv, model_limit, in_flight))  # every layer slides: no longest request
    headroom = _a("context_headroom")
    fit_limit = _round_down(min(layout.longest_request(kv * headroom, in_flight), headroom * p.kv_cache_tokens), block)
    if arch.encoder_only:  # no KV cache at all: the length is the model's, the memory beyond the forward pass unused
        p.kv_bytes_per_token = p.kv_cache_tokens = 0
        p.memory.kv_cache, fit_limit = 0, model_limit
        p.notes.append("encoder-only pooling model: vLLM keeps no KV cache for it (EncoderOnlyAttention) and runs no "
                       f"sampler; {gib(kv)} per GPU of the budget stay unused (a lower engine.gpuMemoryUtilization "
                       "leaves them to others)")
    profile_notes(p, s, longest, limits)
    s.layout, s.in_flight, s.fit_limit = layout, in_flight, fit_limit
    return True


def profile_notes(p: Plan, s: Sizing, longest: int, limits: dict[str, int]) -> None:
    """What a multimodal or pooling model's profiling run adds or leaves out, for the plan's notes."""
    arch, tp, batched = s.arch, p.tensor_parallel_size, s.batched
    tower, embeddings = vision_profile_bytes(arch, tp, batched, s.elem, longest, s.terms, limits)
    if tower:
        item, _ = vision_item(arch, longest, s.terms, limits)
        video = (f" (a video, sized for {longest} tokens of context; --limit-mm-per-prompt '{{\"video\": 0}}' in "
                 "engine.extraArgs profiles an image instead)" if item > (arch.vision_tokens_per_item or 0) else "")
        assert p.memory is not None
        p.notes.append(f"multimodal: vLLM profiles the vision tower first, over {gib(tower)} of activations per GPU "
                       f"for {max(batched, item) // item} item(s) of {item} embeddings{video}; its encoder budget is "
                       f"max-num-batched-tokens {batched} or one item, and it holds their {gib(embeddings)} through "
                       f"the language model's run: the activation peak is {gib(p.memory.activation)}")
    if arch.pooling and not arch.encoder_only:
        p.notes.append("pooling model: vLLM keeps a KV cache for its prompts but decodes nothing, so its profile runs "
                       "a pooler instead of a sampler, and vLLM 0.32 schedules it without async scheduling")


def plan_max_model_len(p: Plan, s: Sizing) -> None:
    """7. --max-model-len: pinned, the profile's maximum or the model's own limit, within what the KV cache holds
    with a margin; a typical request must fit. Then the KV tokens vLLM logs for that length."""
    spec, e, prof, arch, kv = p.spec, p.spec.engine, p.spec.workload_profile, s.arch, s.kv
    model_limit, fit_limit = arch.max_position_embeddings, s.fit_limit
    if e.max_model_len is not None:
        length = e.max_model_len
        if length > model_limit:
            p.problem("spec.engine.maxModelLen", f"{length} is longer than {spec.model.name} supports "
                      f"({model_limit} tokens); vLLM refuses it. Use at most {model_limit}")
        elif length > fit_limit:
            p.problem("spec.engine.maxModelLen", f"{length} tokens do not fit the KV cache ({p.kv_cache_tokens} "
                      f"tokens, {gib(kv)} per GPU) with a {int(100 - _a('context_headroom') * 100)}% margin; the largest "
                      f"length that fits is {fit_limit}. Lower maxModelLen, add GPUs, or use kvCacheDtype: fp8")
        len_why = "pinned by engine.maxModelLen"
    else:
        requested = prof.max_context_tokens or model_limit
        if prof.max_context_tokens and requested > model_limit:
            p.problem("spec.workloadProfile.maxContextTokens", f"{requested} is longer than {spec.model.name} "
                      f"supports ({model_limit} tokens); use at most {model_limit}")
        length = min(requested, model_limit, fit_limit)
        if length == requested:
            len_why = "workloadProfile.maxContextTokens" if prof.max_context_tokens else "the model's own limit"
            len_why += (" (no KV cache: an encoder-only model)" if arch.encoder_only
                        else f", which fits the KV cache ({p.kv_cache_tokens} tokens)")
        else:
            len_why = (f"the KV cache holds {p.kv_cache_tokens} tokens; {length} keeps a "
                       f"{int(100 - _a('context_headroom') * 100)}% margin (wanted {requested})")
            if prof.max_context_tokens:
                p.notes.append(f"warning: maxContextTokens {requested} does not fit; serving at most {length} tokens. "
                               "Add GPUs or set engine.kvCacheDtype: fp8 to serve the full context")
        typical = (prof.p95_prompt_tokens or 0) + (prof.p95_output_tokens or 0)
        if length < max(typical, 16):
            # Blame what actually limits the length: the profile's own maximum, the model, or the KV cache.
            if typical > model_limit:
                p.problem("spec.workloadProfile.p95PromptTokens", f"a typical request (p95 prompt + output = "
                          f"{typical} tokens) is longer than {spec.model.name} supports ({model_limit} tokens)")
            elif prof.max_context_tokens and prof.max_context_tokens < typical:
                p.problem("spec.workloadProfile.maxContextTokens", f"{prof.max_context_tokens} is shorter than one "
                          f"typical request (p95PromptTokens + p95OutputTokens = {typical}); raise it or lower the "
                          "p95 figures")
            else:
                p.problem("spec.gpu", f"the KV cache ({p.kv_cache_tokens} tokens) cannot hold one typical request "
                          f"({typical} tokens); add GPUs or use a quantized model")
    p.max_model_len = length
    if length > 0 and not arch.encoder_only and s.layout is not None:
        p.kv_cache_tokens = s.layout.tokens(kv, length, s.in_flight)
    p.decisions.append(FlagDecision("--max-model-len", str(length), len_why, pinned=e.max_model_len is not None))


def plan_engine_flags(p: Plan, s: Sizing) -> None:
    """8. The batch flags (max-num-seqs capped by what the KV cache holds for typical requests), the queue cap,
    the KV cache dtype, prefix caching and eager mode."""
    e, prof = p.spec.engine, p.spec.workload_profile
    seqs, seqs_why, batched, batched_why, kv_dtype = s.seqs, s.seqs_why, s.batched, s.batched_why, s.kv_dtype
    if e.max_num_seqs is None:
        typical = (prof.p95_prompt_tokens or 0) + (prof.p95_output_tokens or 0)
        if typical and not s.arch.encoder_only:
            cap = max(1, p.kv_cache_tokens // typical)
            if cap < seqs:
                seqs, seqs_why = cap, f"the KV cache holds {cap} requests of p95 prompt+output ({typical} tokens)"
    p.max_num_seqs, p.max_num_batched_tokens = seqs, batched
    p.decisions.append(FlagDecision("--max-num-seqs", str(seqs), seqs_why, pinned=e.max_num_seqs is not None))
    p.decisions.append(FlagDecision("--max-num-batched-tokens", str(batched), batched_why,
                                pinned=e.max_num_batched_tokens is not None))
    check_queue_cap(p)
    if kv_dtype != "auto":
        p.decisions.append(FlagDecision("--kv-cache-dtype", kv_dtype, f"pinned: {p.kv_bytes_per_token} bytes/token per GPU",
                                    pinned=True))
    if e.enable_prefix_caching is None and is_pooling(s.arch):
        p.notes.append("prefix caching left to vLLM: it enables it for a pooling model only when the model's pooling "
                       "type allows (LAST pooling); forced on, vLLM warns that the model may crash or answer wrongly")
    else:
        prefix = True if e.enable_prefix_caching is None else e.enable_prefix_caching
        p.decisions.append(FlagDecision("--enable-prefix-caching" if prefix else "--no-enable-prefix-caching", "",
                                        "pinned" if e.enable_prefix_caching is not None else
                                        "reuse KV of shared prefixes (system prompts, chat history)",
                                        pinned=e.enable_prefix_caching is not None))
    if e.enforce_eager:
        p.decisions.append(FlagDecision("--enforce-eager", "", "pinned: no CUDA graphs (less memory, slower decode)",
                                    pinned=True))
    plan_runner(p, s)


def plan_runner(p: Plan, s: Sizing) -> None:
    """--runner pooling for a decoder marked pooling (spec.model.architecture.pooling, or its config.json
    architecture's name): the plan sized it without a sampler, so vLLM must not run it as a generative model."""
    if not s.arch.pooling or s.arch.encoder_only:
        return
    extra = list(p.spec.engine.extra_args)
    runner = next((a.split("=", 1)[1] if "=" in a else (extra[i + 1] if i + 1 < len(extra) else "")
                   for i, a in enumerate(extra) if a.split("=", 1)[0] == "--runner"), None)
    if runner is None and "--convert" not in {a.split("=", 1)[0] for a in extra}:
        p.decisions.append(FlagDecision("--runner", "pooling", "architecture.pooling: served as a pooling model "
                                        "(embeddings, scores), sized without a sampler"))
    elif runner is not None and runner != "pooling":  # "auto" pools a *ForCausalLM only with a modules.json
        p.problem("spec.model.architecture.pooling", "the model is sized as a pooling model (no sampler), but "
                  "extraArgs run it with --runner other than pooling: drop that --runner, or set pooling: false")


def plan_pod(p: Plan) -> None:
    """9. The pod around vLLM: /dev/shm or host IPC, host memory and CPU, the startup probe's budget."""
    spec, tp = p.spec, p.tensor_parallel_size
    if spec.ipc == "SharedMemory":
        if spec.shm_size is not None:
            p.shm_bytes = int(parse_quantity(spec.shm_size))
            if tp > 1 and p.shm_bytes < GiB:
                p.problem("spec.shmSize", f"{spec.shm_size} of /dev/shm is too small for tensor parallelism over {tp} "
                          "GPUs (NCCL fails with 'Bus error'); use at least 1Gi, or ipc: Host")
        else:
            p.shm_bytes = 2 * GiB if tp == 1 else 4 * GiB * tp
            p.notes.append(f"/dev/shm {gib(p.shm_bytes)} in memory: room for NCCL between {tp} GPU worker(s)")
    else:
        p.notes.append("ipc: Host: NCCL uses the host's shared memory (the pod gets hostIPC: true)")
    p.host_memory_bytes = max(8 * GiB, math.ceil((p.weight_bytes_total / 2 + 4 * GiB) / GiB) * GiB)
    p.cpu_request = max(4, 2 * tp + 2)
    p.startup_seconds = int(max(_a("startup_floor_seconds"),
                                p.weight_bytes_total / _a("load_bandwidth") + _a("engine_init_seconds")))
    if spec.startup_seconds is not None:
        p.notes.append(f"startup probe budget {spec.startup_seconds} s from spec.startupSeconds (derived: "
                       f"{p.startup_seconds} s)")
        p.startup_seconds = spec.startup_seconds
    if api.downloads_in_init_container(spec.model):
        p.notes.append(f"the weights download in the init container 'download' before vLLM starts (no probe "
                       f"deadline: a slow link is never killed); the startup probe's {p.startup_seconds} s cover "
                       f"reading {gib(p.weight_bytes_total)} from the cache and the engine's start")
    else:
        p.notes.append(f"vLLM downloads or reads the weights itself: the startup probe's {p.startup_seconds} s cover "
                       f"{gib(p.weight_bytes_total)} at {_a('load_bandwidth') / 1e6:.0f} MB/s and the engine's start")


def release_notes(p: Plan) -> None:
    """11. What the image's vLLM release means for the args: the loose check's warning, and each flag the plan would
    emit that the release's parser lacks. engine_args leaves such a flag out (vLLM would exit with code 2 on it);
    when the spec asked for it (a pinned value) that is a problem naming the field, the flag and the release,
    since serving without it would ignore the spec; when the planner derived it, vLLM's own default applies
    and a warning says what is lost."""
    check = p.flags
    assert check is not None
    snap = check.snapshot
    if (warning := check.warning()) is not None:
        p.notes.append(f"warning: {warning}")
    elif check.release != vllm_flags.VERSION:
        p.notes.append(f"image {p.spec.image} runs vLLM {check.release}: flags checked against and derived for "
                       "its own parser's snapshot")
    for flag, pinned, why in _planned_flags(p):
        if flag in snap.flags:
            continue
        owner = OWNED_FLAGS.get(flag, "")
        has = [r for r in vllm_flags.releases() if flag in vllm_flags.snapshot(r).flags]
        others = f"vLLM {', '.join(has)}" if has else "no vLLM release the operator knows"
        if pinned or not owner.startswith("spec."):
            where = owner.split(" ", 1)[0] if owner.startswith("spec.") else "spec.image"
            p.problem(where, f"vLLM {snap.version} (the image's release) has no {flag}, which "
                      f"{'this field asks for' if where != 'spec.image' else 'the pod needs'}: "
                      f"{'remove it or ' if where != 'spec.image' else ''}use an image of {others}")
        else:
            p.notes.append(f"warning: vLLM {snap.version} has no {flag}: not passed, vLLM's own default applies "
                           f"instead of the derived value ({why}); {others} has it")


def _planned_flags(p: Plan) -> list[tuple[str, bool, str]]:
    """(flag, pinned by the spec, why) for every flag engine_args may emit but extraArgs."""
    spec = p.spec
    out = [("--host", False, ""), ("--port", False, ""), ("--served-model-name", spec.model.served_name is not None, "")]
    if spec.model.revision:
        out.append(("--revision", True, ""))
    if spec.model.dtype != "auto":
        out.append(("--dtype", True, ""))
    if spec.model.quantization != "none":
        out.append(("--quantization", True, ""))
    out += [(d.flag, d.pinned, d.why) for d in p.decisions]
    if spec.engine.chat_template:
        out.append(("--chat-template", True, ""))
    return out


def min_queue_cap(max_num_seqs: int, target_waiting: float) -> int:
    """The smallest --max-num-queued-reqs with which the autoscaler can still scale up. vLLM counts running
    and waiting requests against the cap (SchedulerConfig.max_num_queued_reqs), so with max_num_seqs running
    at most cap - max_num_seqs wait; the autoscaler (and an HPA, with the same default tolerance) scales up
    only when more than target x (1 + tolerance) wait per replica."""
    return max_num_seqs + math.floor(target_waiting * (1 + AUTOSCALING_TOLERANCE) + 1e-9) + 1


def check_queue_cap(p: Plan) -> None:
    """engine.maxNumQueuedReqs: emitted as pinned; refused when an autoscaler would never see its target."""
    e, a = p.spec.engine, p.spec.autoscaling
    cap = e.max_num_queued_reqs
    if cap is None:
        return
    seqs = p.max_num_seqs
    p.decisions.append(FlagDecision("--max-num-queued-reqs", str(cap), f"pinned by engine.maxNumQueuedReqs: past {cap} "
                                "requests (running and waiting) vLLM answers 503 and clients retry elsewhere",
                                pinned=True))
    if a.enabled:
        need = min_queue_cap(seqs, a.target_waiting_per_replica)
        if cap < need:
            p.problem("spec.engine.maxNumQueuedReqs",
                      f"{cap} requests per server, {seqs} of them running (max-num-seqs), leave room for at most "
                      f"{max(cap - seqs, 0)} waiting; the autoscaler scales up only when more than "
                      f"{a.target_waiting_per_replica * (1 + AUTOSCALING_TOLERANCE):g} wait per replica "
                      f"(targetWaitingPerReplica {a.target_waiting_per_replica:g} and its "
                      f"{AUTOSCALING_TOLERANCE:.0%} tolerance), so it would never scale "
                      f"up and vLLM would answer 503 instead. Use at least {need}, or lower targetWaitingPerReplica")
    elif cap < seqs:
        p.notes.append(f"warning: engine.maxNumQueuedReqs {cap} is below --max-num-seqs {seqs}: vLLM never runs more "
                       f"than {cap} requests at once")


def plan_shutdown(p: Plan) -> None:
    """10. --shutdown-timeout and the pod's termination timeline: the preStop sleep (the pod leaves the Services'
    endpoints while vLLM still serves), then SIGTERM and the drain (vLLM takes no new request and lets the
    in-flight ones finish, up to the timeout), then vLLM's teardown; terminationGracePeriodSeconds covers all
    three, so the kubelet's SIGKILL never cuts a drain short."""
    e, prof = p.spec.engine, p.spec.workload_profile
    speed = _a("drain_tokens_per_second")
    if e.shutdown_timeout_seconds is not None:
        p.drain_seconds, why = e.shutdown_timeout_seconds, "pinned by engine.shutdownTimeoutSeconds"
        if e.shutdown_timeout_seconds == 0:
            why += ": vLLM aborts every in-flight request on SIGTERM"
    else:
        tokens = prof.p95_output_tokens or 512
        source = "workloadProfile.p95OutputTokens" if prof.p95_output_tokens else "an assumed p95 output"
        needed = math.ceil(tokens / speed)
        floor, ceiling = int(_a("drain_floor_seconds")), int(_a("drain_ceiling_seconds"))
        p.drain_seconds = min(ceiling, max(floor, needed))
        clipped = (f", raised to the {floor} s floor" if needed < floor else
                   f", cut to the {ceiling} s ceiling" if needed > ceiling else "")
        why = (f"{source} {tokens} tokens at {speed:g} tokens/s = {needed} s{clipped}: a request started just "
               "before SIGTERM finishes instead of being aborted")
    p.decisions.append(FlagDecision("--shutdown-timeout", str(p.drain_seconds), why,
                                pinned=e.shutdown_timeout_seconds is not None))
    p.prestop_seconds = int(_a("prestop_seconds"))
    margin = int(_a("shutdown_margin_seconds"))
    p.termination_grace_seconds = p.prestop_seconds + p.drain_seconds + margin
    p.notes.append(f"terminationGracePeriodSeconds {p.termination_grace_seconds} = preStop sleep {p.prestop_seconds} s "
                   f"(the pod leaves the Services' endpoints while vLLM still serves) + --shutdown-timeout "
                   f"{p.drain_seconds} s (in-flight requests finish) + {margin} s for vLLM's teardown")


def unsafe_overrides(p: Plan) -> None:
    """--host/--port in extraArgs under the escape hatch: vLLM takes the last occurrence, so they win over the
    operator's; the container port (and with it the probes, the Services' target and a host network's port)
    follows --port, and a note says what the user took over."""
    extra = p.spec.engine.extra_args
    for i, token in enumerate(extra):
        flag, eq, inline = token.partition("=")
        if vllm_flags.normalise(flag) not in UNSAFE_FLAGS:
            continue
        value = inline if eq else (extra[i + 1] if i + 1 < len(extra) else "")
        if vllm_flags.normalise(flag) == "--port":
            if not (value.isdigit() and 1 <= int(value) <= 65535):
                p.problem(f"spec.engine.extraArgs[{i}]", f"--port needs a port number (1-65535), got {value!r}")
                continue
            p.port = int(value)
        p.notes.append(f"warning: extraArgs sets {flag} {value} ({api.ALLOW_UNSAFE_ARGS_ANNOTATION}); the container "
                       f"port is {p.port}: probes and Services follow it, but a --host the pod IP does not reach "
                       "fails every probe")


def engine_args(p: Plan) -> list[str]:
    """The container args after `vllm serve`: model first, then flags in a stable order; only flags the image's
    vLLM release has (release_notes says what was left out), extraArgs as they are."""
    spec = p.spec
    known = (p.flags.snapshot if p.flags is not None else vllm_flags.snapshot()).flags
    args = [spec.model.name]

    def emit(flag: str, *value: str) -> None:
        if flag in known:
            args.extend((flag, *value))

    emit("--host", "0.0.0.0")
    emit("--port", str(DEFAULT_PORT))
    emit("--served-model-name", spec.model.served_name or spec.model.name)
    if spec.model.revision:
        emit("--revision", spec.model.revision)
    if spec.model.dtype != "auto":
        emit("--dtype", spec.model.dtype)
    if spec.model.quantization != "none":
        emit("--quantization", spec.model.quantization)
    for d in p.decisions:
        emit(d.flag, *([d.value] if d.value else []))
    if spec.engine.chat_template:
        # vLLM reads a value that is no file's path and holds Jinja syntax as the template itself.
        emit("--chat-template", spec.engine.chat_template)
    args += list(spec.engine.extra_args)
    return args
