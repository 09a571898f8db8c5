"""Unit tests of the planner: spec + model + GPU -> vLLM flags and estimates.

Pure and fast: every test goes through `pipeline.plan_server` (catalog resolution + the
planner), the same path the CLI and the operator take. The numbers vLLM itself logged are
in `test_matches_vllm_issue_10517*`; the hypothesis test at the end checks that the
planner never raises and that whatever it calls fitting is consistent.
"""

from __future__ import annotations

import math
import re
from typing import Any, get_args

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from vllm_operator import api, catalog, pipeline, planner, validation, vllm_flags
from vllm_operator.planner import GiB, Plan

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"


def make_spec(model: str = LLAMA_8B, **spec: Any) -> api.VLLMServerSpec:
    """A spec from camelCase keyword arguments, e.g. make_spec(gpu={"count": 2}, engine={...})."""
    spec.setdefault("gpu", {"count": 1, "product": "NVIDIA-L4"})
    return api.VLLMServerSpec.model_validate({"model": {"name": model} if isinstance(model, str) else model, **spec})


def plan_for(model: str = LLAMA_8B, name: str = "test", **spec: Any) -> Plan:
    return pipeline.plan_server(name, "default", make_spec(model, **spec))


def messages(plan: Plan, field: str) -> list[str]:
    return [p.message for p in plan.problems if p.field == field]


def arg_value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


# --------------------------------------------------------------------------- vLLM's own numbers
# vllm-project/vllm issue 10517 ("What's the relationship between KV cache and MAX_SEQUENCE_LENGTH"),
# comment by kaspersiminski on 2024-12-02: meta-llama/Llama-3.1-8B-Instruct, 16-bit, on an RTX 3090,
# V0 engine, --gpu-memory-utilization 0.90, chunked prefill off so the profiling pass ran max_model_len
# tokens (hence maxNumBatchedTokens = maxModelLen below), max_num_seqs 256 (the default):
#   --max-model-len 20000: "Loading model weights took 14.9888 GB" (vLLM's GB is GiB),
#       "total_gpu_memory=23.58GiB ... peak_torch_memory=17.06GiB ... non_torch_memory=0.35GiB
#       kv_cache_size=3.81GiB gpu_memory_utilization=0.90", "GPU blocks: 1952" (x 16 = 31232 tokens)
#   --max-model-len 29000: "peak_torch_memory=17.98GiB ... kv_cache_size=2.89GiB", "# GPU blocks: 1478",
#       "The model's max seq len (29000) is larger than the maximum number of tokens that can be
#       stored in KV cache (23648)" -> refused to start.
# V0 captured CUDA graphs after sizing the KV cache, so these figures hold no graph memory; vLLM 0.32
# (the pinned release) takes its CUDA-graph estimate out of the KV cache instead. The plan is made for
# a V0 image (planner.PROFILE_TERMS: V0's sampler and non-torch figures) and with enforceEager.
ISSUE_10517_IMAGE = "vllm/vllm-openai:v0.6.4"
ISSUE_10517_GPU_MEMORY = "23.58Gi"
ISSUE_10517_WEIGHTS_GIB = 14.9888
ISSUE_10517_NON_TORCH_GIB = 0.35
ISSUE_10517 = {  # max_model_len: (peak_torch_memory GiB, kv_cache_size GiB, KV tokens)
    20000: (17.06, 3.81, 1952 * 16),
    29000: (17.98, 2.89, 23648),
}


def issue_10517_plan(max_model_len: int, *, enforce_eager: bool = True, image: str = ISSUE_10517_IMAGE) -> Plan:
    return plan_for(
        LLAMA_8B,
        image=image,
        gpu={"count": 1, "memory": ISSUE_10517_GPU_MEMORY},
        engine={
            "gpuMemoryUtilization": 0.90,
            "maxModelLen": max_model_len,
            "maxNumBatchedTokens": max_model_len,
            "maxNumSeqs": 256,
            "enforceEager": enforce_eager,
        },
    )


def test_matches_vllm_issue_10517_at_20k_tokens():
    plan = issue_10517_plan(20000)
    assert plan.fits, plan.problems
    _, kv_gib, kv_tokens = ISSUE_10517[20000]
    assert plan.memory.kv_cache == pytest.approx(kv_gib * GiB, rel=0.03)
    assert plan.kv_cache_tokens == pytest.approx(kv_tokens, rel=0.03)
    assert plan.kv_bytes_per_token == 131072
    assert plan.max_model_len == 20000


@pytest.mark.parametrize("max_model_len", sorted(ISSUE_10517))
def test_issue_10517_peak_figures(max_model_len):
    """Sanity of the parts: weights, activation peak (peak_torch - weights) and non-torch memory."""
    plan = issue_10517_plan(max_model_len)
    m = plan.memory
    peak_torch_gib, kv_gib, _ = ISSUE_10517[max_model_len]
    assert m.budget == pytest.approx(0.90 * 23.58 * GiB, rel=1e-6)
    assert m.weights == pytest.approx(ISSUE_10517_WEIGHTS_GIB * GiB, rel=0.005)
    assert m.non_torch == pytest.approx(ISSUE_10517_NON_TORCH_GIB * GiB, rel=0.01)
    measured_activation = (peak_torch_gib - ISSUE_10517_WEIGHTS_GIB) * GiB
    # Never below what vLLM measured (the log rounds to 0.01 GiB), and not wildly above it.
    assert measured_activation - 0.01 * GiB <= m.activation <= measured_activation * 1.10
    assert m.kv_cache == pytest.approx(kv_gib * GiB, rel=0.05)
    # The parts add up to the budget.
    assert m.weights + m.activation + m.non_torch + m.cuda_graphs + m.kv_cache == pytest.approx(m.budget, abs=16)


def test_refuses_what_vllm_refused_in_issue_10517_at_29k_tokens():
    plan = issue_10517_plan(29000)
    assert not plan.fits
    msgs = messages(plan, "spec.engine.maxModelLen")
    assert msgs, plan.problems
    proposed = [int(n) for n in re.findall(r"largest length that fits is (\d+)", " ".join(msgs))]
    assert proposed, msgs
    vllm_largest = ISSUE_10517[29000][2]
    assert max(proposed) <= vllm_largest
    assert max(proposed) >= 0.85 * vllm_largest
    assert plan.kv_cache_tokens == pytest.approx(vllm_largest, rel=0.05)


def test_cuda_graphs_come_out_of_the_kv_cache():
    """vLLM >= 0.21 profiles CUDA graphs inside the budget: without enforceEager the KV cache is smaller by them."""
    eager = issue_10517_plan(20000, image=api.DEFAULT_IMAGE)
    graphs = issue_10517_plan(20000, enforce_eager=False, image=api.DEFAULT_IMAGE)
    assert graphs.memory.cuda_graphs > 0 and eager.memory.cuda_graphs == 0
    assert graphs.memory.budget == eager.memory.budget
    assert graphs.memory.kv_cache == eager.memory.kv_cache - graphs.memory.cuda_graphs


# --------------------------------------------------------------------------- KV bytes per token
def arch(**kw: Any) -> api.ModelArchitecture:
    base = dict(num_layers=32, num_attention_heads=32, num_kv_heads=8, head_dim=128)
    return api.ModelArchitecture(**{**base, **kw})


@pytest.mark.parametrize(
    ("architecture", "tp", "kv_dtype", "expected"),
    [
        (arch(), 1, "auto", 2 * 32 * 8 * 128 * 2),  # Llama-3.1-8B: 131072
        (arch(), 2, "auto", 2 * 32 * 4 * 128 * 2),  # 65536
        (arch(), 8, "auto", 2 * 32 * 1 * 128 * 2),
        (arch(), 1, "fp8", 2 * 32 * 8 * 128 * 1),  # fp8 KV halves it
        (arch(), 1, "fp8_e5m2", 2 * 32 * 8 * 128 * 1),
        (arch(num_kv_heads=2), 4, "auto", 2 * 32 * 1 * 128 * 2),  # max(1, 2 // 4) = 1 head per GPU
        (arch(num_kv_heads=1), 8, "auto", 2 * 32 * 1 * 128 * 2),
    ],
)
def test_kv_bytes_per_token_by_hand(architecture, tp, kv_dtype, expected):
    assert planner.kv_bytes_per_token(architecture, tp, kv_dtype, 2) == expected


