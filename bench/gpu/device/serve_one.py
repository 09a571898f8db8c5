"""One operator pod on the GPU machine: `vllm serve` with exactly the args and environment the operator renders for
a VLLMServer (bench/gpu/render.py), plus --load-format dummy (no weights exist there), then what the pod's probes,
the autoscaler and a rollout see of it.

Usage (GPU machine): python3 serve_one.py ROW_JSON
ROW_JSON: {"id", "model_dir" (config.json), "model_id" (the Hub id the args name), "args" (after `vllm serve`),
"env" (the container's env, values only), "startup_budget_s", "shutdown_timeout_s", "grace_s", "metrics_query",
"served_name", "drain_tokens"}
Steps: lay the model's config.json and a word-level tokenizer of the model's vocabulary into HF_HOME's hub cache as
the download container would, start the server, poll /health (the startup probe's budget), scrape /metrics the way
the autoscaler does, ask for a completion, with spec.adapters load a random adapter of each rank through the pods'
runtime endpoint, ask it and unload it, then stream a p95-long answer and send SIGTERM mid-stream: the stream
must finish (drain) within --shutdown-timeout and the server exit. Prints 'RESULT_JSON {...}'.
"""
import hashlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

PORT = 8000
#: The prompts go as token ids (/v1/completions takes a list of ints), so no tokenizer splits them: transformers 5
#: loaded the word-level tokenizer of a Qwen2 model as its own BPE class, which turned "w10 w11 w12 w13" into no
#: tokens at all (e-qwen-32b-awq in the second GPU session: "The decoder prompt cannot be empty"; this change has not
#: run on the GPU yet).
PROMPT_IDS = [10, 11, 12, 13]


def tokenizer_files(vocab_size: int, special_ids: dict | None = None) -> dict:
    """A word-level tokenizer with one word per id of the model's vocabulary ('w<id>'), so any sampled id decodes.
    `special_ids`: more special tokens at the ids config.json gives them (a vision-language model's image tokens)."""
    specials = ["<unk>", "<s>", "</s>"]
    at = {i: t for i, t in enumerate(specials)}
    at.update({i: t for t, i in (special_ids or {}).items()})
    vocab = {at.get(i, f"w{i}"): i for i in range(vocab_size)}
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, t in sorted(at.items())]
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
           "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
           "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "model_max_length": 10**7,
              "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}"}
    return {"tokenizer.json": json.dumps(tok), "tokenizer_config.json": json.dumps(config)}


def lay_out_hub_cache(hf_home: str, model_id: str, model_dir: str) -> str:
    config = json.load(open(os.path.join(model_dir, "config.json")))
    vocab = (config.get("text_config") or {}).get("vocab_size") or config["vocab_size"]
    rev = hashlib.sha1(model_id.encode()).hexdigest()
    repo = os.path.join(hf_home, "hub", "models--" + model_id.replace("/", "--"))
    snap = os.path.join(repo, "snapshots", rev)
    os.makedirs(snap, exist_ok=True)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    open(os.path.join(repo, "refs", "main"), "w").write(rev)
    for name in os.listdir(model_dir):
        open(os.path.join(snap, name), "w").write(open(os.path.join(model_dir, name)).read())
    for name, text in tokenizer_files(vocab).items():
        open(os.path.join(snap, name), "w").write(text)
    return snap


def make_adapter(where: str, model_dir: str, model_id: str, rank: int) -> str:
    """A LoRA adapter of the model's shapes (q_proj and v_proj of every layer, random A and B) as peft writes one:
    adapter_config.json and adapter_model.safetensors (what an adapter of spec.adapters holds)."""
    import torch
    from safetensors.torch import save_file
    c = json.load(open(os.path.join(model_dir, "config.json")))
    c = c.get("text_config") or c
    hidden, heads, kv = c["hidden_size"], c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    head = c.get("head_dim") or hidden // heads
    g = torch.Generator().manual_seed(rank)
    tensors = {}
    for i in range(c["num_hidden_layers"]):
        for proj, out in (("q_proj", heads * head), ("v_proj", kv * head)):
            key = f"base_model.model.model.layers.{i}.self_attn.{proj}"
            tensors[f"{key}.lora_A.weight"] = (torch.randn(rank, hidden, generator=g) * 0.01).to(torch.bfloat16)
            tensors[f"{key}.lora_B.weight"] = (torch.randn(out, rank, generator=g) * 0.01).to(torch.bfloat16)
    os.makedirs(where, exist_ok=True)
    save_file(tensors, os.path.join(where, "adapter_model.safetensors"))
    json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0,
               "target_modules": ["q_proj", "v_proj"], "bias": "none", "base_model_name_or_path": model_id,
               "fan_in_fan_out": False, "modules_to_save": None},
              open(os.path.join(where, "adapter_config.json"), "w"))
    return where


