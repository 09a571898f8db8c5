"""Autoscaling benchmark: reaction time, scrape load and stability on a real vLLM, for the operator's read
schedule before (fixed) and as shipped (adaptive), beside a KEDA-default simulation.

    python bench/autoscale.py                                # 10 trials per source and schedule, 600 s of load each
    python bench/autoscale.py --trials 4 --stability-seconds 240   # a quicker look

Prints figures and writes ``out/bench-autoscale/`` (results.json, trace.json, autoscale.png).
Not a test. Everything is real except the GPU: the test bed's local kube-apiserver +
controller-manager, the operator process (restarted with VLLM_OPERATOR_AUTOSCALER_READS=fixed for
the old schedule), real vLLM servers on the CPU as the pods (fake kubelet, one
127.x.y.z address per pod), a real Prometheus (file-based discovery), and the e2e load
generator.

reaction   the server at 1 replica, idle; a burst of requests; the time from the queue
           (vllm:num_requests_waiting, sampled every 0.2 s straight from vLLM) first
           exceeding targetWaitingPerReplica to the StatefulSet's spec.replicas being
           patched (polled every 0.2 s). Repeated for `source: Pods` and `source:
           Prometheus` at the operator's default interval (5 s), the read schedules alternating
           trial by trial. The new pod runs no vLLM in these trials (it stays "loading"), so the
           server scales back between trials.
load       per read schedule, --load-seconds idle and as long with as many closed-loop clients
           as vLLM has slots (requests running, none waiting: busy below the target): the
           operator's pod scrapes, their bytes, its status applies and its CPU time per minute
           (its own /metrics and /proc), one server with one ready pod.
stability  the default scale-down window (120 s); a constant closed-loop load (clients
           sending back to back) for --stability-seconds, the second replica a real vLLM
           that loads for a minute or more; replica changes are counted, per read schedule.
KEDA sim   the last schedule's recorded queue trace replayed through the same policy (policy.decide) at
           KEDA's defaults: Prometheus scraping every 15 s, KEDA polling every 30 s, the
           HPA's 300 s scale-down window; random phases (--sim-draws per trace). The same
           replay at the operator's settings checks the simulation against the measurements.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

import yaml  # noqa: E402
from kubernetes import client  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from e2e.testbed import vllm_env  # noqa: E402
from e2e.testbed.controlplane import ControlPlane, wait_for  # noqa: E402
from e2e.testbed.fakekubelet import FakeKubelet  # noqa: E402
from e2e.testbed.loadgen import LoadGenerator  # noqa: E402
from e2e.testbed.operator_process import OperatorProcess  # noqa: E402
from e2e.testbed.procs import free_port  # noqa: E402
from e2e.testbed.prometheus import PrometheusServer  # noqa: E402
from vllm_operator.api import AutoscalingSpec  # noqa: E402
from vllm_operator.autoscaler import policy, schedule  # noqa: E402
from vllm_operator.sources.vllm_metrics import Sample, parse_vllm_metrics  # noqa: E402
from vllm_operator.kube.client import Kube  # noqa: E402

NAME = "bench"
TARGET = 4
SLOTS = 2  # vLLM --max-num-seqs of the bench servers (small, so a queue forms on a CPU)
CRD = ROOT / "crds" / "vllmservers.vllm-operator.io.yaml"
GROUP_PATH = "/apis/vllm-operator.io/v1alpha1"


# --------------------------------------------------------------------------- the pods
def _pick_ips(n: int) -> list[str]:
    import socket
    for _ in range(50):
        base = f"127.{random.randint(100, 250)}.{random.randint(1, 254)}"
        ips = [f"{base}.{10 + i}" for i in range(n)]
        ok = True
        for ip in ips:
            with socket.socket() as s:
                try:
                    s.bind((ip, 8000))
                except OSError:
                    ok = False
        if ok:
            return ips
    raise RuntimeError("no free loopback addresses")


class Pods:
    """Fake-kubelet hooks: pod 0 (and, with `real_second`, pod 1) run a real vLLM; servers stay warm."""

    def __init__(self, namespace: str, workdir: Path, prometheus: PrometheusServer):
        self.namespace, self.workdir, self.prometheus = namespace, workdir, prometheus
        self.kubelet: Optional[FakeKubelet] = None
        self.servers: dict[str, vllm_env.VLLMProcess] = {}
        self.pod_ip: dict[str, str] = {}
        self.real_second = False
        self.lock = threading.Lock()

    def on_pod_start(self, pod, ip: str) -> bool:
        name = pod.metadata.name
        with self.lock:
            self.pod_ip[name] = ip
            self._targets()
            if name.endswith("-0") or self.real_second:
                server = self.servers.get(ip)
                if server is None or not server.alive():
                    server = self.servers[ip] = vllm_env.start_vllm(
                        ip, 8000, max_num_seqs=SLOTS, max_model_len=1024, log_path=self.workdir / f"vllm-{ip}.log")
                threading.Thread(target=self._ready_when_healthy, args=(name, server), daemon=True).start()
        return False

    def _ready_when_healthy(self, name: str, server: vllm_env.VLLMProcess) -> None:
        server.wait_healthy(timeout=600)
        self.kubelet.set_ready(self.namespace, name, True)

    def on_pod_stop(self, pod, ip: str) -> None:
        with self.lock:
            self.pod_ip.pop(pod.metadata.name, None)
            self._targets()

    def _targets(self) -> None:
        self.prometheus.set_targets([(f"{ip}:8000", {"namespace": self.namespace, "pod": p})
                                     for p, ip in sorted(self.pod_ip.items())])

    def url(self, pod: str) -> str:
        return f"http://{self.pod_ip[pod]}:8000"

    def scrape(self, pod: str) -> Optional[Sample]:
        ip = self.pod_ip.get(pod)
        server = self.servers.get(ip or "")
        if server is None:
            return None
        try:
            return parse_vllm_metrics(pod, server.metrics_text(timeout=1), time.time())
        except OSError:
            return None

    def close(self) -> None:
        for s in self.servers.values():
            s.stop(grace=10)


# --------------------------------------------------------------------------- the operator, per read schedule
#: The operator's environment per read schedule (autoscaler/actuator.py READS_ENV).
READ_ENV = {"fixed": {"VLLM_OPERATOR_AUTOSCALER_READS": "fixed"}, "adaptive": {}}


class Operators:
    """One operator process at a time, restarted when the read schedule changes; its own /metrics on a port."""

    def __init__(self, kubeconfig: str, out: Path, prometheus_url: str):
        self.kubeconfig, self.out, self.prometheus_url = kubeconfig, out, prometheus_url
        self.mode: Optional[str] = None
        self.proc: Optional[OperatorProcess] = None
        self.port = 0

    def run(self, mode: str) -> None:
        if mode == self.mode and self.proc is not None and self.proc.alive():
            return
        self.stop()
        self.port = free_port()
        self.proc = OperatorProcess(self.kubeconfig, self.out / f"operator-{mode}.log", resync_seconds=30,
                                    env=READ_ENV[mode], extra_args=["--prometheus-url", self.prometheus_url,
                                                                    "--health-port", str(self.port)]).start()
        self.mode = mode
        wait_for(lambda: self._get("/readyz").startswith("ok") or None, 120, "operator ready")

    def _get(self, path: str) -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.read().decode()
        except OSError:
            return ""

    def counters(self) -> dict[str, float]:
        """Its pod scrapes, their bytes, its status applies, and its CPU seconds, now."""
        out = {"t": time.monotonic(), "scrapes": 0.0, "bytes": 0.0, "status_applies": 0.0}
        for family in text_string_to_metric_families(self._get("/metrics")):
            for sample in family.samples:
                if sample.name == "vllm_operator_pod_scrapes_total":
                    out["scrapes"] += sample.value
                elif sample.name == "vllm_operator_pod_scrape_bytes_total":
                    out["bytes"] += sample.value
                elif sample.name == "vllm_operator_api_writes_total" and sample.labels.get(
                        "resource") == "vllmservers/status":
                    out["status_applies"] += sample.value
        assert self.proc is not None and self.proc.proc is not None
        stat = Path(f"/proc/{self.proc.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        out["cpu_seconds"] = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
        return out

    def load(self, seconds: float) -> dict[str, float]:
        """Per minute over `seconds` (one server, one ready pod: per server and per pod alike)."""
        a = self.counters()
        time.sleep(seconds)
        b = self.counters()
        per_min = 60.0 / (b["t"] - a["t"])
        scrapes = b["scrapes"] - a["scrapes"]
        return {"scrapes_per_min": round(scrapes * per_min, 1),
                "kb_per_min": round((b["bytes"] - a["bytes"]) * per_min / 1000, 1),
                "bytes_per_scrape": round((b["bytes"] - a["bytes"]) / scrapes) if scrapes else None,
                "status_applies_per_min": round((b["status_applies"] - a["status_applies"]) * per_min, 2),
                "operator_cpu_ms_per_min": round((b["cpu_seconds"] - a["cpu_seconds"]) * per_min * 1000)}

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
        self.proc, self.mode = None, None


# --------------------------------------------------------------------------- the trace
@dataclass
class Point:
    t: float                      # seconds (monotonic)
    waiting: dict[str, float]     # per ready pod
    running: dict[str, float]
    replicas: int                 # StatefulSet spec.replicas
    ready: list[str]
    starting: int


@dataclass
class Sampler:
    """Every `period` s: the ready pods' queue straight from vLLM, the StatefulSet's replicas, the pods."""

    kube: Kube
    namespace: str
    pods: Pods
    period: float = 0.2
    points: list[Point] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: Optional[threading.Thread] = None

    def start(self) -> "Sampler":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                sts = self.kube.get("apps/v1", "StatefulSet", self.namespace, NAME)
                plist = self.kube.list("v1", "Pod", self.namespace)
                ready = sorted(p["metadata"]["name"] for p in plist if not p["metadata"].get("deletionTimestamp")
                               and any(c["type"] == "Ready" and c["status"] == "True"
                                       for c in (p.get("status") or {}).get("conditions") or []))
                starting = sum(1 for p in plist if not p["metadata"].get("deletionTimestamp")) - len(ready)
                waiting, running = {}, {}
                for name in ready:
                    s = self.pods.scrape(name)
                    if s is not None and s.ok:
                        waiting[name], running[name] = s.waiting, s.running
                self.points.append(Point(t, waiting, running, (sts or {}).get("spec", {}).get("replicas", 1),
                                         ready, starting))
            except Exception:  # noqa: BLE001 - a missed sample is a gap, not a failure
                pass
            self._stop.wait(max(0.0, self.period - (time.monotonic() - t)))

    def since(self, t0: float) -> list[Point]:
        return [p for p in self.points if p.t >= t0]


def crossing(points: list[Point], target: float) -> Optional[float]:
    """When the queue first exceeded the target (the average per ready replica)."""
    for p in points:
        if p.ready and sum(p.waiting.values()) / len(p.ready) > target:
            return p.t
    return None


def first_patch(points: list[Point], above: int) -> Optional[float]:
    return next((p.t for p in points if p.replicas > above), None)


# --------------------------------------------------------------------------- the simulation
def simulate(points: list[Point], spec: AutoscalingSpec, *, poll: float, scrape: Optional[float],
             rng: random.Random, start_replicas: int = 1, hpa_rules: bool = False) -> list[tuple[float, int]]:
    """Replay a trace through policy.decide at a polling period, with the numbers a Prometheus
    scraping every `scrape` s would hold (None: read straight from the pods). Returns the
    (time, desired) of every poll. The replay does not change the recorded queue.
    `hpa_rules`: what an HPA does instead (loading replicas are not capacity on the way, no
    running-requests floor)."""
    if not points:
        return []
    t0, t_end = points[0].t, points[-1].t
    poll_phase = rng.uniform(0, poll)
    scrape_phase = rng.uniform(0, scrape) if scrape else 0.0

    def at(t: float) -> Point:
        lo, hi = 0, len(points) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if points[mid].t <= t:
                lo = mid
            else:
                hi = mid - 1
        return points[lo]

    history: policy.History = []
    replicas, out = start_replicas, []
    t = t0 + poll_phase
    while t <= t_end:
        # The numbers of the last scrape (a trace begins idle, so before it the queue was as at its start).
        seen_at = t if not scrape else t0 + scrape_phase + math.floor((t - t0 - scrape_phase) / scrape) * scrape
        p = at(max(t0, seen_at))
        now = at(t)
        ready = [n for n in now.ready][:replicas]
        samples = [Sample(n, waiting=p.waiting.get(n, 0.0), running=p.running.get(n, 0.0)) for n in ready]
        starting = 0 if hpa_rules else max(0, replicas - len(ready))
        if not history:
            history = [(t - spec.scale_up_stabilization_seconds - 0.001, replicas)]
        d = policy.decide(samples, replicas, len(ready), starting, spec, history, t,
                          slots=None if hpa_rules else SLOTS)
        history = policy.record(history, t, d, spec, poll)
        replicas = d.desired
        out.append((t, replicas))
        t += poll
    return out


def sim_reactions(points: list[Point], spec: AutoscalingSpec, *, poll: float, scrape: Optional[float],
                  draws: int, seed: int) -> tuple[list[float], int]:
    """Reaction times (crossing -> first scale-up) over `draws` random phases; and how many never reacted."""
    cross = crossing(points, spec.target_waiting_per_replica)
    rng = random.Random(seed)
    out, missed = [], 0
    for _ in range(draws):
        decisions = simulate(points, spec, poll=poll, scrape=scrape, rng=rng)
        up = next((t for t, r in decisions if r > 1), None)
        if cross is None or up is None:
            missed += 1
        else:
            out.append(max(0.0, up - cross))
    return out, missed


def pct(values: list[float], q: float) -> Optional[float]:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q
    f, c = math.floor(k), math.ceil(k)
    return s[f] + (s[c] - s[f]) * (k - f)


def summary(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": pct(values, 0.5), "p95": pct(values, 0.95),
            "mean": statistics.fmean(values) if values else None, "max": max(values) if values else None}


# --------------------------------------------------------------------------- the run
def server_doc(namespace: str, **autoscaling: Any) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "llama-3b-autoscaled.yaml").read_text())
    doc["metadata"] = {"name": NAME, "namespace": namespace}
    doc["spec"]["engine"] = {"maxNumSeqs": SLOTS}  # what the real vLLM pods run with
    doc["spec"]["autoscaling"] = {"enabled": True, "minReplicas": 1, "maxReplicas": 2, "source": "Pods",
                                  "targetWaitingPerReplica": TARGET, **autoscaling}
    return doc


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=10, help="reaction trials per source")
    ap.add_argument("--sources", default="Pods,Prometheus", help="sources of the reaction trials")
    ap.add_argument("--burst", type=int, default=60,
                    help="requests per reaction trial (1000 tokens each; the queue must outlast a scrape interval)")
    ap.add_argument("--scrape-interval", default="15s", help="Prometheus's scrape interval (source Prometheus)")
    ap.add_argument("--stability-seconds", type=float, default=600, help="0: reaction trials only")
    ap.add_argument("--clients", type=int, default=8, help="closed-loop clients during the stability run")
    ap.add_argument("--sim-draws", type=int, default=200)
    ap.add_argument("--reads", default="fixed,adaptive",
                    help="the operator's read schedules to compare: fixed (before: every intervalSeconds, the whole "
                         "/metrics; VLLM_OPERATOR_AUTOSCALER_READS=fixed) and adaptive (as shipped)")
    ap.add_argument("--load-seconds", type=float, default=60, help="each scrape-load window (idle, busy)")
    ap.add_argument("--out", default=str(ROOT / "out" / "bench-autoscale"))
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    scrape_s = float(args.scrape_interval.rstrip("s"))
    vllm_env.ensure_vllm()

    results: dict[str, Any] = {"settings": vars(args) | {"target": TARGET, "max_num_seqs": SLOTS,
                                                         "interval_seconds": 5}, "reads": {}}
    cp = ControlPlane(out / "cp")
    cp.start()
    prometheus = PrometheusServer(out / "prometheus", scrape_interval=args.scrape_interval)
    operators = kubelet = pods = sampler = None
    try:
        prometheus.start()
        kube = Kube(cp.api_client())
        cp.kubectl("apply", "-f", str(CRD))
        cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/vllmservers.vllm-operator.io")
        namespace = "bench"
        core = client.CoreV1Api(kube.api)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        # The test bed's Kubernetes (1.37) makes no token Secrets for ServiceAccounts: the account is enough.
        wait_for(lambda: core.read_namespaced_service_account("default", namespace), 60, "default ServiceAccount")
        pods = Pods(namespace, out, prometheus)
        kubelet = FakeKubelet(kube.api, namespace=namespace, node_name="gpu-bench", gpu_product="NVIDIA-L4",
                              ip_pool=_pick_ips(3), on_pod_start=pods.on_pod_start, on_pod_stop=pods.on_pod_stop,
                              auto_ready=False)
        pods.kubelet = kubelet
        kubelet.start()
        operators = Operators(cp.kubeconfig, out, prometheus.url)
        sampler = Sampler(Kube(kube.api, timeout=5.0), namespace, pods).start()

        def apply(**autoscaling: Any) -> None:
            cp.kubectl("apply", "-f", "-", input=json.dumps(server_doc(namespace, **autoscaling)))

        def replicas() -> int:
            return kube.get("apps/v1", "StatefulSet", namespace, NAME)["spec"].get("replicas", 1)

        def idle_at_one() -> None:
            wait_for(lambda: replicas() == 1 and sampler.points[-1].ready == [f"{NAME}-0"]
                     and sum(sampler.points[-1].waiting.values()) == 0
                     and sum(sampler.points[-1].running.values()) == 0, 300, "idle at 1 replica")

        reads = args.reads.split(",")
        operators.run(reads[0])
        apply(scaleDownStabilizationSeconds=10)
        t_load = time.monotonic()
        wait_for(lambda: sampler.points and sampler.points[-1].ready == [f"{NAME}-0"], 900, "pod 0 serving")
        print(f"vLLM pod 0 ready after {time.monotonic() - t_load:.0f}s", flush=True)

        # ---- reaction trials: the read schedules alternate trial by trial (the machine's load drifts)
        for source in args.sources.split(","):
            apply(scaleDownStabilizationSeconds=10, source=source)
            reactions: dict[str, list[float]] = {mode: [] for mode in reads}
            missed = dict.fromkeys(reads, 0)
            for trial in range(args.trials):
                for mode in reads:
                    operators.run(mode)
                    idle_at_one()
                    # From idle: the last scale (the one back to 1) older than the time the adaptive reads
                    # stay fast after one, as for a server that has been idle a while.
                    last_scale = max((p.t for p in sampler.points if p.replicas != 1), default=0.0)
                    time.sleep(max(0.0, last_scale + schedule.RECENT_SCALE_SECONDS + 1 - time.monotonic()))
                    if source == "Prometheus":  # Prometheus must have seen the idle queue too
                        time.sleep(scrape_s + 1)
                    # A random phase against the operator's reads (5 s at most) and Prometheus's scrapes.
                    time.sleep(random.uniform(0, scrape_s if source == "Prometheus" else 5.0))
                    t0 = time.monotonic()
                    gen = LoadGenerator(lambda: [pods.url(f"{NAME}-0")], rate=50, max_requests=args.burst,
                                        duration=180, max_tokens=1000).start()
                    u: Optional[float] = None
                    try:
                        wait_for(lambda: replicas() > 1, 120, "scale-up", interval=0.1)
                        u = time.monotonic()
                    except TimeoutError:
                        pass
                    finally:
                        gen.stop()
                    c = crossing(sampler.since(t0), TARGET)
                    if c is None or u is None:  # the queue drained before a read saw it, or the sampler missed it
                        missed[mode] += 1
                        print(f"{source} {mode} trial {trial + 1}: no scale-up measured (queue above target at "
                              f"{None if c is None else round(c - t0, 1)}, scale-up {u is not None})", flush=True)
                        continue
                    reactions[mode].append(u - c)
                    print(f"{source} {mode} trial {trial + 1}: queue above target at +{c - t0:.1f}s, replicas "
                          f"patched {u - c:.2f}s later", flush=True)
            for mode in reads:
                results["reads"].setdefault(mode, {})[f"reaction_{source.lower()}"] = summary(
                    reactions[mode]) | {"values": reactions[mode], "missed": missed[mode]}

        # ---- scrape load per server: idle, and busy below the target (as many clients as slots: no queue)
        apply(scaleDownStabilizationSeconds=10, source="Pods")
        for mode in reads:
            operators.run(mode)
            idle_at_one()
            results["reads"][mode]["load_idle"] = operators.load(args.load_seconds)
            gen = LoadGenerator(lambda: [pods.url(f"{NAME}-0")], concurrency=SLOTS, max_requests=100_000,
                                duration=args.load_seconds + 60, max_tokens=1000).start()
            try:
                wait_for(lambda: sum(sampler.points[-1].running.values()) >= 1, 60, "requests running")
                results["reads"][mode]["load_busy"] = operators.load(args.load_seconds)
            finally:
                gen.stop()
            print(f"scrape load, {mode}: idle {results['reads'][mode]['load_idle']}, "
                  f"busy {results['reads'][mode]['load_busy']}", flush=True)

        if args.stability_seconds <= 0:
            (out / "results.json").write_text(json.dumps(results, indent=1))
            report(results, out)
            return 0

        # ---- stability: default window, constant load, a real second replica; each read schedule in turn
        ready_urls = lambda: [pods.url(n) for n in (sampler.points[-1].ready if sampler.points else [])]  # noqa: E731
        pts: list[Point] = []
        t0 = 0.0
        for mode in reads:
            operators.run(mode)
            apply(scaleDownStabilizationSeconds=10, source="Pods")
            idle_at_one()
            pods.real_second = True
            apply(source="Pods", maxReplicas=3)  # scaleDownStabilizationSeconds: the default 120
            time.sleep(10)
            t0 = time.monotonic()
            before = operators.counters()
            gen = LoadGenerator(ready_urls, concurrency=args.clients, max_requests=100_000,
                                duration=args.stability_seconds, max_tokens=1000).start()
            while gen.running:
                time.sleep(1)
            gen.stop()
            after = operators.counters()
            pods.real_second = False
            pts = sampler.since(t0 - 10)  # from 10 s before the load: what a scraper saw before it
            changes = [(round(b.t - t0, 1), a.replicas, b.replicas) for a, b in zip(pts, pts[1:])
                       if a.replicas != b.replicas]
            c = crossing(pts, TARGET)
            results["reads"][mode]["stability"] = {
                "seconds": args.stability_seconds, "clients": args.clients, "changes": changes,
                "reaction_seconds": (first_patch(pts, 1) - c) if c and first_patch(pts, 1) else None,
                "second_replica_ready_after": next((round(p.t - t0, 1) for p in pts if len(p.ready) >= 2), None),
                "status_applies": after["status_applies"] - before["status_applies"],
                "scrapes": after["scrapes"] - before["scrapes"]}
            print(f"stability, {mode}: replica changes over {args.stability_seconds:.0f}s of constant load: "
                  f"{changes}", flush=True)
            (out / f"trace-{mode}.json").write_text(json.dumps([p.__dict__ for p in pts]))

        # ---- the simulation on the same traces
        ours = AutoscalingSpec(enabled=True, min_replicas=1, max_replicas=3, target_waiting_per_replica=TARGET)
        keda = ours.model_copy(update={"scale_down_stabilization_seconds": 300})
        sims: dict[str, Any] = {}
        for label, spec, poll, scrape in (("operator, Pods (sim)", ours, 5.0, None),
                                          (f"operator, Prometheus {scrape_s:g}s (sim)", ours, 5.0, scrape_s),
                                          ("KEDA defaults (sim)", keda, 30.0, 15.0)):
            values, missed = sim_reactions(pts, spec, poll=poll, scrape=scrape, draws=args.sim_draws, seed=1)
            sims[label] = summary(values) | {"never_reacted": missed}
        results["simulated_on_stability_trace"] = sims
        rng = random.Random(7)
        keda_curve = simulate(pts, keda, poll=30.0, scrape=15.0, rng=rng)
        hpa_curve = simulate(pts, keda, poll=30.0, scrape=15.0, rng=random.Random(7), hpa_rules=True)
        for key, curve in (("keda_sim_changes", keda_curve), ("keda_hpa_rules_sim_changes", hpa_curve)):
            results[key] = [(round(t - t0, 1), r) for (t, r), (_, prev) in zip(curve[1:], curve) if r != prev]
        (out / "results.json").write_text(json.dumps(results, indent=1))
        plot(out / "autoscale.png", pts, t0, keda_curve, hpa_curve)
        report(results, out)
        return 0
    finally:
        if sampler:
            sampler.stop()
        if operators:
            operators.stop()
        if kubelet:
            kubelet.stop()
        if pods:
            pods.close()
        prometheus.stop()
        cp.stop()


def plot(path: Path, pts: list[Point], t0: float, keda_curve: list[tuple[float, int]],
         hpa_curve: list[tuple[float, int]]) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib): no plot", file=sys.stderr)
        return
    t = [p.t - t0 for p in pts]
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(11, 8.5), sharex=True,
                                        gridspec_kw={"height_ratios": [2, 1.3, 1.3]})
    ax1.plot(t, [sum(p.waiting.values()) for p in pts], label="requests waiting (vllm:num_requests_waiting)")
    ax1.plot(t, [sum(p.running.values()) for p in pts], label="requests running", alpha=0.7)
    ax1.axhline(TARGET, color="grey", ls="--", lw=0.8, label=f"target per replica ({TARGET})")
    ax1.set_ylabel("requests")
    ax1.legend(loc="upper right", fontsize=8)
    ax1.set_title("Constant load (closed loop), one vLLM on the CPU per replica")
    ax2.step(t, [p.replicas for p in pts], where="post", label="desired (StatefulSet replicas)")
    ax2.step(t, [len(p.ready) for p in pts], where="post", label="ready", ls="--")
    ax2.set_ylabel("this operator")
    ax2.set_ylim(0, 3.5)
    ax2.legend(loc="lower right", fontsize=8)
    keda_curve = [(pts[0].t, 1), *keda_curve]
    hpa_curve = [(pts[0].t, 1), *hpa_curve]
    kt = [x - t0 for x, _ in keda_curve]
    ax3.step(kt, [r for _, r in keda_curve], where="post", color="tab:red",
             label="desired: this policy at KEDA's defaults (30 s polling, 15 s scrape, 300 s down window)")
    ax3.step([x - t0 for x, _ in hpa_curve], [r for _, r in hpa_curve], where="post", color="tab:purple",
             ls=":", label="desired: same timing, HPA rules (loading replicas not counted, no running floor)")
    ax3.set_ylabel("KEDA (sim)")
    ax3.set_ylim(0, 3.5)
    ax3.set_xlabel("seconds since the load started")
    ax3.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def report(results: dict, out: Path) -> None:
    def fmt(s: dict) -> str:
        if not s or s.get("p50") is None:
            return "n/a"
        extra = f", never reacted {s['never_reacted']}" if s.get("never_reacted") else (
            f", missed {s['missed']}" if s.get("missed") else "")
        return f"p50 {s['p50']:.1f}s  p95 {s['p95']:.1f}s  max {s['max']:.1f}s  (n={s['n']}{extra})"

    print("\nreaction time (queue above target -> replicas patched)")
    for mode, r in results.get("reads", {}).items():
        for key in ("reaction_pods", "reaction_prometheus"):
            if key in r:
                label = f"measured, {mode} reads, source {key.split('_')[1]}"
                print(f"  {label:<45}{fmt(r[key])}")
    for label, s in results.get("simulated_on_stability_trace", {}).items():
        print(f"  {label:<29}{fmt(s)}")
    print("scrape load per server (one ready pod), per minute")
    for mode, r in results.get("reads", {}).items():
        for window in ("load_idle", "load_busy"):
            if window in r:
                print(f"  {mode:<9} {window[5:]:<5} {r[window]}")
    for mode, r in results.get("reads", {}).items():
        st = r.get("stability")
        if st:
            print(f"stability, {mode} reads: {len(st['changes'])} replica change(s) in {st['seconds']:.0f}s: "
                  f"{st['changes']}; {st['status_applies']:.0f} status applies, {st['scrapes']:.0f} scrapes")
    if "keda_sim_changes" in results:
        print(f"KEDA-default replay of the last trace changes replicas at: {results['keda_sim_changes']}")
        print(f"  ... with the HPA's rules instead of this policy's: {results['keda_hpa_rules_sim_changes']}")
    print(f"results: {out / 'results.json'}")


if __name__ == "__main__":
    sys.exit(main())
