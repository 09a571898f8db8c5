"""Queue-based autoscaling end to end, with real parts only: the test bed's kube-apiserver +
controller-manager, the operator process, real vLLM servers on the CPU as the pods (started by the fake
kubelet on each pod's own 127.x.y.z address, Ready only once /health answers), a bounded
load generator, and a real Prometheus scraping the pods through file-based discovery.

One server goes through the whole story, in order (each test continues the previous one):

1. source Pods: the queue rises, 1 -> 2; while the second vLLM loads (~80 s here) the
   queue keeps growing and no further scale-up happens (loading replicas are capacity on
   the way);
2. a metrics endpoint hangs: replicas are held past the scale-down window, AutoscalingActive
   False says which pod; once it answers, 2 -> 1 after the window;
3. source Prometheus (the operator's --prometheus-url): 1 -> 2 (capped at maxReplicas); its load keeps running
   through 3b (the dashboard's queries) into 4, so that no scale-down window can pass before Prometheus stops;
4. Prometheus stopped, then the load: held; back: 2 -> 1.

The second pod's vLLM stays warm after its pod is deleted and serves the next pod that gets
its address, so only the first scale-up pays for a model load.
"""

from __future__ import annotations

import calendar
import json
import math
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Optional

import pytest
import yaml
from kubernetes import client

from e2e.testbed import vllm_env
from e2e.testbed.convergence import wait_established
from e2e.testbed.controlplane import wait_for
from e2e.testbed.fakekubelet import FakeKubelet, free_loopback_ips
from e2e.testbed.loadgen import LoadGenerator
from e2e.testbed.operator_process import OperatorProcess
from e2e.testbed.monitoring import dashboard_queries
from e2e.testbed.operator_install import free_port
from e2e.testbed.prometheus import PrometheusServer
from vllm_operator.sources.vllm_metrics import parse_vllm_metrics
from vllm_operator.kube.client import Kube

pytestmark = [pytest.mark.apiserver, pytest.mark.vllm, pytest.mark.story]

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "vllmservers.vllm-operator.io.yaml"
GROUP_PATH = "/apis/vllm-operator.io/v1alpha1"
NAME = "auto"
TARGET = 4                      # targetWaitingPerReplica
INTERVAL = 2                    # intervalSeconds
WINDOW = 20                     # scaleDownStabilizationSeconds
LOAD_TIMEOUT = 420              # one vLLM start on 2 busy cores (about 80 s when idle)
# Closed loop against vLLM with --max-num-seqs 2: C clients keep C requests in flight, so
# C - 2 wait whatever the machine's speed. 8 clients: 6 waiting -> exactly 2 replicas at
# target 4 (3 would need more than 8). 20 clients: 18 waiting, which alone would ask for 5.
LOAD = dict(max_requests=2000, duration=500, max_tokens=1000)
# Step 3's requests are short, so that some finish while it runs: vLLM observes its request histograms (end-to-end
# latency, time in the queue: the dashboard's panels in step 3b) when a request finishes, and on 2 loaded cores a
# 1,000-token request can outlast step 1's whole load (20 sent, none finished, in 262 s).
SHORT_TOKENS = 16


# --------------------------------------------------------------------------- the pods: real vLLM


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                pass
    return out