def adapters_at_runtime(row: dict, s: dict) -> None:
    """spec.adapters on a running pod, as the operator does it (docs/adapters.md, "At runtime"): POST
    /v1/load_lora_adapter with a name and a path, the adapter listed by /v1/models, a completion naming it, then
    POST /v1/unload_lora_adapter and the name answered 404. Adapters of the spec's ranks, made here (random)."""
    out = s["adapters"] = []
    for a in row["adapters"]:
        r: dict = {"name": a["name"], "rank": a["rank"]}
        out.append(r)
        try:
            path = make_adapter(f"/root/adapters/{a['name']}", row["model_dir"], row["model_id"], a["rank"])
        except Exception as e:
            r["error"] = f"making it: {e!r}"[:300]
            continue
        t = time.time()
        code, body = post("/v1/load_lora_adapter", {"lora_name": a["name"], "lora_path": path}, timeout=120)
        r["load_status"], r["load_s"], r["load_body"] = code, round(time.time() - t, 2), body[:200].decode(errors="replace")
        code, body = get("/v1/models")
        try:
            r["listed"] = [m["id"] for m in json.loads(body)["data"] if m.get("parent")]
        except Exception:
            r["listed"] = None
        t = time.time()
        code, body = post("/v1/completions", {"model": a["name"], "prompt": PROMPT_IDS, "max_tokens": 16,
                                              "ignore_eos": True, "temperature": 0})
        r["completion_status"], r["completion_s"] = code, round(time.time() - t, 2)
        try:
            r["completion_tokens"] = json.loads(body)["usage"]["completion_tokens"]
        except Exception:
            r["completion_body"] = body[:300].decode(errors="replace")
    for r in out[1:]:  # the first stays loaded while the stream drains; the others are unloaded
        if r.get("load_status") != 200:
            continue
        code, body = post("/v1/unload_lora_adapter", {"lora_name": r["name"]})
        r["unload_status"] = code
        code, body = post("/v1/completions", {"model": r["name"], "prompt": PROMPT_IDS, "max_tokens": 4})
        r["after_unload_status"] = code


def stand_in_files(env: dict) -> list:
    """A path the pod gets from a mounted volume (SSL_CERT_FILE from a Secret) stood in by this machine's CA bundle:
    what a start needs of it is a readable bundle."""
    made = []
    path = env.get("SSL_CERT_FILE")
    if path and not os.path.exists(path):
        for src in ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"):
            if os.path.exists(src):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                open(path, "w").write(open(src).read())
                made.append(f"SSL_CERT_FILE {path}: {src}")
                break
        else:
            try:
                import certifi
                os.makedirs(os.path.dirname(path), exist_ok=True)
                open(path, "w").write(open(certifi.where()).read())
                made.append(f"SSL_CERT_FILE {path}: certifi")
            except Exception as e:
                made.append(f"SSL_CERT_FILE {path}: none ({e!r})")
    return made


def get(path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}{path}", timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except Exception as e:
        return -1, repr(e).encode()


def post(path: str, body: dict, timeout: float = 60.0) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except Exception as e:
        return -1, repr(e).encode()


