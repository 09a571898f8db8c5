"""The autoscaler's tick against a fake API (pure): what it writes when kopf's body lags behind its writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from vllm_operator.autoscaler import actuator

ROOT = Path(__file__).resolve().parents[2]


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
        from vllm_operator.sources.vllm_metrics import Sample

        if isinstance(self.waiting, str):
            return [Sample.failed(p.name, self.waiting) for p in pods]
        return [Sample(p.name, waiting=self.waiting) for p in pods]


def test_the_at_max_replicas_gauge_follows_the_decisions_and_survives_a_hold():
    from vllm_operator import telemetry

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
        return result, telemetry.REGISTRY.get_sample_value("vllm_operator_autoscaler_at_max_replicas",
                                                         {"namespace": "ns", "name": "s"})

    result, gauge = tick(40.0)  # 160 waiting over 4 replicas, target 4: wants 40
    assert result.decision.code == "AtLimit" and gauge == 1
    result, gauge = tick("timed out")
    assert result.decision.hold and gauge == 1  # a hold does not know better: keeps what was said
    result, gauge = tick(4.0)
    assert not result.decision.limited and gauge == 0
    telemetry.forget_autoscaler("ns", "s")


def test_the_autoscaler_does_not_import_the_reconciler():
    """It shares the conditions helper (conditions.py) and the field ownership (ownership.py) with the
    reconciler, not the reconciler itself: the reconciler imports autoscaler.ownership, so the other way round
    would be a cycle."""
    probe = ("import sys, vllm_operator.autoscaler.actuator; "
             "print(sorted(m for m in sys.modules if m == 'vllm_operator.controller.reconcile'))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.stdout.strip() == "[]"


class QueueSource:
    """Every ready pod answers the same queue (waiting, running), or fails with the error set."""

    def __init__(self):
        self.waiting, self.running, self.error = 0.0, 0.0, ""

    def read(self, pods):
        from vllm_operator.sources.vllm_metrics import Sample

        if self.error:
            return [Sample.failed(p.name, self.error) for p in pods]
        return [Sample(p.name, waiting=self.waiting, running=self.running) for p in pods]


class ScalingKube(FakeKube):
    """Status applies as FakeKube; a StatefulSet apply sets the cached StatefulSet's replicas."""

    def __init__(self, body, cache):
        super().__init__(body)
        self.cache = cache

    def apply(self, obj, *, subresource=None, field_manager=None):
        if obj["kind"] == "StatefulSet":
            self.cache.sts["spec"]["replicas"] = obj["spec"]["replicas"]
            return obj
        return super().apply(obj, subresource=subresource, field_manager=field_manager)