class VLLMPods:
    """The fake kubelet's hooks: a real vLLM per pod address, Ready once healthy (and released).

    A pod's readiness can be held back after its server is healthy (`gate`), so a test can
    decide the moment a new replica joins. Servers stay warm when their pod goes away.
    """

    def __init__(self, namespace: str, logdir: Path, prometheus: PrometheusServer):
        self.namespace = namespace
        self.logdir = logdir
        self.prometheus = prometheus
        self.kubelet: Optional[FakeKubelet] = None
        self.servers: dict[str, vllm_env.VLLMProcess] = {}     # by IP, kept warm
        self.pod_ip: dict[str, str] = {}
        self.healthy: dict[str, threading.Event] = {}
        self.release: dict[str, threading.Event] = {}
        self.gate = False
        self.errors: list[str] = []
        self.progress: dict[str, str] = {}  # pod -> where its readiness stands (for a failure's report)
        #: Other scrape targets (the operator's own /metrics, for the dashboard's queries).
        self.extra_targets: list[tuple[str, dict[str, str]]] = []
        self._lock = threading.Lock()

    def url(self, pod: str) -> str:
        return f"http://{self.pod_ip[pod]}:8000"

    def _targets(self) -> None:
        self.prometheus.set_targets([(f"{ip}:8000", {"namespace": self.namespace, "pod": pod})
                                     for pod, ip in sorted(self.pod_ip.items())] + self.extra_targets)

    def on_pod_start(self, pod, ip: str) -> bool:
        name = pod.metadata.name
        with self._lock:
            server = self.servers.get(ip)
            if server is None or not server.alive():
                server = self.servers[ip] = vllm_env.start_vllm(
                    ip, 8000, max_num_seqs=2, max_model_len=1024, log_path=self.logdir / f"vllm-{ip}.log")
            self.pod_ip[name] = ip
            self.healthy[name] = threading.Event()
            self.release[name] = threading.Event()
            if not self.gate:
                self.release[name].set()
            self._targets()
        threading.Thread(target=self._become_ready, args=(name, server), daemon=True).start()
        return False  # Ready only once /health answers

    def _become_ready(self, name: str, server: vllm_env.VLLMProcess) -> None:
        healthy, release = self.healthy[name], self.release[name]  # this pod's, whatever comes after it
        self.progress[name] = "waiting for /health"
        try:
            server.wait_healthy(timeout=LOAD_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(f"{name}: {e}")
            self.progress[name] = f"failed: {e}"
            return
        healthy.set()
        self.progress[name] = "healthy, waiting for the test's release"
        release.wait()
        self.kubelet.set_ready(self.namespace, name, True)
        self.progress[name] = f"set Ready at {time.strftime('%H:%M:%S')}"

    def on_pod_stop(self, pod, ip: str) -> None:
        with self._lock:
            self.pod_ip.pop(pod.metadata.name, None)
            self._targets()  # the server itself stays warm for the next pod on this address

    def api_server_pid(self, pod: str) -> int:
        """The vLLM API server process (the guard's child) that answers /metrics."""
        [pid] = _children(self.servers[self.pod_ip[pod]].pid)
        return pid

    def waiting(self, pod: str) -> float:
        text = self.servers[self.pod_ip[pod]].metrics_text(timeout=5)
        return parse_vllm_metrics(pod, text, time.time()).waiting

    def close(self) -> None:
        for server in self.servers.values():
            server.stop(grace=10)


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def stack(control_plane, k8s, tmp_path_factory):
    vllm_env.ensure_vllm()
    work = tmp_path_factory.mktemp("autoscale-e2e")
    prometheus = PrometheusServer(work / "prometheus", scrape_interval="1s").start()
    control_plane.kubectl("apply", "-f", str(CRD))
    wait_established(control_plane, "vllmservers.vllm-operator.io")
    namespace = f"autoscale-{os.getpid()}-{random.randint(0, 9999)}"
    core = client.CoreV1Api(k8s)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    # The ServiceAccount admission plugin refuses pods until the namespace's default ServiceAccount exists.
    wait_for(lambda: core.read_namespaced_service_account("default", namespace), 60, "default ServiceAccount")
    pods = VLLMPods(namespace, work, prometheus)
    kubelet = FakeKubelet(k8s, namespace=namespace, node_name=f"gpu-{namespace}"[:60], gpu_product="NVIDIA-L4",
                          ip_pool=free_loopback_ips(2), on_pod_start=pods.on_pod_start, on_pod_stop=pods.on_pod_stop,
                          auto_ready=False)
    pods.kubelet = kubelet
    kubelet.start()
    health = free_port()
    pods.extra_targets = [(f"127.0.0.1:{health}", {"job": "vllm-operator"})]
    operator = OperatorProcess(control_plane.kubeconfig, work / "operator.log", resync_seconds=3,
                               # The dashboard's per-server panels read the series that name each server, which
                               # the operator serves without a token only when told to (docs/monitoring.md).
                               extra_args=["--prometheus-url", prometheus.url, "--health-port", str(health),
                                           "--metrics-public-server-series"]).start()
    state = {"namespace": namespace, "pods": pods, "prometheus": prometheus, "operator": operator,
             "kubelet": kubelet, "kube": Kube(k8s), "cp": control_plane, "load": None}
    try:
        yield state
    finally:
        try:  # what the server said last, for a failure's report
            body = state["kube"].request("GET", f"{GROUP_PATH}/namespaces/{namespace}/vllmservers/{NAME}")
            print("--- status\n" + json.dumps(body.get("status"), indent=1)[:6000])
            evs = [e for e in state["kube"].list("v1", "Event", namespace) if e["involvedObject"].get("name") == NAME]
            print("--- events\n" + "\n".join(f"{e['type']} {e['reason']}: {e['message'][:300]}" for e in evs[-15:]))
            print(f"--- kubelet errors: {kubelet.errors[-10:]}")
            print(f"--- pods: {pods.progress}; addresses {pods.pod_ip}; kubelet's pods "
                  f"{[(p.name, p.uid[:8], p.ip, p.ready, p.reported_ready) for p in kubelet._pods.values()]}")
        except Exception as e:  # noqa: BLE001 - a report, never a second failure
            print(f"(no status: {e})")
        if state["load"] is not None:
            state["load"].stop()
        operator.stop()
        kubelet.stop()
        pods.close()
        prometheus.stop()
        control_plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        print("--- operator log tail\n" + operator.log_tail(80))
        assert not pods.errors, pods.errors
        assert not [s for s in pods.servers.values() if s.alive()], "a vLLM server outlived the test"


def server_doc(namespace: str, **autoscaling) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "llama-3b-autoscaled.yaml").read_text())
    doc["metadata"] = {"name": NAME, "namespace": namespace}
    doc["spec"]["engine"] = {"maxNumSeqs": 2}  # what the pods' real vLLM servers run with
    doc["spec"]["autoscaling"] = {"enabled": True, "minReplicas": 1, "maxReplicas": 3, "source": "Pods",
                                  "targetWaitingPerReplica": TARGET, "intervalSeconds": INTERVAL,
                                  "scaleDownStabilizationSeconds": WINDOW, **autoscaling}
    return doc


