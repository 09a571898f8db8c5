"""The autoscaler's tick against a fake API (pure): what it writes when kopf's body lags behind its writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from vllm_operator.autoscaler import actuator

ROOT = Path(__file__).resolve().parents[1]


class FakeKube:
    """No StatefulSet yet; a status apply answers with the object at the next resourceVersion."""

    field_manager = actuator.FIELD_MANAGER

    def __init__(self, body: dict):
        self.body = json.loads(json.dumps(body))
        self.status_applies = 0

    def get(self, *args, **kwargs):
        return None

    def list(self, *args, **kwargs):
        return []

    def apply(self, obj, *, subresource=None, field_manager=None):
        assert subresource == "status"
        self.status_applies += 1
        status = self.body.setdefault("status", {})
        status["autoscaling"] = obj["status"]["autoscaling"]
        others = [c for c in status.get("conditions") or [] if c["type"] not in ("AutoscalingActive",
                                                                                "AutoscalingLimited")]
        status["conditions"] = others + obj["status"]["conditions"]
        self.body["metadata"]["resourceVersion"] = str(int(self.body["metadata"]["resourceVersion"]) + 1)
        return json.loads(json.dumps(self.body))

    def request(self, *args, **kwargs):
        return None


def test_a_lagging_body_does_not_make_every_tick_write_the_same_status_again():
    body = yaml.safe_load((ROOT / "examples" / "llama-3b-autoscaled.yaml").read_text())
    body["metadata"] = {"name": "s", "namespace": "ns", "uid": "u1", "generation": 1, "resourceVersion": "5"}
    kube = FakeKube(body)
    clock = [1000.0]
    scaler = actuator.Autoscaler(kube, actuator.Sources(), "ns", "s", clock=lambda: clock[0])
    first = scaler.tick(json.loads(json.dumps(body)))
    assert first.status_written and kube.status_applies == 1
    for _ in range(5):  # kopf has not delivered our write yet: the same old body each tick
        clock[0] += 5
        assert not scaler.tick(json.loads(json.dumps(body))).status_written
    assert kube.status_applies == 1
    clock[0] += 5
    assert not scaler.tick(json.loads(json.dumps(kube.body))).status_written  # the watch caught up
    other = json.loads(json.dumps(body))
    other["metadata"]["uid"] = "u2"  # re-created under the same name: its own status counts
    clock[0] += 5
    assert scaler.tick(other).status_written


class EmptyCache:
    """The reconciler's reader, holding no StatefulSet and no pods for the server yet."""

    def __init__(self):
        self.sts = None

    def children(self, namespace, name, uid, kinds=None):
        return {("StatefulSet", name): self.sts} if self.sts else {}

    def pods(self, namespace, name):
        return []


class CountingKube(FakeKube):
    def __init__(self, body):
        super().__init__(body)
        self.gets = 0

    def get(self, *args, **kwargs):
        self.gets += 1
        return None


def test_a_statefulset_missing_from_the_cache_is_asked_for_at_most_every_30_seconds():
    body = yaml.safe_load((ROOT / "examples" / "llama-3b-autoscaled.yaml").read_text())
    body["metadata"] = {"name": "s", "namespace": "ns", "uid": "u1", "generation": 1, "resourceVersion": "5"}
    kube, cache = CountingKube(body), EmptyCache()
    clock = [1000.0]
    scaler = actuator.Autoscaler(kube, actuator.Sources(), "ns", "s", clock=lambda: clock[0], reader=cache)
    for _ in range(6):  # 25 s of 5 s ticks
        assert scaler.tick(json.loads(json.dumps(body))).note == "the StatefulSet does not exist yet"
        clock[0] += 5
    assert kube.gets == 1
    clock[0] += actuator.UNCACHED_GET_SECONDS
    scaler.tick(json.loads(json.dumps(body)))
    assert kube.gets == 2
    cache.sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "spec": {"replicas": 1},
                 "metadata": {"name": "s", "namespace": "ns", "ownerReferences": [{"uid": "u1", "controller": True}]}}
    clock[0] += 5
    assert scaler.tick(json.loads(json.dumps(body))).note != "the StatefulSet does not exist yet"
    assert kube.gets == 2  # the cache has it now


class ScriptedSource:
    """A metrics source answering each ready pod with the next scripted sample (waiting, or an error)."""

    def __init__(self):
        self.waiting: object = 0.0

    def read(self, pods):
        from vllm_operator.autoscaler.metrics import Sample

        if isinstance(self.waiting, str):
            return [Sample.failed(p.name, self.waiting) for p in pods]
        return [Sample(p.name, waiting=self.waiting) for p in pods]


def test_the_at_max_replicas_gauge_follows_the_decisions_and_survives_a_hold():
    from vllm_operator import telemetry as metrics

    body = yaml.safe_load((ROOT / "examples" / "llama-3b-autoscaled.yaml").read_text())  # maxReplicas 4
    body["metadata"] = {"name": "s", "namespace": "ns", "uid": "u1", "generation": 1, "resourceVersion": "5"}
    cache = EmptyCache()
    cache.sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "spec": {"replicas": 4},
                 "metadata": {"name": "s", "namespace": "ns", "ownerReferences": [{"uid": "u1", "controller": True}]}}
    pods = [{"metadata": {"name": f"s-{i}", "namespace": "ns"}, "spec": {"containers": [{"name": "vllm"}]},
             "status": {"podIP": f"10.0.0.{i}", "conditions": [{"type": "Ready", "status": "True"}]}}
            for i in range(4)]
    cache.pods = lambda namespace, name: pods
    source = ScriptedSource()
    clock = [1000.0]
    scaler = actuator.Autoscaler(FakeKube(body), actuator.Sources(pods=source), "ns", "s", clock=lambda: clock[0],
                                 reader=cache)

    def tick(waiting):
        source.waiting = waiting
        clock[0] += 5
        result = scaler.tick(json.loads(json.dumps(body)))
        return result, metrics.REGISTRY.get_sample_value("vllm_operator_autoscaler_at_max_replicas",
                                                         {"namespace": "ns", "name": "s"})

    result, gauge = tick(40.0)  # 160 waiting over 4 replicas, target 4: wants 40
    assert result.decision.code == "AtLimit" and gauge == 1
    result, gauge = tick("timed out")
    assert result.decision.hold and gauge == 1  # a hold does not know better: keeps what was said
    result, gauge = tick(4.0)
    assert not result.decision.limited and gauge == 0
    metrics.forget_autoscaler("ns", "s")


def test_the_autoscaler_does_not_import_the_reconciler():
    """It shares the conditions helper (conditions.py) and the field ownership (ownership.py) with the
    reconciler, not the reconciler itself: the reconciler imports autoscaler.ownership, so the other way round
    would be a cycle."""
    probe = ("import sys, vllm_operator.autoscaler.actuator; "
             "print(sorted(m for m in sys.modules if m == 'vllm_operator.controller.reconcile'))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.stdout.strip() == "[]"