def _one_ready_replica(**autoscaling):
    body = yaml.safe_load((ROOT / "examples" / "llama-3b-autoscaled.yaml").read_text())
    body["metadata"] = {"name": "s", "namespace": "ns", "uid": "u1", "generation": 1, "resourceVersion": "5"}
    body["spec"]["autoscaling"].update(autoscaling)
    cache = EmptyCache()
    cache.sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "spec": {"replicas": 1},
                 "metadata": {"name": "s", "namespace": "ns", "ownerReferences": [{"uid": "u1", "controller": True}]}}
    pod = {"metadata": {"name": "s-0", "namespace": "ns"}, "spec": {"containers": [{"name": "vllm"}]},
           "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}}
    cache.pods = lambda namespace, name: [pod]
    return body, cache


def test_the_tick_says_when_to_read_again_from_what_it_read():
    from vllm_operator.autoscaler import schedule

    body, cache = _one_ready_replica(intervalSeconds=5, maxReplicas=4)
    source, clock = QueueSource(), [1000.0]
    scaler = actuator.Autoscaler(ScalingKube(body, cache), actuator.Sources(pods=source), "ns", "s",
                                 clock=lambda: clock[0], reader=cache)

    def tick(seconds, waiting=0.0, running=0.0, error=""):
        source.waiting, source.running, source.error = waiting, running, error
        clock[0] += seconds
        return scaler.tick(json.loads(json.dumps(body)))

    assert tick(0).next_read == schedule.NextRead(2.5, schedule.IDLE)
    assert tick(2.5, running=1).next_read == schedule.NextRead(1.0, schedule.BUSY)
    assert tick(1, running=2, waiting=1).next_read.why == schedule.BUSY
    result = tick(1, running=2, waiting=20)  # 20 waiting, target 4: 1 -> 5, capped at 4
    assert result.scaled and result.next_read.why == schedule.BUSY
    for _ in range(3):  # the new replicas are on their way: the queue is empty now, yet the scale is recent
        assert tick(10).next_read.why == schedule.BUSY
    assert tick(1).next_read == schedule.NextRead(2.5, schedule.IDLE)  # 31 s after the scale
    assert tick(2.5, error="timed out").next_read == schedule.NextRead(5.0, schedule.HOLDING)


def test_prometheus_and_the_fixed_baseline_read_every_interval():
    from vllm_operator.autoscaler import schedule

    body, cache = _one_ready_replica(intervalSeconds=5, source="Prometheus")
    source = QueueSource()
    source.running = 2.0
    scaler = actuator.Autoscaler(ScalingKube(body, cache), actuator.Sources(
        "http://prometheus.example:9090", pods=QueueSource(), prometheus=lambda url: source), "ns", "s",
        clock=lambda: 1000.0, reader=cache)
    result = scaler.tick(json.loads(json.dumps(body)))
    assert result.decision is not None and result.next_read == schedule.NextRead(5.0, schedule.FIXED)

    body, cache = _one_ready_replica(intervalSeconds=5)
    fixed = actuator.Sources(pods=source, fixed_reads=True)
    scaler = actuator.Autoscaler(ScalingKube(body, cache), fixed, "ns", "s", clock=lambda: 1000.0, reader=cache)
    assert scaler.tick(json.loads(json.dumps(body))).next_read == schedule.NextRead(5.0, schedule.FIXED)
    assert not actuator.Sources(fixed_reads=True).pods.only_wanted and actuator.Sources().pods.only_wanted


class PickerCount:
    """The endpoint picker's count of requests it had no pod for, as the test sets it."""

    def __init__(self):
        self.count, self.asked = 0.0, []

    def read(self, namespace, pool):
        self.asked.append((namespace, pool))
        return self.count, ""


def test_minreplicas_zero_goes_to_zero_after_the_idle_window_and_back_on_the_pickers_count():
    """docs/scale-to-zero.md at the tick: idle reads for the whole window -> 0; at zero, the picker's count of
    requests with no pod rising -> 1; the count read from the server's own pool."""
    body, cache = _one_ready_replica(minReplicas=0, maxReplicas=2, intervalSeconds=1,
                                     scaleDownStabilizationSeconds=0, scaleToZero={"idleSeconds": 30})
    body["spec"]["routing"] = {"inferencePool": {"enabled": True}}
    source, picker, clock = QueueSource(), PickerCount(), [1000.0]
    scaler = actuator.Autoscaler(ScalingKube(body, cache), actuator.Sources(pods=source, picker=picker), "ns", "s",
                                 clock=lambda: clock[0], reader=cache)

    def tick(seconds, running=0.0):
        source.running = running
        clock[0] += seconds
        return scaler.tick(json.loads(json.dumps(body)))

    assert tick(0).decision.desired == 1
    assert tick(20).decision.desired == 1
    assert tick(5, running=1).decision.desired == 1, "a request restarts the window"
    assert tick(29).decision.desired == 1
    result = tick(1)
    assert result.scaled and result.decision.code == "ScaleToZero" and cache.sts["spec"]["replicas"] == 0
    cache.pods = lambda namespace, name: []
    assert tick(60).decision.code == "ScaledToZero" and cache.sts["spec"]["replicas"] == 0
    picker.count = 1.0  # a request arrived and found no pod
    result = tick(1)
    assert result.scaled and result.decision.code == "ScaleFromZero" and cache.sts["spec"]["replicas"] == 1
    assert set(picker.asked) == {("ns", "s")}


def test_a_step_of_the_wall_clock_neither_shortens_nor_stretches_the_idle_window():
    """Windows are timed on the monotonic clock, as Go's monotonic readings time the HPA's: the wall clock
    stepping forward an hour (NTP, a VM resumed) scales nothing to zero early, stepping back an hour holds
    nothing; the wall clock still stamps what is written (lastScaleTime)."""
    body, cache = _one_ready_replica(minReplicas=0, maxReplicas=2, intervalSeconds=1,
                                     scaleDownStabilizationSeconds=0, scaleToZero={"idleSeconds": 30})
    body["spec"]["routing"] = {"inferencePool": {"enabled": True}}
    wall, mono = [1_800_000_000.0], [500.0]
    kube = ScalingKube(body, cache)
    scaler = actuator.Autoscaler(kube, actuator.Sources(pods=QueueSource(), picker=PickerCount()), "ns", "s",
                                 clock=lambda: wall[0], monotonic=lambda: mono[0], reader=cache)

    def tick(seconds, wall_step=0.0):
        wall[0] += seconds + wall_step
        mono[0] += seconds
        return scaler.tick(json.loads(json.dumps(body)))

    assert tick(0).decision.desired == 1
    assert tick(10, wall_step=3600).decision.desired == 1, "an hour of wall clock is not 30 s idle"
    assert tick(10, wall_step=-7200).decision.desired == 1
    result = tick(10)  # 30 s idle on the monotonic clock, the wall clock an hour behind where it was
    assert result.scaled and result.decision.code == "ScaleToZero"
    assert kube.body["status"]["autoscaling"]["lastScaleTime"] == actuator._now_iso(wall[0])


def test_the_real_wall_clock_comes_with_the_monotonic_one_and_a_fake_clock_drives_both():
    import time

    assert actuator.Autoscaler(None, actuator.Sources(), "ns", "s").monotonic is time.monotonic
    fake = lambda: 1000.0  # noqa: E731
    assert actuator.Autoscaler(None, actuator.Sources(), "ns", "s", clock=fake).monotonic is fake