def server(st) -> dict:
    return st["kube"].request("GET", f"{GROUP_PATH}/namespaces/{st['namespace']}/vllmservers/{NAME}")


def cond(body: dict, type_: str) -> dict:
    return next((c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def replicas(st) -> int:
    return st["kube"].get("apps/v1", "StatefulSet", st["namespace"], NAME)["spec"].get("replicas", 1)


def events(st, reason: str) -> list[dict]:
    return [e for e in st["kube"].list("v1", "Event", st["namespace"])
            if e["involvedObject"].get("name") == NAME and e["reason"] == reason]


def times(st, reason: str) -> int:
    """How many times an Event of this reason was recorded (the operator counts on one Event per reason)."""
    return sum(e.get("count") or 1 for e in events(st, reason))


def ready_pods(st) -> set[str]:
    out = set()
    for pod in st["kube"].list("v1", "Pod", st["namespace"]):
        if any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or []):
            out.add(pod["metadata"]["name"])
    return out


def start_load(st, clients: int, **load) -> LoadGenerator:
    """Load on pod 0 only (what reached it through the Service before the new replica joined)."""
    pods: VLLMPods = st["pods"]
    st["load"] = LoadGenerator(lambda: [pods.url(f"{NAME}-0")], concurrency=clients, **{**LOAD, **load}).start()
    return st["load"]


def finished_in_prometheus(st) -> float:
    """Requests pod 0's vLLM finished, as Prometheus last scraped them: the count of its queue-time histogram,
    which vLLM observes (with the end-to-end latency) when a request finishes, never while it waits or runs."""
    expr = f'vllm:request_queue_time_seconds_count{{namespace="{st["namespace"]}", pod="{NAME}-0"}}'
    return sum(float(r["value"][1]) for r in st["prometheus"].query(expr))


def stop_load_and_drain(st) -> None:
    stats = st["load"].stop()
    st["load"] = None
    assert stats.sent > 0 and not [e for e in stats.errors if "HTTP" in e], stats
    wait_for(lambda: st["pods"].waiting(f"{NAME}-0") == 0, 60, "pod 0's queue drained")


def hold_for(st, seconds: float, want_replicas: int, reason_has: str) -> dict:
    """Poll until AutoscalingActive has been False (MetricsUnavailable) for `seconds`, with the
    replicas at `want_replicas` at every poll."""
    def held():
        body = server(st)
        assert replicas(st) == want_replicas, "replicas changed while the metrics were missing"
        active = cond(body, "AutoscalingActive")
        if active.get("status") != "False":
            return None
        assert active["reason"] == "MetricsUnavailable" and reason_has in active["message"], active
        since = calendar.timegm(time.strptime(active["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ"))
        return body if time.time() - since >= seconds else None
    return wait_for(held, seconds + 90, f"held at {want_replicas} for {seconds}s", interval=1)


# --------------------------------------------------------------------------- the story
@pytest.mark.timeout(1200)
def test_1_pods_source_scales_up_once_while_the_new_replica_loads(stack):
    st, pods = stack, stack["pods"]
    st["cp"].kubectl("apply", "-f", "-", input=json.dumps(server_doc(st["namespace"])))
    wait_for(lambda: ready_pods(st) == {f"{NAME}-0"}, LOAD_TIMEOUT + 60, "pod 0 serving (real vLLM loaded)",
             interval=1)
    idle = wait_for(lambda: (lambda b: b if cond(b, "AutoscalingActive").get("status") == "True" else None)(server(st)),
                    60, "autoscaler active")
    assert cond(idle, "AutoscalingLimited")["reason"] == "AtMinReplicas"
    assert "(metrics: pods' /metrics)" in cond(idle, "AutoscalingActive")["message"]

    pods.gate = True  # the next pod becomes Ready only when this test says so
    t0 = time.monotonic()
    load = start_load(st, clients=8)
    wait_for(lambda: replicas(st) == 2, 120, "scale-up to 2", interval=0.5)
    took = time.monotonic() - t0
    # The autoscaler patches the StatefulSet, then posts its event, then writes status: poll
    # for the status. Its reason moves on at the next tick (the new replica is starting), so
    # the decision's own words are checked in the event, which stays.
    wait_for(lambda: (lambda a: a if a.get("desiredReplicas") == 2 and a.get("lastScaleTime") else None)(
        server(st)["status"].get("autoscaling") or {}), 30, "status.autoscaling records the scale-up")
    [up] = wait_for(lambda: events(st, "ScaledUp"), 30, "ScaledUp event")
    assert up["message"].startswith("1 -> 2 replicas (pods' /metrics): scale up 1 -> 2")
    print(f"scaled up {took:.1f}s after the load started")

    # The new replica loads its model for a minute or more; the queue grows meanwhile.
    load.set_concurrency(20)
    seen_max, seen_waiting_reason, peak = 2, False, 0.0

    def loaded():
        nonlocal seen_max, seen_waiting_reason, peak
        seen_max = max(seen_max, replicas(st))
        assert seen_max == 2, "scaled up again while the new replica was still loading"
        b = server(st)
        au = b["status"].get("autoscaling") or {}
        if cond(b, "AutoscalingActive").get("reason") == "WaitingForStartingReplicas":
            seen_waiting_reason = True
            peak = max(peak, au.get("metricValue") or 0)
        ev = pods.healthy.get(f"{NAME}-1")
        return ev is not None and ev.is_set()

    wait_for(loaded, LOAD_TIMEOUT + 60, "pod 1's vLLM loaded", interval=1)
    assert f"{NAME}-1" not in ready_pods(st)
    assert seen_waiting_reason, "status said why it did not scale further"
    assert peak > 2 * TARGET, f"the queue ({peak} per ready replica) asked for more than 2 replicas meanwhile"
    # (a tick's scrape of the busy pod 0 may time out and hold instead: the reason is polled)
    wait_for(lambda: "1 replica still starting count as capacity on the way" in
             (server(st)["status"].get("autoscaling") or {}).get("reason", ""), 60, "the reason names the starting replica")

    stop_load_and_drain(st)
    pods.release[f"{NAME}-1"].set()
    wait_for(lambda: ready_pods(st) == {f"{NAME}-0", f"{NAME}-1"}, 60, "pod 1 Ready")
    assert replicas(st) == 2


@pytest.mark.timeout(600)
def test_2_a_hung_metrics_endpoint_holds_then_scales_down_after_the_window(stack):
    st, pods = stack, stack["pods"]
    pods.gate = False
    pid = pods.api_server_pid(f"{NAME}-1")
    os.kill(pid, signal.SIGSTOP)  # pod 1 stays Ready but its /metrics hangs
    try:
        body = hold_for(st, WINDOW + 2 * INTERVAL, 2, f"{NAME}-1 (GET http://")
        assert "timed out" in cond(body, "AutoscalingActive")["message"]
        assert "metricValue" not in body["status"]["autoscaling"]
        wait_for(lambda: events(st, "MetricsUnavailable"), 30, "a MetricsUnavailable Event")
    finally:
        os.kill(pid, signal.SIGCONT)
    back = time.monotonic()
    wait_for(lambda: cond(server(st), "AutoscalingActive").get("status") == "True", 60, "metrics back")
    wait_for(lambda: replicas(st) == 1, WINDOW + 120, "scale-down to 1", interval=0.5)
    # The last hold was recorded at most one interval (plus the 1 s scrape timeout) before SIGCONT,
    # and a scale-down waits a whole window after it.
    assert time.monotonic() - back >= WINDOW - INTERVAL - 1.5, "a full window of fresh data before scaling down"
    # status is written after the patch and the event (as in test 1): poll, and read the reason in the event
    wait_for(lambda: (server(st)["status"].get("autoscaling") or {}).get("desiredReplicas") == 1, 30,
             "status.autoscaling records the scale-down")
    [down] = wait_for(lambda: events(st, "ScaledDown"), 30, "ScaledDown event")
    assert down["message"].startswith("2 -> 1 replicas (pods' /metrics): scale down 2 -> 1: 0 waiting per ready "
                                      "replica"), down["message"]


@pytest.mark.timeout(600)
def test_3_prometheus_source_scales_up_to_max(stack):
    st = stack
    doc = server_doc(st["namespace"], source="Prometheus", maxReplicas=2)  # the operator's --prometheus-url
    st["cp"].kubectl("apply", "-f", "-", input=json.dumps(doc))
    wait_for(lambda: "(metrics: Prometheus http://" in cond(server(st), "AutoscalingActive").get("message", ""),
             90, "the autoscaler reads Prometheus")
    wait_for(lambda: cond(server(st), "AutoscalingActive").get("status") == "True", 60, "Prometheus has pod 0")
    ups = times(st, "ScaledUp")
    finished = finished_in_prometheus(st)
    start_load(st, clients=14, max_tokens=SHORT_TOKENS)  # 12 waiting: asks for 3, capped at maxReplicas 2
    wait_for(lambda: replicas(st) == 2, 120, "scale-up to 2 on Prometheus's numbers", interval=0.5)
    wait_for(lambda: times(st, "ScaledUp") == ups + 1, 30, "second ScaledUp event")
    wait_for(lambda: ready_pods(st) == {f"{NAME}-0", f"{NAME}-1"}, LOAD_TIMEOUT, "pod 1 Ready (warm vLLM)")
    limited = wait_for(lambda: (lambda c: c if c.get("status") == "True" else None)(
        cond(server(st), "AutoscalingLimited")), 120, "AutoscalingLimited at maxReplicas")
    assert limited["reason"] == "AtMaxReplicas" and limited["message"].startswith("at maxReplicas 2")
    # What step 3b's latency panels read: requests that finished within their rate window, scraped.
    wait_for(lambda: finished_in_prometheus(st) > finished, 120, "a request of this load finished and Prometheus "
             "scraped it", interval=1)
    # The load keeps the wanted replicas at 2 through step 3b, however long its queries take here; step 4 stops it
    # once Prometheus is down.


@pytest.mark.timeout(300)
def test_3b_every_dashboard_query_returns_data(stack):
    """The chart's Grafana dashboard against the real Prometheus that scraped the real vLLM pods (under load,
    queueing, scaling) and the operator: every panel's query (its variables as Grafana fills them for every
    namespace and server) answers with numbers, none of them NaN (a histogram with no request in its window).

    The request histograms' panels count requests that finished within the last 5 minutes (the rate window):
    step 3 saw one of its load's requests finished and scraped, and the load still runs."""
    prometheus: PrometheusServer = stack["prometheus"]

    def numbers(expr: str) -> list[float]:
        return [float(r["value"][1]) for r in prometheus.query(expr)]

    empty = {}
    for q in dashboard_queries():
        try:
            wait_for(lambda: (lambda v: v and not any(math.isnan(x) for x in v))(numbers(q.expr)), 60,
                     f"{q.panel} {q.ref_id}", interval=1)
        except TimeoutError:
            empty[f"{q.panel} {q.ref_id}"] = numbers(q.expr)
    assert not empty, empty


@pytest.mark.timeout(600)
def test_4_prometheus_down_holds_then_scales_down(stack):
    st = stack
    prometheus: PrometheusServer = st["prometheus"]
    prometheus.stop()
    try:
        # The load of step 3 stops once Prometheus is down: before that, an empty queue it scraped would start the
        # scale-down window. Drained, as read from pod 0's own /metrics.
        stop_load_and_drain(st)
        # The reason is the fetch's category (fetch.py), never what an answer said.
        body = hold_for(st, WINDOW + 2 * INTERVAL, 2, f"Prometheus {prometheus.url}: connection refused")
        assert "metrics missing for auto-0" in cond(body, "AutoscalingActive")["message"]
    finally:
        prometheus.start()
    downs = times(st, "ScaledDown")
    wait_for(lambda: cond(server(st), "AutoscalingActive").get("status") == "True", 90, "Prometheus back")
    wait_for(lambda: replicas(st) == 1, WINDOW + 120, "scale-down to 1", interval=0.5)
    wait_for(lambda: times(st, "ScaledDown") == downs + 1, 30, "second ScaledDown event")
    assert st["operator"].alive()
