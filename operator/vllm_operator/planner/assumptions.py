"""Every constant the planner sizes with, each with its source (`ASSUMPTIONS`), and the memory profile of
each vLLM release (`PROFILE_TERMS`; docs/sizing.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from .. import vllm_flags


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
    "quant_overhead": (
        1.07,
        "4-bit group quantization (group size 128) beside its 0.5 bytes a weight: an fp16 scale and a 4-bit zero point "
        "per group are 1.039 x (AWQ Marlin's qweight, scales, qzeros); vLLM 0.26.0 loaded 5.38 GiB for Qwen2.5-7B-AWQ "
        "and 18.49 GiB for Qwen2.5-32B-AWQ on an H200 (tests/data/gpu q01, q04): 1.07 holds both (1.03 left the 32B "
        "0.61 GiB under: +0.59% KV promised)",
    ),
    "mxfp4_overhead": (
        3072 / 2880,
        "MXFP4 experts as vLLM 0.11 holds them on an H100, fitted to llm-d's logged weights: gpt-oss-20b 13.47 GiB "
        "(planned 13.45), gpt-oss-120b 64.38 GiB (planned 64.55); the factor is what padding the experts' 2880 to "
        "3072 gives. An A100 at TP 4 (Marlin) logged 17.22 GiB per GPU for gpt-oss-120b, 1.1 GiB more than this",
    ),
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


def assumption(name: str) -> float:
    """The value of one of ASSUMPTIONS (its source is beside it there)."""
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
    v2_runner: bool = False
    """Whether a generative model that is not a mixture of experts runs on Model Runner V2 with V2's profile
    (vllm 0.26: config/vllm.py _is_default_v2_model_runner_model): no CUDA-graph estimate taken from the budget
    (gpu/model_runner.profile_cudagraph_memory returns 0: the graphs are captured on top of it), and a peak of the
    larger of the forward pass and one vocabulary x hidden matrix plus `v2_peak_margin` (runs_v2, activation_bytes)."""
    v2_peak_margin: float = 0.0
    """What V2's measured peak adds to that larger term, bytes."""
    v2_encoder_profiled: bool = True
    """Whether Model Runner V2's profile runs a multimodal model's encoder on dummy items before the KV cache is
    sized. vLLM 0.26's does not (vllm/v1/worker/gpu/model_runner.py profile_run runs the language model and the
    sampler only; gpu/mm/encoder_cache.py: "TODO: Implement MM budget for encoder dummy run"): the vision tower's
    activations at serving time come from the memory beside the budget, as V2's CUDA graphs do."""
    moe_workspace_factor: float = 0.0
    """A mixture of experts' fused-MoE workspace, which the profile's forward pass leaves allocated through the
    sampler's dummy run (vllm/v1/worker/workspace.py WorkspaceManager keeps it for the process;
    fused_moe/modular_kernel.py takes workspace13/workspace2 from it): this many x max_num_batched_tokens x hidden x
    dtype bytes on top of the larger of the forward pass and the sampler (V1 runner only)."""
    graphs_in_budget: float = 0.75 * GiB
    """The CUDA-graph estimate taken from the budget where it is (cuda_graphs_in_budget and not V2), bytes."""
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
        since=(0, 26), logits_bytes=14, non_torch=0.24 * GiB, tp_overhead=0.45 * GiB, cuda_graphs_in_budget=True,
        concurrent_batches=2, v2_runner=True, v2_peak_margin=0.13 * GiB, graphs_in_budget=0.5 * GiB,
        moe_workspace_factor=24, v2_encoder_profiled=False,
        source="vLLM 0.26.0 on an H200 (tests/data/gpu, bench/gpu; docs/sizing.md 'vLLM 0.26.0 on an H200'): dense "
               "models run on Model Runner V2, whose profile_cudagraph_memory returns 0 (graphs captured after the KV "
               "cache: 0.15 GiB for Llama-3.1-8B at 20 sequences) and whose peak is max(forward pass, vocabulary x "
               "hidden) + 0.13 GiB on a cold torch.compile (Llama-3.1-8B 1.104 GiB, Gemma 2 9B 1.818, Qwen2.5-0.5B "
               "0.355); mixtures of experts run on V1, which estimates 0.45-0.49 GiB of graphs inside the budget "
               "(Qwen3-30B-A3B) and peaks at 14 bytes per logit of max_num_seqs x vocabulary "
               "(v1/worker/gpu_model_runner.py _dummy_sampler_run; Qwen3-30B-A3B 2.675 GiB at 1024 x 151,936, gpt-oss-20b 2.872 at 1024 x 201,088) "
               "plus the fused-MoE workspace the forward pass leaves (moe_workspace_factor 24: Qwen3-30B-A3B at 4,096 "
               "and 8,192 batched tokens, Mixtral-8x7B 1.866 GiB); non-torch 0.225 (V2) and 0.240 GiB (V1); "
               "'Asynchronous scheduling is enabled': two batches in flight (Mistral-7B-v0.1's window reproduces to "
               "10 tokens in 1,455,912); V2 runs no encoder in its profile (Qwen2.5-VL-7B: a 1.07 GiB peak, the language "
               "model's). TP overhead not measured (one GPU)"),
    ProfileTerms(
        since=(0, 28), logits_bytes=39, non_torch=0.15 * GiB, tp_overhead=0.45 * GiB, cuda_graphs_in_budget=True,
        concurrent_batches=1,
        source="0.28-0.31: not measured (each pins a newer torch than the GPU machine has); the 0.21 terms kept"),
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
    # gpt-oss: 4-bit values with one 8-bit scale per 32 (4.25 bits), on the MoE experts only (weight_bytes)
    "mxfp4": 4.25 / 8,
}
