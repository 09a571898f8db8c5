"""A real two-"node" vLLM group: two CPU vLLM processes, a leader on 127.0.0.1 that serves the API and a headless
worker on 127.0.0.2 (VLLM_HOST_IP), pipeline parallel 2 over the tiny test model's two layers, answer a completion.

Each process gets the multi-node arguments the operator emits for a group (--pipeline-parallel-size, --nnodes,
--node-rank, --master-addr, --master-port, and --headless for the worker), expanded as the kubelet expands them
from the LeaderWorkerSet's variables (LWS_WORKER_INDEX 0 and 1, LWS_LEADER_ADDRESS the leader's address). Only
the coordination port is a free one instead of 29500 (the machine is shared), and the engine's CPU arguments are
the test bed's (float32, a short context).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from e2e.testbed import vllm_env
from e2e.testbed.controlplane import wait_for
from e2e.testbed.procs import free_ports
from tests.unit.test_vllm_snapshots import example_plans, kubelet_args

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[1]
GROUP_FLAGS = ("--pipeline-parallel-size", "--nnodes", "--node-rank", "--master-addr", "--master-port")


def group_args(rank: int, leader: str, port: int) -> list[str]:
    """The operator's multi-node flags of the 70B example's group, for pod `rank`, with `leader` as the address
    LWS gives the leader and the coordination port moved to `port`."""
    [plan] = [p for p in example_plans() if p.name == "llama-70b"]
    args = kubelet_args(plan, rank)
    out: list[str] = []
    for flag in GROUP_FLAGS:
        value = args[args.index(flag) + 1]
        out += [flag, {"--master-addr": leader, "--master-port": str(port)}.get(flag, value)]
    return out + (["--headless"] if "--headless" in args else [])


def start(argv: list[str], host_ip: str, log: Path) -> subprocess.Popen:
    python = vllm_env.ensure_vllm()
    env = vllm_env._vllm_env({"VLLM_TARGET_DEVICE": "cpu", "VLLM_HOST_IP": host_ip, "GLOO_SOCKET_IFNAME": "lo"})
    with open(log, "ab") as out:
        return subprocess.Popen([str(python), str(ROOT / "e2e" / "testbed" / "vllm_cli.py"), *argv],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the process's own group (its engine processes), SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.mark.timeout(1200)
def test_a_leader_and_a_headless_worker_serve_a_completion_with_pipeline_parallel_2(tmp_path):
    api_port, coordination = free_ports(2)
    common = ["serve", str(vllm_env.tiny_model_dir()), "--served-model-name", "tiny", "--dtype", "float32",
              "--max-model-len", "512", "--max-num-seqs", "2"]
    leader_args = [*common, *group_args(0, "127.0.0.1", coordination), "--host", "127.0.0.1", "--port", str(api_port)]
    worker_args = [*common, *group_args(1, "127.0.0.1", coordination)]
    assert worker_args[-1] == "--headless" and "--pipeline-parallel-size" in worker_args
    logs = {"leader": tmp_path / "leader.log", "worker": tmp_path / "worker.log"}
    procs = [start(leader_args, "127.0.0.1", logs["leader"]), start(worker_args, "127.0.0.2", logs["worker"])]
    try:
        def healthy() -> bool:
            for proc, (role, log) in zip(procs, logs.items()):
                if proc.poll() is not None:
                    raise AssertionError(f"the {role} exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{api_port}/health", timeout=5) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(healthy, 900, "the group's API (leader and worker joined)", interval=2.0)
        body = json.dumps({"model": "tiny", "prompt": "Hello, my name is", "max_tokens": 8, "temperature": 0})
        request = urllib.request.Request(f"http://127.0.0.1:{api_port}/v1/completions", data=body.encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as r:
            answer = json.loads(r.read())
        assert answer["usage"]["completion_tokens"] == 8
        assert "pp2" in answer["system_fingerprint"]  # vLLM's own record of the pipeline
        worker_log = logs["worker"].read_text()
        assert "headless" in worker_log and "PP rank 1" in worker_log
    finally:
        for proc in procs:
            stop(proc)
        print({role: log.read_text()[-2000:] for role, log in logs.items()}, file=sys.stderr)
