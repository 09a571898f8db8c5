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
@pytest.mark.parametrize("no_rope_layers", [[], [1, 1, 1, 0] * 12])
def test_llama4_item_and_chunked_layers_are_vllms_own(no_rope_layers):
    """vLLM 0.32's own code (e2e/testbed/vllm_llama4.py says what it stands in for) on Llama 4 Scout's config: the
    image it profiles is 17 tiles of 144 embeddings, the catalog's vision item; the chunked layers are the catalog's
    36 and what the config reader counts (also when no_rope_layers is left empty, as transformers then fills it); and a
    chunked layer's blocks per request (ChunkedLocalAttentionSpec) are the planner's window blocks or one fewer,
    never more: the plan keeps at least what vLLM keeps."""
    from e2e.testbed import vllm_env
    from tests.unit.test_catalog import LLAMA4_SCOUT_CONFIG
    from vllm_operator import catalog

    config = {**LLAMA4_SCOUT_CONFIG, "text_config": {**LLAMA4_SCOUT_CONFIG["text_config"],
                                                     "no_rope_layers": no_rope_layers}}
    lengths, in_flight = [1024, 8192, 24576, 24577, 131072, 10485760], 2 * 8192
    out = vllm_env.llama4_facts(config, lengths, in_flight=in_flight)
    entry = catalog.lookup_model("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    assert (out["max_patches"], out["tiles"], out["embeddings_per_tile"]) == (16, 17, 144)
    assert out["tiles"] * out["embeddings_per_tile"] == entry.vision_tokens_per_item
    assert out["chunked_layers"] == entry.sliding_window_layers == catalog.architecture_from_config(
        config).sliding_window_layers
    layout = planner.KVLayout(page_bytes=1, full_layers=12, sliding_layers=36, sliding_window=entry.sliding_window)
    for length, vllm_blocks in zip(lengths, out["chunk_blocks"]):
        ours = layout.blocks_per_request(length, in_flight) - -(-length // 16)  # one full group's blocks out
        per_group = ours // layout.groups[1]
        assert vllm_blocks <= per_group <= vllm_blocks + 1, (length, vllm_blocks, per_group)


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
