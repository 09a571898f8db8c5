"""Real vLLM 0.26.0 on an NVIDIA H200 (random weights of the real sizes), replayed through the planner on the CPU.

tests/data/gpu/rows.json holds each row's setup and vLLM's own numbers (its log lines are in tests/data/gpu/logs;
bench/gpu made both: bench/gpu/README.md). The bounds of issue 24: mean absolute error of the planned KV tokens
against vLLM's <= 2%, no row where the plan promises more than vLLM allocated by more than 0.5%, every configuration
vLLM refused refused by the planner and none it ran refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu import analyse
from vllm_operator import adapters

DATA = Path(__file__).parents[1] / "data" / "gpu"
ROWS = json.loads((DATA / "rows.json").read_text())
SIZED = [r for r in ROWS if not r["refused"]]
#: the rows the KV bounds hold on: every sized row but the bench's own artefacts (analyse.NOT_A_SERVER)
BOUNDED = [r for r in SIZED if r["id"] not in analyse.NOT_A_SERVER]
MAE_LIMIT, OVERESTIMATE_LIMIT = 0.02, 0.005


def test_every_row_keeps_vllms_own_lines():
    """Each row's numbers are backed by the lines of vLLM's log they were read from."""
    assert len(ROWS) == len({r["id"] for r in ROWS})
    for row in ROWS:
        log = (DATA / "logs" / f"{row['id']}.log").read_text()
        assert row.get("vllm_version", "0.26.0") == "0.26.0", row["id"]
        if row["refused"]:  # vLLM's own exception: in the engine's log, or raised to the caller (config checks)
            assert row["error"].startswith(("ValidationError", "RuntimeError", "ValueError")), row["id"]
            assert "ValueError" in log or row["error"].startswith("ValidationError"), row["id"]
            continue
        assert f"GPU KV cache size: {row['log_kv_tokens']:,} tokens" in log, row["id"]
        assert f'"num_blocks": {row["probe_kv"]["num_blocks"]}' in log, row["id"]
        # the probe's exact bytes agree with the rounded figure vLLM logs
        assert abs(row["probe_memory"]["returned_kv_bytes"] / 2**30 - row["log_available_kv_gib"]) < 0.006, row["id"]


def test_the_rows_cover_runners_layouts_and_refusals():
    """Issue 24's classes: at least 30 rows; dense and MoE; online fp8 weights and an fp8 KV cache; a pre-quantized
    checkpoint; sliding windows; a pooling model; refusals; the operator's own pods."""
    assert len(ROWS) >= 30 and len(SIZED) >= 30 and len(ROWS) - len(SIZED) >= 5
    args = [r["args"] for r in SIZED if r["kind"] == "llm"]
    assert any(a.get("quantization") == "fp8" for a in args) and any(a.get("kv_cache_dtype") == "fp8" for a in args)
    assert any(a.get("runner") == "pooling" for a in args)
    assert {"q01-qwen2.5-7b-awq", "q02-llama-3.1-8b-fp8-ct", "q04-qwen2.5-32b-awq"} <= {r["id"] for r in SIZED}
    assert len([r for r in ROWS if r["kind"] == "serve"]) >= 4
    assert {r["model_runner"] for r in SIZED} == {"V1", "V2"}
    specs = {g["spec"] for r in SIZED for g in r["probe_kv"]["groups"]}
    assert {"FullAttentionSpec", "SlidingWindowSpec"} <= specs


def test_plan_verdicts_are_vllms():
    """vLLM refused a length over the model's, a batch below max-num-seqs and a length its KV cache could not hold;
    the planner refuses the same three, and none of the configurations vLLM ran."""
    for row in ROWS:
        t = analyse.compare(row)
        assert t["refused_by_plan"] == row["refused"], (row["id"], t["problems"])


def test_kv_tokens_meet_the_bounds():
    """The planner's 0.26 terms (planner.PROFILE_TERMS) on every row that vLLM ran."""
    table = [analyse.compare(row) for row in BOUNDED]
    mae = sum(abs(t["error"]) for t in table) / len(table)
    worst = max(t["error"] for t in table)
    assert mae <= MAE_LIMIT and worst <= OVERESTIMATE_LIMIT, (mae, worst)


def test_rederived_026_terms_meet_the_bounds():
    """The terms re-derived from these rows (bench.gpu.analyse.candidate_kv; docs/sizing.md says what each is and
    which vLLM line it comes from) hold the bounds on every row: what the planner's 0.26 entry must reproduce."""
    table = [analyse.compare(row, candidate=True) for row in BOUNDED]
    mae = sum(abs(t["error"]) for t in table) / len(table)
    assert mae <= MAE_LIMIT, mae
    assert max(t["error"] for t in table) <= OVERESTIMATE_LIMIT, [(t["id"], t["error"]) for t in table]


