"""Run the matrix rows not yet done, one child process per row, until a deadline.

Usage (GPU machine): python3 runner.py MATRIX_JSON DEADLINE_EPOCH_SECONDS
A row is {"id", "kind": "llm" | "serve", "model": <folder under models/>, ...}: "llm" rows start vllm.LLM
(run_one.py), "serve" rows run `vllm serve` with the operator's args (serve_one.py). A row with "fast": true is
stopped once vLLM has logged its KV cache size (sizing is done then; CUDA-graph capture is skipped).
Results: /root/results/<id>.json (vLLM's numbers) and <id>.log (its memory lines); one summary line per row.
"""
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import memlog  # noqa: E402

RESULTS = "/root/results"


def gpu_used_mib() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
        return int(out.strip().splitlines()[0])
    except Exception:
        return -1


def wait_gpu_free(limit_s: float = 30) -> int:
    end = time.time() + limit_s
    used = gpu_used_mib()
    while used > 1500 and time.time() < end:
        time.sleep(0.5)
        used = gpu_used_mib()
    return used


def env_for(row: dict) -> dict:
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                # the machine's rule: NVLink multicast stays off
                "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
                # no flashinfer in the payload: vLLM fails at start without this
                "VLLM_USE_FLASHINFER_SAMPLER": "0",
                "VLLM_LOGGING_LEVEL": "DEBUG", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
                "PYTHONPATH": os.path.join(HERE, "probe") + os.pathsep + env.get("PYTHONPATH", "")})
    env.update(row.get("env_extra", {}))
    return env


def run_row(row: dict, deadline: float) -> dict:
    rid = row["id"]
    row = dict(row)
    row["model_dir"] = os.path.join(HERE, "models", row["model"])
    rf = f"{RESULTS}/{rid}.row.json"
    json.dump(row, open(rf, "w"))
    logf = f"{RESULTS}/{rid}.full.log"
    timeout = min(row.get("timeout_s", 300), deadline - time.time() - 5)
    script = "run_one.py" if row.get("kind", "llm") == "llm" else "serve_one.py"
    used_before = gpu_used_mib()
    t0 = time.time()
    killed = None
    with open(logf, "w") as lf:
        p = subprocess.Popen([sys.executable, os.path.join(HERE, script), rf], stdout=lf, stderr=subprocess.STDOUT,
                             env=env_for(row), start_new_session=True)
        while True:
            try:
                p.wait(timeout=1)
                break
            except subprocess.TimeoutExpired:
                pass
            if time.time() - t0 > timeout:
                killed = "timeout"
            elif row.get("fast"):
                try:
                    txt = open(logf, errors="replace").read()
                except OSError:
                    txt = ""
                if "Maximum concurrency for" in txt:
                    time.sleep(1)
                    killed = "fast: stopped after the KV cache size line"
            if killed:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
                p.wait()
                break
    wall = time.time() - t0
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        pass
    used_after = wait_gpu_free()
    txt = open(logf, errors="replace").read()
    res = {"id": rid, "ok": False}
    for line in txt.splitlines():
        if line.startswith("RESULT_JSON "):
            res = json.loads(line[len("RESULT_JSON "):])
    if killed:
        res["killed"] = killed
    res.update(memlog.parse(txt))
    if not res.get("ok") and not res.get("log_kv_tokens"):
        res["error_lines"] = [l[:600] for l in txt.splitlines()
                              if any(k in l for k in ("Error", "error:", "larger than", "out of memory"))][-8:]
    res["row"] = {k: v for k, v in row.items() if k != "model_dir"}
    res.update(runner_wall_s=round(wall, 1), gpu_used_mib_before=used_before, gpu_used_mib_after=used_after)
    # A row the command's deadline cut before vLLM sized its KV cache is not done: the next command runs it again.
    cut = killed == "timeout" and timeout < row.get("timeout_s", 300) and not res.get("log_kv_tokens")
    json.dump(res, open(f"{RESULTS}/{rid}{'.cut' if cut else ''}.json", "w"), indent=1, default=str)
    with open(f"{RESULTS}/{rid}.log", "w") as mf:
        mf.write("\n".join(memlog.keep(txt)) + "\n")
    return res


def main() -> None:
    matrix = json.load(open(sys.argv[1]))
    deadline = float(sys.argv[2])
    os.makedirs(RESULTS, exist_ok=True)
    for row in matrix:
        rid = row["id"]
        if os.path.exists(f"{RESULTS}/{rid}.json"):
            continue
        left = deadline - time.time()
        if left < row.get("min_s", 60):
            print(f"[runner] stop: {left:.0f}s left < {row.get('min_s', 60)}s for {rid}", flush=True)
            break
        res = run_row(row, deadline)
        print(f"[runner] {rid} {res['runner_wall_s']}s ok={res.get('ok')} tokens={res.get('log_kv_tokens')} "
              f"blocks={res.get('num_gpu_blocks_logged')} kv={res.get('log_available_kv_gib')} "
              f"{res.get('killed', '')} {str(res.get('error', ''))[:240]}", flush=True)
        if res.get("serve"):
            print(f"[runner] {rid} serve: {json.dumps(res['serve'], default=str)[:900]}", flush=True)


if __name__ == "__main__":
    main()
