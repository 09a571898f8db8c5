"""The KV evidence's multimodal and pooling cases against vLLM's own code (the vLLM CPU venv)."""

from __future__ import annotations


import pytest

from vllm_operator import api, planner
from tests.unit.test_kv_evidence import QWEN25_VL, qwen25_vl_arch, vl_plan, embed_plan

MAE_LIMIT, OVERESTIMATE_LIMIT = 0.03, 0.05


@pytest.mark.vllm
def test_profiled_items_are_vllms_own_count():
    """vLLM 0.32's own code (e2e/testbed/vllm_mm_items.py says what it stands in for): per max_model_len,
    Qwen2_5_VLProcessingInfo.get_mm_max_tokens_per_item on the config with the preprocessor's published pixel
    limits gives the image and video sizes the planner's vision_item profiles the larger of; per batch,
    compute_mm_encoder_budget and MultiModalBudget._get_max_items give the items vision_profile_bytes counts (its
    count is vLLM's wherever max_num_seqs x items per prompt does not bind, and never below it)."""
    from e2e.testbed import vllm_env

    lengths = [4096, 16384, 32767, 40000, 98304, 128000, 262144]
    batches = [{"tokens": t, "batched": b, "seqs": s, "max_model_len": n}
               for t, b, s, n in [(16384, 16384, 1024, 128000), (16384, 2048, 256, 32768), (114688, 8192, 1024, 128000),
                                  (256, 8192, 1024, 131072), (256, 2048, 256, 131072), (256, 1000, 256, 8192),
                                  (256, 8192, 4, 512)]]
    out = vllm_env.mm_max_tokens_per_item(QWEN25_VL, lengths, min_pixels=3136, max_pixels=12845056, batches=batches)
    arch, terms = qwen25_vl_arch(), planner.profile_terms("0.32.0")
    for length, item in zip(lengths, out["items"]):
        assert planner.vision_item(arch, length, terms)[0] == max(item.values()), (length, item)
        assert planner.vision_item(arch, length, terms, {"video": 0})[0] == item["image"]
    for batch, vllm_count in zip(batches, out["batches"]):
        tokens = batch["tokens"]
        probe = api.ModelArchitecture(vision_tokens_per_item=tokens, vision_patches_per_item=tokens,
                                      vision_hidden_size=1, vision_intermediate_size=1, hidden_size=1)
        ours = planner.vision_profile_bytes(probe, 1, batch["batched"], 1)[1] // tokens  # embeddings / item size
        binds = batch["seqs"] * max(1, batch["max_model_len"] // tokens) < max(batch["batched"], tokens) // tokens
        assert ours >= vllm_count["items"] and (binds or ours == vllm_count["items"]), (batch, vllm_count, ours)


@pytest.mark.vllm
def test_pooling_and_multimodal_args_pass_vllms_parser():
    """--runner pooling (no prefix-caching flag, the raised batch) and a multimodal plan with --limit-mm-per-prompt
    in extraArgs are accepted by vLLM 0.32's own `vllm serve` parser and engine-args checks."""
    from e2e.testbed import vllm_env

    pooled = embed_plan(True)
    images = vl_plan(qwen25_vl_arch(), "NVIDIA-H100-80GB-HBM3", extraArgs=["--limit-mm-per-prompt", '{"video": 0}'])
    assert pooled.fits and images.fits
    results = vllm_env.check_args([pooled.args, images.args])
    assert all(r["ok"] for r in results), results
