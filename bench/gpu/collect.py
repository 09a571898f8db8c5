"""Turn what the GPU machine sent back (results.tgz of each device call) into the committed evidence:
tests/data/gpu/rows.json (one entry per row: its setup and vLLM's numbers; the rows already there stay) and
tests/data/gpu/logs/<id>.log (the memory, sizing and refusal lines of vLLM's own log, as device/memlog.py keeps them).

Usage: python -m bench.gpu.collect RESULTS_DIR [RESULTS_DIR ...]   (folders holding results/<id>.json)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "gpu"
GiB = 2**30

#: The fields of a row's result kept in rows.json (the rest is in its log).
KEEP = ("ok", "error", "killed", "vllm_version", "torch_version", "num_gpu_blocks", "block_size", "max_model_len",
        "use_v2_model_runner", "async_scheduling", "cudagraph_mode", "log_model_loading_gib", "log_available_kv_gib",
        "log_kv_tokens", "log_max_concurrency", "log_cudagraph_estimate_gib", "log_graph_capture_gib",
        "log_graph_capture_s", "log_non_kv_gib", "log_torch_peak_increase_gib", "log_non_torch_increase_gib",
        "log_weights_gib", "probe_memory", "probe_kv", "probe_lora", "lora_config", "num_gpu_blocks_logged", "serve",
        "runner_wall_s")


def entry(result: dict, row: dict) -> dict:
    out = {"id": result["id"], "kind": row.get("kind", "llm"), "model": row["model"]}
    if out["kind"] == "llm":
        out["args"] = row["args"]
        out["fast"] = bool(row.get("fast"))
    else:
        out.update({k: row[k] for k in ("model_id", "args", "env", "changed", "startup_budget_s",
                                         "shutdown_timeout_s", "grace_s", "prestop_s", "drain_tokens", "plan")})
        if row.get("adapters"):
            out["adapters"] = row["adapters"]
    out.update({k: result[k] for k in KEEP if k in result})
    if "error" in out:
        out["error"] = out["error"][:600]
    memory = result.get("probe_memory") or {}
    if memory.get("model_runner"):
        out["model_runner"] = "V2" if memory["model_runner"].endswith("worker.gpu.model_runner") else "V1"
    out["refused"] = bool(result.get("error")) and not result.get("log_kv_tokens")
    return out


def main(folders: list[str]) -> int:
    # the rows of earlier sessions stay; a row run again replaces its earlier entry
    old = OUT / "rows.json"
    rows: dict[str, dict] = {r["id"]: r for r in json.loads(old.read_text())} if old.exists() else {}
    (OUT / "logs").mkdir(parents=True, exist_ok=True)
    for folder in folders:
        for path in sorted(Path(folder).glob("results/*.json")):
            if path.name.endswith((".row.json", ".cut.json")):
                continue
            result = json.loads(path.read_text())
            row = json.loads(path.with_name(path.name.replace(".json", ".row.json")).read_text())
            if not result.get("log_kv_tokens") and not result.get("error"):
                continue  # cut by the device's deadline before vLLM said anything: no evidence
            rows[result["id"]] = entry(result, row)
            log = path.with_suffix(".log")
            if log.exists():
                (OUT / "logs" / log.name).write_text(log.read_text())
        gpu = Path(folder) / "results" / "gpu.txt"
        if gpu.exists():
            (OUT / "gpu.txt").write_text(gpu.read_text())
    (OUT / "rows.json").write_text(json.dumps(sorted(rows.values(), key=lambda r: r["id"]), indent=1) + "\n")
    print(f"{len(rows)} rows -> {OUT / 'rows.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
