"""The catalog: built-in model/GPU data, config.json reading, and resolution precedence."""

from __future__ import annotations

import re
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from importlib import resources

from e2e.testbed.hub_http import HubServer
from vllm_operator import api
from vllm_operator.api import ModelSpec
from vllm_operator.catalog import (
    GPUInfo,
    gpu_families,
    match_gpu,
    mig_profiles,
    near_gpu_names,
    ResolvedModel,
    UnknownModelError,
    architecture_from_config,
    estimate_parameter_count,
    known_gpus,
    known_models,
    lookup_gpu,
    lookup_model,
)
from vllm_operator.sources.model_facts import fetch_config, hf_config_url, read_config_file, resolve_model

REQUIRED = (
    "num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "hidden_size",
    "intermediate_size", "vocab_size", "max_position_embeddings", "parameter_count",
)
#: Models whose parameter count legitimately exceeds the text-only shape estimate.
MULTIMODAL = {
    "google/gemma-3-4b-it": "SigLIP vision tower (~417M) + projector counted in the checkpoint",
    "google/gemma-3-12b-it": "SigLIP vision tower (~417M) + projector counted in the checkpoint",
    "google/gemma-3-27b-it": "SigLIP vision tower (~417M) + projector counted in the checkpoint",
    "mistralai/Mistral-Small-3.1-24B-Instruct-2503": "Pixtral vision tower (~403M) + projector counted in the checkpoint",
    "mistralai/Mistral-Small-3.2-24B-Instruct-2506": "Pixtral vision tower (~403M) + projector counted in the checkpoint",
}
#: Models whose shapes the gated-MLP estimate does not describe, with why; their counts are recounted exactly from
#: their own shapes (test_deepseek_v3_count_is_its_shapes) and held within SHAPES_LIMIT of the estimate.
SHAPES_LEAVE_OUT = {
    "deepseek-ai/DeepSeek-V3": ("MLA's low-rank projections, 3 dense layers and a shared expert", 0.05),
    "deepseek-ai/DeepSeek-R1": ("MLA's low-rank projections, 3 dense layers and a shared expert", 0.05),
    # recounted in test_llama4_counts_are_their_shapes
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": ("a shared expert a layer and the vision tower", 0.07),
    "meta-llama/Llama-4-Maverick-17B-128E-Instruct": ("experts on every other layer only, dense layers of 16384, a "
                                                      "shared expert and the vision tower", 0.49),
}
RAW_MODELS = yaml.safe_load(resources.files("vllm_operator.catalog").joinpath("models.yaml").read_text())["models"]
RAW_GPUS = yaml.safe_load(resources.files("vllm_operator.catalog").joinpath("gpus.yaml").read_text())["gpus"]
RAW_GPU = {entry["product"]: entry for entry in RAW_GPUS}


# --------------------------------------------------------------------------- data
def test_catalog_sizes():
    assert len(known_models()) >= 30
    assert len(known_gpus()) >= 35


#: Today's data-center and workstation GPUs, by the name their CUDA device reports (GFD's label is this
#: with spaces as dashes).
EXPECTED_GPUS = [
    "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200", "NVIDIA H200 NVL",
    "NVIDIA B200", "NVIDIA GB200", "NVIDIA H20", "NVIDIA GH200 480GB", "NVIDIA L40", "NVIDIA L40S", "NVIDIA L4",
    "NVIDIA A10", "NVIDIA A10G", "NVIDIA A30", "NVIDIA A40", "NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB",
    "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB",
    "Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB", "Tesla T4", "NVIDIA RTX 6000 Ada Generation",
    "NVIDIA RTX A6000", "NVIDIA RTX A2000", "NVIDIA RTX A2000 12GB",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
]


@pytest.mark.parametrize("device_name", EXPECTED_GPUS)
def test_catalog_covers_todays_gpus_by_their_gfd_label(device_name):
    label = device_name.replace(" ", "-")  # what GPU feature discovery puts in nvidia.com/gpu.product
    gpu = lookup_gpu(label)
    assert gpu is not None and gpu.product == label


@pytest.mark.parametrize("model_id", sorted(RAW_MODELS))
def test_every_model_is_complete_and_consistent(model_id):
    arch = lookup_model(model_id)
    assert arch is not None
    for field in REQUIRED:
        value = getattr(arch, field)
        assert isinstance(value, int) and value > 0, f"{model_id}: {field}={value!r}"
    assert arch.num_attention_heads % arch.num_kv_heads == 0
    assert arch.tie_word_embeddings is not None
    assert arch.torch_dtype in ("bfloat16", "float16", "float32")
    assert RAW_MODELS[model_id]["source"].startswith("https://huggingface.co/")
    estimate = estimate_parameter_count(**{
        k: getattr(arch, k) for k in (
            "num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "hidden_size",
            "intermediate_size", "vocab_size", "num_experts", "tie_word_embeddings",
        )
    })
    error = abs(arch.parameter_count - estimate) / estimate
    if model_id in SHAPES_LEAVE_OUT:
        why, limit = SHAPES_LEAVE_OUT[model_id]
        assert error <= limit, f"{model_id}: {why} ({error:.2%})"
        return
    assert error <= 0.15, f"{model_id}: {arch.parameter_count:,} vs shape estimate {estimate:,} ({error:.1%})"
    if model_id not in MULTIMODAL:
        assert error <= 0.01, f"{model_id}: dense text model should match its shapes within 1% ({error:.2%})"


