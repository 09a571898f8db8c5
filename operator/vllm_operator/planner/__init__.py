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

The package: ``assumptions`` (ASSUMPTIONS and each release's PROFILE_TERMS), ``memory`` (the memory math),
``plan_types`` (Plan, FlagDecision, Memory, Sizing), ``layout`` (`plan`: spec.nodes, or the fewest nodes up to
spec.maxNodes that fit), ``steps`` (`plan_layout` and its numbered steps), ``stages`` (the pipeline stages of a
server across nodes), ``lora`` (spec.adapters' flags and slots). `plan`, its numbered steps
and the types and memory math they use are importable from ``vllm_operator.planner``.
"""

from .assumptions import (
    ASSUMPTIONS, BYTES_PER_WEIGHT, GiB, MiB, PROFILE_TERMS, ProfileTerms, assumption, profile_terms,
)
from .memory import (
    KVLayout, activation_bytes, dtype_bytes, gib, is_pooling, kv_bytes_per_token, kv_bytes_per_token_per_layer,
    hybrid_kv_off, kv_layout, loads_as_stored, mm_limits, non_torch_bytes, rotary_cache_bytes, runs_v2, tokens_in_flight,
    tp_shards_evenly, valid_tp_sizes, vision_item, vision_profile_bytes, weight_bytes, weights_quantization,
)
from .plan_types import (
    DEFAULT_PORT, FlagDecision, Memory, Plan, Sizing,
)
from .layout import choose_nodes, layout_refused, plan
from .steps import (
    check_inputs, check_queue_cap, engine_args, longest_model_len, min_queue_cap, plan_batch, plan_engine_flags,
    plan_kv_cache, plan_max_model_len, plan_memory_budget, plan_pod, plan_runner, plan_shutdown,
    plan_layout, plan_tensor_parallel, plan_weights, profile_notes, check_release_flags, resolve_gpu_memory,
    unsafe_overrides,
)

__all__ = [
    "ASSUMPTIONS", "BYTES_PER_WEIGHT", "GiB", "MiB", "PROFILE_TERMS", "ProfileTerms", "assumption", "profile_terms",
    "KVLayout", "activation_bytes", "dtype_bytes", "gib", "is_pooling", "kv_bytes_per_token",
    "kv_bytes_per_token_per_layer", "hybrid_kv_off", "kv_layout", "loads_as_stored", "mm_limits", "non_torch_bytes",
    "rotary_cache_bytes", "runs_v2", "tokens_in_flight", "tp_shards_evenly", "valid_tp_sizes", "vision_item",
    "vision_profile_bytes", "weight_bytes", "weights_quantization", "DEFAULT_PORT", "FlagDecision", "Memory",
    "Plan", "Sizing", "check_inputs", "check_queue_cap", "engine_args", "longest_model_len", "min_queue_cap", "plan",
    "plan_batch", "plan_engine_flags", "plan_kv_cache", "plan_max_model_len", "plan_memory_budget", "plan_pod",
    "plan_runner", "plan_shutdown", "plan_tensor_parallel", "plan_weights", "profile_notes", "check_release_flags",
    "resolve_gpu_memory", "unsafe_overrides", "plan_layout", "choose_nodes", "layout_refused",
]