@pytest.mark.parametrize(
    ("model", "count", "engine", "expected"),
    [
        (LLAMA_8B, 1, {}, 131072),
        (LLAMA_8B, 2, {}, 65536),
        (LLAMA_8B, 1, {"kvCacheDtype": "fp8"}, 65536),
        (LLAMA_8B, 2, {"kvCacheDtype": "fp8"}, 32768),
        ("Qwen/Qwen2.5-1.5B-Instruct", 4, {}, 2 * 28 * 1 * 128 * 2),  # 2 KV heads over 4 GPUs: 1 each
    ],
)
def test_plan_kv_bytes_per_token(model, count, engine, expected):
    plan = plan_for(model, gpu={"count": count, "memory": "80Gi"}, ipc="Host", engine=engine)
    assert plan.fits, plan.problems
    assert plan.kv_bytes_per_token == expected
    assert plan.tensor_parallel_size == count


# --------------------------------------------------------------------------- problems that name the field
def test_tp_must_divide_attention_heads():
    plan = plan_for(LLAMA_8B, gpu={"count": 3, "memory": "24Gi"}, ipc="Host")
    [msg] = messages(plan, "spec.gpu.count")
    assert "32 attention heads" in msg
    assert "1, 2, 4, 8, 16" in msg


def test_tp_must_split_kv_heads_evenly():
    # Phi-3-medium: 40 heads, 10 KV heads; 4 divides 40 but not 10 (vLLM's QKVParallelLinear would fail).
    plan = plan_for("microsoft/Phi-3-medium-4k-instruct", gpu={"count": 4, "memory": "80Gi"}, ipc="Host")
    [msg] = messages(plan, "spec.gpu.count")
    assert "10 KV heads" in msg and "1, 2, 5, 10" in msg


def test_model_that_cannot_fit_asks_for_more_gpus_or_quantization():
    plan = plan_for(LLAMA_70B, gpu={"count": 1, "product": "NVIDIA-L4"})
    assert not plan.fits
    [msg] = messages(plan, "spec.gpu")
    assert "does not fit" in msg
    assert "gpu.count" in msg and "quantiz" in msg
    suggested = int(re.search(r"gpu\.count: (\d+)", msg).group(1))
    # ...and the suggestion really fits.
    assert plan_for(LLAMA_70B, gpu={"count": suggested, "product": "NVIDIA-L4"}, ipc="Host",
                    workloadProfile={"maxContextTokens": 4096}).fits


def test_a_utilization_that_leaves_no_budget_is_refused_not_raised():
    """Found by the extreme-spec fuzz: a pinned utilisation so small the budget rounds to 0 bytes divided by zero in
    the suggestions; it is a refusal that suggests no GPU size."""
    plan = plan_for({"name": "Qwen/Qwen2.5-0.5B-Instruct", "quantization": "awq_marlin"},
                    gpu={"count": 1, "product": "Tesla-T4"}, engine={"gpuMemoryUtilization": 1e-300})
    assert not plan.fits and plan.problems
    assert not any("a GPU with more memory" in m for m in messages(plan, "spec.gpu"))


def test_context_longer_than_the_model_supports_profile():
    plan = plan_for(LLAMA_8B, gpu={"count": 1, "memory": "80Gi"}, workloadProfile={"maxContextTokens": 200_000})
    [msg] = messages(plan, "spec.workloadProfile.maxContextTokens")
    assert "200000" in msg and "131072" in msg


def test_context_longer_than_the_model_supports_engine():
    plan = plan_for(LLAMA_8B, gpu={"count": 8, "memory": "80Gi"}, ipc="Host", engine={"maxModelLen": 200_000})
    [msg] = messages(plan, "spec.engine.maxModelLen")
    assert "200000" in msg and "131072" in msg


SIZING_CASES = [
    (LLAMA_8B, {"count": 1, "product": "NVIDIA-L4"}, {}),
    (LLAMA_8B, {"count": 1, "product": "NVIDIA-L4"}, {"maxContextTokens": 16384}),
    (LLAMA_8B, {"count": 1, "product": "NVIDIA-A10G"}, {"maxContextTokens": 120000}),
    (LLAMA_8B, {"count": 2, "product": "NVIDIA-L4"}, {"p95PromptTokens": 4000, "p95OutputTokens": 1000}),
    ("meta-llama/Llama-3.2-3B-Instruct", {"count": 1, "product": "NVIDIA-H100-80GB-HBM3"}, {}),
    ("Qwen/Qwen2.5-7B-Instruct", {"count": 1, "product": "NVIDIA-A10G"}, {"priority": "throughput"}),
    ("google/gemma-3-4b-it", {"count": 2, "memory": "12Gi", "reservedMemory": "1.2Gi"}, {"maxContextTokens": 32768}),
    (LLAMA_70B, {"count": 4, "product": "NVIDIA-H100-80GB-HBM3"}, {"targetConcurrency": 64}),
    (LLAMA_70B, {"count": 8, "product": "NVIDIA-L4"}, {"maxContextTokens": 8192}),
    ("Qwen/Qwen2.5-0.5B-Instruct", {"count": 1, "product": "Tesla-T4"}, {"maxContextTokens": 1_000_000}),
]


@pytest.mark.parametrize(("model", "gpu", "profile"), SIZING_CASES)
def test_derived_max_model_len_stays_within_every_limit(model, gpu, profile):
    profile = dict(profile)
    requested = profile.get("maxContextTokens")
    plan = plan_for(model, gpu=gpu, ipc="Host", workloadProfile=profile)
    limit = plan.model.architecture.max_position_embeddings
    if requested and requested > limit:
        assert messages(plan, "spec.workloadProfile.maxContextTokens")
        return
    assert plan.fits, plan.problems
    assert plan.max_model_len <= planner.ASSUMPTIONS["context_headroom"][0] * plan.kv_cache_tokens
    assert plan.max_model_len <= limit
    if requested:
        assert plan.max_model_len <= requested
    assert arg_value(plan.args, "--max-model-len") == str(plan.max_model_len)


@pytest.mark.parametrize("reserved", ["0", "512Mi", "1.2Gi", "4Gi", "10Gi"])
@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("gpu", [{"product": "NVIDIA-L4"}, {"memory": "12Gi"}, {"product": "NVIDIA-H100-80GB-HBM3"}])
def test_derived_utilization_leaves_reserved_memory_free(reserved, eager, gpu):
    model = "Qwen/Qwen2.5-0.5B-Instruct"
    plan = plan_for(model, gpu={"count": 1, "reservedMemory": reserved, **gpu}, engine={"enforceEager": eager},
                    workloadProfile={"maxContextTokens": 4096})
    total, reserved_b = plan.gpu_memory, int(api.parse_quantity(reserved))
    util = plan.gpu_memory_utilization
    # vLLM's budget, the reservation, vLLM's CUDA context and the margin all fit on the GPU...
    outside = planner.ASSUMPTIONS["cuda_context"][0] + planner.ASSUMPTIONS["safety_margin"][0]
    assert 0 < util and util * total + reserved_b + outside <= total
    if not plan.fits:  # 10Gi of a 12Gi card reserved: too little left, and the problem says so
        assert reserved_b >= total / 2 and [p.field for p in plan.problems] == ["spec.gpu"], plan.problems
        return
    assert float(arg_value(plan.args, "--gpu-memory-utilization")) == pytest.approx(util)
    # ...and weights, activations, overheads, CUDA graphs and KV cache fit in the budget.
    m = plan.memory
    assert m.weights + m.activation + m.non_torch + m.cuda_graphs + m.kv_cache <= util * total
    assert m.cuda_graphs == (0 if eager else planner.ASSUMPTIONS["cuda_graph_per_gpu"][0])
    assert util <= planner.ASSUMPTIONS["default_utilization"][0]


