"""Routing through the Gateway API Inference Extension with real parts: the extension's CRDs on the test bed's
kube-apiserver, the InferencePool and the endpoint picker's RBAC as the operator builds them, the real endpoint
picker (cmd/epp of the pinned release) running with the operator's args and config (and -v 4, for its per-request
scores) under its ServiceAccount's token (so its Role is proved sufficient), and two real vLLM CPU servers as the
pool's pods (the fake kubelet starts one on each pod's own 127.x address, with the LoRA flags and environment the
operator puts in the pod).

The pool is shared by two VLLMServers, as docs/routing.md describes: "chat" owns it (the pool, the picker) and
serves a LoRA adapter, "chat-b" joins it (inferencePool.poolName: chat) without adapters. Both serve the model name
"tiny" behind the one pool.

No gateway data plane can be installed here: the test bed's gateway (e2e/testbed/epp.py) plays its part over the
picker's real ext_proc gRPC interface and forwards each request to the endpoint the picker chose.

The stories:

- by load: with one server's pod loaded (its vLLM queue holds requests) every request through the gateway goes to
  the other server's pod; then the other way round (so the route is served by both servers' pods);
- by adapter: the adapter "sql" is loaded on chat's pod only (by the operator's own adapter sync, through vLLM's
  runtime endpoint); once vLLM names it in vllm:lora_requests_info, every "sql" request through the gateway goes to
  that pod, by the picker's lora-affinity-scorer; a second picker with the operator's config for
  `loraAffinity: 0` (the baseline) sends some of the same requests to chat-b's pod, which answers 404; and with
  chat's pod loaded, the queue outweighs the affinity (a score, not a filter): the adapter's requests go to chat-b's
  pod and fail.
"""

from __future__ import annotations

import json
import os
import random
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.testbed import epp, lora_adapters, vllm_env
from e2e.testbed.controlplane import wait_for
from e2e.testbed.fakekubelet import FakeKubelet, free_loopback_ips
from e2e.testbed.loadgen import LoadGenerator
from e2e.testbed.serviceaccount import service_account_kubeconfig
from vllm_operator import api, builders, pipeline
from vllm_operator.controller.adapters import AdapterSync, list_adapters
from vllm_operator.kube.client import Kube
from vllm_operator.sources.vllm_metrics import PodRef, parse_vllm_metrics

pytestmark = [pytest.mark.apiserver, pytest.mark.vllm]

POOL = "chat"
JOINER = "chat-b"
PODS = ("chat-0", "chat-b-0")   # chat's pod (with the adapter), chat-b's pod (without)
ADAPTER, ADAPTER_RANK = "sql", 8
LOAD_TIMEOUT = 420   # one vLLM start on 2 busy cores
SPEC = {"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct", "servedName": "tiny"}, "gpu": {"product": "L4"},
        "routing": {"inferencePool": {"enabled": True}}}
#: The server that joins chat's pool: the same model name, no adapter.
JOINER_SPEC = {**SPEC, "routing": {"inferencePool": {"enabled": True, "poolName": POOL}}}
#: The vLLM flags of the operator's pod that the test bed's vLLM is started with (the rest are the test bed's own:
#: the tiny model, float32, the pod's address).


def with_adapter(adapter_dir: Path) -> dict[str, Any]:
    """chat's spec: the pool's owner, serving the tiny adapter "sql" (a path, as a path in the pod's cache would be)."""
    return {**SPEC, "adapters": [{"name": ADAPTER, "source": str(adapter_dir / ADAPTER), "rank": ADAPTER_RANK}]}


def plan_of(namespace: str, spec: dict[str, Any], name: str):
    plan = pipeline.plan_server(name, namespace, api.VLLMServerSpec.model_validate(spec))
    assert plan.fits, plan.problems
    return plan


def routing_objects(namespace: str, spec: dict[str, Any] = SPEC, name: str = POOL) -> dict[tuple[str, str], dict]:
    """The routing objects the operator builds for a server (kind, name) -> object, without owner references."""
    return {(o["kind"], o["metadata"]["name"]): o for o in builders.build_routing(plan_of(namespace, spec, name))}


