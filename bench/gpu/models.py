"""One config.json per model of the matrix: from the operator's catalog (the shapes the planner plans with, written
as the model's own family writes its config.json) or from a Hub config.json kept in tests/data/configs or
bench/gpu/configs. vLLM on the GPU machine reads nothing else (random weights, `load_format="dummy"`).

Usage: python -m bench.gpu.models OUT_DIR   (one OUT_DIR/<name>/config.json per entry of MODELS)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from vllm_operator import catalog

ROOT = Path(__file__).resolve().parents[2]

#: name -> (source, family or None). source: "catalog:<Hub id>" or a config.json path under the repository.
MODELS: dict[str, tuple[str, str | None]] = {
    "qwen2.5-0.5b": ("catalog:Qwen/Qwen2.5-0.5B-Instruct", "qwen2"),
    "qwen2.5-3b": ("catalog:Qwen/Qwen2.5-3B-Instruct", "qwen2"),
    "qwen2.5-7b": ("tests/data/configs/Qwen2.5-7B-Instruct.config.json", None),
    "qwen2.5-14b": ("catalog:Qwen/Qwen2.5-14B-Instruct", "qwen2"),
    "qwen2.5-32b": ("catalog:Qwen/Qwen2.5-32B-Instruct", "qwen2"),
    "qwen2.5-72b": ("catalog:Qwen/Qwen2.5-72B-Instruct", "qwen2"),
    "qwen3-0.6b": ("catalog:Qwen/Qwen3-0.6B", "qwen3"),
    "qwen3-8b": ("catalog:Qwen/Qwen3-8B", "qwen3"),
    "qwen3-32b": ("catalog:Qwen/Qwen3-32B", "qwen3"),
    "llama-3.2-1b": ("catalog:meta-llama/Llama-3.2-1B-Instruct", "llama"),
    "llama-3.2-3b": ("catalog:meta-llama/Llama-3.2-3B-Instruct", "llama"),
    "llama-3.1-8b": ("catalog:meta-llama/Llama-3.1-8B-Instruct", "llama"),
    "llama-3.1-70b": ("catalog:meta-llama/Llama-3.1-70B-Instruct", "llama"),
    "mistral-7b-v0.3": ("catalog:mistralai/Mistral-7B-Instruct-v0.3", "mistral"),
    "mistral-small-24b": ("catalog:mistralai/Mistral-Small-24B-Instruct-2501", "mistral"),
    "mistral-7b-v0.1": ("bench/gpu/configs/Mistral-7B-v0.1.config.json", None),
    "mixtral-8x7b": ("catalog:mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral"),
    "qwen3-30b-a3b": ("bench/gpu/configs/Qwen3-30B-A3B.config.json", None),
    "gpt-oss-20b": ("tests/data/configs/gpt-oss-20b.config.json", None),
    "gemma-2-9b": ("catalog:google/gemma-2-9b-it", "gemma2"),
    "gemma-2-27b": ("catalog:google/gemma-2-27b-it", "gemma2"),
    "gemma-3-1b": ("catalog:google/gemma-3-1b-it", "gemma3_text"),
    "qwen2.5-7b-awq": ("tests/data/configs/Qwen2.5-7B-Instruct-AWQ.config.json", None),
    "qwen2.5-32b-awq": ("bench/gpu/configs/Qwen2.5-32B-Instruct-AWQ.config.json", None),
    "llama-3.1-8b-fp8-ct": ("bench/gpu/configs/Llama-3.1-8B-Instruct-FP8.config.json", None),
    "qwen2.5-7b-gptq": ("bench/gpu/configs/Qwen2.5-7B-Instruct-GPTQ-Int4.config.json", None),
    "qwen2.5-vl-7b": ("tests/data/configs/Qwen2.5-VL-7B-Instruct.config.json", None),
    "gte-qwen2-7b": ("bench/gpu/configs/gte-Qwen2-7B-instruct.config.json", None),
    # Llama 4 Scout's text model cut to 16 of its 48 layers (one H200 holds 69 GiB of it): the layer and the
    # chunked attention are Scout's own (bench/gpu/README.md)
    "llama-4-scout-16l": ("bench/gpu/configs/Llama-4-Scout-16L-text.config.json", None),
}

LLAMA3_ROPE = {"high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192,
               "rope_type": "llama3"}


def from_catalog(hub_id: str, family: str) -> dict[str, Any]:
    a = catalog.lookup_model(hub_id)
    assert a is not None, hub_id
    base: dict[str, Any] = {
        "hidden_size": a.hidden_size, "intermediate_size": a.intermediate_size, "num_hidden_layers": a.num_layers,
        "num_attention_heads": a.num_attention_heads, "num_key_value_heads": a.num_kv_heads, "head_dim": a.head_dim,
        "vocab_size": a.vocab_size, "max_position_embeddings": a.max_position_embeddings,
        "tie_word_embeddings": bool(a.tie_word_embeddings), "torch_dtype": a.torch_dtype or "bfloat16",
        "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "rms_norm_eps": 1e-5,
    }
    if family == "llama":
        rope = ({**LLAMA3_ROPE, "factor": 32.0 if "3.2" in hub_id else 8.0} if a.max_position_embeddings > 8192
                else None)
        return {**base, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "rope_theta": 500000.0,
                "rope_scaling": rope, "attention_bias": False, "mlp_bias": False}
    if family == "qwen2":
        return {**base, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "rope_theta": 1000000.0,
                "rms_norm_eps": 1e-6, "use_sliding_window": False, "sliding_window": 131072,
                "max_window_layers": a.num_layers}
    if family == "qwen3":
        return {**base, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "rope_theta": 1000000.0,
                "rms_norm_eps": 1e-6, "attention_bias": False, "use_sliding_window": False, "sliding_window": None,
                "max_window_layers": a.num_layers}
    if family == "mistral":
        return {**base, "architectures": ["MistralForCausalLM"], "model_type": "mistral",
                "rope_theta": 100000000.0 if "Small" in hub_id else 1000000.0, "sliding_window": None}
    if family == "mixtral":
        return {**base, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "rope_theta": 1000000.0,
                "num_local_experts": a.num_experts, "num_experts_per_tok": 2, "sliding_window": None,
                "router_aux_loss_coef": 0.02}
    if family == "gemma2":
        return {**base, "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "rope_theta": 10000.0,
                "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh", "hidden_act": "gelu_pytorch_tanh",
                "query_pre_attn_scalar": 144 if a.head_dim == 128 else 256, "sliding_window": a.sliding_window,
                "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "attention_bias": False,
                "pad_token_id": 0}
    if family == "gemma3_text":
        return {**base, "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "rope_theta": 1000000.0,
                "rope_local_base_freq": 10000.0, "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh",
                "query_pre_attn_scalar": 256, "sliding_window": a.sliding_window, "sliding_window_pattern": 6,
                "rope_scaling": None, "attn_logit_softcapping": None, "final_logit_softcapping": None,
                "attention_bias": False, "pad_token_id": 0}
    raise ValueError(family)


def config_for(name: str) -> dict[str, Any]:
    source, family = MODELS[name]
    if source.startswith("catalog:"):
        assert family is not None
        return from_catalog(source.removeprefix("catalog:"), family)
    return json.loads((ROOT / source).read_text())


def main(out: str) -> int:
    for name in MODELS:
        folder = Path(out) / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config_for(name), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