def test_known_exact_parameter_counts():
    assert lookup_model("meta-llama/Llama-3.1-8B-Instruct").parameter_count == 8_030_261_248
    assert lookup_model("google/gemma-3-4b-it").parameter_count == 4_300_079_472
    assert lookup_model("Qwen/Qwen2.5-7B-Instruct").parameter_count == 7_615_616_512


@pytest.mark.parametrize(("model_id", "config"), [
    ("Qwen/Qwen3-30B-A3B", Path(__file__).parents[1] / "data" / "hub" / "Qwen" / "Qwen3-30B-A3B" / "config.json"),
    ("Qwen/Qwen3-235B-A22B", Path(__file__).parents[1] / "data" / "configs" / "Qwen3-235B-A22B-FP8.config.json"),
])
def test_qwen3_moe_entries_are_their_stored_configs_and_exact_counts(model_id, config):
    """Issue 20 item 6: the Qwen3 MoE entries hold the shapes of their stored config.json (the FP8 checkpoint's for
    235B-A22B: the same shapes), and the exact count is the shapes' plus the routers and the q/k norms, which the
    Hub's safetensors metadata gives for 30B-A3B (tests/data/hub/safetensors.json)."""
    entry = lookup_model(model_id)
    stored = architecture_from_config(json.loads(config.read_text()))
    shapes = ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "hidden_size", "intermediate_size",
              "vocab_size", "max_position_embeddings", "num_experts", "tie_word_embeddings")
    assert {k: getattr(entry, k) for k in shapes} == {k: getattr(stored, k) for k in shapes}
    routers, qk_norms = entry.num_layers * entry.num_experts * entry.hidden_size, entry.num_layers * 2 * entry.head_dim
    estimate = estimate_parameter_count(**{k: getattr(entry, k) for k in shapes if k != "max_position_embeddings"})
    assert entry.parameter_count == estimate + routers + qk_norms
    hub_counts = json.loads((Path(__file__).parents[1] / "data" / "hub" / "safetensors.json").read_text())
    if model_id in hub_counts:
        assert entry.parameter_count == hub_counts[model_id]["total"]


@pytest.mark.parametrize(("model_id", "row"), [("openai/gpt-oss-20b", "llmd-gpt-oss-20b-h100"),
                                              ("openai/gpt-oss-120b", "llmd-gpt-oss-120b-h100")])
def test_gpt_oss_entries_size_mxfp4_weights_as_vllm_logged_them(model_id, row):
    """Issue 20 item 6: gpt-oss stores its experts in MXFP4 and the rest in 16-bit; sized so, its weights are what
    vLLM logged on an H100 (llm-d's table in tests/data/kv_capacity_evidence.yaml) within 1%, where 16-bit sizing
    would have said 39 and 218 GiB. The entry's shapes are its stored config.json's."""
    from vllm_operator.planner.memory import weight_bytes

    entry = lookup_model(model_id)
    stored = architecture_from_config(json.loads((Path(__file__).parents[1] / "data" / "configs" /
                                                  f"{model_id.split('/')[1]}.config.json").read_text()))
    assert entry.model_copy(update={"parameter_count": None}) == stored
    evidence = yaml.safe_load((Path(__file__).parents[1] / "data" / "kv_capacity_evidence.yaml").read_text())
    [logged] = [r["logged"]["weights_gib"] for r in evidence["rows"] if r["id"] == row]
    assert weight_bytes(entry, entry.quantization, 2) / 2**30 == pytest.approx(logged, rel=0.01)


@pytest.mark.parametrize("model_id", ["deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-R1"])
def test_deepseek_v3_count_is_its_shapes(model_id):
    """Issue 20 item 6: DeepSeek-V3 and -R1 (one architecture), counted tensor by tensor from config.json: MLA
    (q_lora_rank 1536, kv_lora_rank 512, qk_nope 128 + qk_rope 64, v_head_dim 128), 3 dense layers of 18432, 58 MoE
    layers of 256 routed + 1 shared experts of 2048 with a router and its correction bias, two norms a layer."""
    arch = lookup_model(model_id)
    h, heads, layers, dense, q_rank, kv_rank, nope, rope, v_dim = 7168, 128, 61, 3, 1536, 512, 128, 64, 128
    mla = (h * q_rank + q_rank + q_rank * heads * (nope + rope) + h * (kv_rank + rope) + kv_rank
           + kv_rank * heads * (nope + v_dim) + heads * v_dim * h)
    moe = (arch.num_experts + 1) * 3 * h * arch.intermediate_size + arch.num_experts * h + arch.num_experts
    count = (2 * arch.vocab_size * h + layers * (mla + 2 * h) + dense * 3 * h * 18432 + (layers - dense) * moe + h)
    assert (arch.hidden_size, arch.num_attention_heads, arch.num_layers) == (h, heads, layers)
    assert arch.parameter_count == count == 671_026_419_200
    assert (arch.kv_lora_rank, arch.qk_rope_head_dim, arch.quantization) == (kv_rank, rope, "fp8")


