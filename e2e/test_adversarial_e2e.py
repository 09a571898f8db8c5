"""Hostile tenants against the real operator process on the real API server; another tenant keeps being served.

One story, in order:

1. A tenant namespace full of attacks, each through a field a tenant controls (issue 10): a configURL that
   redirects to a page only the operator reaches, trickles, answers 16 MiB or JSON nested 100,000 deep, or
   names an address the operator's settings do not allow; a prometheusURL that redirects; pods whose /metrics
   redirect, trickle, answer 9 MiB or NaN; a spec of 1 MB of lowercase letters (the credential check was
   quadratic). Each one ends as a condition with a category, never an exception, a restart or a hang.
2. Another tenant's server, created after the attacks are in place, reconciles and scales on its queue.
3. Nothing the hostile servers sent reached a status or an Event, nothing followed a redirect, /healthz
   answered as the chart's liveness probe asks all along, and the operator's peak memory stayed under the
   chart's limit.

The "pods" are the fake kubelet's: each pod's address gets a local HTTP server. The attacker's answer as a
hostile tenant's image would (e2e/testbed/hostile_http.py); the victim's serve vLLM 0.32's real /metrics text
(tests/data, recorded from the CPU server) with a queue in it: no real vLLM is needed to show that the
operator keeps scaling someone else's server while it is under attack.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml
from kubernetes import client

from e2e.testbed.controlplane import wait_for
from e2e.testbed.fakekubelet import FakeKubelet, free_loopback_ips
from e2e.testbed.hostile_http import SECRET, HostileServer, Reply, redirect_to, secret_page
from e2e.testbed.operator_install import condition, free_port, kubectl_apply
from e2e.testbed.operator_process import OperatorProcess
from vllm_operator.kube.client import Kube

pytestmark = [pytest.mark.apiserver, pytest.mark.story]

ROOT = Path(__file__).resolve().parents[1]
GROUP_PATH = "/apis/vllm-operator.io/v1alpha1"
REAL_METRICS = (ROOT / "tests" / "data" / "vllm-0.32.0-cpu-tiny-metrics.txt").read_text()
#: The chart's liveness probe of the operator (templates/deployment.yaml): a kubelet restarts it after
#: FAILURES probes in a row that do not answer 200 within TIMEOUT seconds.
CHART = (ROOT / "charts" / "vllm-operator" / "templates" / "deployment.yaml").read_text()
LIVENESS_TIMEOUT = int(re.search(r"livenessProbe:(?:\n.*?)*?timeoutSeconds: (\d+)", CHART).group(1))
LIVENESS_FAILURES = int(re.search(r"livenessProbe:(?:\n.*?)*?failureThreshold: (\d+)", CHART).group(1))
MEMORY_LIMIT = yaml.safe_load((ROOT / "charts" / "vllm-operator" / "values.yaml").read_text())[
    "resources"]["limits"]["memory"]


def vllm_metrics(waiting: str) -> bytes:
    return REAL_METRICS.replace('vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0',
                                f'vllm:num_requests_waiting{{engine="0",model_name="tiny"}} {waiting}').encode()


def deep_json(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def server(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "llama-3b-autoscaled.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": namespace}
    doc["spec"]["autoscaling"].update(intervalSeconds=1, maxReplicas=2, scaleDownStabilizationSeconds=600)
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(doc["spec"].get(key), dict):
            doc["spec"][key].update(value)
        else:
            doc["spec"][key] = value
    return doc




class Pods:
    """What answers at each fake pod's address: the routes its server's name asks for."""

    def __init__(self, routes_for: dict[str, dict[str, Reply]]):
        self.routes_for = routes_for
        self.servers: dict[str, HostileServer] = {}
        self._lock = threading.Lock()

    def on_pod_start(self, pod: client.V1Pod, ip: str) -> bool:
        owner = pod.metadata.labels.get("app.kubernetes.io/instance", "")
        with self._lock:
            if ip not in self.servers:
                self.servers[ip] = HostileServer(self.routes_for.get(owner, {}), host=ip, port=8000).__enter__()
        return True

    def on_pod_stop(self, pod: client.V1Pod, ip: str) -> None:
        with self._lock:
            s = self.servers.pop(ip, None)
        if s is not None:
            s.__exit__(None, None, None)

    def close(self) -> None:
        for ip in list(self.servers):
            self.on_pod_stop(None, ip)  # type: ignore[arg-type]


class LivenessProbe:
    """GET /healthz every second the way the chart's liveness probe does, recording the longest run of
    failures (no 200 within its timeout) and the slowest answer."""

    def __init__(self, port: int):
        self.url = f"http://127.0.0.1:{port}/healthz"
        self.failures_in_a_row = self.worst_run = self.probes = 0
        self.slowest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "LivenessProbe":
        wait_for(self._ok, 60, "the operator's /healthz")
        self._thread.start()
        return self

    def _ok(self) -> bool:
        try:
            with urllib.request.urlopen(self.url, timeout=LIVENESS_TIMEOUT) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            t0 = time.monotonic()
            ok = self._ok()
            self.slowest = max(self.slowest, time.monotonic() - t0)
            self.probes += 1
            self.failures_in_a_row = 0 if ok else self.failures_in_a_row + 1
            self.worst_run = max(self.worst_run, self.failures_in_a_row)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(LIVENESS_TIMEOUT + 2)


def peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def quantity_bytes(text: str) -> int:
    from vllm_operator.api import parse_quantity
    return int(parse_quantity(text))


# --------------------------------------------------------------------------- the world
@pytest.fixture(scope="module")
def world(control_plane, k8s, crd_installed, tmp_path_factory):
    work = tmp_path_factory.mktemp("adversarial")
    core = client.CoreV1Api(k8s)
    suffix = f"{random.randint(0, 99999):05d}"
    attacker, victim = f"attacker-{suffix}", f"victim-{suffix}"
    for ns in (attacker, victim):
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        wait_for(lambda ns=ns: core.read_namespaced_service_account("default", ns), 60, "default ServiceAccount")

    hostile = HostileServer({
        "/secret": secret_page(),
        "/redirect/config.json": redirect_to("/secret"),
        "/trickle/config.json": Reply(200, b'{"architectures": ["LlamaForCausalLM"]}' * 100, trickle=0.3),
        "/huge/config.json": Reply(200, b'{"a":[' + b"{}," * (16 * 2**20 // 3) + b"{}]}"),
        "/deep/config.json": Reply(200, deep_json(100_000)),
        "/api/v1/query": redirect_to("/secret"),
    }).__enter__()
    secret_url = f"{hostile.base}/secret"
    pods = Pods({
        "pod-redirect": {"/metrics": redirect_to(secret_url)},
        "pod-trickle": {"/metrics": Reply(200, vllm_metrics("9"), trickle=0.2)},
        "pod-huge": {"/metrics": Reply(200, vllm_metrics("9") + b"# " + b"x" * (9 * 2**20) + b"\n")},
        "pod-nan": {"/metrics": Reply(200, vllm_metrics("NaN"))},
        "prom-redirect": {"/metrics": Reply(200, vllm_metrics("0"))},
        "spec-letters": {"/metrics": Reply(200, vllm_metrics("0"))},
        "victim": {"/metrics": Reply(200, vllm_metrics("10.0"))},  # 10 waiting, target 4: 3, capped at 2
    })
    kubelets = [FakeKubelet(k8s, namespace=ns, node_name=f"gpu-{ns}"[:60], gpu_product="NVIDIA-L4",
                            ip_pool=free_loopback_ips(12), on_pod_start=pods.on_pod_start, on_pod_stop=pods.on_pod_stop)
                for ns in (attacker, victim)]
    for k in kubelets:
        k.start()
    health = free_port()
    operator = OperatorProcess(control_plane.kubeconfig, work / "operator.log", resync_seconds=3, extra_args=[
        "--health-port", str(health),
        "--allowed-config-url", f"{hostile.base}/",        # a platform team allowed a host that turned hostile
        "--allowed-prometheus-url", f"{hostile.base}/"]).start()
    probe = LivenessProbe(health).start()
    state = {"attacker": attacker, "victim": victim, "hostile": hostile, "pods": pods, "operator": operator,
             "probe": probe, "kube": Kube(k8s), "cp": control_plane}
    try:
        yield state
    finally:
        probe.stop()
        operator.stop()
        print(operator.log_tail(150))
        for k in kubelets:
            k.stop()
        pods.close()
        hostile.__exit__(None, None, None)
        for ns in (attacker, victim):
            try:
                core.delete_namespace(ns)
            except client.ApiException:
                pass


def get(world: dict[str, Any], ns: str, name: str) -> dict[str, Any]:
    return world["kube"].request("GET", f"{GROUP_PATH}/namespaces/{ns}/vllmservers/{name}")


def wait_condition(world: dict[str, Any], name: str, type_: str, status: str, contains: str,
                   timeout: float = 120) -> dict[str, Any]:
    seen: list[Any] = [None]

    def probe() -> Optional[dict[str, Any]]:
        body = get(world, world["attacker"], name)
        seen[0] = (body.get("status") or {}).get("conditions")
        c = condition(body, type_)
        return c if c.get("status") == status and contains in c.get("message", "") else None
    try:
        return wait_for(probe, timeout, f"{name}: {type_}={status} with {contains!r}")
    except TimeoutError as e:
        raise AssertionError(f"{e}; its conditions: {json.dumps(seen[0])[:3000]}") from None


# --------------------------------------------------------------------------- 1. the attacks
CONFIG_ATTACKS = [
    ("cfg-redirect", "/redirect/config.json", "redirect refused"),
    ("cfg-trickle", "/trickle/config.json", "timed out"),
    ("cfg-huge", "/huge/config.json", f"response larger than {2**20} bytes"),
    ("cfg-deep", "/deep/config.json", "nested"),
]
POD_ATTACKS = [
    ("pod-redirect", "redirect refused"),
    ("pod-trickle", "timed out"),
    ("pod-huge", "response larger than"),
    ("pod-nan", "non-finite value"),
]


def test_every_attack_ends_as_a_condition_with_a_category(world):
    ns, base = world["attacker"], world["hostile"].base
    for name, path, _ in CONFIG_ATTACKS:
        kubectl_apply(world["cp"], server(name, ns, model={"name": f"evil/{name}", "configURL": base + path}))
    # Addresses the operator reaches but its settings do not allow.
    kubectl_apply(world["cp"], server("cfg-internal", ns, model={"name": "evil/internal",
                                                                 "configURL": "http://127.0.0.1:1/config.json"}))
    kubectl_apply(world["cp"], server("cfg-file", ns, model={"name": "evil/file", "configURL": "file:///etc/passwd"}))
    for name, _ in POD_ATTACKS:
        kubectl_apply(world["cp"], server(name, ns))
    kubectl_apply(world["cp"], server("prom-redirect", ns, autoscaling={"source": "Prometheus",
                                                                         "prometheusURL": base}))
    letters = "abcdefghijklmnopqrstuvwxyz" * 630  # 16,380 characters, the CRD's longest value
    big = server("spec-letters", ns, engine={"env": [{"name": f"LETTERS_{i}", "value": letters} for i in range(64)]})
    # 1 MB in one object: server-side apply (a client-side apply's annotation may hold 256 KB only).
    world["cp"].kubectl("apply", "--server-side", "-f", "-", input=json.dumps(big))

    for name, _, category in CONFIG_ATTACKS:
        c = wait_condition(world, name, "SpecValid", "False", category)
        assert c["message"].startswith("spec.model.configURL"), c
    c = wait_condition(world, "cfg-internal", "SpecValid", "False", "only under the URLs its settings allow")
    assert "--allowed-config-url" in c["message"]
    # The operator's own files are no config: no existence or size oracle.
    wait_condition(world, "cfg-file", "SpecValid", "False", "must be an http(s) URL with a host")
    for name, category in POD_ATTACKS:
        wait_condition(world, name, "AutoscalingActive", "False", category)
    wait_condition(world, "prom-redirect", "AutoscalingActive", "False", "redirect refused")
    # 1 MB of letters is a spec like any other: planned and applied, its pod serves.
    wait_condition(world, "spec-letters", "Ready", "True", "")
    world["probes when every attack had landed"] = world["probe"].probes


# --------------------------------------------------------------------------- 2. the other tenant
def test_another_tenant_created_under_attack_reconciles_and_scales(world):
    ns, kube = world["victim"], world["kube"]
    kubectl_apply(world["cp"], server("victim", ns))
    wait_for(lambda: condition(get(world, ns, "victim"), "SpecValid").get("status") == "True", 60,
             "the victim's spec planned")
    sts = wait_for(lambda: kube.get("apps/v1", "StatefulSet", ns, "victim"), 60, "the victim's StatefulSet")
    # Created at minReplicas (1) or already scaled by the autoscaler (2): a read right after creation may find
    # either, so the state asserted is the one waited for below, not the first one seen.
    assert sts["spec"]["replicas"] in (1, 2)
    # Its one pod reports 10 waiting at target 4: the autoscaler asks for 3 and is capped at 2.
    wait_for(lambda: kube.get("apps/v1", "StatefulSet", ns, "victim")["spec"]["replicas"] == 2, 120,
             "the victim scaled to 2 on its queue")
    wait_for(lambda: [e for e in kube.list("v1", "Event", ns) if e["involvedObject"].get("name") == "victim"
                      and e.get("reason") == "ScaledUp" and (e.get("message") or "").startswith("1 -> 2 replicas")],
             60, "the autoscaler's ScaledUp Event: 1 -> 2 replicas")
    body = wait_for(lambda: (lambda s: s if condition(s, "AutoscalingLimited").get("status") == "True" else None)(
        get(world, ns, "victim")), 60, "AutoscalingLimited at maxReplicas")
    assert condition(body, "AutoscalingLimited")["reason"] == "AtMaxReplicas"


# --------------------------------------------------------------------------- 3. what did not happen
def test_nothing_leaked_nothing_followed_and_the_operator_stayed_healthy(world):
    ns, kube = world["attacker"], world["kube"]
    servers = kube.request("GET", f"{GROUP_PATH}/namespaces/{ns}/vllmservers")["items"]
    assert len(servers) == len(CONFIG_ATTACKS) + len(POD_ATTACKS) + 4
    for s in servers:
        assert SECRET not in json.dumps(s.get("status")), s["metadata"]["name"]
    events = kube.list("v1", "Event", ns)
    assert events, "the attacks were reported"
    assert not [e["message"] for e in events if SECRET in (e.get("message") or "")]
    # No redirect was followed: only the configs and Prometheus were asked, never the page behind them.
    assert "/secret" not in world["hostile"].requests
    assert {p.split("?")[0] for p in world["hostile"].requests} <= {
        path for _, path, _ in CONFIG_ATTACKS} | {"/api/v1/query"}

    operator, probe = world["operator"], world["probe"]
    assert operator.proc.poll() is None, "the operator never exited"
    print(f"/healthz: {probe.probes} probes, longest run of failures {probe.worst_run}, "
          f"slowest answer {probe.slowest:.2f} s; peak RSS {peak_rss_bytes(operator.proc.pid) / 2**20:.0f} MiB")
    # The probe ran while the attacks were under way and after every one had landed (they go on: the pods'
    # attacks at every tick of their autoscalers, the configs at every retry).
    assert 0 < world["probes when every attack had landed"] < probe.probes
    assert probe.worst_run < LIVENESS_FAILURES, "a kubelet would have restarted the operator"
    assert peak_rss_bytes(operator.proc.pid) < quantity_bytes(MEMORY_LIMIT), "the chart's limit would OOM-kill it"
