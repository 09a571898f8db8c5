"""The autoscaler's tick against a fake API (pure): what it writes when kopf's body lags behind its writes."""

from __future__ import annotations

import json
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