#: Mistral Small 3.1's config.json (https://huggingface.co/mistralai/Mistral-Small-3.1-24B-Instruct-2503), the fields
#: the planner reads; 3.2 (2506) has the same.
MISTRAL3_CONFIG = {
    "architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3", "spatial_merge_size": 2,
    "torch_dtype": "bfloat16",
    "text_config": {"head_dim": 128, "hidden_size": 5120, "intermediate_size": 32768, "max_position_embeddings": 131072,
                    "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 40,
                    "num_key_value_heads": 8, "sliding_window": None, "vocab_size": 131072},
    "vision_config": {"head_dim": 64, "hidden_size": 1024, "image_size": 1540, "intermediate_size": 4096,
                      "model_type": "pixtral", "num_attention_heads": 16, "num_hidden_layers": 24, "patch_size": 14},
}


@pytest.mark.parametrize("model_id", ["mistralai/Mistral-Small-3.1-24B-Instruct-2503",
                                      "mistralai/Mistral-Small-3.2-24B-Instruct-2506"])
def test_mistral_small_3_entries_are_their_config_with_the_pixtral_tower(model_id):
    """Issue 20 item 6: the entries are what their config.json gives, the vision tower's profiling shapes included
    (the largest image vLLM profiles: 1540 x 1540, 110 x 110 patches, 55 rows of 55 merged embeddings and a break)."""
    entry = lookup_model(model_id)
    from_config = architecture_from_config(MISTRAL3_CONFIG)
    assert entry.model_copy(update={"parameter_count": None, "tie_word_embeddings": None, "quantization": "none"}) \
        == from_config  # the catalog leaves a 16-bit checkpoint's quantization unsaid, as its other entries
    assert (entry.vision_tokens_per_item, entry.vision_patches_per_item) == ((55 + 1) * 55, 110 * 110)


#: Llama 4 Scout's config.json (https://huggingface.co/meta-llama/Llama-4-Scout-17B-16E-Instruct), the fields the
#: planner reads, as public copies in other projects' tests give them (models.yaml confirmed_via); Maverick's has
#: 128 local experts, interleave_moe_layer_step 2 and 1048576 positions.
LLAMA4_SCOUT_CONFIG = {
    "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "text_config": {"model_type": "llama4_text", "attention_chunk_size": 8192, "head_dim": 128, "hidden_size": 5120,
                    "intermediate_size": 8192, "intermediate_size_mlp": 16384, "interleave_moe_layer_step": 1,
                    "max_position_embeddings": 10485760, "num_attention_heads": 40, "num_experts_per_tok": 1,
                    "num_hidden_layers": 48, "num_key_value_heads": 8, "num_local_experts": 16,
                    "no_rope_layers": [1, 1, 1, 0] * 12, "use_qk_norm": True, "vocab_size": 202048},
    "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 1408, "image_size": 336,
                      "intermediate_size": 5632, "num_attention_heads": 16, "num_hidden_layers": 34, "patch_size": 14,
                      "pixel_shuffle_ratio": 0.5, "projector_input_dim": 4096, "projector_output_dim": 4096,
                      "vision_output_dim": 4096},
}
LLAMA4_MAVERICK_CONFIG = {**LLAMA4_SCOUT_CONFIG, "text_config": {
    **LLAMA4_SCOUT_CONFIG["text_config"], "num_local_experts": 128, "interleave_moe_layer_step": 2,
    "max_position_embeddings": 1048576}}


def _llama4_count(config: dict) -> int:
    """Llama 4's parameters tensor by tensor, as vLLM's mllama4.py / llama4.py build them: untied embeddings; per
    layer q/k/v/o (no biases; the q/k norm is an L2 norm without weights) and two RMSNorms; a MoE layer (every
    interleave_moe_layer_step-th) has the routed experts, one shared expert and a router, the others a dense MLP of
    intermediate_size_mlp. The vision tower: an unfolded patch embedding, a class token, positions for the patches
    and it, two LayerNorms around 34 encoder layers (q/k/v/o and fc1/fc2 with biases, two LayerNorms), the
    pixel-shuffle adapter's two bias-free linears (1408 x 4 -> 4096 -> 4096) and the projector (4096 -> 5120)."""
    t, v = config["text_config"], config["vision_config"]
    h, layers, experts, step = t["hidden_size"], t["num_hidden_layers"], t["num_local_experts"], t["interleave_moe_layer_step"]
    attn = h * t["num_attention_heads"] * t["head_dim"] * 2 + h * t["num_key_value_heads"] * t["head_dim"] * 2
    moe = (experts + 1) * 3 * h * t["intermediate_size"] + h * experts
    dense = 3 * h * t["intermediate_size_mlp"]
    moe_layers = sum(1 for i in range(layers) if (i + 1) % step == 0)
    text = (2 * t["vocab_size"] * h + h + layers * (attn + 2 * h) + moe_layers * moe
            + (layers - moe_layers) * dense)
    w, inner, side = v["hidden_size"], v["intermediate_size"], v["image_size"] // v["patch_size"]
    shuffled = w * round(1 / v["pixel_shuffle_ratio"] ** 2)
    encoder_layer = 4 * (w * w + w) + (w * inner + inner) + (inner * w + w) + 2 * 2 * w
    vision = (3 * v["patch_size"] ** 2 * w + w + (side * side + 1) * w + 2 * 2 * w + v["num_hidden_layers"] * encoder_layer
              + shuffled * v["projector_input_dim"] + v["projector_input_dim"] * v["projector_output_dim"]
              + v["vision_output_dim"] * h)
    return text + vision