def stream(body: dict, events: list, done: threading.Event) -> None:
    """Read one streamed completion: (time, completion tokens so far, finish_reason) per chunk."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=600)
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        events.append((time.time(), "status", resp.status))
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                events.append((time.time(), "done", None))
                break
            chunk = json.loads(data)
            usage = chunk.get("usage") or {}
            choice = (chunk.get("choices") or [{}])[0]
            events.append((time.time(), usage.get("completion_tokens"), choice.get("finish_reason")))
    except Exception as e:
        events.append((time.time(), "error", repr(e)))
    finally:
        done.set()


def main() -> None:
    row = json.load(open(sys.argv[1]))
    res: dict = {"id": row["id"], "ok": False, "serve": {}}
    s = res["serve"]
    env = dict(os.environ)
    env.update(row["env"])
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    env["VLLM_LOGGING_LEVEL"] = "INFO"
    for d in (env.get("HOME"), env.get("HF_HOME")):
        if d:
            os.makedirs(d, exist_ok=True)
    lay_out_hub_cache(env["HF_HOME"], row["model_id"], row["model_dir"])
    s["stood_in"] = stand_in_files(env)
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", *row["args"], "--load-format", "dummy"]
    s["argv"] = argv[3:]
    t0 = time.time()
    server = subprocess.Popen(argv, env=env, stdout=sys.stdout, stderr=subprocess.STDOUT, start_new_session=True)
    # The probe's budget is what a pod gets; with random weights a start that takes more than 300 s here is
    # broken, so the wait stops there (and says so) rather than spend the device's time.
    budget = min(row["startup_budget_s"], 300)
    while time.time() - t0 < budget:
        if server.poll() is not None:
            break
        code, _ = get("/health", 2)
        if code == 200:
            s["ready_s"] = round(time.time() - t0, 1)
            break
        time.sleep(0.5)
    s["startup_budget_s"] = row["startup_budget_s"]
    if "ready_s" not in s:
        s["exit_code_before_ready"] = server.poll()
        res["error"] = "not ready within the startup probe's budget" if server.poll() is None else "exited"
        os.killpg(server.pid, signal.SIGKILL)
        print("RESULT_JSON " + json.dumps(res), flush=True)
        return
    code, body = get("/metrics/?" + row["metrics_query"])
    text = body.decode(errors="replace")
    s["metrics_filtered_status"], s["metrics_filtered_bytes"] = code, len(body)
    s["families"] = sorted(set(re.findall(r"^# TYPE (\S+)", text, re.M)))
    s["metrics_filtered"] = [line for line in text.splitlines() if line and not line.startswith("#")][:20]
    info = re.search(r"^vllm:cache_config_info\{([^}]*)\}", text, re.M)
    if info:
        labels = dict(re.findall(r'(\w+)="([^"]*)"', info.group(1)))
        s["cache_config_info"] = {k: labels.get(k) for k in ("num_gpu_blocks", "block_size", "cache_dtype",
                                                               "gpu_memory_utilization", "enable_prefix_caching")}
        try:
            s["measured_kv_tokens"] = int(labels["num_gpu_blocks"]) * int(labels["block_size"])
        except (KeyError, ValueError):
            pass
    code, body = get("/metrics")
    s["metrics_full_status"], s["metrics_full_bytes"] = code, len(body)
    served = row["served_name"]
    t = time.time()
    code, body = post("/v1/completions", {"model": served, "prompt": PROMPT_IDS, "max_tokens": 32,
                                          "ignore_eos": True, "temperature": 0})
    s["completion_status"], s["completion_s"] = code, round(time.time() - t, 2)
    try:
        answer = json.loads(body)
        s["completion_text"] = answer["choices"][0]["text"][:160]
        s["completion_usage"] = answer.get("usage")
    except Exception:
        s["completion_body"] = body[:400].decode(errors="replace")
    if row.get("adapters"):
        try:
            adapters_at_runtime(row, s)
        except Exception as e:
            s["adapters_error"] = repr(e)[:400]
    # A p95-long answer, streamed; SIGTERM once it is decoding (as the kubelet sends it after the preStop sleep).
    n = row["drain_tokens"]
    events: list = []
    done = threading.Event()
    body = {"model": served, "prompt": PROMPT_IDS, "max_tokens": n, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    th = threading.Thread(target=stream, args=(body, events, done), daemon=True)
    th.start()
    t_stream = time.time()
    while time.time() - t_stream < 30 and not done.is_set():
        toks = [e[1] for e in events if isinstance(e[1], int)]
        if toks and toks[-1] >= min(64, n // 4):
            break
        time.sleep(0.02)
    t_term = time.time()
    tokens_at_term = max([e[1] for e in events if isinstance(e[1], int)] or [0])
    server.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    code, body = post("/v1/completions", {"model": served, "prompt": [1], "max_tokens": 4}, timeout=5)
    s["new_request_after_sigterm"] = {"status": code, "body": body[:200].decode(errors="replace")}
    done.wait(row["shutdown_timeout_s"] + 30)
    t_end = time.time()
    try:
        server.wait(timeout=max(5, row["shutdown_timeout_s"] + 20 - (time.time() - t_term)))
        s["server_exit_code"] = server.returncode
        s["server_exit_after_sigterm_s"] = round(time.time() - t_term, 2)
    except subprocess.TimeoutExpired:
        s["server_exit_code"] = None
        os.killpg(server.pid, signal.SIGKILL)
    toks = [(e[0], e[1]) for e in events if isinstance(e[1], int)]
    finish = [e[2] for e in events if isinstance(e[1], int) and e[2]]
    s["stream"] = {"max_tokens": n, "tokens_at_sigterm": tokens_at_term,
                   "tokens_received": toks[-1][1] if toks else 0, "finish_reason": finish[-1] if finish else None,
                   "done_marker": any(e[1] == "done" for e in events),
                   "errors": [e[2] for e in events if e[1] == "error"],
                   "stream_end_after_sigterm_s": round(t_end - t_term, 2), "shutdown_timeout_s": row["shutdown_timeout_s"]}
    if len(toks) > 10:
        (ta, ka), (tb, kb) = toks[1], toks[-1]
        s["decode_tokens_per_s"] = round((kb - ka) / (tb - ta), 1) if tb > ta else None
        before = [(t, k) for t, k in toks if t <= t_term]
        if len(before) > 5:
            s["decode_tokens_per_s_before_sigterm"] = round((before[-1][1] - before[1][1]) /
                                                             max(1e-6, before[-1][0] - before[1][0]), 1)
    try:
        os.killpg(server.pid, signal.SIGKILL)
    except OSError:
        pass
    res["ok"] = bool(s.get("ready_s")) and s.get("completion_status") == 200
    print("RESULT_JSON " + json.dumps(res, default=str), flush=True)


if __name__ == "__main__":
    main()
