"""Routing through the Gateway API Inference Extension with real parts: the extension's CRDs on the test bed's
kube-apiserver, the InferencePool and the endpoint picker's RBAC as the operator builds them, the real endpoint
picker (cmd/epp of the pinned release) running with the operator's args and config under its ServiceAccount's
token (so its Role is proved sufficient), and two real vLLM CPU servers as the pool's pods (the fake kubelet starts
one on each pod's own 127.x address).

No gateway data plane can be installed here: the test bed's gateway (e2e/testbed/epp.py) plays its part over the
picker's real ext_proc gRPC interface and forwards each request to the endpoint the picker chose.

The story: with one server loaded (its vLLM queue holds requests) every request through the gateway goes to the
other one; then the other way round.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.testbed import epp, vllm_env
from e2e.testbed.controlplane import wait_for
from e2e.testbed.fakekubelet import FakeKubelet, free_loopback_ips
from e2e.testbed.loadgen import LoadGenerator
from e2e.testbed.serviceaccount import service_account_kubeconfig
from vllm_operator import api, builders, pipeline
from vllm_operator.kube.client import Kube
from vllm_operator.sources.vllm_metrics import parse_vllm_metrics

pytestmark = [pytest.mark.apiserver, pytest.mark.vllm]

POOL = "chat"
LOAD_TIMEOUT = 420   # one vLLM start on 2 busy cores
SPEC = {"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct", "servedName": "tiny"}, "gpu": {"product": "L4"},
        "routing": {"inferencePool": {"enabled": True}}}


def routing_objects(namespace: str, spec: dict[str, Any] = SPEC, name: str = POOL) -> dict[tuple[str, str], dict]:
    """The routing objects the operator builds for a server (kind, name) -> object, without owner references."""
    plan = pipeline.plan_server(name, namespace, api.VLLMServerSpec.model_validate(spec))
    assert plan.fits, plan.problems
    return {(o["kind"], o["metadata"]["name"]): o for o in builders.build_routing(plan)}


def pool_pod(namespace: str, name: str, pool: str) -> dict[str, Any]:
    """A pod as a VLLMServer's StatefulSet makes it, as far as the pool cares: its labels and port 8000."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {**builders.labels(name.rsplit("-", 1)[0]), builders.POOL_LABEL: pool}},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.33.0",
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
        server = vllm_env.start_vllm(ip, 8000, max_num_seqs=2, max_model_len=1024,
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
    objects = routing_objects(namespace)
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
        for pod in ("chat-0", "chat-1"):
            kube.apply(pool_pod(namespace, pod, POOL))
        deployment = objects[("Deployment", builders.picker_name(POOL))]
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        kubeconfig = service_account_kubeconfig(control_plane, namespace, builders.picker_name(POOL),
                                                work / "picker.kubeconfig")
        picker = epp.Picker(container["args"], kubeconfig, work / "picker", namespace)
        picker.wait_serving()
        gateway = epp.Gateway(picker, work)
        gateway.wait_listening()
        yield {"namespace": namespace, "servers": servers, "picker": picker, "gateway": gateway,
               "kubelet": kubelet, "kube": kube}
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
                 servers.by_pod[p].is_healthy() for p in ("chat-0", "chat-1")) and _picker_sees(bed, 2)),
             LOAD_TIMEOUT + 60, "both vLLM pods Ready and in the picker's pool", interval=2)


def _picker_sees(bed, n: int) -> bool:
    for line in bed["picker"].metrics_text().splitlines():
        if line.startswith("inference_pool_ready_pods"):
            return float(line.rsplit(" ", 1)[1]) >= n
    return False


def _endpoint(bed, pod: str) -> str:
    return f"{bed['servers'].ip[pod]}:8000"


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("loaded,idle", [("chat-0", "chat-1"), ("chat-1", "chat-0")])
def test_picker_routes_to_the_less_loaded_server(bed, loaded, idle):
    """Six clients keep requests in the loaded server's vLLM (two run, the rest wait: vllm:num_requests_waiting);
    every request through the gateway meanwhile is sent to the other one, by the picker's queue and KV scorers."""
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