@pytest.mark.parametrize(("model_id", "config", "published"), [
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", LLAMA4_SCOUT_CONFIG, 108_641_793_536),
    ("meta-llama/Llama-4-Maverick-17B-128E-Instruct", LLAMA4_MAVERICK_CONFIG, 401_583_781_376),
])
def test_llama4_counts_are_their_shapes(model_id, config, published):
    """Issue 20 item 6: Llama 4's entries are their config.json (the vision tower's profiling shapes included: 17
    tiles of the 16:1 image vLLM profiles, 144 embeddings each after the pixel shuffle), and the count is the
    shapes' tensor by tensor, which is the published total of each checkpoint (models.yaml confirmed_via)."""
    entry = lookup_model(model_id)
    assert entry.model_copy(update={"parameter_count": None, "quantization": "none"}) \
        == architecture_from_config(config)
    assert (entry.vision_tokens_per_item, entry.vision_patches_per_item) == (17 * 144, 17 * (24 * 24 + 1))
    assert entry.parameter_count == _llama4_count(config) == published


def test_the_docs_count_the_catalog():
    """docs/how-it-works.md says how many models and GPUs the catalog holds: the numbers are the catalog's."""
    text = (Path(__file__).parents[2] / "docs" / "how-it-works.md").read_text()
    models = re.search(r"a catalog of (\d+) widely served models", text)
    gpus = re.search(r"a catalog of (\d+)\s+NVIDIA", text)
    assert models and int(models.group(1)) == len(known_models())
    assert gpus and int(gpus.group(1)) == len(known_gpus())


def test_shapes_that_are_not_hidden_over_heads():
    assert lookup_model("mistralai/Mistral-Small-24B-Instruct-2501").head_dim == 128
    assert lookup_model("Qwen/Qwen3-4B").head_dim == 128
    assert lookup_model("google/gemma-2-9b-it").head_dim == 256
    assert lookup_model("google/gemma-3-4b-it").head_dim == 256
    assert lookup_model("mistralai/Mixtral-8x7B-Instruct-v0.1").num_experts == 8


@pytest.mark.parametrize("gpu", known_gpus(), ids=lambda g: g.product)
def test_every_gpu_has_memory_source_and_capability(gpu: GPUInfo):
    assert gpu.memory_bytes >= 4 * 2**30
    # A vendor document by name, and its address where it has a public one (else device logs stand in).
    document, _, url = gpu.source.partition(", https://")
    assert document[:1].isupper() and (url or RAW_GPU[gpu.product].get("memory_evidence")), gpu.source
    major, minor = (int(x) for x in gpu.compute_capability.split("."))
    assert gpu.supports_fp8 == ((major, minor) >= (8, 9))
    assert gpu.memory_bandwidth_gbps and gpu.memory_bandwidth_gbps > 0
    assert lookup_gpu(gpu.product) is gpu


@pytest.mark.parametrize("entry", RAW_GPUS, ids=lambda e: e["product"])
def test_gpu_memory_is_evidenced_or_flagged(entry):
    # A figure from a real device log says where; anything else is flagged as estimated or explained.
    assert entry.get("memory_evidence") or entry.get("memory_estimated") or entry.get("note")
    if entry.get("nvidia_smi_mib"):
        assert entry["memory_mib"] <= entry["nvidia_smi_mib"]