@pytest.mark.parametrize("util", [0.855, 0.8951, 0.9, 0.5])
def test_pinned_utilization_is_emitted_exactly(util):
    plan = plan_for("Qwen/Qwen2.5-0.5B-Instruct", engine={"gpuMemoryUtilization": util})
    assert plan.fits, plan.problems
    assert arg_value(plan.args, "--gpu-memory-utilization") == str(util)
    assert plan.memory.budget == int(util * plan.gpu_memory)


def test_pinned_utilization_too_high_for_reserved_memory():
    plan = plan_for(LLAMA_8B, gpu={"count": 1, "product": "NVIDIA-L4", "reservedMemory": "4Gi"},
                    engine={"gpuMemoryUtilization": 0.95})
    [msg] = messages(plan, "spec.engine.gpuMemoryUtilization")
    assert "0.95" in msg and "at most" in msg


def test_reserved_memory_that_leaves_nothing():
    plan = plan_for(LLAMA_8B, gpu={"count": 1, "memory": "8Gi", "reservedMemory": "8Gi"})
    assert messages(plan, "spec.gpu.reservedMemory")


@pytest.mark.parametrize("concurrency", [None, 1, 7, 300, 1000, 5000, 65536])
@pytest.mark.parametrize("priority", ["latency", "balanced", "throughput"])
@pytest.mark.parametrize("engine", [{}, {"maxNumSeqs": 4096}])
def test_batched_tokens_at_least_seqs(concurrency, priority, engine):
    profile = {"priority": priority, **({"targetConcurrency": concurrency} if concurrency else {})}
    plan = plan_for("Qwen/Qwen2.5-0.5B-Instruct", gpu={"count": 1, "product": "NVIDIA-H100-80GB-HBM3"},
                    workloadProfile={**profile, "maxContextTokens": 4096}, engine=engine)
    # Whether or not it fits, the derived batch budget never drops below the sequences.
    assert plan.max_num_batched_tokens >= plan.max_num_seqs or not plan.args
    if plan.fits:
        assert int(arg_value(plan.args, "--max-num-batched-tokens")) >= int(arg_value(plan.args, "--max-num-seqs"))
    assert not messages(plan, "spec.engine.maxNumBatchedTokens")


@pytest.mark.parametrize(
    ("gpu", "profile", "field", "expect"),
    [
        ("NVIDIA-H100-80GB-HBM3", {"maxContextTokens": 8192, "p95PromptTokens": 12000},
         "spec.workloadProfile.maxContextTokens", "12000"),
        ("NVIDIA-H100-80GB-HBM3", {"p95PromptTokens": 150000, "p95OutputTokens": 1000},
         "spec.workloadProfile.p95PromptTokens", "131072"),
        ("NVIDIA-L4", {"p95PromptTokens": 120000}, "spec.gpu", "add GPUs"),
    ],
)
def test_typical_request_longer_than_the_context_blames_the_limit(gpu, profile, field, expect):
    plan = plan_for("meta-llama/Llama-3.2-3B-Instruct", gpu={"count": 1, "product": gpu}, workloadProfile=profile)
    assert [p.field for p in plan.problems] == [field]
    assert expect in plan.problems[0].message


def test_pinned_batched_tokens_below_seqs():
    plan = plan_for(LLAMA_8B, engine={"maxNumBatchedTokens": 64, "maxNumSeqs": 128})
    [msg] = messages(plan, "spec.engine.maxNumBatchedTokens")
    assert "64" in msg and "128" in msg


@pytest.mark.parametrize("gpu", ["NVIDIA-L4", "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"])
@pytest.mark.parametrize("profile", [{}, {"p95PromptTokens": 12000}, {"targetConcurrency": 512}])
def test_priorities_order_batched_tokens(gpu, profile):
    batched = []
    for priority in ("latency", "balanced", "throughput"):
        plan = plan_for("meta-llama/Llama-3.2-3B-Instruct", gpu={"count": 1, "product": gpu},
                        workloadProfile={**profile, "priority": priority, "maxContextTokens": 16384})
        assert plan.fits, plan.problems
        batched.append(plan.max_num_batched_tokens)
    assert batched == sorted(batched), batched
    assert batched[0] < batched[2] or profile.get("targetConcurrency")


def test_target_concurrency_grows_max_num_seqs():
    seqs = []
    for concurrency in (1, 4, 16, 64, 256):
        plan = plan_for("meta-llama/Llama-3.2-3B-Instruct", gpu={"count": 1, "product": "NVIDIA-H100-80GB-HBM3"},
                        workloadProfile={"targetConcurrency": concurrency, "maxContextTokens": 8192})
        assert plan.fits, plan.problems
        assert plan.max_num_seqs >= concurrency
        seqs.append(plan.max_num_seqs)
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_kv_cache_caps_max_num_seqs_for_typical_requests():
    plan = plan_for(LLAMA_8B, workloadProfile={"targetConcurrency": 200, "p95PromptTokens": 4000,
                                              "p95OutputTokens": 1000, "maxContextTokens": 8192})
    assert plan.fits, plan.problems
    assert plan.max_num_seqs == plan.kv_cache_tokens // 5000


@pytest.mark.parametrize("model", [LLAMA_70B, "Qwen/Qwen2.5-32B-Instruct", "Qwen/Qwen2.5-72B-Instruct"])
@pytest.mark.parametrize("quantization", ["awq", "awq_marlin", "gptq"])
def test_four_bit_weights_are_about_a_third_and_a_half(model, quantization):
    """4-bit group quantization: ~3.5x smaller (embeddings stay 16-bit; Qwen2.5-32B-AWQ is 19.3 GB of 65.5)."""
    full = plan_for(model, gpu={"count": 8, "memory": "80Gi"}, ipc="Host")
    quant = plan_for({"name": model, "quantization": quantization}, gpu={"count": 8, "memory": "80Gi"}, ipc="Host")
    assert full.fits and quant.fits
    assert full.weight_bytes_total / quant.weight_bytes_total == pytest.approx(3.5, rel=0.10)


def test_fp8_weights_are_about_half():
    full = plan_for(LLAMA_70B, gpu={"count": 8, "memory": "80Gi"}, ipc="Host")
    fp8 = plan_for({"name": LLAMA_70B, "quantization": "fp8"}, gpu={"count": 8, "memory": "80Gi"}, ipc="Host")
    assert full.weight_bytes_total / fp8.weight_bytes_total == pytest.approx(2.0, rel=0.05)


@pytest.mark.parametrize("quantization", sorted(validation.UNSUPPORTED_QUANTIZATION))
def test_quantization_vllm_does_not_have(quantization):
    plan = plan_for({"name": LLAMA_8B, "quantization": quantization})
    [msg] = messages(plan, "spec.model.quantization")
    assert quantization in msg and vllm_flags.VERSION in msg


def test_quantized_checkpoint_uses_base_model_architecture():
    plan = plan_for({"name": "Qwen/Qwen2.5-32B-Instruct-AWQ", "quantization": "awq_marlin"},
                    gpu={"count": 1, "product": "NVIDIA-L40S"}, workloadProfile={"maxContextTokens": 32768})
    assert plan.fits, plan.problems
    assert "Qwen/Qwen2.5-32B-Instruct" in plan.model.source
    assert plan.args[0] == "Qwen/Qwen2.5-32B-Instruct-AWQ"
    assert 17 * GiB < plan.weight_bytes_total < 19.5 * GiB


