"""spec.adapters end to end, with real parts only: kube-apiserver, the operator process, real vLLM 0.32 CPU servers as
the pods (started by the fake kubelet on each pod's own 127.x.y.z address with the LoRA flags and the environment the
operator put in the pod, Ready once /health answers) serving the tiny model, and tiny PEFT adapters made for it
(tools/make_tiny_adapters.py). The adapters' sources are absolute paths, as a path in the pod's cache volume or a
mounted volume would be (here the host's path plays the pod's).

One server goes through the story, in order:

1. two adapters in the spec: the operator loads both on the ready pod, status.adapters says 1 of 1 each,
   servedModels lists them, a completion naming one is answered;
2. a third adapter and a broken one (no such directory) added: the third is served without a restart (the pod's uid
   and restart count unchanged), the broken one is named in AdaptersReady, status and an Event while the others
   keep serving;
3. one adapter and the broken one removed: vLLM answers 404 for the removed one, without a restart;
4. a second replica: its fresh vLLM gets the adapters (status 2 of 2), and answers for them;
5. pod 0 deleted and recreated (a fresh vLLM on it): it gets its adapters back.

Then, beside the story: the LoRA slots' memory the planner computes (adapters.LoRALayout) is the bytes vLLM's CPU
engine allocated for them, summed over its LoRA layers' own tensors, for two configurations.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

import pytest
from kubernetes import client

from e2e.testbed import lora_adapters, vllm_env
from e2e.testbed.controlplane import wait_for
from e2e.testbed.convergence import wait_established
from e2e.testbed.fakekubelet import FakeKubelet, free_loopback_ips
from e2e.testbed.operator_process import OperatorProcess
from vllm_operator import adapters
from vllm_operator.kube.client import Kube

pytestmark = [pytest.mark.apiserver, pytest.mark.vllm, pytest.mark.story]

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "vllmservers.vllm-operator.io.yaml"
GROUP_PATH = "/apis/vllm-operator.io/v1alpha1"
NAME = "lora"
SERVED = "tiny"
LOAD_TIMEOUT = 480  # one vLLM start on 2 busy cores (about 80 s when idle)
#: The pod's flags vLLM is started with (the operator's), and its environment variable.
LORA_FLAGS = ("--enable-lora", "--max-loras", "--max-cpu-loras", "--max-lora-rank")


class LoRAPods:
    """The fake kubelet's pods as real vLLM servers started with the pod's own LoRA flags and environment."""

    def __init__(self, namespace: str, logdir: Path):
        self.namespace, self.logdir = namespace, logdir
        self.kubelet: Optional[FakeKubelet] = None
        self.servers: dict[str, vllm_env.VLLMProcess] = {}  # by pod name
        self.errors: list[str] = []
        self.started: list[tuple[str, list[str], dict[str, str]]] = []
        self._lock = threading.Lock()

    def on_pod_start(self, pod, ip: str) -> bool:
        name = pod.metadata.name
        container = pod.spec.containers[0]
        args, env = list(container.args or []), {e.name: e.value for e in container.env or [] if e.value}
        extra = []
        for i, a in enumerate(args):
            if a == "--enable-lora":
                extra.append(a)
            elif a in LORA_FLAGS:
                extra += [a, args[i + 1]]
        own_env = {adapters.RUNTIME_ENV: env[adapters.RUNTIME_ENV]} if adapters.RUNTIME_ENV in env else {}
        with self._lock:
            old = self.servers.pop(name, None)
            if old is not None:
                old.stop(grace=5)
            self.kubelet.set_ready(self.namespace, name, False)  # Ready only once this pod's vLLM answers
            self.started.append((name, extra, own_env))
            server = self.servers[name] = vllm_env.start_vllm(
                ip, 8000, served_name=SERVED, max_num_seqs=2, max_model_len=512, extra_args=extra, env=own_env,
                log_path=self.logdir / f"vllm-{name}-{len(self.started)}.log")
        threading.Thread(target=self._become_ready, args=(name, server), daemon=True).start()
        return False

    def _become_ready(self, name: str, server: vllm_env.VLLMProcess) -> None:
        try:
            server.wait_healthy(timeout=LOAD_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(f"{name}: {e}: {server.log_tail()[-2000:]}")
            return
        self.kubelet.set_ready(self.namespace, name, True)

    def on_pod_stop(self, pod, ip: str) -> None:
        with self._lock:
            server = self.servers.pop(pod.metadata.name, None)
        if server is not None:
            threading.Thread(target=server.stop, kwargs={"grace": 5}, daemon=True).start()

    def close(self) -> None:
        for server in self.servers.values():
            server.stop(grace=5)


@pytest.fixture(scope="module")
def stack(control_plane, k8s, tmp_path_factory):
    vllm_env.ensure_vllm()
    made = lora_adapters.adapters_dir()
    work = tmp_path_factory.mktemp("adapters-e2e")
    control_plane.kubectl("apply", "-f", str(CRD))
    wait_established(control_plane, "vllmservers.vllm-operator.io")
    namespace = f"lora-{os.getpid()}-{random.randint(0, 9999)}"
    core = client.CoreV1Api(k8s)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    wait_for(lambda: core.read_namespaced_service_account("default", namespace), 60, "default ServiceAccount")
    pods = LoRAPods(namespace, work)
    kubelet = FakeKubelet(k8s, namespace=namespace, node_name=f"gpu-{namespace}"[:60], gpu_product="NVIDIA-L4",
                          ip_pool=free_loopback_ips(3), on_pod_start=pods.on_pod_start, on_pod_stop=pods.on_pod_stop,
                          auto_ready=False)
    pods.kubelet = kubelet
    kubelet.start()
    operator = OperatorProcess(control_plane.kubeconfig, work / "operator.log", resync_seconds=3).start()
    st = {"namespace": namespace, "pods": pods, "kubelet": kubelet, "kube": Kube(k8s), "cp": control_plane,
          "adapters": made, "operator": operator}
    try:
        yield st
    finally:
        try:
            body = server(st)
            print("--- status\n" + json.dumps(body.get("status"), indent=1)[:6000])
            print(f"--- vLLM starts: {pods.started}; kubelet errors: {kubelet.errors[-10:]}")
        except Exception as e:  # noqa: BLE001 - a report, never a second failure
            print(f"(no status: {e})")
        operator.stop()
        kubelet.stop()
        pods.close()
        control_plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        print("--- operator log tail\n" + operator.log_tail(60))
        assert not pods.errors, pods.errors


# --------------------------------------------------------------------------- helpers
def server(st) -> dict:
    return st["kube"].request("GET", f"{GROUP_PATH}/namespaces/{st['namespace']}/vllmservers/{NAME}")


def cond(body: dict, type_: str) -> dict:
    return next((c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def adapter(st, name: str, rank: int) -> dict[str, Any]:
    return {"name": name, "source": str(st["adapters"] / name), "rank": rank}


def set_adapters(st, entries: list[dict[str, Any]], replicas: int = 1) -> None:
    patch = {"spec": {"adapters": entries, "replicas": replicas}}
    st["kube"].request("PATCH", f"{GROUP_PATH}/namespaces/{st['namespace']}/vllmservers/{NAME}", body=patch,
                       content_type="application/merge-patch+json")


def rows(st) -> dict[str, dict]:
    return {r["name"]: r for r in (server(st).get("status") or {}).get("adapters") or []}


def wait_status(st, want: dict[str, tuple[int, int]], timeout: float = 180) -> dict[str, dict]:
    """Until status.adapters holds exactly these adapters, each loaded on (loaded, replicas)."""
    def ok():
        found = rows(st)
        return found if {k: (v["loaded"], v["replicas"]) for k, v in found.items()} == want else None
    return wait_for(ok, timeout, f"status.adapters {want}", interval=1)


def pod(st, name: str) -> dict:
    return st["kube"].get("v1", "Pod", st["namespace"], name)


def incarnation(st, name: str) -> tuple[str, int]:
    p = pod(st, name)
    return p["metadata"]["uid"], sum(c.get("restartCount", 0) for c in p["status"].get("containerStatuses") or [])


def complete(st, pod_name: str, model: str) -> tuple[int, dict]:
    ip = st["kubelet"].pod_ip(st["namespace"], pod_name)
    request = urllib.request.Request(f"http://{ip}:8000/v1/completions", method="POST",
                                     data=json.dumps({"model": model, "prompt": "the cat", "max_tokens": 4}).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, {}


def ready(st, name: str) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod(st, name)["status"].get("conditions") or [])


# --------------------------------------------------------------------------- the story
@pytest.mark.timeout(900)
def test_1_adapters_are_loaded_and_answer(stack):
    st = stack
    doc = {"apiVersion": "vllm-operator.io/v1alpha1", "kind": "VLLMServer",
           "metadata": {"name": NAME, "namespace": st["namespace"]},
           "spec": {"model": {"name": "meta-llama/Llama-3.2-3B-Instruct", "servedName": SERVED},
                    "gpu": {"count": 1, "product": "NVIDIA-L4"}, "engine": {"maxNumSeqs": 2},
                    "adapters": [adapter(st, "sql", 8), adapter(st, "chat", 16)]}}
    st["cp"].kubectl("apply", "-f", "-", input=json.dumps(doc))
    wait_for(lambda: ready(st, f"{NAME}-0"), LOAD_TIMEOUT + 60, "pod 0 serving (real vLLM loaded)", interval=1)
    [(_, flags, env)] = st["pods"].started
    assert flags == ["--enable-lora", "--max-loras", "4", "--max-cpu-loras", "32", "--max-lora-rank", "16"]
    assert env == {adapters.RUNTIME_ENV: "True"}
    wait_status(st, {"sql": (1, 1), "chat": (1, 1)})
    body = wait_for(lambda: (lambda b: b if cond(b, "AdaptersReady").get("status") == "True" else None)(server(st)),
                    60, "AdaptersReady True")
    assert body["status"]["servedModels"] == [SERVED, "sql", "chat"]
    status, answer = complete(st, f"{NAME}-0", "sql")
    assert status == 200 and answer["model"] == "sql", answer
    assert complete(st, f"{NAME}-0", SERVED)[0] == 200
    st["first"] = incarnation(st, f"{NAME}-0")


@pytest.mark.timeout(600)
def test_2_an_added_adapter_is_served_without_a_restart_and_a_broken_one_is_named(stack):
    st = stack
    missing = {"name": "broken", "source": str(st["adapters"] / "no-such-adapter"), "rank": 8}
    set_adapters(st, [adapter(st, "sql", 8), adapter(st, "chat", 16), adapter(st, "poem", 8), missing])
    found = wait_for(lambda: (lambda r: r if r.get("poem", {}).get("loaded") == 1 and r.get("broken", {}).get(
        "lastError") else None)(rows(st)), 180, "poem loaded, broken failed", interval=1)
    assert found["broken"]["loaded"] == 0
    assert found["broken"]["lastError"].startswith(f"{NAME}-0: load: HTTP 4"), found
    ready_cond = wait_for(lambda: (lambda c: c if c.get("reason") == "AdapterLoadFailed" else None)(
        cond(server(st), "AdaptersReady")), 60, "AdaptersReady names the broken adapter")
    assert ready_cond["status"] == "False" and "broken" in ready_cond["message"]
    assert "keep serving" in ready_cond["message"]
    events = wait_for(lambda: [e for e in st["kube"].list("v1", "Event", st["namespace"])
                               if e["reason"] == "AdapterLoadFailed"], 60, "AdapterLoadFailed event")
    assert "broken" in events[0]["message"] and events[0]["type"] == "Warning"
    for name in ("poem", "sql", "chat"):
        assert complete(st, f"{NAME}-0", name)[0] == 200, name
    assert server(st)["status"]["servedModels"] == [SERVED, "sql", "chat", "poem"]
    assert incarnation(st, f"{NAME}-0") == st["first"], "the pod was restarted"
    assert len(st["pods"].started) == 1, "a second vLLM was started"


@pytest.mark.timeout(600)
def test_3_a_removed_adapter_is_gone_without_a_restart(stack):
    st = stack
    set_adapters(st, [adapter(st, "sql", 8), adapter(st, "poem", 8)])
    wait_status(st, {"sql": (1, 1), "poem": (1, 1)})
    wait_for(lambda: complete(st, f"{NAME}-0", "chat")[0] == 404, 120, "chat unloaded (404)", interval=1)
    assert complete(st, f"{NAME}-0", "sql")[0] == 200
    wait_for(lambda: cond(server(st), "AdaptersReady").get("status") == "True", 60, "AdaptersReady True again")
    assert incarnation(st, f"{NAME}-0") == st["first"], "the pod was restarted"
    assert len(st["pods"].started) == 1


@pytest.mark.timeout(900)
def test_4_a_second_replica_gets_the_adapters(stack):
    st = stack
    set_adapters(st, [adapter(st, "sql", 8), adapter(st, "poem", 8)], replicas=2)
    wait_for(lambda: ready(st, f"{NAME}-1"), LOAD_TIMEOUT + 60, "pod 1 serving", interval=1)
    wait_status(st, {"sql": (2, 2), "poem": (2, 2)})
    assert complete(st, f"{NAME}-1", "poem")[0] == 200
    assert complete(st, f"{NAME}-1", "chat")[0] == 404


@pytest.mark.timeout(900)
def test_5_a_recreated_pod_gets_its_adapters_back(stack):
    st = stack
    uid = pod(st, f"{NAME}-0")["metadata"]["uid"]
    st["kube"].request("DELETE", f"/api/v1/namespaces/{st['namespace']}/pods/{NAME}-0")
    wait_for(lambda: pod(st, f"{NAME}-0")["metadata"]["uid"] != uid and ready(st, f"{NAME}-0"), LOAD_TIMEOUT + 120,
             "pod 0 recreated and serving", interval=1)
    wait_status(st, {"sql": (2, 2), "poem": (2, 2)})
    assert complete(st, f"{NAME}-0", "sql")[0] == 200


# --------------------------------------------------------------------------- the memory formula
MEASURE = r'''
import json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
import torch
from vllm import LLM

def lora_bytes(model):
    storages = {}  # a view (embed_tokens' lora_a_stacked_2d) shares its tensor's storage: counted once
    for module in model.modules():
        if not type(module).__name__.endswith("WithLoRA"):
            continue
        for value in vars(module).values():
            for t in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(t, torch.Tensor):
                    storage = t.untyped_storage()
                    storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())

out = []
for slots, rank in json.loads(sys.argv[2]):
    llm = LLM(model=sys.argv[1], dtype="float32", enable_lora=True, max_loras=slots, max_lora_rank=rank,
              max_model_len=256, max_num_seqs=2, enforce_eager=True)
    out.append(llm.apply_model(lora_bytes)[0])
    del llm
print("RESULT " + json.dumps(out))
'''


@pytest.mark.timeout(900)
def test_the_lora_slots_memory_is_what_vllm_allocates(tmp_path):
    """The planner's LoRALayout over the tiny model's config, beside the bytes of every tensor vLLM's LoRA layers
    hold (their stacked A and B per slot and slice; each storage once), on the real CPU engine."""
    from vllm_operator import api
    python = vllm_env.ensure_vllm()
    model = vllm_env.tiny_model_dir()
    cfg = json.loads((model / "config.json").read_text())
    arch = api.ModelArchitecture.model_validate({
        "numLayers": cfg["num_hidden_layers"], "numAttentionHeads": cfg["num_attention_heads"],
        "numKVHeads": cfg["num_key_value_heads"], "vocabSize": cfg["vocab_size"], "headDim": cfg.get("head_dim") or cfg["hidden_size"] //
        cfg["num_attention_heads"], "hiddenSize": cfg["hidden_size"], "intermediateSize": cfg["intermediate_size"]})
    configs = [(1, 16), (3, 32)]
    script = tmp_path / "measure.py"
    script.write_text(MEASURE)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run([str(python), str(script), str(model), json.dumps(configs)], capture_output=True,
                          text=True, timeout=840, env=env, cwd=tmp_path)
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, done.stdout[-3000:] + done.stderr[-5000:]
    measured = json.loads(lines[-1][len("RESULT "):])
    planned = [adapters.LoRALayout(slots=s, rank=r, elem=4).bytes_per_gpu(arch, 1) for s, r in configs]  # float32
    print(f"LoRA slots: planned {planned}, vLLM allocated {measured}")
    assert measured == planned