# --------------------------------------------------------------------------- lookups
@pytest.mark.parametrize("name, expected", [
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
    ("META-LLAMA/llama-3.1-8b-instruct", "meta-llama/Llama-3.1-8B-Instruct"),
    ("meta-llama/Meta-Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
    ("Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
    ("qwen3-8b", "Qwen/Qwen3-8B"),
    ("google/gemma-3-27b-it/", "google/gemma-3-27b-it"),
])
def test_lookup_model_by_id_alias_and_case(name, expected):
    assert lookup_model(name) == lookup_model(expected) is not None


def test_lookup_model_unknown_and_other_org():
    assert lookup_model("acme/never-heard-of-it") is None
    assert lookup_model("someone-else/Llama-3.1-8B-Instruct") is None  # only bare names match by short name


@pytest.mark.parametrize("label, product, gib", [
    ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB", 79.15),
    ("Tesla-T4", "Tesla-T4", 14.73),
    ("NVIDIA-L4", "NVIDIA-L4", 22.49),
    ("nvidia-l4", "NVIDIA-L4", 22.49),
    ("NVIDIA-L4-SHARED", "NVIDIA-L4", 22.49),
    ("NVIDIA-GeForce-RTX-3090", "NVIDIA-GeForce-RTX-3090", 23.56),
    ("NVIDIA GeForce RTX 3090", "NVIDIA-GeForce-RTX-3090", 23.56),
    ("RTX-3090", "NVIDIA-GeForce-RTX-3090", 23.56),
    ("NVIDIA-RTX-A2000-12GB", "NVIDIA-RTX-A2000-12GB", 12.0),
    ("NVIDIA-RTX-A2000", "NVIDIA-RTX-A2000", 6.0),
    ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-80GB-HBM3", 79.18),
    ("NVIDIA-A10G", "NVIDIA-A10G", 22.06),
    ("NVIDIA-A10", "NVIDIA-A10", 22.18),
    ("NVIDIA-L40S", "NVIDIA-L40S", 44.52),
    ("NVIDIA-L40", "NVIDIA-L40", 44.52),  # was the marketed 48 GiB; nvidia-smi shows the L40S's 46068 MiB
    ("NVIDIA-A40", "NVIDIA-A40", 44.35),
    ("Tesla-V100-SXM2-16GB", "Tesla-V100-SXM2-16GB", 15.75),
    ("NVIDIA-H20", "NVIDIA-H20", 95.00),
    ("NVIDIA-RTX-6000-Ada-Generation", "NVIDIA-RTX-6000-Ada-Generation", 47.48),
    ("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", 94.97),
])
def test_lookup_gpu_by_gfd_label(label, product, gib):
    gpu = lookup_gpu(label)
    assert gpu is not None and gpu.product == product
    assert gpu.memory_bytes / 2**30 == pytest.approx(gib, abs=0.01)


def test_lookup_gpu_unknown_family_and_mig():
    assert lookup_gpu("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb") is None  # a slice, not a GPU: see match_gpu
    assert lookup_gpu("H100") is None  # three products: see match_gpu
    assert lookup_gpu("AMD-MI300X") is None
    assert lookup_gpu("") is None


@pytest.mark.parametrize("gpu", known_gpus(), ids=lambda g: g.product)
def test_every_product_is_a_label_value_gfd_can_write(gpu: GPUInfo):
    # GFD writes the NVML name with spaces as dashes, and appends -SHARED on shared GPUs: both must stay
    # valid label values (at most 63 characters), or no node selector could name them.
    assert " " not in gpu.product
    for value in (gpu.product, gpu.product + "-SHARED", *gpu.gke, *([gpu.karpenter] if gpu.karpenter else [])):
        assert len(value) <= 63 and re.fullmatch(api.LABEL_VALUE_PATTERN, value), value
    for profile, memory in gpu.mig:
        assert re.fullmatch(r"[1-8]g\.[0-9]+gb", profile) and 4 * 2**30 <= memory <= gpu.memory_bytes


@pytest.mark.parametrize("name, products, shared", [
    ("L4", ["NVIDIA-L4"], False),
    ("l4", ["NVIDIA-L4"], False),
    ("NVIDIA-L4", ["NVIDIA-L4"], False),
    ("NVIDIA L4", ["NVIDIA-L4"], False),
    ("nvidia-l4-shared", ["NVIDIA-L4"], True),
    ("NVIDIA-A100-SXM4-80GB-SHARED", ["NVIDIA-A100-SXM4-80GB"], True),
    ("A100-80GB", ["NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"], False),
    ("a100 80gb", ["NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"], False),
    ("H100", ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", "NVIDIA-H100-NVL"], False),
    ("h100-sxm", ["NVIDIA-H100-80GB-HBM3"], False),
    ("NVIDIA-H200", ["NVIDIA-H200"], False),  # the exact GFD label is that product ...
    ("H200", ["NVIDIA-H200", "NVIDIA-H200-NVL"], False),  # ... the bare name the family
    ("L40-S", ["NVIDIA-L40S"], False),
    ("nvidia-tesla-a100", ["NVIDIA-A100-SXM4-40GB"], False),  # a GKE accelerator name
    ("rtx-pro-6000", ["NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
                      "NVIDIA-RTX-PRO-6000-Blackwell-Workstation-Edition",
                      "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edition"], False),
])
def test_match_gpu_alias_forms(name, products, shared):
    match = match_gpu(name)
    assert match is not None and [g.product for g in match.products] == products
    assert match.shared is shared and match.mig_profile is None
    assert (match.family is not None) is (len(products) > 1)


def test_match_gpu_reads_gfd_mig_single_strategy_label():
    match = match_gpu("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb")
    assert [g.product for g in match.products] == ["NVIDIA-A100-SXM4-40GB"] and match.mig_profile == "1g.5gb"
    assert match.products[0].mig_memory("1g.5gb") == 4864 * 2**20  # nvidia-smi mig -lgip: 4.75 GiB


def test_karpenter_names_by_convention():
    # Karpenter's a100 is the p4d (40 GB) and the p4de (80 GB): its per-GPU memory label tells them apart.
    match = match_gpu("a100", "Karpenter")
    assert {g.product for g in match.products} == {"NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-SXM4-80GB"}
    assert {g.karpenter_memory_mib for g in match.products} == {40960, 81920}
    assert match_gpu("a10g", "Karpenter").products[0].product == "NVIDIA-A10G"


def test_gke_accelerator_names_are_one_product_each():
    seen: dict[str, str] = {}
    for gpu in known_gpus():
        for value in gpu.gke:
            assert seen.setdefault(value, gpu.product) == gpu.product, value
    assert set(seen) >= {"nvidia-l4", "nvidia-tesla-t4", "nvidia-tesla-a100", "nvidia-a100-80gb", "nvidia-h100-80gb",
                         "nvidia-h200-141gb", "nvidia-b200"}


def test_families_name_two_or_more_products_and_never_an_alias():
    for family, products in gpu_families().items():
        assert len(products) >= 2
        assert match_gpu(family).products == products
        assert all(family.lower() not in [a.lower() for a in g.aliases] for g in products)


def test_mig_profiles_of_a100_and_h100():
    profiles = mig_profiles()
    assert {"1g.5gb", "1g.10gb", "3g.40gb", "7g.80gb"} <= set(profiles)
    assert {g.product for g in profiles["1g.5gb"]} == {"NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"}
    h100 = lookup_gpu("NVIDIA-H100-80GB-HBM3")
    assert h100.mig_memory("3g.40gb") == int(39.50 * 1024) * 2**20
    assert h100.mig_memory("7g.80gb") == h100.memory_bytes  # the table's 79.25 GiB is capped at the whole GPU


@pytest.mark.parametrize("name, first", [
    ("H100x", "H100"),
    ("NVIDIA-H100-SXM5-94GB", "H100"),
    ("NVIDIA-L4O", "NVIDIA-L4"),
    ("A10OG", "NVIDIA-A10G"),
    ("h100-pcie-x", "H100"),
])
def test_near_gpu_names(name, first):
    assert match_gpu(name) is None
    assert near_gpu_names(name)[0] == first


def test_near_gpu_names_leaves_other_vendors_alone():
    assert near_gpu_names("AMD-MI300X-192GB") == []


def test_fp8_support_follows_architecture():
    assert lookup_gpu("NVIDIA-L4").supports_fp8
    assert lookup_gpu("NVIDIA-H100-80GB-HBM3").supports_fp8
    assert not lookup_gpu("NVIDIA-A100-SXM4-80GB").supports_fp8
    assert not lookup_gpu("Tesla-T4").supports_fp8


# --------------------------------------------------------------------------- config.json
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "rope_type": "llama3",
    "original_max_position_embeddings": 8192}, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256,
}
GEMMA_3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "mm_tokens_per_image": 256, "torch_dtype": "bfloat16",
    "text_config": {
        "head_dim": 256, "hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
        "num_attention_heads": 8, "num_hidden_layers": 34, "num_key_value_heads": 4,
        "query_pre_attn_scalar": 256, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16,
                      "num_hidden_layers": 27, "patch_size": 14},
}
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "head_dim": 128, "hidden_size": 4096,
    "intermediate_size": 12288, "max_position_embeddings": 40960, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 151936,
}


