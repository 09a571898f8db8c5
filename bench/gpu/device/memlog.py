"""Read vLLM 0.26.0's memory lines out of its log (and the probe's exact figures, probe/sitecustomize.py).

Used on the GPU machine (runner.py keeps each row's lines and these fields) and here (bench/gpu/collect.py reads the
committed lines again). Each pattern is the format string of the vLLM source line named beside it.
"""
import json
import re

GiB = 2**30

#: (field, pattern, converter): the last match wins (a line repeated by a retry is the final one).
PATTERNS = [
    # vllm/v1/worker/gpu_model_runner.py (V1) "Model loading took %s GiB memory and %.6f seconds";
    # vllm/v1/worker/gpu/model_runner.py (V2) "Model loading took %s GiB and %.6f seconds"
    ("log_model_loading_gib", r"Model loading took ([\d.]+) GiB", float),
    # vllm/utils/mem_utils.py MemoryProfilingResult.__repr__ (gpu_worker logs it at DEBUG)
    ("log_profile", r"Total non KV cache memory: ([\d.]+)GiB; torch peak memory increase: ([\d.]+)GiB; "
                    r"non-torch forward increase memory: ([\d.]+)GiB; weights memory: ([\d.]+)GiB", None),
    # gpu_worker.determine_available_memory
    ("log_available_kv_gib", r"Available KV cache memory: ([\d.-]+) GiB", float),
    # gpu_model_runner.profile_cudagraph_memory (V1 only; V2's returns 0 and logs nothing)
    ("log_cudagraph_estimate_gib", r"Estimated CUDA graph memory: ([\d.]+) GiB total", float),
    # vllm/v1/core/kv_cache_utils.py get_kv_cache_configs
    ("log_kv_tokens", r"GPU KV cache size: ([\d,]+) tokens", lambda s: int(s.replace(",", ""))),
    ("log_max_concurrency", r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x", float),
    # gpu_model_runner.capture_model (V1), gpu/model_runner.capture_model (V2)
    ("log_graph_capture", r"Graph capturing finished in ([\d.]+) secs?, took ([\d.-]+) GiB", None),
    # vllm/v1/engine/core.py
    ("log_init_engine_s", r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s", float),
    # vllm/platforms/cuda.py get_attn_backend_cls
    ("attention_backend", r"Using (\S+) backend\.", str),
    # gpu_worker.init_device
    ("v2_model_runner_logged", r"(Using V2 Model Runner)", lambda s: True),
]


def parse(text: str) -> dict:
    out: dict = {}
    for field, pattern, conv in PATTERNS:
        found = re.findall(pattern, text)
        if not found:
            continue
        last = found[-1]
        if field == "log_profile":
            a, b, c, d = map(float, last)
            out.update(log_non_kv_gib=a, log_torch_peak_increase_gib=b, log_non_torch_increase_gib=c,
                       log_weights_gib=d)
        elif field == "log_graph_capture":
            out["log_graph_capture_s"], out["log_graph_capture_gib"] = float(last[0]), float(last[1])
        else:
            out[field] = conv(last)
    for line in text.splitlines():
        at = line.find("VLLM_PROBE ")
        if at < 0:
            continue
        try:
            probe = json.loads(line[at + len("VLLM_PROBE "):])
        except ValueError:
            continue
        kind = probe.pop("probe", "")
        if kind == "memory":
            out["probe_memory"] = probe
        elif kind == "kv_cache_config":
            out["probe_kv"] = probe
        elif kind == "lora":
            out["probe_lora"] = probe
    if "probe_kv" in out and "num_blocks" in out["probe_kv"]:
        out["num_gpu_blocks_logged"] = out["probe_kv"]["num_blocks"]
    return out


#: The lines kept with a row (tests/data/gpu/<row>.log): vLLM's memory, sizing and refusal lines, nothing else.
KEEP = re.compile(r"(Model loading took|Memory profiling takes|Available KV cache memory|CUDA graph|GPU KV cache size|"
                  r"Maximum concurrency|Graph capturing finished|init engine|Using \S+ backend|V2 Model Runner|"
                  r"V1 model runner|Initial free memory|worker init memory snapshot|worker requested memory|"
                  r"Free memory after profiling|VLLM_PROBE|Error|error:|Exception|out of memory|OutOfMemory|"
                  r"larger than|not enough|exceeds|Reason:|RESULT_JSON|Chunked prefill|max_num_batched_tokens|"
                  r"Asynchronous scheduling|async scheduling|fp8|FP8|quantiz|sliding|Encoder cache|profiled with|"
                  r"cudagraph_mode|Capturing CUDA graphs|Application startup|Shutting down|shutdown|drain|Draining|"
                  r"SIGTERM|Started server process|Uvicorn running|LoRA|lora_adapter)")


def keep(text: str, limit: int = 400) -> list[str]:
    out = [line[:limit] for line in text.splitlines() if KEEP.search(line) and not line.startswith("RESULT_JSON")]
    return out
