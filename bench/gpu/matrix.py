"""The matrix of GPU rows (bench/gpu/README.md): sizing rows that start `vllm.LLM` once each, and serve rows that run
the operator's own pod args (render.py). Written to matrix.json in the order they run: when the device time runs
out, the rows at the end are the ones left.

Usage: python -m bench.gpu.matrix OUT_JSON [SERVE_JSON [DONE_JSON]]   (DONE_JSON: leave out the rows it holds)
"""

from __future__ import annotations

import json
import sys
from typing import Any

#: vLLM's `vllm serve` defaults on a GPU of 70 GiB or more (the LLM class alone uses others): pinned on every row.
SERVE_DEFAULTS = {"max_num_seqs": 1024, "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.9}


def row(rid: str, model: str, fast: bool = True, **args: Any) -> dict[str, Any]:
    return {"id": rid, "kind": "llm", "model": model, "args": {**SERVE_DEFAULTS, **args}, "fast": fast,
            "timeout_s": 300 if fast else 420, "min_s": 45 if fast else 90}


def lora_row(rid: str, model: str, rank: int, max_loras: int = 4, **args: Any) -> dict[str, Any]:
    """A sizing row with --enable-lora: the slots (max_loras x rank) as a spec pins them and --max-cpu-loras as the
    planner derives it for one adapter of that rank (analyse.spec_for, analyse.lora_flags)."""
    from bench.gpu import analyse
    from vllm_operator import pipeline
    base = row(rid, model, **args)
    base["args"].update(enable_lora=True, max_loras=max_loras, max_lora_rank=rank)
    plan = pipeline.plan_server(rid, "default", analyse.spec_for(base))
    lora = analyse.lora_flags(plan)
    assert lora and lora["max_loras"] == max_loras and lora["max_lora_rank"] == rank, (rid, lora)
    base["args"].update(lora)
    return base


ROWS = [
    # dense, Model Runner V2 (CUDA graphs captured on top of the budget in 0.26)
    row("d01-qwen2.5-0.5b", "qwen2.5-0.5b", max_model_len=32768),
    row("d02-llama-3.1-8b", "llama-3.1-8b", max_model_len=131072),
    row("d03-qwen2.5-7b", "qwen2.5-7b", max_model_len=32768),
    row("m01-qwen3-30b-a3b", "qwen3-30b-a3b", max_model_len=40960),
    row("d04-llama-3.1-8b-u95-4k", "llama-3.1-8b", gpu_memory_utilization=0.95, max_model_len=4096, max_num_seqs=256,
        max_num_batched_tokens=2048),
    row("d05-llama-3.1-8b-seqs64", "llama-3.1-8b", max_model_len=16384, max_num_seqs=64, max_num_batched_tokens=16384),
    row("d06-llama-3.1-8b-eager", "llama-3.1-8b", max_model_len=32768, enforce_eager=True),
    row("d07-llama-3.1-8b-kvfp8", "llama-3.1-8b", max_model_len=65536, kv_cache_dtype="fp8"),
    row("d08-qwen3-0.6b-u50", "qwen3-0.6b", gpu_memory_utilization=0.5, max_model_len=40960),
    row("d09-llama-3.2-3b-u70", "llama-3.2-3b", gpu_memory_utilization=0.7, max_model_len=131072),
    row("d10-qwen2.5-14b", "qwen2.5-14b", max_model_len=32768),
    row("d11-qwen3-32b", "qwen3-32b", max_model_len=32768),
    row("d12-qwen3-8b-seqs512", "qwen3-8b", gpu_memory_utilization=0.8, max_model_len=32768, max_num_seqs=512,
        max_num_batched_tokens=4096),
    row("d13-llama-3.1-70b-fp8", "llama-3.1-70b", gpu_memory_utilization=0.95, max_model_len=32768, quantization="fp8"),
    row("d14-qwen2.5-72b-fp8-kvfp8", "qwen2.5-72b", gpu_memory_utilization=0.95, max_model_len=16384,
        quantization="fp8", kv_cache_dtype="fp8"),
    row("d15-mistral-small-24b", "mistral-small-24b", max_model_len=32768),
    # mixture of experts (Model Runner V1: CUDA graphs estimated inside the budget)
    row("m02-mixtral-8x7b", "mixtral-8x7b", max_model_len=32768),
    row("m03-qwen3-30b-a3b-u60", "qwen3-30b-a3b", gpu_memory_utilization=0.6, max_model_len=16384, max_num_seqs=256,
        max_num_batched_tokens=4096),
    row("m04-gpt-oss-20b", "gpt-oss-20b", max_model_len=131072),
    # sliding windows and hybrids
    row("s01-gemma-2-9b", "gemma-2-9b", max_model_len=8192),
    row("s02-gemma-3-1b-u50", "gemma-3-1b", gpu_memory_utilization=0.5, max_model_len=32768),
    row("s03-mistral-7b-v0.1", "mistral-7b-v0.1", max_model_len=32768),
    row("s04-gemma-2-27b", "gemma-2-27b", max_model_len=8192),
    # pre-quantized checkpoints (as config.json says)
    row("q01-qwen2.5-7b-awq", "qwen2.5-7b-awq", max_model_len=32768),
    row("q02-llama-3.1-8b-fp8-ct", "llama-3.1-8b-fp8-ct", max_model_len=131072),
    row("q03-qwen2.5-7b-gptq-u85", "qwen2.5-7b-gptq", gpu_memory_utilization=0.85, max_model_len=32768),
    row("q04-qwen2.5-32b-awq", "qwen2.5-32b-awq", max_model_len=32768),
    # a vision-language model, a pooling model
    {**row("v01-qwen2.5-vl-7b", "qwen2.5-vl-7b", max_model_len=32768), "processor": True},
    row("p01-gte-qwen2-7b-pooling", "gte-qwen2-7b", max_model_len=32768, max_num_batched_tokens=32768,
        runner="pooling"),
    # what vLLM refuses
    row("x01-llama-3.1-70b-bf16", "llama-3.1-70b", gpu_memory_utilization=0.95, max_model_len=8192),
    row("x02-qwen2.5-32b-u50", "qwen2.5-32b", gpu_memory_utilization=0.5, max_model_len=32768),
    row("x03-llama-3.1-8b-u20-128k", "llama-3.1-8b", gpu_memory_utilization=0.2, max_model_len=131072),
    row("x04-llama-3.1-8b-len-over-model", "llama-3.1-8b", max_model_len=262144),
    row("x05-llama-3.2-1b-batch-below-seqs", "llama-3.2-1b", max_model_len=8192, max_num_batched_tokens=512),
    # more of the same kinds, if the time allows
    row("d16-qwen2.5-32b-u92", "qwen2.5-32b", gpu_memory_utilization=0.92, max_model_len=32768, max_num_seqs=256),
    row("d17-llama-3.2-1b", "llama-3.2-1b", max_model_len=131072),
    row("d18-qwen2.5-3b-u60", "qwen2.5-3b", gpu_memory_utilization=0.6, max_model_len=32768),
    row("d19-mistral-7b-v0.3", "mistral-7b-v0.3", max_model_len=32768),
    # LoRA slots (issue 22): the same server without and with --enable-lora, two ranks, two models
    row("a00-llama-3.1-8b-base-32k", "llama-3.1-8b", max_model_len=32768),
    lora_row("a01-llama-3.1-8b-lora-r16", "llama-3.1-8b", 16, max_model_len=32768),
    lora_row("a02-llama-3.1-8b-lora-r64", "llama-3.1-8b", 64, max_model_len=32768),
    lora_row("a03-qwen2.5-7b-lora-r16", "qwen2.5-7b", 16, max_model_len=32768),
    # Llama 4 (issue 20): chunked local attention on 3 of every 4 layers, a mixture of 16 experts and a shared one;
    # as vLLM runs it by default, and with the hybrid KV cache manager off (every layer's KV kept: what the planner
    # sizes)
    row("c01-llama-4-scout-16l", "llama-4-scout-16l", max_model_len=131072),
    row("c02-llama-4-scout-16l-nohma", "llama-4-scout-16l", max_model_len=131072,
        disable_hybrid_kv_cache_manager=True),
]


#: The second session's order (the first ran d01-d09, m03, q01, s01, s03, x03-x05 and two pods): one row of each
#: class still missing first (a refusal after the profile, 72B in fp8, a hybrid sliding window, compressed-tensors,
#: pooling, gpt-oss, AWQ), then the other big models, then two examples as pods, then the rest.
NEXT = ["x02-qwen2.5-32b-u50", "d14-qwen2.5-72b-fp8-kvfp8", "s02-gemma-3-1b-u50", "q02-llama-3.1-8b-fp8-ct",
        "p01-gte-qwen2-7b-pooling", "m04-gpt-oss-20b", "q04-qwen2.5-32b-awq",
        "d13-llama-3.1-70b-fp8", "m02-mixtral-8x7b", "s04-gemma-2-27b", "q03-qwen2.5-7b-gptq-u85", "d11-qwen3-32b",
        "d15-mistral-small-24b", "d10-qwen2.5-14b",
        "e-llama-3b-autoscaled", "e-qwen-32b-awq", "d12-qwen3-8b-seqs512", "x01-llama-3.1-70b-bf16",
        "d16-qwen2.5-32b-u92", "d17-llama-3.2-1b", "d18-qwen2.5-3b-u60", "d19-mistral-7b-v0.3"]


#: The third session's order (issue 22's LoRA rows and the pods not yet run first; the vision-language row last).
NEXT = ["a00-llama-3.1-8b-base-32k", "a01-llama-3.1-8b-lora-r16", "a02-llama-3.1-8b-lora-r64",
        "e-llama-8b-lora-adapters", "a03-qwen2.5-7b-lora-r16", "e-qwen-32b-awq", "e-qwen-7b-daemonset",
        "e-llama-8b-sidecar-patch", "own-llama-70b-fp8", "v01-qwen2.5-vl-7b"] + NEXT


#: The fourth session's: Llama 4's rows.
NEXT = ["c02-llama-4-scout-16l-nohma", "c01-llama-4-scout-16l"] + NEXT


#: Rows already in DONE_JSON that run again: the AWQ pod's completion never ran (its prompt was empty).
RUN_AGAIN = {"e-qwen-32b-awq"}


def todo(rows: list[dict[str, Any]], done_json: str) -> list[dict[str, Any]]:
    """The rows not in DONE_JSON (tests/data/gpu/rows.json), NEXT's first in its order, then the others."""
    done = {r["id"] for r in json.load(open(done_json))} - RUN_AGAIN
    left = {r["id"]: r for r in rows if r["id"] not in done}
    out = [left.pop(i) for i in NEXT if i in left] + list(left.values())
    for r in out:  # a row started with less time left than it needs is cut before vLLM says anything
        if r["kind"] == "llm":
            r["min_s"] = 100 if any(b in r["model"] for b in ("70b", "72b", "32b", "mixtral", "27b", "scout")) else 70
        else:  # the pods of the second session: 98-113 s to ready, 6-10 s to drain and exit
            r["min_s"] = 240 if "70b" in r["model"] else 180
    return out


def main(out: str, serve: str | None = None, done_json: str | None = None) -> int:
    rows = list(ROWS)
    if serve:
        # The pods (their full starts capture CUDA graphs: the graph rows) spread among the sizing rows, so that a
        # budget that runs out leaves some of each kind.
        served = {r["id"]: r for r in json.load(open(serve))}
        order = ["e-llama-8b-single-gpu", "own-qwen3-30b-a3b", "e-qwen-32b-awq", "e-qwen-7b-daemonset",
                 "e-llama-3b-autoscaled", "own-llama-70b-fp8", "e-llama-8b-sidecar-patch"]
        at = [2, 4, 10, 16, 22, 28, 34]
        for position, rid in sorted(zip(at, order), reverse=True):
            rows.insert(position, served.pop(rid))
        rows += list(served.values())
    # the refusals vLLM finds while it checks its config cost seconds: first; the ones after profiling mid-way
    quick = [r for r in rows if r["id"].startswith(("x04", "x05"))]
    late = [r for r in rows if r["id"].startswith(("x01", "x02", "x03"))]
    rows = [r for r in rows if r not in quick and r not in late]
    rows = quick + rows[:14] + late + rows[14:]
    if done_json:
        rows = todo(rows, done_json)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids))
    json.dump(rows, open(out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