def test_architecture_from_llama_config():
    arch = architecture_from_config(LLAMA_31_8B)
    assert (arch.num_layers, arch.num_attention_heads, arch.num_kv_heads, arch.head_dim) == (32, 32, 8, 128)
    assert (arch.hidden_size, arch.intermediate_size, arch.vocab_size) == (4096, 14336, 128256)
    assert arch.max_position_embeddings == 131072
    assert arch.tie_word_embeddings is False and arch.torch_dtype == "bfloat16"
    assert arch.parameter_count is None and arch.num_experts is None


def test_architecture_from_gemma3_text_config():
    arch = architecture_from_config(GEMMA_3_4B)
    assert (arch.num_layers, arch.num_attention_heads, arch.num_kv_heads, arch.head_dim) == (34, 8, 4, 256)
    assert arch.hidden_size == 2560 and arch.intermediate_size == 10240
    assert arch.torch_dtype == "bfloat16"  # from the top level
    # the text_config above omits what the transformers defaults fill; none is invented here
    assert arch.vocab_size is None and arch.max_position_embeddings is None


def test_architecture_from_qwen3_config_keeps_explicit_head_dim():
    arch = architecture_from_config(QWEN3_8B)
    assert arch.head_dim == 128 and arch.hidden_size == 4096 and arch.max_position_embeddings == 40960


def test_architecture_from_config_defaults_and_moe():
    old_style = {"hidden_size": 2048, "num_attention_heads": 16, "num_hidden_layers": 24,
                 "max_position_embeddings": 2048, "dtype": "float16"}
    arch = architecture_from_config(old_style)
    assert arch.num_kv_heads == 16 and arch.head_dim == 128 and arch.torch_dtype == "float16"
    mixtral = {**LLAMA_31_8B, "num_local_experts": 8, "vocab_size": 32000}
    assert architecture_from_config(mixtral).num_experts == 8
    qwen_moe = {**QWEN3_8B, "num_experts": 128, "moe_intermediate_size": 768, "intermediate_size": 6144}
    arch = architecture_from_config(qwen_moe)
    assert arch.num_experts == 128 and arch.intermediate_size == 768
    with pytest.raises(ValueError):
        architecture_from_config(["not", "an", "object"])


