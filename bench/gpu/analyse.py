"""Compare the planner with every GPU row of tests/data/gpu/rows.json, term by term (a throwaway analysis: what the
planner's memory model gets wrong on vLLM 0.26.0, and by how much). Prints one line per row and the error summary.

Usage: python -m bench.gpu.analyse [--candidate]   (--candidate: the terms re-derived for 0.26, candidate_kv)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from vllm_operator import api, catalog, pipeline, planner
from vllm_operator.planner import GiB

from bench.gpu import models

ROOT = Path(__file__).resolve().parents[2]
ROWS: list[dict[str, Any]] = json.loads((ROOT / "tests" / "data" / "gpu" / "rows.json").read_text())
#: The Hub's parameter counts (what the operator sizes a model outside its catalog with) of the configs that are not
#: in the catalog.
PARAMETERS = {"qwen2.5-7b": 7_615_616_512, "qwen2.5-7b-awq": 7_615_616_512, "qwen3-30b-a3b": 30_532_122_624,
              "mistral-7b-v0.1": 7_241_732_096, "gpt-oss-20b": 20_914_757_184, "qwen2.5-32b-awq": 32_763_876_352,
              "llama-3.1-8b-fp8-ct": 8_030_261_248, "qwen2.5-7b-gptq": 7_615_616_512,
              "qwen2.5-vl-7b": 8_292_166_656, "gte-qwen2-7b": 7_613_104_640,
              # Scout's text tensors for 16 layers (tests/unit/test_catalog.py _llama4_count's text part)
              "llama-4-scout-16l": 37_302_604_800}
IMAGE = "vllm/vllm-openai:v0.26.0"
#: Rows whose measurement is the bench's own artefact, not what a server of that checkpoint allocates: kept as data,
#: checked for vLLM's verdict, left out of the KV bounds. The reason is in the row's own log.
NOT_A_SERVER = {
    "q03-qwen2.5-7b-gptq-u85": (
        "vLLM 0.26's auto_gptq reads which layers are quantized from the checkpoint's safetensors headers when "
        "config.json lists none (quantization/auto_gptq.py AutoGPTQConfig.maybe_update_config); a folder with only "
        "config.json has none, so every layer loaded unquantized (gptq_utils.is_layer_gptq_quantized over an empty "
        "list): 14.29 GiB of weights, a 16-bit 7B's, where a real GPTQ checkpoint loads ~5.4 GiB"),
}


def spec_for(row: dict[str, Any]) -> api.VLLMServerSpec:
    """The VLLMServer of a sizing row: its model (the catalog's, or its config.json's shapes and the Hub's count) on
    an H200, with the row's vLLM arguments pinned."""
    source, _family = models.MODELS[row["model"]]
    a = row["args"]
    model: dict[str, Any] = {"name": source.removeprefix("catalog:") if source.startswith("catalog:") else row["model"]}
    if not source.startswith("catalog:"):
        arch = catalog.architecture_from_config(models.config_for(row["model"]))
        model["architecture"] = {**arch.model_dump(by_alias=True, exclude_none=True),
                                 "parameterCount": PARAMETERS[row["model"]]}
    if a.get("quantization"):
        model["quantization"] = a["quantization"]
    engine: dict[str, Any] = {"gpuMemoryUtilization": a["gpu_memory_utilization"], "maxModelLen": a["max_model_len"],
                              "maxNumBatchedTokens": a["max_num_batched_tokens"], "maxNumSeqs": a["max_num_seqs"]}
    if a.get("kv_cache_dtype"):
        engine["kvCacheDtype"] = a["kv_cache_dtype"]
    if a.get("enforce_eager"):
        engine["enforceEager"] = True
    if a.get("disable_hybrid_kv_cache_manager"):
        engine["extraArgs"] = ["--disable-hybrid-kv-cache-manager"]
    spec: dict[str, Any] = {"model": model, "image": IMAGE, "gpu": {"count": 1, "product": "NVIDIA-H200"},
                            "engine": engine}
    if a.get("enable_lora"):
        # LoRA rows: one adapter of the slots' rank, a path in the pod (the planner takes the spec's rank), and the
        # row's slots pinned; the planner derives --max-cpu-loras (matrix.lora_args ran it to make the row).
        spec["adapters"] = [{"name": "a1", "source": "/cache/adapters/a1", "rank": a["max_lora_rank"]}]
        engine.update(maxLoras=a["max_loras"], maxLoraRank=a["max_lora_rank"])
    return api.VLLMServerSpec.model_validate(spec)


def lora_flags(plan: planner.Plan) -> dict[str, Any]:
    """The LoRA flags a plan derived, as vllm.LLM keyword arguments."""
    flags = {d.flag: d.value for d in plan.decisions}
    if "--enable-lora" not in flags:
        return {}
    return {"enable_lora": True, "max_loras": int(flags["--max-loras"]),
            "max_lora_rank": int(flags["--max-lora-rank"]), "max_cpu_loras": int(flags["--max-cpu-loras"])}


def serve_args(row: dict[str, Any]) -> dict[str, Any]:
    """A serve row's engine arguments, read back from the args the operator rendered."""
    args, out = row["args"], {}
    for flag, key, conv in (("--gpu-memory-utilization", "gpu_memory_utilization", float),
                            ("--max-model-len", "max_model_len", int), ("--max-num-seqs", "max_num_seqs", int),
                            ("--max-num-batched-tokens", "max_num_batched_tokens", int),
                            ("--quantization", "quantization", str), ("--kv-cache-dtype", "kv_cache_dtype", str),
                            ("--max-loras", "max_loras", int), ("--max-lora-rank", "max_lora_rank", int),
                            ("--max-cpu-loras", "max_cpu_loras", int)):
        if flag in args:
            out[key] = conv(args[args.index(flag) + 1])
    if "--enable-lora" in args:
        out["enable_lora"] = True
    return out


def compare(row: dict[str, Any], candidate: bool = False) -> dict[str, Any]:
    if row["kind"] == "serve":
        row = {**row, "args": serve_args(row)}
    spec = spec_for(row)
    plan = pipeline.plan_server(row["id"][:40].rstrip("-."), "default", spec)
    out: dict[str, Any] = {"id": row["id"], "refused_by_vllm": row["refused"],
                           "refused_by_plan": not plan.fits, "problems": [str(p) for p in plan.problems]}
    if row["refused"] or plan.memory is None:
        return out
    m, probe = plan.memory, row["probe_memory"]
    terms = planner.profile_terms(IMAGE.rsplit(":v", 1)[1])
    arch = plan.model.complete
    layout = planner.kv_layout(arch, 1, spec.engine.kv_cache_dtype or "auto", 2,
                               hybrid=planner.hybrid_kv_off(spec) is None)
    in_flight = planner.tokens_in_flight(row["args"]["max_num_batched_tokens"], terms, planner.is_pooling(arch))
    kv = m.kv_cache
    if candidate:  # vLLM 0.26 schedules asynchronously (its log: "Asynchronous scheduling is enabled"): 2 batches
        in_flight = (1 if planner.is_pooling(arch) else 2) * row["args"]["max_num_batched_tokens"]
        kv = candidate_kv(plan, row)
    ours = layout.tokens(kv, row["args"]["max_model_len"], in_flight)
    logged = row["log_kv_tokens"]
    out.update({
        "logged_tokens": logged, "planned_tokens": ours, "error": ours / logged - 1,
        # vLLM allocates the LoRA slots inside load_model's memory profiler: its weights figure holds them
        "weights": (m.weights + m.lora - probe["weights_memory"]) / GiB,
        "lora": (m.lora - row["probe_lora"]["total"]) / GiB if row.get("probe_lora") else None,
        "activation": (m.activation - probe["torch_peak_increase"]) / GiB,
        "non_torch": (m.non_torch - probe["non_torch_increase"]) / GiB,
        "graphs": (m.cuda_graphs - probe["cudagraph_memory_estimate"]) / GiB,
        "budget": (m.budget - probe["requested_memory"]) / GiB,
        "kv": (m.kv_cache - probe["returned_kv_bytes"]) / GiB,
        "runner": row.get("model_runner"),
    })
    return out


def candidate_kv(plan: planner.Plan, row: dict[str, Any]) -> float:
    """The KV bytes of the candidate 0.26 terms (docs/sizing.md, "vLLM 0.26.0 on an H200"): the runner is V2 for a
    generative model that is not a mixture of experts (VllmConfig._is_default_v2_model_runner_model); V2 takes no
    CUDA-graph estimate from the budget (gpu/model_runner.profile_cudagraph_memory returns 0) and its cold-compile
    peak is the larger of the forward pass and one vocabulary x hidden matrix, plus 0.13 GiB; V1 keeps the planner's
    sampler peak and takes 0.5 GiB of graphs; non-torch is 0.24 GiB for both."""
    assert plan.memory is not None and plan.model is not None
    arch, a = plan.model.complete, row["args"]
    v2 = not arch.num_experts and not planner.is_pooling(arch)
    elem = 2
    forward = a["max_num_batched_tokens"] * (2 * arch.intermediate_size + 7 * arch.hidden_size) * elem
    if v2:
        activation = max(forward, arch.vocab_size * arch.hidden_size * elem) + 0.13 * GiB
        graphs = 0
    else:
        activation, graphs = plan.memory.activation, 0.5 * GiB
    return plan.memory.budget - plan.memory.weights - activation - 0.24 * GiB - graphs - plan.memory.lora


def lora_column(t: dict[str, Any]) -> str:
    """The LoRA slots' planned minus measured GiB (the probe's sum of the LoRA tensors), for a LoRA row."""
    return "" if t.get("lora") is None else f"  LoRA slots {t['lora']:+.4f}"


def main() -> int:
    candidate = "--candidate" in sys.argv
    table = [compare(row, candidate) for row in ROWS]
    print(f"{'row':36s} {'runner':6s} {'logged':>10s} {'planned':>10s} {'error':>7s} | planned - vLLM, GiB: "
          f"{'budget':>7s} {'weights':>7s} {'activ.':>7s} {'nontorch':>8s} {'graphs':>7s} {'kv':>7s}")
    for t in table:
        if "error" not in t:
            print(f"{t['id']:36s} refused by vLLM: {t['refused_by_vllm']}, by the plan: {t['refused_by_plan']} "
                  f"{t['problems'][:1]}")
            continue
        print(f"{t['id']:36s} {t['runner'] or '':6s} {t['logged_tokens']:>10,} {t['planned_tokens']:>10,} "
              f"{t['error']:>+7.2%} | {t['budget']:>7.3f} {t['weights']:>7.3f} {t['activation']:>7.3f} "
              f"{t['non_torch']:>8.3f} {t['graphs']:>7.3f} {t['kv']:>7.3f}"
              f"{lora_column(t)}"
              f"{'  (not a server: left out)' if t['id'] in NOT_A_SERVER else ''}")
    compared = [t for t in table if "error" in t and t["id"] not in NOT_A_SERVER]
    mae = sum(abs(t["error"]) for t in compared) / len(compared)
    worst = max(compared, key=lambda t: t["error"])
    verdicts = [t for t in table if t["refused_by_vllm"] != t["refused_by_plan"]]
    print(f"\n{len(compared)} rows: MAE {mae:.2%}, worst overestimate {worst['error']:+.2%} ({worst['id']}); "
          f"verdicts that differ from vLLM's: {[t['id'] for t in verdicts]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
