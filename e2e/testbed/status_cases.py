"""The statuses the operator writes, produced by the real Reconciler and the real autoscaler tick over the
examples and the failure cases, without a cluster (tests/unit/test_status.py compares them with what the operator
wrote before and validates them against the CRD's schema on the real API server).

Each producer returns {case name: [status as sent to the status subresource, ...]} in the order they were
written: the reconciler's (every reconcile that wrote one) and the autoscaler's (every tick that wrote one)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from e2e.testbed.memory_world import NS, World
from vllm_operator.autoscaler import actuator
from vllm_operator.builders import LWS_API_VERSION
from vllm_operator.sources.vllm_metrics import PodRef, Sample
from vllm_operator.kube.client import ApiError
from vllm_operator.controller.drift import HASH_ANNOTATION

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.yaml"))
#: The time of the failure cases of tests/unit/test_failures.py (their pods started at 10:00).
FAILURE_NOW = "2026-01-01T10:10:00Z"

Statuses = dict[str, list[dict[str, Any]]]


def _recording(world: World) -> list[dict[str, Any]]:
    """Every status the world's Reconciler sends, as sent (a copy of the JSON)."""
    sent: list[dict[str, Any]] = []
    real_apply = world.kube.apply

    def apply(obj, **kw):
        if kw.get("subresource") == "status":
            sent.append(json.loads(json.dumps(obj["status"])))
        return real_apply(obj, **kw)

    world.kube.apply = apply  # type: ignore[method-assign]
    return sent


