"""The operator's pods for the GPU machine: each example of examples/ that fits one H200, and a few specs of our own,
rendered by the operator's own code (pipeline.plan_server, builders.pod_template) for an H200 and the image of the
vLLM release that runs there, and turned into serve rows for device/serve_one.py: the vLLM container's args and
env exactly as rendered, the startup probe's budget, --shutdown-timeout and the grace period.

What is changed from an example, and said in the row's "changed": gpu.product (an H200: the one GPU there) and
spec.image (vllm/vllm-openai:v0.26.0, the release the machine's torch runs). Env vars whose value comes from a
Secret (HF_TOKEN) have no value there and are left out.

Usage: python -m bench.gpu.render OUT_JSON
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from vllm_operator import api, builders, catalog, pipeline
from vllm_operator.sources import vllm_metrics as metrics

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "vllm/vllm-openai:v0.26.0"
PRODUCT = "NVIDIA-H200"

#: example file -> the models/ folder holding its config.json (bench/gpu/models.py); None: does not fit one H200.
EXAMPLES: dict[str, str | None] = {
    "llama-8b-single-gpu.yaml": "llama-3.1-8b",
    "llama-3b-autoscaled.yaml": "llama-3.2-3b",
    "llama-8b-sidecar-patch.yaml": "llama-3.1-8b",
    "qwen-32b-awq.yaml": "qwen2.5-32b-awq",
    "qwen-7b-daemonset.yaml": "qwen2.5-7b",
    "llama-8b-lora-adapters.yaml": "llama-3.1-8b",
    "qwen-routed.yaml": "qwen2.5-7b",
    "gemma-3-4b-2x-a2000.yaml": None,  # gpu.count 2: tensor parallelism over two GPUs, and the machine has one
}

#: Specs of our own: a mixture of experts with every flag derived, a 70B in online fp8, a sliding-window model.
OWN: list[tuple[str, str, dict[str, Any]]] = [
    ("own-qwen3-30b-a3b", "qwen3-30b-a3b", {
        "model": {"name": "Qwen/Qwen3-30B-A3B",
                  "architecture": {"parameterCount": 30_532_122_624}},
        "gpu": {"count": 1},
        "workloadProfile": {"maxContextTokens": 32768, "p95PromptTokens": 4000, "p95OutputTokens": 1000}}),
    ("own-llama-70b-fp8", "llama-3.1-70b", {
        "model": {"name": "meta-llama/Llama-3.1-70B-Instruct", "quantization": "fp8"},
        "gpu": {"count": 1},
        "workloadProfile": {"maxContextTokens": 32768, "p95OutputTokens": 256, "priority": "latency"}}),
]


def spec_of(doc: dict[str, Any]) -> dict[str, Any]:
    spec = copy.deepcopy(doc["spec"])
    spec.setdefault("gpu", {})["product"] = PRODUCT
    spec["image"] = IMAGE
    return spec


def serve_row(rid: str, folder: str, name: str, spec_dict: dict[str, Any], changed: list[str],
              configs: dict[str, Any]) -> dict[str, Any]:
    if "architecture" in spec_dict["model"]:  # not in the catalog: its config.json's shapes, as a Hub lookup gives
        shapes = catalog.architecture_from_config(configs[folder]).model_dump(by_alias=True, exclude_none=True)
        spec_dict["model"]["architecture"] = {**shapes, **spec_dict["model"]["architecture"]}
    spec = api.VLLMServerSpec.model_validate(spec_dict)
    plan = pipeline.plan_server(name, "default", spec)
    assert plan.fits, (rid, [str(p) for p in plan.problems])
    pod = builders.pod_template(plan)
    vllm = next(c for c in pod["spec"]["containers"] if c["name"] == "vllm")
    env = {e["name"]: e["value"] for e in vllm.get("env", []) if "value" in e}
    skipped = [e["name"] for e in vllm.get("env", []) if "value" not in e]
    probe = vllm["startupProbe"]
    budget = probe.get("initialDelaySeconds", 0) + probe["periodSeconds"] * probe["failureThreshold"]
    return {
        "id": rid, "kind": "serve", "model": folder, "model_id": spec.model.name, "args": vllm["args"], "env": env,
        "env_from_secrets_left_out": skipped, "changed": changed,
        "startup_budget_s": budget, "shutdown_timeout_s": plan.drain_seconds,
        "grace_s": pod["spec"]["terminationGracePeriodSeconds"], "prestop_s": plan.prestop_seconds,
        "served_name": spec.model.served_name or spec.model.name, "metrics_query": metrics.ONLY_WANTED_QUERY,
        "drain_tokens": spec.workload_profile.p95_output_tokens or 512,
        # serve_one.py loads a random adapter of each rank at runtime (the pods' own endpoint), asks it, unloads it
        "adapters": [{"name": a.name, "rank": a.rank} for a in spec.adapters if a.rank],
        "plan": {"kv_cache_tokens": plan.kv_cache_tokens, "max_model_len": plan.max_model_len,
                 "gpu_memory_utilization": plan.gpu_memory_utilization, "estimates": plan.estimates(),
                 "notes": plan.status()["notes"]},
        "timeout_s": 300 + plan.drain_seconds + 60, "min_s": 240,
    }


def rows(configs: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for file, folder in EXAMPLES.items():
        if folder is None:
            continue
        doc = yaml.safe_load((ROOT / "examples" / file).read_text())
        out.append(serve_row(f"e-{file.removesuffix('.yaml')}", folder, doc["metadata"]["name"], spec_of(doc),
                             [f"spec.gpu.product {PRODUCT}", f"spec.image {IMAGE}"], configs))
    for rid, folder, spec in OWN:
        out.append(serve_row(rid, folder, rid, {**spec, "image": IMAGE, "gpu": {**spec["gpu"], "product": PRODUCT}},
                             [], configs))
    return out


def main(out: str) -> int:
    from bench.gpu import models
    configs = {name: models.config_for(name) for name in models.MODELS}
    json.dump(rows(configs), open(out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