def test_hf_config_url():
    assert hf_config_url("org/model", None, "https://huggingface.co") == \
        "https://huggingface.co/org/model/resolve/main/config.json"
    assert hf_config_url("org/model", "v1.0", "http://mirror:8080/") == \
        "http://mirror:8080/org/model/resolve/v1.0/config.json"


# --------------------------------------------------------------------------- resolve
def spec(name: str, **kwargs) -> ModelSpec:
    return ModelSpec.model_validate({"name": name, **kwargs})


def test_resolve_catalog_model():
    resolved = resolve_model(spec("meta-llama/Llama-3.1-8B-Instruct"))
    assert isinstance(resolved, ResolvedModel)
    assert resolved.architecture.parameter_count == 8_030_261_248
    assert resolved.source.startswith("catalog (https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct")
    assert resolved.estimated == ()


def test_resolve_spec_field_wins_over_catalog():
    resolved = resolve_model(spec("meta-llama/Llama-3.1-8B-Instruct",
                                  architecture={"maxPositionEmbeddings": 8192, "numKVHeads": 4}))
    assert resolved.architecture.max_position_embeddings == 8192
    assert resolved.architecture.num_kv_heads == 4
    assert resolved.architecture.num_layers == 32  # untouched fields still come from the catalog
    assert resolved.source.startswith("spec over catalog (")


def test_resolve_config_url_wins_over_catalog():
    seen = []

    def fake_fetch(url):
        seen.append(url)
        return {**LLAMA_31_8B, "max_position_embeddings": 65536}

    resolved = resolve_model(spec("meta-llama/Llama-3.1-8B-Instruct", configURL="https://example.test/config.json"),
                             fetch=fake_fetch)
    assert seen == ["https://example.test/config.json"]
    assert resolved.architecture.max_position_embeddings == 65536
    assert resolved.architecture.parameter_count == 8_030_261_248  # not in config.json: catalog's stays
    assert resolved.source == "config.json (https://example.test/config.json) over catalog (" \
        "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/blob/main/config.json)"


def test_resolve_config_url_failure_is_an_error():
    def failing(url):
        raise ValueError(f"could not fetch config.json from {url}: HTTP 404 Not Found")

    with pytest.raises(ValueError, match="HTTP 404"):
        resolve_model(spec("acme/x", configURL="https://example.test/x.json"), fetch=failing)