def _ready_pod(world: World, name: str = "srv-0", ip: str = "10.0.0.5") -> None:
    world.add_pod(name, status={"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}],
                                "containerStatuses": [{"name": "vllm", "ready": True, "restartCount": 0,
                                                       "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]})


class _Measured:
    """kvcapacity.Observations as the reconciler asks it: what vLLM allocated on each ready pod."""

    def __init__(self, tokens: dict[str, int]):
        self.tokens = tokens

    def measure(self, refs):
        return {r.name: self.tokens[r.name] for r in refs if r.name in self.tokens}


def _case(scenario: Callable[[World], None], spec_changes: Optional[dict] = None, *,
          example: str = "llama-8b-single-gpu.yaml", read_events: bool = False,
          now: str = "2026-01-01T00:00:00Z", lws: bool = True) -> list[dict[str, Any]]:
    world = World(spec_changes, example, read_events=read_events, now=now)
    # No KEDA in this cluster; LeaderWorkerSet where `lws`.
    world.kube.serves = lambda api_version: lws and api_version == LWS_API_VERSION  # type: ignore[attr-defined]
    world.kube.field_manager = "vllm-operator"  # type: ignore[attr-defined]
    real_apply = world.kube.apply

    def apply(obj, **kw):  # the autoscaler co-owning replicas (ownership.adopt_replicas) sets only those
        if kw.get("field_manager") == actuator.FIELD_MANAGER and obj["kind"] == "StatefulSet":
            live = world.kube.objects[("StatefulSet", NS, obj["metadata"]["name"])]
            live["spec"]["replicas"] = obj["spec"]["replicas"]
            return copy.deepcopy(live)
        return real_apply(obj, **kw)

    world.kube.apply = apply  # type: ignore[method-assign]
    sent = _recording(world)
    scenario(world)
    return sent


def _lifecycle(world: World) -> None:
    """Created, rolled out, serving; then a spec change rolls it again."""
    world.reconcile()
    world.workload_reports(ready=0)
    world.reconcile()
    [sts] = [world.kube.objects[(k, n, name)] for (k, n, name) in world.kube.objects
             if k in ("StatefulSet", "DaemonSet", "LeaderWorkerSet") and name == "srv"]
    want = sts["spec"].get("replicas", 1)
    world.workload_reports(ready=want)
    world.reconcile()
    world.change_spec(image="vllm/vllm-openai:v0.32.1")
    world.reconcile()
    world.workload_reports(ready=want, updated=0)
    world.reconcile()


def _no_node(world: World) -> None:
    world.reconcile()
    world.workload_reports(ready=0, desired=0)
    world.reconcile()


def _invalid_update(world: World) -> None:
    world.reconcile()
    world.workload_reports(ready=1)
    world.reconcile()
    world.change_spec(gpu={"count": 3, "product": "NVIDIA-L4"})  # 32 heads do not split over 3 GPUs
    world.reconcile()
    world.reconcile()


def _name_conflict(world: World) -> None:
    world.kube.objects[("Service", NS, "srv")] = {"apiVersion": "v1", "kind": "Service",
                                                   "metadata": {"name": "srv", "namespace": NS, "uid": "theirs"}}
    world.reconcile()


def _api_rejected(world: World) -> None:
    real_apply = world.kube.apply

    def apply(obj, **kw):
        if obj["kind"] == "StatefulSet" and not kw.get("subresource"):
            raise ApiError(422, json.dumps({"message": 'StatefulSet.apps "srv" is invalid: spec.template.spec.'
                                                       'containers[0].image: Required value'}), "PATCH", "/x")
        return real_apply(obj, **kw)

    world.kube.apply = apply  # type: ignore[method-assign]
    world.reconcile()


def _pod_security(world: World) -> None:
    world.kube.objects[("Namespace", None, NS)] = {"metadata": {"name": NS, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted"}}}
    world.reconcile()


def _plan_outdated(world: World) -> None:
    world.reconcile()
    world.workload_reports(ready=1)
    world.reconcile()
    sts = world.kube.objects[("StatefulSet", NS, "srv")]  # as an older operator version left it
    sts["metadata"]["annotations"][HASH_ANNOTATION] = "older"
    args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
    args[args.index("--max-num-seqs") + 1] = "7"
    world.reconcile()


def _kv_capacity(tokens: int) -> Callable[[World], None]:
    def scenario(world: World) -> None:
        world.reconciler.kv_capacity = _Measured({"srv-0": tokens})  # type: ignore[assignment]
        world.reconcile()
        _ready_pod(world)
        world.workload_reports(ready=1)
        world.reconcile()
        world.kube.objects.pop(("Pod", NS, "srv-0"))  # a restart: the measurement stays
        world.workload_reports(ready=0)
        world.reconcile()
    return scenario


class _Adapters:
    """controller/adapters.AdapterSync as the reconciler asks it: what each ready pod lists, a load that failed."""

    def observe(self, namespace, server, refs, incarnations, wanted):
        from vllm_operator.adapters import PodAdapters
        return [PodAdapters(r.name, listed=frozenset({"sql"}), errors={"broken": "load: HTTP 404"}) for r in refs]


def _adapters(world: World) -> None:
    world.reconciler.adapter_sync = _Adapters()  # type: ignore[assignment]
    world.reconcile()
    _ready_pod(world)
    world.workload_reports(ready=1)
    world.reconcile()


ADAPTERS = {"adapters": [{"name": "sql", "source": "org/sql-lora", "rank": 8},
                         {"name": "broken", "source": "/cache/adapters/missing", "rank": 8}]}


def _failure(pods: list[dict[str, Any]], events: list[dict[str, Any]]) -> Callable[[World], None]:
    """One failure case of tests/unit/test_failures.py: its pods (labelled as the workload's) and Events."""
    def scenario(world: World) -> None:
        world.reconcile()
        sts = world.kube.objects[("StatefulSet", NS, "srv")]
        labels = sts["spec"]["template"]["metadata"]["labels"]
        for pod in pods:
            pod = copy.deepcopy(pod)
            pod["metadata"] = {**pod["metadata"], "namespace": NS, "labels": labels}
            world.kube.objects[("Pod", NS, pod["metadata"]["name"])] = pod
        for e in events:
            e = copy.deepcopy(e)
            if e["involvedObject"].get("kind") == "StatefulSet":
                e["involvedObject"]["uid"] = sts["metadata"]["uid"]
            world.cluster_events.append(e)
        world.workload_reports(ready=sum(1 for p in pods if any(
            cs.get("ready") for cs in (p.get("status") or {}).get("containerStatuses") or [])))
        world.reconcile()
    return scenario


def reconciler_statuses() -> Statuses:
    from e2e.testbed.failure_cases import CASES

    out: Statuses = {}
    for example in EXAMPLES:
        out[f"lifecycle/{example}"] = _case(_lifecycle, example=example)
    out["scaled-to-zero"] = _case(_lifecycle, {"replicas": 0})
    out["daemonset-on-no-node"] = _case(_no_node, {"workload": "DaemonSet", "cache": None})
    out["leaderworkerset-not-installed"] = _case(lambda w: (w.reconcile(), w.reconcile()),
                                                 example="llama-70b-two-nodes.yaml", lws=False)
    out["invalid-from-the-start"] = _case(lambda w: (w.reconcile(), w.reconcile()),
                                          {"gpu": {"count": 3, "product": "NVIDIA-L4"}})
    out["invalid-update"] = _case(_invalid_update)
    out["name-conflict"] = _case(_name_conflict)
    out["api-rejected"] = _case(_api_rejected)
    out["pod-security"] = _case(_pod_security, {"ipc": "Host", "gpu": {"count": 2, "product": "NVIDIA-L4"}})
    out["plan-outdated"] = _case(_plan_outdated)
    out["hpa"] = _case(_lifecycle, {"autoscaling": {"enabled": True, "mode": "HPA", "maxReplicas": 3}})
    out["keda-not-installed"] = _case(_lifecycle, {"autoscaling": {"enabled": True, "mode": "KEDA", "maxReplicas": 3,
                                                                   "prometheusURL": "http://prometheus.monitoring:9090"}})
    out["chat-template"] = _case(_lifecycle, {"engine": {"chatTemplate": "{% for m in messages %}{{ m.content }}"
                                                                          "{% endfor %}"}})
    out["chat-template-refused"] = _case(lambda w: (w.reconcile(), w.reconcile()),
                                         {"engine": {"chatTemplate": "{{ raise_exception('no') }}"}})
    out["kv-capacity-as-planned"] = _case(_kv_capacity(10**9))
    out["adapters-one-failing"] = _case(_adapters, ADAPTERS)
    out["kv-capacity-below-plan"] = _case(_kv_capacity(1000))
    for case_id, pods, events, now, *_ in CASES:
        if any("involvedObject" not in e for e in events):
            continue  # events.k8s.io/v1 Events: the in-memory World reads core/v1 ones only
        out[f"failure/{case_id}"] = _case(_failure(pods, events), read_events=True, now=now or FAILURE_NOW)
    return out


# --------------------------------------------------------------------------- the autoscaler
class _ScalerKube:
    """Just enough of kube.Kube for a tick: a StatefulSet, its pods, the server; applies recorded."""

    field_manager = actuator.FIELD_MANAGER

    def __init__(self, body: dict[str, Any], replicas: int, pods: list[dict[str, Any]], owned: bool = True):
        self.body = body
        self.sts: Optional[dict[str, Any]] = {
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "s", "namespace": "ns", "uid": "sts-uid",
                         "ownerReferences": [{"uid": "u1" if owned else "other", "controller": True}]},
            "spec": {"replicas": replicas}}
        self.pods = pods
        self.statuses: list[dict[str, Any]] = []

    def get(self, api_version, kind, namespace, name):
        return copy.deepcopy(self.sts)

    def list(self, api_version, kind, namespace, *, label_selector=None):
        return copy.deepcopy(self.pods)

    def apply(self, obj, *, subresource=None, field_manager=None):
        if subresource == "status":
            self.statuses.append(json.loads(json.dumps(obj["status"])))
            status = self.body.setdefault("status", {})
            status["autoscaling"] = obj["status"]["autoscaling"]
            status["conditions"] = [c for c in status.get("conditions") or [] if c["type"] not in
                                    actuator.CONDITIONS] + obj["status"]["conditions"]
            self.body["metadata"]["resourceVersion"] = str(int(self.body["metadata"]["resourceVersion"]) + 1)
            return copy.deepcopy(self.body)
        assert self.sts is not None
        self.sts["spec"]["replicas"] = obj["spec"]["replicas"]
        return copy.deepcopy(self.sts)

    def request(self, *args, **kwargs):
        return None


class _Queue:
    """A metrics source whose pods report the given queue (None: the scrape failed)."""

    def __init__(self, waiting: Optional[float], running: float = 1.0, kv: Optional[float] = 0.25):
        self.waiting, self.running, self.kv = waiting, running, kv

    def read(self, pods: list[PodRef]) -> list[Sample]:
        if self.waiting is None:
            return [Sample.failed(p.name, "connection refused") for p in pods]
        return [Sample(p.name, waiting=self.waiting, running=self.running, kv_cache_usage=self.kv) for p in pods]


def _pod(i: int, ready: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": f"s-{i}", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "vllm", "args": ["--max-num-seqs", "8"]}]},
            "status": {"phase": "Running", "podIP": f"10.0.0.{i + 1}",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def _tick_case(queue: list[Optional[float]], *, replicas: int = 1, pods: int = 1, spec: Optional[dict] = None,
               sts: str = "owned", kv: Optional[float] = 0.25) -> list[dict[str, Any]]:
    """Ticks 30 s apart (past STATUS_REFRESH_SECONDS: every change is written) with the given queue per pod."""
    body = yaml.safe_load((ROOT / "examples" / "llama-3b-autoscaled.yaml").read_text())
    body["metadata"] = {"name": "s", "namespace": "ns", "uid": "u1", "generation": 1, "resourceVersion": "5"}
    body["spec"]["autoscaling"].update(spec or {})
    kube = _ScalerKube(body, replicas, [_pod(i) for i in range(pods)], owned=sts == "owned")
    if sts == "missing":
        kube.sts = None
    clock = [1_767_225_600.0]  # 2026-01-01T00:00:00Z
    source = _Queue(None, kv=kv)
    scaler = actuator.Autoscaler(kube, actuator.Sources(pods=source), "ns", "s",  # type: ignore[arg-type]
                                 clock=lambda: clock[0])
    for waiting in queue:
        source.waiting = waiting
        scaler.tick(copy.deepcopy(kube.body))
        clock[0] += 30
    return kube.statuses


def autoscaler_statuses() -> Statuses:
    return {
        "steady": _tick_case([0.0, 0.0]),
        "scale-up-then-down": _tick_case([9.0, 9.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], spec={
            "scaleDownStabilizationSeconds": 60}),
        "at-max": _tick_case([50.0], replicas=3, pods=3),
        "at-min": _tick_case([0.0], replicas=2, pods=2, spec={"minReplicas": 2}),
        "no-kv-usage": _tick_case([3.0], kv=None),
        "metrics-unavailable": _tick_case([None, None]),
        "no-workload": _tick_case([0.0], sts="missing"),
        "not-ours": _tick_case([0.0], sts="theirs"),
        "invalid-spec": _tick_case([0.0], spec={"source": "Prometheus"}),
    }


def all_statuses() -> Statuses:
    return {**{f"reconciler/{k}": v for k, v in reconciler_statuses().items()},
            **{f"autoscaler/{k}": v for k, v in autoscaler_statuses().items()}}