# --------------------------------------------------------------------------- spec checks
@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"name": "MY_TOKEN_VAR", "value": "hf_abcdefghijklmnopqrstuvwxyz012345"}, "spec.engine.env[0]"),
        ({"name": "SOMETHING", "value": "hf_abcdefghijklmnopqrstuvwxyz012345"}, "spec.engine.env[0]"),
        ({"name": "HF_TOKEN", "value": "anything"}, "spec.engine.env[0]"),
        ({"name": "HF_TOKEN", "value": ""}, "spec.engine.env[0]"),
        ({"name": "OPENAI_API_KEY", "value": "sk-abcdefghijklmnopqrstuv"}, "spec.engine.env[0]"),
    ],
)
def test_credentials_in_env_are_refused(env, field):
    plan = plan_for(LLAMA_8B, engine={"env": [env]})
    assert messages(plan, field), plan.problems
    assert not plan.fits


@pytest.mark.parametrize("env", [
    {"name": "CUDA_VISIBLE_DEVICES", "value": "0"},
    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
    {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"secretKeyRef": {"name": "gpus", "key": "list"}}},
])
def test_device_plugin_env_is_refused(env):
    plan = plan_for(LLAMA_8B, engine={"env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}, env]},
                    workloadProfile={"maxContextTokens": 8192})
    [problem] = plan.problems
    assert problem.field == "spec.engine.env[1]"
    assert problem.message.startswith(f"{env['name']} may not be set: the NVIDIA device plugin")
    assert "spec.gpu" in problem.message


def test_harmless_env_is_accepted():
    plan = plan_for(LLAMA_8B, engine={"env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]},
                    workloadProfile={"maxContextTokens": 8192})
    assert plan.fits, plan.problems


def test_autoscaling_on_a_daemonset():
    plan = plan_for(LLAMA_8B, workload="DaemonSet", autoscaling={"enabled": True, "maxReplicas": 3})
    [msg] = messages(plan, "spec.autoscaling.enabled")
    assert "StatefulSet" in msg


def test_autoscaling_without_max_replicas():
    plan = plan_for(LLAMA_8B, autoscaling={"enabled": True})
    assert messages(plan, "spec.autoscaling.maxReplicas") == ["required when autoscaling is enabled"]


# --------------------------------------------------------------------------- extraArgs
@pytest.mark.parametrize(
    ("extra", "expect"),
    [
        (["--foo-bar"], "has no flag --foo-bar"),
        (["--foo-bar", "1"], "has no flag --foo-bar"),
        (["--swap-space", "4"], "removed"),
        (["--prefill-chunk-size", "512"], "does not exist"),
        (["--gpu-memory-utilization-gpu0", "0.9"], "does not exist"),
        (["--max-model-len", "4096"], "spec.engine.maxModelLen"),
        (["--max_model_len=4096"], "spec.engine.maxModelLen"),
        (["--tensor-parallel-size", "2"], "spec.gpu.count"),
        (["--gpu-memory-utilization", "0.5"], "spec.engine.gpuMemoryUtilization"),
        (["--kv-cache-dtype", "fp8"], "spec.engine.kvCacheDtype"),
        (["--port", "9000"], "port 8000"),
        (["--scheduling-policy", "fifo"], "not one of"),
        (["--scheduling-policy=fifo"], "not one of"),
        (["--disable-log-stats=yes"], "takes no value"),
        (["--seed"], "needs a value"),
        (["4"], "is not a flag"),
        (["--served-model-name", "a", "b"], "spec.model.servedName"),  # nargs "+": both values go with it
    ],
)
def test_bad_extra_args(extra, expect):
    plan = plan_for(LLAMA_8B, engine={"extraArgs": extra}, workloadProfile={"maxContextTokens": 8192})
    [problem] = plan.problems  # one problem per bad flag, its value included
    assert problem.field == "spec.engine.extraArgs[0]"
    assert expect in problem.message


@pytest.mark.parametrize(
    "extra",
    [["--seed", "1"], ["--max-logprobs=5"], ["--seed", "-1"], ["--scheduling-policy", "priority"],
     ["--disable-log-stats", "--max_logprobs", "5"], ["--compilation-config.mode", "3"],
     ["--uvicorn-log-level=warning", "--disable-custom-all-reduce"],
     ["--allowed-media-domains", "a.example", "b.example", "--seed", "1"]],  # nargs "+" (was: 'b.example' not a flag)
)
def test_valid_extra_args_are_passed_through(extra):
    plan = plan_for(LLAMA_8B, engine={"extraArgs": extra}, workloadProfile={"maxContextTokens": 8192})
    assert plan.fits, plan.problems
    assert plan.args[-len(extra):] == extra


@pytest.mark.parametrize(("extra", "expect"), [
    (["--pipeline-parallel-size", "2"], "spec.nodes"),  # main's multi-node (OWNED_FLAGS): the field that plans it
    (["-pp", "2"], "spec.nodes"),  # the other spelling
    (["--data-parallel-size=2"], "spec.replicas"),
    (["-dp", "2"], "spec.replicas"),
    (["--enable-lora"], "spec.adapters"),  # main's adapters (OWNED_FLAGS): the field that plans them
    (["--lora-modules", "a=/adapters/a"], "spec.adapters"),
    (["--fully-sharded-loras"], "spec.adapters"),
    (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}'], "Speculative decoding"),
    (["--speculative-config.method", "ngram"], "Speculative decoding"),
    (["--kv-transfer-config", '{"kv_connector": "LMCacheConnectorV1"}'], "KV connector"),
    (["--kv-offloading-size", "8"], "KV offload"),
    (["--cpu-offload-gb", "10"], "a quantized checkpoint"),
    (["--num-gpu-blocks-override", "1000"], "spec.engine.gpuMemoryUtilization"),
    (["--kv-cache-memory-bytes", "8000000000"], "spec.engine.gpuMemoryUtilization"),
])
def test_extra_args_that_change_gpus_or_memory_are_refused_with_the_field_to_use(extra, expect):
    """Issue 20 item 3: a flag that changes the GPU count or the memory would make `plan` say "fits" for a pod that
    waits for GPUs it lacks or runs out of memory; refused, also for an image whose release has no snapshot."""
    for image in (api.DEFAULT_IMAGE, "vllm/vllm-openai:v9.9.9"):
        plan = plan_for(LLAMA_8B, image=image, engine={"extraArgs": extra}, workloadProfile={"maxContextTokens": 8192})
        [problem] = plan.problems  # the refused flag's value goes with it
        assert problem.field == "spec.engine.extraArgs[0]" and expect in problem.message, problem
        assert "the plan (and the pod's GPU count and memory) does not count it" in problem.message \
            or "spec." in problem.message


# --------------------------------------------------------------------------- shutdown
@pytest.mark.parametrize(("engine", "profile", "seconds", "why"), [
    ({}, {}, 30, "an assumed p95 output 512 tokens at 20 tokens/s = 26 s"),
    ({}, {"p95OutputTokens": 1000}, 50, "workloadProfile.p95OutputTokens 1000 tokens at 20 tokens/s = 50 s"),
    ({"shutdownTimeoutSeconds": 45}, {"p95OutputTokens": 1000}, 45, "pinned by engine.shutdownTimeoutSeconds"),
    ({"shutdownTimeoutSeconds": 0}, {}, 0, "aborts every in-flight request"),
])
def test_shutdown_timeout_lets_a_p95_request_finish(engine, profile, seconds, why):
    plan = plan_for(LLAMA_8B, engine=engine, workloadProfile={"maxContextTokens": 8192, **profile})
    assert plan.fits, plan.problems
    assert arg_value(plan.args, "--shutdown-timeout") == str(seconds) == str(plan.drain_seconds)
    [decision] = [d for d in plan.decisions if d.flag == "--shutdown-timeout"]
    assert why in decision.why and decision.pinned is ("shutdownTimeoutSeconds" in engine)
    assert plan.termination_grace_seconds == plan.prestop_seconds + seconds + 10
    [note] = [n for n in plan.notes if n.startswith("terminationGracePeriodSeconds")]
    assert f"--shutdown-timeout {seconds} s" in note and f"preStop sleep {plan.prestop_seconds} s" in note


def test_shutdown_timeout_is_not_an_extra_arg():
    plan = plan_for(LLAMA_8B, engine={"extraArgs": ["--shutdown-timeout", "60"]},
                    workloadProfile={"maxContextTokens": 8192})
    [problem] = plan.problems
    assert problem.field == "spec.engine.extraArgs[0]" and "spec.engine.shutdownTimeoutSeconds" in problem.message


# --------------------------------------------------------------------------- queue cap
AUTOSCALED = {"enabled": True, "maxReplicas": 4}
QUEUE_PROFILE = {"maxContextTokens": 8192, "targetConcurrency": 8}  # max-num-seqs 10 (8 x 1.25, balanced)


@pytest.mark.parametrize(("cap", "autoscaling", "refused"), [
    (13, AUTOSCALED, False),  # 10 running + 3 waiting: 3 / 2 = 1.5 > 1.1, the autoscaler can scale up
    (12, AUTOSCALED, True),  # 2 waiting at most: 2 / 2 = 1.0, within the tolerance for ever
    (8, AUTOSCALED, True),  # not even the batch fills
    (21, {**AUTOSCALED, "targetWaitingPerReplica": 10}, True),  # 11 waiting: exactly 1.1, within the tolerance
    (22, {**AUTOSCALED, "targetWaitingPerReplica": 10}, False),
    (23, {**AUTOSCALED, "targetWaitingPerReplica": 10, "mode": "HPA"}, False),
    (11, {**AUTOSCALED, "targetWaitingPerReplica": 0.5}, False),  # 1 waiting: 1 / 0.5 = 2
    (5, {}, False),  # no autoscaler: a coarse valve, with a warning that the batch never fills
])
def test_queue_cap_leaves_the_autoscaler_its_target(cap, autoscaling, refused):
    plan = plan_for(LLAMA_8B, engine={"maxNumQueuedReqs": cap}, autoscaling=autoscaling,
                    workloadProfile=QUEUE_PROFILE)
    assert plan.max_num_seqs == 10
    msgs = messages(plan, "spec.engine.maxNumQueuedReqs")
    assert bool(msgs) is refused, plan.problems
    if refused:
        target = autoscaling["targetWaitingPerReplica"] if "targetWaitingPerReplica" in autoscaling else 2
        need = planner.min_queue_cap(10, target)
        assert f"Use at least {need}" in msgs[0] and "503" in msgs[0]
        assert not messages(plan_for(LLAMA_8B, engine={"maxNumQueuedReqs": need}, autoscaling=autoscaling,
                                     workloadProfile=QUEUE_PROFILE), "spec.engine.maxNumQueuedReqs")
    else:
        assert plan.fits, plan.problems
        assert arg_value(plan.args, "--max-num-queued-reqs") == str(cap)
        assert any(n.startswith("warning: engine.maxNumQueuedReqs") for n in plan.notes) is (cap < 10)


def test_queue_cap_is_not_emitted_unless_set_and_not_an_extra_arg():
    assert "--max-num-queued-reqs" not in plan_for(LLAMA_8B, workloadProfile={"maxContextTokens": 8192}).args
    plan = plan_for(LLAMA_8B, engine={"extraArgs": ["--max-num-queued-reqs=64"]},
                    workloadProfile={"maxContextTokens": 8192})
    [problem] = plan.problems
    assert problem.field == "spec.engine.extraArgs[0]" and "spec.engine.maxNumQueuedReqs" in problem.message


# --------------------------------------------------------------------------- shared memory
def test_tensor_parallel_with_tiny_shm_is_refused():
    plan = plan_for(LLAMA_8B, gpu={"count": 2, "product": "NVIDIA-L4"}, ipc="SharedMemory", shmSize="64Mi")
    [msg] = messages(plan, "spec.shmSize")
    assert "64Mi" in msg and "ipc: Host" in msg


def test_shm_derived_from_tp():
    one = plan_for(LLAMA_8B, workloadProfile={"maxContextTokens": 8192})
    two = plan_for(LLAMA_8B, gpu={"count": 2, "product": "NVIDIA-L4"}, workloadProfile={"maxContextTokens": 8192})
    assert one.fits and two.fits
    assert one.shm_bytes >= GiB and two.shm_bytes >= 2 * GiB


def test_ipc_host_needs_no_shm():
    plan = plan_for(LLAMA_8B, gpu={"count": 2, "product": "NVIDIA-L4"}, ipc="Host")
    assert plan.fits, plan.problems
    assert plan.shm_bytes == 0


def test_plan_status_shape():
    plan = plan_for(LLAMA_8B, workloadProfile={"maxContextTokens": 8192})
    status = api.PlanStatus.model_validate(plan.status())
    assert status.args == plan.args
    assert status.estimates.kv_cache_tokens == plan.kv_cache_tokens
    assert any(n.startswith("--max-model-len 8192") for n in status.notes)


# --------------------------------------------------------------------------- which GPU the plan is for
@pytest.mark.parametrize("written", ["L4", "l4", "NVIDIA-L4", "nvidia l4", "nvidia-l4-shared"])
def test_aliases_plan_like_the_canonical_product(written):
    canonical = plan_for(LLAMA_8B, gpu={"product": "NVIDIA-L4"})
    plan = plan_for(LLAMA_8B, gpu={"product": written})
    assert plan.fits, plan.problems
    assert plan.gpu_memory == catalog.lookup_gpu("NVIDIA-L4").memory_bytes == canonical.gpu_memory
    assert plan.args == canonical.args


@pytest.mark.parametrize("family, smallest", [
    ("H100", "NVIDIA-H100-PCIe"),  # 79.11 GiB, against the SXM's 79.18 and the NVL's 93.10
    ("A100-80GB", "NVIDIA-A100-SXM4-80GB"),
    ("A100", "NVIDIA-A100-PCIE-40GB"),
    ("V100", "Tesla-V100-SXM2-16GB"),
    ("H200", "NVIDIA-H200"),
])
def test_a_family_plans_with_its_smallest_member(family, smallest):
    plan = plan_for(LLAMA_8B, gpu={"product": family})
    assert plan.gpu_memory == catalog.lookup_gpu(smallest).memory_bytes
    assert smallest in plan.gpu_source
    assert any(n.startswith(f"gpu.product {family} selects any of") for n in plan.notes), plan.notes


def test_an_a100_family_keeps_vllms_small_gpu_batch_defaults():
    # vLLM's 1024/8192 defaults are for >= 70 GiB GPUs that are not A100s: any A100 in the family counts.
    plan = plan_for(LLAMA_8B, gpu={"product": "A100-80GB"}, workloadProfile={"priority": "balanced"})
    assert arg_value(plan.args, "--max-num-seqs") == "256"


def test_mig_slice_plans_with_the_slice_memory():
    plan = plan_for(LLAMA_8B, gpu={"product": "A100-80GB", "migProfile": "3g.40gb"})
    assert plan.fits, plan.problems
    assert plan.gpu_memory == int(39.25 * 1024) * 2**20
    assert plan.gpu.resource == "nvidia.com/mig-3g.40gb"
    assert arg_value(plan.args, "--tensor-parallel-size") == "1"


def test_mig_slices_cannot_be_tensor_parallel():
    plan = plan_for(LLAMA_8B, gpu={"product": "H100", "migProfile": "3g.40gb", "count": 2}, ipc="Host")
    [msg] = messages(plan, "spec.gpu.count")
    assert "MIG" in msg and "count: 1" in msg


def test_mig_profile_the_gpu_does_not_have():
    plan = plan_for(LLAMA_8B, gpu={"product": "NVIDIA-H100-80GB-HBM3", "migProfile": "1g.5gb"})
    [msg] = messages(plan, "spec.gpu.migProfile")
    assert "1g.10gb" in msg and "7g.80gb" in msg  # the profiles it does have


@pytest.mark.parametrize("written, suggestion, example", [
    ("H100x", "H100", "79Gi"),
    ("NVIDIA-H100-SXM5-94GB", "H100", "93Gi"),
    ("NVIDIA-L4O", "NVIDIA-L4", "22Gi"),
])
def test_unknown_product_gets_near_matches_and_a_memory_example_of_its_family(written, suggestion, example):
    plan = plan_for(LLAMA_8B, gpu={"product": written})
    [msg] = messages(plan, "spec.gpu.product")
    assert f"did you mean {suggestion}" in msg and f"for example {example}" in msg
    assert not messages(plan, "spec.gpu.memory")  # one problem, on the field to fix first


def test_unknown_product_with_memory_is_selected_as_written():
    plan = plan_for(LLAMA_8B, gpu={"product": "NVIDIA-H100-SXM5-94GB", "memory": "92Gi"})
    assert plan.fits, plan.problems
    assert plan.gpu_memory == 92 * GiB
    assert [(r.key, r.values) for r in plan.gpu.requirements] == [
        ("nvidia.com/gpu.product", ("NVIDIA-H100-SXM5-94GB",))]


def test_no_product_needs_memory():
    plan = plan_for(LLAMA_8B, gpu={"count": 1})
    [msg] = messages(plan, "spec.gpu.memory")
    assert "24Gi" in msg


def test_memory_above_the_catalogs_is_noted():
    plan = plan_for(LLAMA_8B, gpu={"product": "L4", "memory": "24Gi"})
    assert plan.gpu_memory == 24 * GiB
    assert any("gpu.memory 24Gi is more than the catalog NVIDIA-L4: 22.49 GiB" in n for n in plan.notes), plan.notes


def test_gpu_resources_in_spec_resources_are_refused():
    plan = plan_for(LLAMA_8B, resources={"limits": {"nvidia.com/mig-1g.10gb": "1"}})
    [msg] = messages(plan, "spec.resources")
    assert "nvidia.com/mig-1g.10gb comes from spec.gpu" in msg


# --------------------------------------------------------------------------- the planner never raises
MODELS = catalog.known_models()
GPU_PRODUCTS = [g.product for g in catalog.known_gpus()] + list(catalog.gpu_families()) + ["l4", "nvidia-l4-shared"]
GOOD_EXTRA_ARGS = [[], ["--seed", "3"], ["--max-logprobs=5"], ["--disable-log-stats"]]
EXTRA_ARGS = GOOD_EXTRA_ARGS + [["--foo"], ["--swap-space", "4"], ["--max-model-len", "4096"],
                                ["--scheduling-policy", "fifo"]]


def _optional(strategy, chance: int = 2):
    """None, or a draw from `strategy` about once in `chance` times (most random specs should be plausible)."""
    return st.sampled_from(range(chance)).flatmap(lambda n: strategy if n == 0 else st.none())


def _drop_none(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}


@st.composite
def random_specs(draw) -> dict:
    """Random specs: one in four anything-goes (extreme ints, random pins, impossible combinations), the
    rest plausible (a valid TP for the model, a real GPU), so the properties of fitting plans are exercised."""
    wild = draw(st.integers(0, 3)) == 0
    extreme_ints = st.one_of(st.integers(1, 100), st.integers(1, 100_000), st.sampled_from([1, 16, 65536, 10**6]))
    model = draw(st.sampled_from(MODELS + (["example/unknown-model"] if wild else [])))
    architecture = catalog.lookup_model(model)
    if wild or architecture is None:
        count = draw(st.integers(1, 16))
    else:
        count = draw(st.sampled_from([t for t in planner.valid_tp_sizes(architecture) if t <= 8]))
    gpu = _drop_none({
        "count": count,
        "product": draw(_optional(st.sampled_from(GPU_PRODUCTS + ["NVIDIA-Unknown-9000"]), 1)),
        "migProfile": draw(_optional(st.sampled_from(list(catalog.mig_profiles()) + ["2g.99gb"]), 6)),
        "labelConvention": draw(_optional(st.sampled_from(["GFD", "GKE", "Karpenter"]), 3)),
        "memory": draw(_optional(st.integers(1 if wild else 16, 200).map(lambda n: f"{n}Gi"))),
        "reservedMemory": draw(_optional(st.sampled_from(["0", "256Mi", "1.2Gi", "4Gi", "100Gi"] if wild
                                                         else ["0", "256Mi", "1.2Gi"]), 3)),
    })
    pin = 2 if wild else 6  # how rarely an engine value is pinned
    profile = _drop_none({
        "maxContextTokens": draw(_optional(st.one_of(st.integers(16, 200_000), st.sampled_from([16, 100_000_000]))
                                           if wild else st.integers(512, 32768))),
        "p95PromptTokens": draw(_optional(st.one_of(extreme_ints, st.just(100_000_000)) if wild
                                          else st.integers(1, 4000), 3)),
        "p95OutputTokens": draw(_optional(st.one_of(extreme_ints, st.just(100_000_000)) if wild
                                          else st.integers(1, 1000), 3)),
        "targetConcurrency": draw(_optional(st.integers(1, 65536) if wild else st.integers(1, 512), 3)),
        "priority": draw(_optional(st.sampled_from(["latency", "balanced", "throughput"]))),
    })
    engine = _drop_none({
        "gpuMemoryUtilization": draw(_optional(st.floats(0.01, 1.0) if wild else st.floats(0.5, 0.9), pin)),
        "maxModelLen": draw(_optional(st.one_of(st.integers(16, 200_000), st.just(100_000_000)) if wild
                                      else st.integers(256, 8192), pin)),
        "maxNumSeqs": draw(_optional(st.integers(1, 65536) if wild else st.integers(1, 512), pin)),
        "maxNumBatchedTokens": draw(_optional(st.integers(1, 10_000_000) if wild else st.integers(512, 16384), pin)),
        "kvCacheDtype": draw(_optional(st.sampled_from(["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]), 3)),
        "enablePrefixCaching": draw(_optional(st.booleans(), 3)),
        "enforceEager": draw(_optional(st.booleans(), 3)),
        "shutdownTimeoutSeconds": draw(_optional(st.integers(0, 3600), pin)),
        "maxNumQueuedReqs": draw(_optional(st.integers(1, 2000), pin)),
        "extraArgs": draw(st.sampled_from(EXTRA_ARGS if wild else GOOD_EXTRA_ARGS)),
    })
    workload = draw(st.sampled_from(["StatefulSet", "DaemonSet"]))
    autoscaling = draw(st.sampled_from([{}, {"enabled": True, "maxReplicas": 3}, {"enabled": True}] if wild else
                                       [{}] + ([{"enabled": True, "maxReplicas": 3}] if workload == "StatefulSet"
                                               else [])))
    quantizations = list(get_args(api.Quantization)) if wild else ["none", "awq", "gptq_marlin", "fp8"]
    return _drop_none({
        "model": {
            "name": model,
            "quantization": draw(st.sampled_from(quantizations)),
            "dtype": draw(st.sampled_from(["auto", "bfloat16", "float16", "float32"])),
        },
        "workload": workload,
        "replicas": draw(st.integers(0, 5)),
        "gpu": gpu,
        "ipc": draw(st.sampled_from(["Host", "SharedMemory"])),
        "shmSize": draw(_optional(st.sampled_from(["64Mi", "1Gi", "16Gi"] if wild else ["16Gi"]), 4)),
        "workloadProfile": profile,
        "engine": engine,
        "autoscaling": autoscaling,
    })


def _flags(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args[1:] if a.startswith("--")]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_specs())
def test_planner_never_raises(raw):
    spec = api.VLLMServerSpec.model_validate(raw)
    plan = pipeline.plan_server("random", "default", spec)
    assert isinstance(plan, Plan)
    assert plan.fits == (not plan.problems)
    for problem in plan.problems:
        assert problem.field.startswith(("spec", "metadata")) and problem.message
    event("fits" if plan.fits else f"problem on {plan.problems[0].field.split('[')[0]}")
    if not plan.fits:
        return
    known = vllm_flags.flags()
    assert plan.args and plan.args[0] == spec.model.name
    assert plan.kv_cache_tokens > 0
    assert 16 <= plan.max_model_len <= plan.kv_cache_tokens
    assert plan.max_model_len <= plan.model.architecture.max_position_embeddings
    assert plan.max_num_batched_tokens >= plan.max_num_seqs >= 1
    assert 0 < plan.gpu_memory_utilization <= 1
    for flag in _flags(plan.args):
        assert vllm_flags.normalise(flag) in known, flag
    m = plan.memory
    assert m.weights + m.activation + m.non_torch + m.cuda_graphs + m.kv_cache <= m.budget
    assert m.budget + m.reserved <= m.total
    assert arg_value(plan.args, "--max-model-len") == str(plan.max_model_len)
    # The flag carries exactly the utilization the memory was planned with (no rounding either way).
    assert float(arg_value(plan.args, "--gpu-memory-utilization")) == plan.gpu_memory_utilization
    assert math.isfinite(plan.max_concurrency) and plan.max_concurrency > 0
    # A fitting plan can be scheduled: a MIG slice is one device, and what the pod selects was planned for.
    assert not spec.gpu.mig_profile or (spec.gpu.count == 1 and plan.gpu.resource != "nvidia.com/gpu"
                                        or spec.gpu.label_convention == "GKE")
    if spec.gpu.memory is None:  # planned for the smallest GPU (or slice) the pod can land on
        mig = plan.gpu.mig_profile
        sizes = [g.mig_memory(mig) if mig else g.memory_bytes for g in plan.gpu.products]
        assert plan.gpu_memory == min(size for size in sizes if size is not None)


def test_extended_resources_need_a_limit_equal_to_the_request():
    """What the API server refuses in a pod template ('Limit must be set for non overcommitable resources',
    'must be equal to ... limit'), refused first with the field's path."""
    plan = plan_for(LLAMA_8B, resources={"requests": {"example.com/foo": "1", "cpu": "4"}})
    [msg] = messages(plan, "spec.resources.requests.example.com/foo")
    assert "limits.example.com/foo to 1" in msg
    plan = plan_for(LLAMA_8B, resources={"requests": {"hugepages-2Mi": "1Gi"}, "limits": {"hugepages-2Mi": "2Gi"}})
    assert messages(plan, "spec.resources.requests.hugepages-2Mi")
    plan = plan_for(LLAMA_8B, resources={"requests": {"example.com/foo": "1", "cpu": "2"},
                                         "limits": {"example.com/foo": 1, "cpu": "4"}})
    assert not [p for p in plan.problems if p.field.startswith("spec.resources")]


def test_the_vllm_image_may_be_pinned_by_digest():
    digest = "@sha256:" + "ab" * 32
    pinned = plan_for(image=api.DEFAULT_IMAGE + digest)
    assert not pinned.problems and not [n for n in pinned.notes if "vLLM" in n and "image" in n]
    assert pinned.flags.exact and pinned.flags.snapshot.version == vllm_flags.VERSION
    from vllm_operator import builders
    [sts] = [o for o in builders.build_all(pinned, {"metadata": {"name": "test", "uid": "u"}})
             if o["kind"] == "StatefulSet"]
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == api.DEFAULT_IMAGE + digest
    # a digest alone names no release: checked loosely against the default release's flags, with a warning
    other = plan_for(image="registry.corp/vllm@sha256:" + "cd" * 32)
    assert not other.flags.exact and other.flags.snapshot.version == vllm_flags.VERSION
    assert [n for n in other.notes if n.startswith("warning: image registry.corp/vllm@sha256:")
            and "names no vLLM release" in n and "Name the release in the tag" in n]


@pytest.mark.parametrize("model, gpu, field, words", [
    ({"name": "Qwen/Qwen2.5-1.5B-Instruct", "dtype": "bfloat16"}, "T4", "spec.model.dtype",
     "bfloat16 needs compute capability 8.0 in vLLM 0.32.0; Tesla-T4 has 7.5: use float16"),
    ({"name": "Qwen/Qwen2.5-7B-Instruct", "quantization": "awq"}, "V100-SXM2-32GB", "spec.model.quantization",
     "awq needs compute capability 7.5 in vLLM 0.32.0; Tesla-V100-SXM2-32GB has 7.0: a checkpoint quantized with "
     "compressed-tensors, gptq, gptq_marlin runs there"),
    ({"name": "Qwen/Qwen2.5-7B-Instruct", "quantization": "fp8"}, "V100-SXM2-32GB", "spec.model.quantization",
     "fp8 needs compute capability 7.5"),
])
def test_what_the_gpu_cannot_run_is_refused_as_vllm_refuses_it(model, gpu, field, words):
    p = plan_for(model, gpu={"count": 1, "product": gpu})
    [problem] = [q for q in p.problems if q.field == field]
    assert problem.message.startswith(words), problem.message


@pytest.mark.parametrize("model, gpu", [
    ({"name": "Qwen/Qwen2.5-1.5B-Instruct", "dtype": "auto"}, "T4"),       # vLLM casts to float16 there
    ({"name": "Qwen/Qwen2.5-1.5B-Instruct", "dtype": "float16"}, "T4"),
    ({"name": "Qwen/Qwen2.5-7B-Instruct", "quantization": "fp8"}, "T4"),    # 7.5: Marlin in 0.32
    ({"name": "Qwen/Qwen2.5-7B-Instruct", "quantization": "gptq"}, "V100-SXM2-32GB"),
    ({"name": "Qwen/Qwen2.5-7B-Instruct", "quantization": "awq"}, "A100-SXM4-40GB"),
])
def test_what_the_gpu_can_run_is_not_refused(model, gpu):
    p = plan_for(model, gpu={"count": 1, "product": gpu})
    assert not [q for q in p.problems if q.field in ("spec.model.dtype", "spec.model.quantization")], p.problems


def test_an_unknown_gpu_is_not_checked_against_capabilities():
    p = plan_for({"name": "Qwen/Qwen2.5-1.5B-Instruct", "dtype": "bfloat16"},
                 gpu={"count": 1, "product": "NVIDIA-Future-GPU", "memory": "48Gi"})
    assert not [q for q in p.problems if q.field == "spec.model.dtype"]


def test_max_below_min_replicas_is_refused_whether_autoscaling_is_on_or_not():
    # as the CRD's rule does (found by tests/unit/test_fuzz.py: the API server refused what the planner passed)
    for enabled in (True, False):
        p = plan_for(autoscaling={"enabled": enabled, "minReplicas": 4, "maxReplicas": 1})
        assert messages(p, "spec.autoscaling.maxReplicas") == ["1 is below minReplicas 4"], enabled


@pytest.mark.parametrize("image, version", [
    ("vllm/vllm-openai:v0.35.1", "0.35.1"), ("vllm/vllm-openai:0.33.0", "0.33.0"),
    ("registry.corp/vllm-openai:v0.34.0rc1@sha256:" + "ab" * 32, "0.34.0rc1"),
    ("registry.corp/vllm-openai:v0.32.0-cu130", "0.32.0"), ("vllm/vllm-openai:latest", None), ("registry.corp/vllm@sha256:" + "ab" * 32, None),
])
def test_the_vllm_release_an_image_names(image, version):
    assert validation.image_vllm_version(image) == version


@pytest.mark.parametrize("image, snapshot, exact", [
    (api.DEFAULT_IMAGE, vllm_flags.VERSION, True),
    ("vllm/vllm-openai:v0.31.0", "0.31.0", True), ("vllm/vllm-openai:v0.28.0-cu130", "0.28.0", True),
    ("registry.corp/vllm-openai:v0.33.0@sha256:" + "ab" * 32, "0.33.0", True),
    # no snapshot of its own: the latest one not newer, else the oldest; loose
    ("vllm/vllm-openai:v0.32.1", "0.32.0", False), ("vllm/vllm-openai:v0.33.0rc1", "0.32.0", False),
    ("vllm/vllm-openai:v0.35.1", "0.33.0", False), ("vllm/vllm-openai:v0.27.1", "0.26.0", False),
    ("vllm/vllm-openai:latest", vllm_flags.VERSION, False),
])
def test_the_image_release_chooses_the_flag_snapshot(image, snapshot, exact):
    check = validation.flag_check(api.VLLMServerSpec.model_validate({"model": {"name": "m"}, "image": image}))
    assert (check.snapshot.version, check.exact) == (snapshot, exact)
    assert (check.warning() is None) == exact


def test_the_snapshots_are_each_releases_own_parser():
    """Each committed snapshot says the release it was made from, and they differ where the releases do."""
    assert vllm_flags.VERSION in vllm_flags.releases() and len(vllm_flags.releases()) >= 4
    for release in vllm_flags.releases():
        assert vllm_flags.snapshot(release).version == release
    has = {r: set(vllm_flags.snapshot(r).flags) for r in vllm_flags.releases()}
    assert "--max-num-queued-reqs" not in has["0.28.0"] and "--max-num-queued-reqs" in has["0.29.0"]
    assert "--enable-shm-tensor-arena" not in has["0.31.0"] and "--enable-shm-tensor-arena" in has["0.32.0"]
    assert "--disable-prefix-caching" in has["0.33.0"] and "--disable-prefix-caching" not in has["0.32.0"]
    # 0.33 still parses --no-enable-x though its --help no longer shows it
    assert "--no-enable-prefix-caching" in has["0.33.0"]


def test_a_flag_of_one_release_is_accepted_with_its_image_and_refused_with_another():
    new_in_032 = ["--enable-shm-tensor-arena"]
    assert plan_for(image="vllm/vllm-openai:v0.32.0", engine={"extraArgs": new_in_032}).fits
    old = plan_for(image="vllm/vllm-openai:v0.31.0", engine={"extraArgs": new_in_032})
    assert messages(old, "spec.engine.extraArgs[0]") == [
        "vLLM 0.31.0 has no flag --enable-shm-tensor-arena: the server would exit with code 2 and crash-loop"]
    removed_in_031 = ["--enable-mamba-fine-grained-prefix-cache"]
    assert plan_for(image="vllm/vllm-openai:v0.30.0", engine={"extraArgs": removed_in_031}).fits
    assert not plan_for(image="vllm/vllm-openai:v0.31.0", engine={"extraArgs": removed_in_031}).fits
    # a choice one release added: --kv-cache-dtype is derived, so a JSON-free choice flag: --moe-backend
    assert plan_for(image="vllm/vllm-openai:v0.32.0", engine={"extraArgs": ["--moe-backend", "aiter_mega_moe"]}).fits
    assert not plan_for(image="vllm/vllm-openai:v0.31.0",
                        engine={"extraArgs": ["--moe-backend", "aiter_mega_moe"]}).fits


def test_another_spelling_of_a_derived_flag_is_refused():
    """vLLM's other option strings for a derived flag's action set the same value (the snapshot records them)."""
    for image, extra, owner in [
        (api.DEFAULT_IMAGE, ["--device-memory-utilization", "0.99"], "spec.engine.gpuMemoryUtilization"),
        ("vllm/vllm-openai:v0.33.0", ["--disable-prefix-caching"], "spec.engine.enablePrefixCaching"),
        ("vllm/vllm-openai:v0.35.0", ["--device-memory-utilization=0.99"], "spec.engine.gpuMemoryUtilization"),
    ]:
        [msg] = messages(plan_for(image=image, engine={"extraArgs": extra}), "spec.engine.extraArgs[0]")
        assert "other name for" in msg and owner in msg, (image, msg)


def test_a_derived_flag_the_release_lacks_is_not_emitted():
    """vLLM 0.28 has no --max-num-queued-reqs: pinned by the spec, it is a problem naming the field and the
    release; the other releases get it."""
    spec = dict(engine={"maxNumQueuedReqs": 600})
    old = plan_for(image="vllm/vllm-openai:v0.28.0", **spec)
    assert "--max-num-queued-reqs" not in old.args
    [msg] = messages(old, "spec.engine.maxNumQueuedReqs")
    assert msg.startswith("vLLM 0.28.0 (the image's release) has no --max-num-queued-reqs") and "0.29.0" in msg
    new = plan_for(image="vllm/vllm-openai:v0.29.0", **spec)
    assert new.fits and new.args[new.args.index("--max-num-queued-reqs") + 1] == "600"
    # every flag the plan emits is one the chosen release has
    for release in vllm_flags.releases():
        p = plan_for(image=f"vllm/vllm-openai:v{release}")
        assert p.fits, (release, p.problems)
        known = vllm_flags.snapshot(release).flags
        assert [a for a in p.args[1:] if a.startswith("--") and a not in known] == [], release


def test_a_derived_flag_missing_without_a_pin_is_left_to_vllm_with_a_warning():
    """The planner's own choice that a release cannot take is dropped, with a warning naming flag and release."""
    p = plan_for(image="vllm/vllm-openai:v0.28.0")
    p.decisions.append(planner.FlagDecision("--max-num-queued-reqs", "600", "derived for the test"))
    p.notes.clear()
    planner.check_release_flags(p)
    assert p.fits and "--max-num-queued-reqs" not in planner.engine_args(p)
    assert [n for n in p.notes if n.startswith("warning: vLLM 0.28.0 has no --max-num-queued-reqs: not passed")]


def test_another_vllm_release_gets_its_new_flags_checked_loosely():
    new = ["--some-flag-of-0.35", "3", "--seed", "1"]
    strict = plan_for(engine={"extraArgs": new})
    assert [q.field for q in strict.problems] == ["spec.engine.extraArgs[0]"]
    loose = plan_for(image="vllm/vllm-openai:v0.35.1", engine={"extraArgs": new[:2]})
    assert loose.fits, loose.problems
    [note] = [n for n in loose.notes if n.startswith("warning: image vllm/vllm-openai:v0.35.1 runs vLLM 0.35.1")]
    assert note.endswith("passed unchecked: --some-flag-of-0.35") and "against vLLM 0.33.0's flags" in note
    assert loose.flags.unchecked == ("--some-flag-of-0.35",)
    assert loose.args[-2:] == ["--some-flag-of-0.35", "3"]
    # what the operator owns, and credentials, stay refused whatever the release
    for extra in (["--max-model-len", "4096"], ["--api-key", "secret-value-here"], ["--port", "9000"]):
        p = plan_for(image="vllm/vllm-openai:v0.35.1", engine={"extraArgs": extra})
        assert [q.field for q in p.problems] == ["spec.engine.extraArgs[0]"], (extra, p.problems)


def test_v2_profile_of_vllm_026_runs_no_vision_encoder():
    """vLLM 0.26's Model Runner V2 profiles the language model only (its profile_run runs no encoder; Qwen2.5-VL-7B
    on an H200 peaked at the language model's 1.07 GiB, tests/data/gpu v01): the 0.26 plan reserves no vision tower,
    while 0.32's profile does, and the same model's language part is the same in both."""
    import json
    from pathlib import Path
    config = Path(__file__).parents[1] / "data" / "configs" / "Qwen2.5-VL-7B-Instruct.config.json"
    arch = catalog.architecture_from_config(json.loads(config.read_text()))
    old, new = planner.profile_terms("0.26.0"), planner.profile_terms("0.32.0")
    assert not old.v2_encoder_profiled and new.v2_encoder_profiled
    with_tower = planner.activation_bytes(arch, 1, 8192, 1024, 2, new, 32768)
    language_only = planner.activation_bytes(arch, 1, 8192, 1024, 2, old, 32768)
    forward = 8192 * (2 * arch.intermediate_size + planner.assumption("activation_hidden_factor") * arch.hidden_size) * 2
    assert language_only == int(max(forward, arch.vocab_size * arch.hidden_size * 2) + old.v2_peak_margin)
    assert with_tower > language_only