def test_an_unreadable_config_is_reported_under_the_field_that_named_it(tmp_path: Path):
    from vllm_operator import api, pipeline

    def failing(url):
        raise ValueError(f"could not fetch config.json from {url}: HTTP 404 Not Found")

    doc = yaml.safe_load((Path(__file__).parents[2] / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["spec"]["model"] = {"name": "acme/x", "configURL": "https://example.test/x.json"}
    plan = pipeline.plan_server("x", "ns", api.VLLMServerSpec.model_validate(doc["spec"]), fetch=failing)
    assert [(p.field, "HTTP 404" in p.message) for p in plan.problems] == [("spec.model.configURL", True)]
    doc["spec"]["model"] = {"name": "acme/x"}  # --model-config names a directory without config.json
    plan = pipeline.plan_server("x", "ns", api.VLLMServerSpec.model_validate(doc["spec"]), local_config=str(tmp_path))
    assert [p.field for p in plan.problems] == ["--model-config"], plan.problems
    doc["spec"]["model"] = {"name": "acme/x"}  # unknown, nothing fetched: the architecture is what to set
    plan = pipeline.plan_server("x", "ns", api.VLLMServerSpec.model_validate(doc["spec"]))
    assert [p.field for p in plan.problems] == ["spec.model.architecture"], plan.problems


def test_resolve_local_directory(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_8B))
    resolved = resolve_model(spec("acme/local"), local_config=str(tmp_path))
    assert resolved.architecture.head_dim == 128
    assert resolved.source == f"config.json ({tmp_path})"
    assert resolved.estimated == ("parameter_count",)
    assert resolved.architecture.parameter_count == pytest.approx(8_190_735_360, rel=0.001)


def test_a_model_name_that_is_a_local_directory_is_not_read(tmp_path: Path):
    """Issue 20 item 3: the operator cannot read a directory of its own machine, so neither does `plan`: the facts of
    a local config.json come through --model-config, never through the spec."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_8B))
    with pytest.raises(UnknownModelError):
        resolve_model(spec(str(tmp_path)))


def test_resolve_spec_only_fills_and_reports_estimates():
    resolved = resolve_model(spec("acme/custom-7b", architecture={
        "numLayers": 32, "numAttentionHeads": 32, "hiddenSize": 4096, "intermediateSize": 11008,
        "vocabSize": 32000, "maxPositionEmbeddings": 4096,
    }))
    arch = resolved.architecture
    assert resolved.source == "spec"
    assert arch.num_kv_heads == 32 and arch.head_dim == 128 and arch.torch_dtype == "bfloat16"
    assert set(resolved.estimated) == {"num_kv_heads", "head_dim", "parameter_count", "torch_dtype"}
    assert arch.parameter_count == pytest.approx(6_738_415_616, rel=0.001)  # Llama-2-7B's published count


def test_resolve_back_solves_intermediate_from_parameter_count():
    resolved = resolve_model(spec("acme/custom", architecture={
        "numLayers": 32, "numAttentionHeads": 32, "numKVHeads": 8, "hiddenSize": 4096,
        "vocabSize": 128256, "maxPositionEmbeddings": 8192, "parameterCount": 8_030_261_248,
    }))
    assert resolved.architecture.intermediate_size == 14336
    assert "intermediate_size" in resolved.estimated


def test_unknown_model_names_missing_camel_case_fields():
    with pytest.raises(UnknownModelError) as info:
        resolve_model(spec("acme/mystery-13b"))
    message = str(info.value)
    assert "acme/mystery-13b" in message
    for name in ("numLayers", "numAttentionHeads", "hiddenSize", "maxPositionEmbeddings",
                 "parameterCount", "numKVHeads", "spec.model.architecture", "spec.model.configURL"):
        assert name in message
    assert isinstance(info.value, ValueError)


def test_unknown_model_partial_spec_lists_only_what_is_missing():
    with pytest.raises(UnknownModelError) as info:
        resolve_model(spec("acme/partial", architecture={"numLayers": 40, "numAttentionHeads": 40,
                                                         "numKVHeads": 8, "hiddenSize": 5120}))
    assert info.value.missing[0] == "maxPositionEmbeddings"
    assert "numLayers" not in str(info.value)


# --------------------------------------------------------------------------- real HTTP
@pytest.fixture
def hub(tmp_path: Path):
    """The local Hub stand-in (e2e/hub_http.py), which the real huggingface_hub client reads: acme/tiny-llama has a
    config.json, acme/broken one that is not JSON."""
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps({**LLAMA_31_8B, "num_hidden_layers": 2}))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{ not json")
    with HubServer({"acme/tiny-llama": tmp_path / "tiny", "acme/broken": tmp_path / "broken"}) as server:
        yield server.base


def test_resolve_through_hf_endpoint(hub):
    resolved = resolve_model(spec("acme/tiny-llama"), hf_endpoint=hub)
    assert resolved.architecture.num_layers == 2
    assert resolved.architecture.num_kv_heads == 8
    assert resolved.source == f"Hub ({hub}/acme/tiny-llama: config.json, safetensors metadata)"
    assert resolved.estimated == ("parameter_count",)  # this repo has no safetensors metadata


def test_hf_endpoint_not_used_for_catalog_models(hub):
    resolved = resolve_model(spec("meta-llama/Llama-3.1-8B-Instruct"), hf_endpoint=hub)
    assert resolved.source.startswith("catalog (")


def test_fetch_404_names_the_url(hub):
    url = f"{hub}/acme/missing/resolve/main/config.json"
    with pytest.raises(ValueError, match="404") as info:
        fetch_config(url)
    assert url in str(info.value)


def test_fetch_invalid_json_names_the_url(hub):
    url = f"{hub}/acme/broken/resolve/main/config.json"
    with pytest.raises(ValueError) as info:
        fetch_config(url)
    assert str(info.value) == f"config.json at {url}: not JSON"


def test_fetch_unreachable_endpoint_is_a_clear_error():
    with pytest.raises(ValueError, match="could not fetch config.json from http://127.0.0.1:9/"):
        fetch_config("http://127.0.0.1:9/config.json", timeout=2)


def test_hf_endpoint_failure_becomes_unknown_model_error(hub):
    with pytest.raises(UnknownModelError) as info:
        resolve_model(spec("acme/missing"), hf_endpoint=hub)
    assert "no such model on the Hub" in str(info.value) and "numLayers" in str(info.value)


def test_hf_endpoint_failure_is_harmless_when_spec_is_complete(hub):
    resolved = resolve_model(spec("acme/missing", architecture={
        "numLayers": 2, "numAttentionHeads": 4, "hiddenSize": 256, "intermediateSize": 512,
        "vocabSize": 1000, "maxPositionEmbeddings": 512,
    }), hf_endpoint=hub)
    assert resolved.source == "spec"


def test_read_local_file_and_directory(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_8B))
    assert read_config_file(str(tmp_path)) == QWEN3_8B
    assert read_config_file(f"file://{tmp_path / 'config.json'}") == QWEN3_8B
    with pytest.raises(ValueError, match="could not read"):
        read_config_file(str(tmp_path / "nope.json"))


def test_the_operator_never_reads_its_own_files(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_8B))
    for location in (str(tmp_path), str(tmp_path / "config.json"), f"file://{tmp_path / 'config.json'}"):
        with pytest.raises(ValueError) as info:
            fetch_config(location)
        assert str(info.value) == f"could not fetch config.json from {location}: not an http(s) URL"
    with pytest.raises(UnknownModelError):  # a name that is a directory here is just an unknown model's name
        resolve_model(spec(str(tmp_path)))


def test_no_network_at_import():
    # In a fresh interpreter, so the module objects other tests hold stay the same.
    code = (
        "import socket\n"
        "def forbidden(*a, **k):\n"
        "    raise SystemExit('network access at import')\n"
        "socket.socket.connect = forbidden\n"
        "socket.create_connection = forbidden\n"
        "import vllm_operator.catalog as c\n"
        "assert c.known_models() and c.known_gpus()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr + result.stdout