def pool_pod(namespace: str, pod: str, plan) -> dict[str, Any]:
    """A pod of the server's StatefulSet, as far as the pool and the test bed's vLLM care: the template's labels
    (the pool's member label among them), the vLLM container's args and environment, port 8000."""
    template = builders.pod_template(plan)
    [vllm] = [c for c in template["spec"]["containers"] if c["name"] == "vllm"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": namespace, "labels": template["metadata"]["labels"]},
            "spec": {"containers": [{"name": "vllm", "image": vllm["image"], "args": vllm["args"],
                                     "env": [e for e in vllm.get("env", []) if "value" in e],
                                     "ports": [{"name": "http", "containerPort": 8000}]}]}}


class Servers:
    """The fake kubelet's hook: a real vLLM on each pod's address, Ready once /health answers."""

    def __init__(self, namespace: str, logdir: Path):
        self.namespace, self.logdir = namespace, logdir
        self.kubelet: Any = None
        self.by_pod: dict[str, vllm_env.VLLMProcess] = {}
        self.ip: dict[str, str] = {}
        self.errors: list[str] = []

    def on_pod_start(self, pod: client.V1Pod, ip: str) -> bool:
        name = pod.metadata.name
        extra, env = lora_adapters.pod_lora_launch(pod)
        server = vllm_env.start_vllm(ip, 8000, max_num_seqs=2, max_model_len=1024, extra_args=extra, env=env,
                                     log_path=self.logdir / f"vllm-{name}.log")
        self.by_pod[name], self.ip[name] = server, ip
        threading.Thread(target=self._ready, args=(name, server), daemon=True).start()
        return False

    def _ready(self, name: str, server: vllm_env.VLLMProcess) -> None:
        try:
            server.wait_healthy(timeout=LOAD_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(f"{name}: {e}")
            return
        self.kubelet.set_ready(self.namespace, name, True)

    def waiting(self, pod: str) -> float:
        return parse_vllm_metrics(pod, self.by_pod[pod].metrics_text(timeout=10), time.time()).waiting

    def quiet(self, pod: str) -> bool:
        """No request running or waiting (the previous case's load, cancelled, has drained)."""
        sample = parse_vllm_metrics(pod, self.by_pod[pod].metrics_text(timeout=10), time.time())
        return sample.waiting == 0 and sample.running == 0

    def close(self) -> None:
        for server in self.by_pod.values():
            server.stop(grace=10)


@pytest.fixture(scope="module")
def bed(control_plane, k8s, tmp_path_factory):
    vllm_env.ensure_vllm()
    work = tmp_path_factory.mktemp("routing-e2e")
    epp.install_crds(control_plane)
    namespace = f"routing-{os.getpid()}-{random.randint(0, 9999)}"
    core = client.CoreV1Api(k8s)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    wait_for(lambda: core.read_namespaced_service_account("default", namespace), 60, "default ServiceAccount")
    kube = Kube(k8s)
    adapter_dir = lora_adapters.adapters_dir()
    owner = plan_of(namespace, with_adapter(adapter_dir), POOL)
    joiner = plan_of(namespace, JOINER_SPEC, JOINER)
    assert builders.build_routing(joiner) == [], "a joining server emits no pool or picker of its own"
    objects = routing_objects(namespace, with_adapter(adapter_dir))
    for kind in ("ServiceAccount", "Role", "RoleBinding", "InferencePool"):
        [obj] = [o for (k, _), o in objects.items() if k == kind]
        kube.apply(obj)
    servers = Servers(namespace, work)
    kubelet = FakeKubelet(k8s, namespace=namespace, node_name=f"n-{namespace}"[:60], ip_pool=free_loopback_ips(2),
                          on_pod_start=servers.on_pod_start, auto_ready=False)
    servers.kubelet = kubelet
    kubelet.start()
    picker = gateway = None
    try:
        kube.apply(pool_pod(namespace, "chat-0", owner))
        kube.apply(pool_pod(namespace, "chat-b-0", joiner))
        deployment = objects[("Deployment", builders.picker_name(POOL))]
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        kubeconfig = service_account_kubeconfig(control_plane, namespace, builders.picker_name(POOL),
                                                work / "picker.kubeconfig")
        # -v 4 (debug) beside the operator's args: the picker logs each scorer's score of each pod for every request
        # it schedules, which the adapter case waits on.
        picker = epp.Picker([*container["args"], "--v", "4"], kubeconfig, work / "picker", namespace)
        picker.wait_serving()
        gateway = epp.Gateway(picker, work)
        gateway.wait_listening()
        yield {"namespace": namespace, "servers": servers, "picker": picker, "gateway": gateway,
               "kubelet": kubelet, "kube": kube, "work": work, "kubeconfig": kubeconfig, "adapter_dir": adapter_dir}
    finally:
        for proc in (gateway, picker):
            if proc is not None:
                print(f"--- {proc.cmd[0]}\n{proc.log_tail(30)}")
                proc.stop()
        kubelet.stop()
        servers.close()
        core.delete_namespace(namespace)


def _all_ready(bed) -> None:
    servers = bed["servers"]
    wait_for(lambda: (servers.errors and pytest.fail("; ".join(servers.errors)))
             or (len(bed["kubelet"].running_pods) == 2 and all(
                 servers.by_pod[p].is_healthy() for p in PODS) and _picker_sees(bed, 2)),
             LOAD_TIMEOUT + 60, "both vLLM pods Ready and in the picker's pool", interval=2)


def _picker_sees(bed, n: int) -> bool:
    for line in bed["picker"].metrics_text().splitlines():
        if line.startswith("inference_pool_ready_pods"):
            return float(line.rsplit(" ", 1)[1]) >= n
    return False


def _endpoint(bed, pod: str) -> str:
    return f"{bed['servers'].ip[pod]}:8000"


@pytest.mark.timeout(300)
def test_a_picker_or_gateway_whose_port_another_process_holds_is_started_again_on_a_fresh_one(bed, monkeypatch):
    """The test bed's own readiness, with the fault injected (a port taken between free_ports() and the bind,
    which a second suite on the machine does): a listener of this test holds the port the picker is given for
    ext-proc, then the one the gateway is given. A connection to that port succeeds, so readiness that only
    connects would send the gateway's requests to that listener (a picker given the same port for ext-proc and
    health did so in a loaded run); the picker's and the gateway's own "listening" lines say whose port it is.
    Both start again on a fresh port, and a request goes through them to a pool pod."""
    _all_ready(bed)
    real_ports, real_port = epp.free_ports, epp.free_port
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        monkeypatch.setattr(epp, "free_ports", lambda n: [taken, *real_ports(n - 1)])
        picker = epp.Picker(bed["picker"].args, bed["kubeconfig"], bed["work"] / "picker-port-taken",
                            bed["namespace"])
        gateway = None
        try:
            monkeypatch.setattr(epp, "free_ports", real_ports)
            picker.wait_serving()
            assert picker.starts == 2 and picker.grpc_port != taken, (picker.starts, picker.grpc_port, taken)
            assert ("ext-proc", picker.grpc_port) in picker.listening()
            monkeypatch.setattr(epp, "free_port", lambda: taken)
            gateway = epp.Gateway(picker, bed["work"])
            monkeypatch.setattr(epp, "free_port", real_port)
            gateway.wait_listening()
            assert gateway.starts == 2 and gateway.port != taken, (gateway.starts, gateway.port, taken)
            wait_for(lambda: _picker_sees({"picker": picker}, 2), 60, "the new picker's pool", interval=0.5)
            answer = gateway.complete("tiny", f"{random.random()}: say something", max_tokens=2)
            assert answer["status"] == 200 and answer["endpoint"] in {_endpoint(bed, p) for p in PODS}, answer
        finally:
            for proc in (gateway, picker):
                if proc is not None:
                    proc.stop()


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("loaded,idle", [("chat-0", "chat-b-0"), ("chat-b-0", "chat-0")])
def test_picker_routes_to_the_less_loaded_server(bed, loaded, idle):
    """Six clients keep requests in the loaded server's vLLM (two run, the rest wait: vllm:num_requests_waiting);
    every request through the gateway meanwhile is sent to the other one, by the picker's queue and KV scorers.
    The two pods are two VLLMServers' (the pool's owner and the server that joined it): both serve the route."""
    _all_ready(bed)
    servers, gateway = bed["servers"], bed["gateway"]
    wait_for(lambda: servers.quiet(idle), 120, f"{idle}'s vLLM quiet (no request left from another case)",
             interval=0.5)
    load = LoadGenerator(lambda: [f"http://{_endpoint(bed, loaded)}"], concurrency=6, max_requests=5000,
                         duration=600, max_tokens=900).start()
    try:
        wait_for(lambda: servers.waiting(loaded) >= 2, 180, f"requests waiting in {loaded}'s vLLM", interval=0.5)
        chosen = []
        for i in range(6):
            assert servers.waiting(loaded) >= 1, "the load stopped queueing: the test would prove nothing"
            answer = gateway.complete("tiny", f"request {i} {random.random()}: say something", max_tokens=4)
            assert answer["status"] == 200, answer
            assert answer["answer"]["choices"][0]["text"] is not None
            chosen.append(answer["endpoint"])
        assert chosen == [_endpoint(bed, idle)] * 6, (chosen, _endpoint(bed, loaded))
    finally:
        load.stop()


def _lora_series(text: str) -> list[str]:
    """vLLM's vllm:lora_requests_info series (one per set of running and waiting adapters it has seen)."""
    return [line for line in text.splitlines() if line.startswith("vllm:lora_requests_info{")]


def _complete_direct(bed, pod: str, model: str) -> int:
    """POST /v1/completions straight to a pod's vLLM (not through the gateway); its status."""
    body = json.dumps({"model": model, "prompt": "the cat", "max_tokens": 4}).encode()
    req = urllib.request.Request(f"http://{_endpoint(bed, pod)}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _lora_scores(picker: epp.Picker, pod: str) -> list[float]:
    """The lora-affinity-scorer's scores of a pod, in the order the picker logged them (at -v 4: one per request it
    scheduled, as JSON lines; the endpoint named "<pod>-rank-<n>", one per data-parallel rank)."""
    out = []
    for line in picker.log_path.read_text(errors="replace").splitlines():
        if "Calculated score" not in line or "lora-affinity" not in line:
            continue
        entry = json.loads(line)
        if entry["endpoint"]["name"].rsplit("-rank-", 1)[0] == pod:
            out.append(float(entry["score"]))
    return out


def _route_adapter_requests(gateway: epp.Gateway, n: int) -> list[tuple[str, int]]:
    """n requests for the adapter through a gateway, one at a time: (the endpoint the picker chose, the status).
    Each prompt starts with fresh random text, shorter than one of the prefix scorer's blocks: no prefix favours a
    pod."""
    out = []
    for i in range(n):
        for attempt in range(3):
            answer = gateway.complete(ADAPTER, f"{random.random():.6f} q{i}", max_tokens=2)
            if answer["status"] != 502:
                break
            # The test bed's gateway itself failed (its call to the picker, or the connection to the pod: the body
            # says which), which says nothing of the picker's choice: asked again, as a gateway's retry policy on
            # reset does, and shown.
            print(f"gateway 502 (attempt {attempt + 1}): {str(answer['answer'])[:300]}")
        out.append((answer["endpoint"], answer["status"]))
    return out


@pytest.mark.timeout(900)
def test_picker_sends_an_adapters_requests_to_the_pod_that_serves_it(bed):
    """The adapter is loaded on chat's pod only, by the operator's adapter sync (its real code, over vLLM's runtime
    endpoint); chat-b's pod has none, and answers 404 for it. Once the adapter has served a request on chat-0, vLLM
    names it in vllm:lora_requests_info (running_lora_adapters="sql"), which the picker (v1.2.0) reads for its
    lora-affinity-scorer: every "sql" request through the gateway then goes to chat-0 and is served. The baseline:
    a second picker on the same pool, with the operator's config for `loraAffinity: 0` (the scorer left out), sends
    some of the same requests to chat-b-0 (its pick among equal pods is random), where they fail with 404. Last,
    with chat-0's queue held up, the default weights send the adapter's requests to chat-b-0: a 404 each."""
    _all_ready(bed)
    servers, namespace = bed["servers"], bed["namespace"]
    for pod in PODS:
        wait_for(lambda: servers.quiet(pod), 120, f"{pod}'s vLLM quiet", interval=0.5)

    # 1. the operator's adapter sync loads what chat's spec wants on chat's pod, and nothing on chat-b's
    source = str(bed["adapter_dir"] / ADAPTER)
    sync = AdapterSync()
    try:
        def loaded() -> bool:
            [known] = sync.observe(namespace, POOL, [PodRef("chat-0", namespace, servers.ip["chat-0"])],
                                   {"chat-0": ("uid-chat-0", 0)}, ((ADAPTER, source),))
            return ADAPTER in (known.listed or ())
        wait_for(loaded, 180, f"{ADAPTER} loaded on chat-0 by the operator's adapter sync", interval=1)
    finally:
        sync.close()
    assert list_adapters(f"http://{_endpoint(bed, 'chat-b-0')}") == set()
    assert _complete_direct(bed, "chat-b-0", ADAPTER) == 404, "chat-b-0 cannot serve the adapter"

    # 2. the adapter serves a request on chat-0 (earlier traffic): vLLM names it in vllm:lora_requests_info
    assert _complete_direct(bed, "chat-0", ADAPTER) == 200
    series = wait_for(lambda: [s for s in _lora_series(servers.by_pod["chat-0"].metrics_text(timeout=10))
                               if f'running_lora_adapters="{ADAPTER}"' in s], 30,
                      "vllm:lora_requests_info naming the adapter", interval=0.5)
    assert 'max_lora="' in series[0], series
    # The picker reads every pod's /metrics every refreshMetricsMilliseconds (50), and logs (-v 4) what each scorer
    # made of each pod for every request it schedules: adapter requests are sent (wherever they go) until its
    # lora-affinity-scorer scores chat-0 1.0, "the adapter is active there"; the ten below are sent after that.
    def affinity_read() -> bool:
        _route_adapter_requests(bed["gateway"], 1)
        scores = _lora_scores(bed["picker"], "chat-0")
        return bool(scores) and scores[-1] == 1.0
    wait_for(affinity_read, 60, "the picker's lora-affinity score 1.0 for chat-0", interval=0.5)

    # 3. every adapter request through the gateway goes to chat-0, and is served
    routed = _route_adapter_requests(bed["gateway"], 10)
    assert routed == [(_endpoint(bed, "chat-0"), 200)] * 10, routed

    # 4. the baseline: the same pool, the operator's picker config without the lora-affinity-scorer
    plain = routing_objects(namespace, {**with_adapter(bed["adapter_dir"]),
                                        "routing": {"inferencePool": {"enabled": True, "picker": {
                                            "scorers": {"loraAffinity": 0}}}}})
    [container] = plain[("Deployment", builders.picker_name(POOL))]["spec"]["template"]["spec"]["containers"]
    assert "lora-affinity-scorer" not in " ".join(container["args"])
    picker = epp.Picker(container["args"], bed["kubeconfig"], bed["work"] / "picker-no-lora", namespace)
    gateway = None
    try:
        picker.wait_serving()
        wait_for(lambda: _picker_sees({"picker": picker}, 2), 60, "the baseline picker's pool", interval=0.5)
        gateway = epp.Gateway(picker, bed["work"])
        gateway.wait_listening()
        baseline = _route_adapter_requests(gateway, 12)
    finally:
        for proc in (gateway, picker):
            if proc is not None:
                proc.stop()
    to_b = [status for endpoint, status in baseline if endpoint == _endpoint(bed, "chat-b-0")]
    print(f"lora-affinity-scorer: 10 of 10 adapter requests to the adapter's pod; without it: "
          f"{len(baseline) - len(to_b)} of {len(baseline)}, the rest answered {sorted(set(to_b))}")
    assert to_b and set(to_b) == {404}, baseline

    # 5. affinity is a score, not a filter: with chat-0's queue held up, the queue scorer (weight 2) outweighs it
    # (weight 1) and the adapter's requests go to chat-b-0, which cannot serve them (docs/routing.md says so)
    load = LoadGenerator(lambda: [f"http://{_endpoint(bed, 'chat-0')}"], concurrency=6, max_requests=5000,
                         duration=600, max_tokens=900).start()
    try:
        wait_for(lambda: servers.waiting("chat-0") >= 2, 180, "requests waiting in chat-0's vLLM", interval=0.5)
        under_load = []
        for _ in range(4):
            assert servers.waiting("chat-0") >= 1, "the load stopped queueing: the step would prove nothing"
            under_load += _route_adapter_requests(bed["gateway"], 1)
    finally:
        load.stop()
    print(f"with chat-0 loaded: {under_load}")
    assert under_load == [(_endpoint(bed, "chat-b-0"), 404)] * 4, under_load