SERVED = [r for r in ROWS if r["kind"] == "serve"]


@pytest.mark.parametrize("row", SERVED, ids=lambda r: r["id"])
def test_operator_pods_serve_and_drain_on_the_gpu(row):
    """`vllm serve` with the operator's args and env: ready within the startup probe's budget; /metrics has the
    families the autoscaler reads and cache_config_info's blocks x block size are the KV cache vLLM logged; SIGTERM
    mid-stream lets the stream finish within --shutdown-timeout, refuses new requests and exits cleanly; the decode
    speed there is above the 20 tokens/s the drain sizing assumes."""
    s = row["serve"]
    assert s["ready_s"] < row["startup_budget_s"]
    assert {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
            "vllm:cache_config_info"} <= set(s["families"])
    assert s["measured_kv_tokens"] == row["probe_kv"]["num_blocks"] * 16 == row["log_kv_tokens"]
    assert s["new_request_after_sigterm"]["status"] != 200
    assert s["server_exit_code"] == 0 and s["server_exit_after_sigterm_s"] < row["grace_s"] - row["prestop_s"]
    assert s["completion_status"] == 200 and s["completion_usage"]["completion_tokens"] == 32
    stream = s["stream"]
    assert stream["tokens_at_sigterm"] < stream["max_tokens"] == stream["tokens_received"] == row["drain_tokens"]
    assert stream["finish_reason"] == "length" and stream["done_marker"] and not stream["errors"]
    assert stream["stream_end_after_sigterm_s"] < row["shutdown_timeout_s"]
    assert s["decode_tokens_per_s"] > 20


@pytest.mark.parametrize("row", [r for r in SERVED if r.get("adapters")], ids=lambda r: r["id"])
def test_adapters_load_serve_and_unload_at_runtime_on_the_gpu(row):
    """spec.adapters on the GPU pod (issue 22): each adapter (random, of its spec rank) loaded through the pod's
    runtime endpoint is listed by /v1/models and answers a completion by its name; an unloaded one answers 404."""
    done = row["serve"]["adapters"]
    assert [a["name"] for a in done] == [a["name"] for a in row["adapters"]]
    for i, a in enumerate(done):
        assert a["load_status"] == 200 and a["completion_status"] == 200 and a["completion_tokens"] == 16, a
        assert [x["name"] for x in done[:i + 1]] == a["listed"], a
        if i:
            assert a["unload_status"] == 200 and a["after_unload_status"] == 404, a


LORA = [r for r in ROWS if r.get("probe_lora")]


@pytest.mark.parametrize("row", LORA, ids=lambda r: r["id"])
def test_lora_slots_on_the_gpu_are_the_planners_term(row):
    """--enable-lora on the H200 (issue 22): the bytes of every LoRA tensor vLLM allocated on the GPU (the probe sums
    them) are the planner's LoRA term (adapters.LoRALayout) to the byte where vLLM wraps embed_tokens and lm_head
    (Llama: its class declares embedding_modules); for a model whose class declares none (Qwen2 in 0.26:
    models/qwen2.py), vLLM wraps the linear layers only and the plan is larger by exactly that pair (safe). vLLM
    counts the slots in its weights figure (allocated inside load_model's memory profiler): it grows by them and the
    caching allocator's rounding, under 3% of them."""
    rowspec = {**row, "args": analyse.serve_args(row)} if row["kind"] == "serve" else row
    plan = analyse.pipeline.plan_server(row["id"][:40].rstrip("-."), "default", analyse.spec_for(rowspec))
    assert plan.memory is not None and plan.model is not None
    measured, args = row["probe_lora"], rowspec["args"]
    vocab = (adapters.LoRALayout.vocab_elements(plan.model.complete) * args["max_loras"] * args["max_lora_rank"] * 2
             if "VocabParallelEmbeddingWithLoRA" not in measured["by_class"] else 0)
    assert plan.memory.lora - vocab == measured["total"], (plan.memory.lora, vocab, measured)
    lora_args = ("enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras")
    same = {k: v for k, v in row["args"].items() if k not in lora_args} if row["kind"] == "llm" else None
    base = [b for b in ROWS if b["kind"] == "llm" and b["model"] == row["model"] and b["args"] == same]
    for b in base:  # the same server without LoRA, in the same session
        grown = row["probe_memory"]["weights_memory"] - b["probe_memory"]["weights_memory"]
        assert 0 <= grown - measured["total"] < 0.03 * measured["total"], (b["id"], grown, measured["total"])
