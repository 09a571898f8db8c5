"""The Argo CD health check (operator/vllm_operator/argocd_health.lua) under a real Lua 5.1.

The VLLMServer objects are not written by hand: the real Reconciler writes their status
(through an in-memory API, below) for each state Argo CD must tell apart, so the check is
tested against the conditions and reasons the operator actually produces.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

from e2e.lua_health import HEALTH_SCRIPT, run_health_check, to_lua
from vllm_operator import packaging
from vllm_operator.reconcile import Reconciler

ROOT = Path(__file__).resolve().parents[1]
NS = "team"


class MemoryKube:
    """Just enough of kube.Kube for the Reconciler: objects in a dict, apply merges, events counted."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []

    def get(self, api_version, kind, namespace, name):
        obj = self.objects.get((kind, namespace, name))
        return copy.deepcopy(obj) if obj else None

    def list(self, api_version, kind, namespace, *, label_selector=None):
        wanted = dict(kv.split("=", 1) for kv in label_selector.split(",")) if label_selector else {}
        return [copy.deepcopy(o) for (k, ns, _), o in self.objects.items() if k == kind and ns == namespace
                and all((o["metadata"].get("labels") or {}).get(a) == b for a, b in wanted.items())]

    def apply(self, obj, *, subresource=None, field_manager=None):
        key = (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        if subresource == "status":
            self.objects[key]["status"] = copy.deepcopy(obj["status"])
        else:
            live = self.objects.setdefault(key, {"status": {}})
            live.update(copy.deepcopy(obj))
            live["metadata"].setdefault("uid", f"uid-{key[2]}")
            live["metadata"].setdefault("generation", 1)
        return copy.deepcopy(self.objects[key])

    def delete(self, api_version, kind, namespace, name, *, uid=None):
        return self.objects.pop((kind, namespace, name), None) is not None

    def request(self, method, path, *, body=None, **_):
        assert method == "POST" and path.endswith("/events"), (method, path)
        self.events.append(body)


class World:
    """One VLLMServer, its children and pods, reconciled by the real Reconciler."""

    def __init__(self, spec_changes: Optional[dict] = None, example: str = "llama-8b-single-gpu.yaml"):
        self.kube = MemoryKube()
        self.reconciler = Reconciler(self.kube, clock=lambda: "2026-01-01T00:00:00Z")  # type: ignore[arg-type]
        doc = yaml.safe_load((ROOT / "examples" / example).read_text())
        doc["metadata"] = {"name": "srv", "namespace": NS, "uid": "uid-srv", "generation": 1}
        doc["spec"].update(spec_changes or {})
        self.kube.objects[("VLLMServer", NS, "srv")] = doc

    @property
    def server(self) -> dict[str, Any]:
        return self.kube.get(None, "VLLMServer", NS, "srv")

    def change_spec(self, **changes) -> None:
        srv = self.kube.objects[("VLLMServer", NS, "srv")]
        srv["spec"].update(changes)
        srv["metadata"]["generation"] += 1

    def reconcile(self) -> dict[str, Any]:
        self.reconciler.reconcile(NS, "srv")
        return self.server

    def workload_reports(self, ready: int, *, updated: Optional[int] = None, desired: Optional[int] = None) -> None:
        """What the StatefulSet or DaemonSet controller would write into the workload's status."""
        for kind in ("StatefulSet", "DaemonSet"):
            w = self.kube.objects.get((kind, NS, "srv"))
            if w is None:
                continue
            want = w["spec"].get("replicas", 1) if desired is None else desired
            done = want if updated is None else updated
            if kind == "StatefulSet":
                w["status"] = {"observedGeneration": w["metadata"]["generation"], "replicas": want,
                               "readyReplicas": ready, "updatedReplicas": done,
                               "currentRevision": "r1", "updateRevision": "r1" if done >= want else "r2"}
            else:
                w["status"] = {"observedGeneration": 1, "desiredNumberScheduled": want, "numberReady": ready,
                               "updatedNumberScheduled": done}

    def crash_loop(self) -> None:
        self.kube.objects[("Pod", NS, "srv-0")] = {
            "metadata": {"name": "srv-0", "namespace": NS,
                         "labels": {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": "srv"}},
            "status": {"containerStatuses": [{
                "name": "vllm", "restartCount": 5, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "message": "torch.OutOfMemoryError: CUDA out of memory"}},
            }]},
        }


def health(obj: dict[str, Any]) -> dict[str, str]:
    return run_health_check(obj)


# --------------------------------------------------------------------------- states
def test_new_object_without_status_is_progressing():
    world = World()
    assert health(world.server) == {"status": "Progressing", "message": "Waiting for the operator to report status"}


def test_created_but_no_replica_ready_is_progressing():
    world = World()
    srv = world.reconcile()
    hs = health(srv)
    assert hs["status"] == "Progressing"
    assert "0/1 replicas ready" in hs["message"]


def test_all_replicas_ready_and_settled_is_healthy():
    world = World({"replicas": 2})
    world.reconcile()
    world.workload_reports(ready=2)
    srv = world.reconcile()
    assert health(srv) == {"status": "Healthy", "message": "2/2 replicas ready"}


def test_partially_ready_is_progressing():
    world = World({"replicas": 3})
    world.reconcile()
    world.workload_reports(ready=1)
    hs = health(world.reconcile())
    assert hs == {"status": "Progressing", "message": "1/3 replicas ready"}


def test_rolling_update_while_serving_is_progressing():
    world = World({"replicas": 2})
    world.reconcile()
    world.workload_reports(ready=2, updated=1)
    hs = health(world.reconcile())
    assert hs["status"] == "Progressing" and "1/2 updated" in hs["message"]


def test_invalid_spec_is_degraded_with_the_operators_message():
    world = World({"gpu": {"count": 3, "product": "NVIDIA-L4"}})  # 32 heads do not split over 3 GPUs
    srv = world.reconcile()
    hs = health(srv)
    assert hs["status"] == "Degraded"
    assert hs["message"].startswith("Invalid spec: ") and "spec.gpu.count" in hs["message"]


def test_invalid_update_of_a_running_server_is_degraded():
    world = World()
    world.reconcile()
    world.workload_reports(ready=1)
    assert health(world.reconcile())["status"] == "Healthy"
    world.change_spec(engine={"extraArgs": ["--prefill-chunk-size", "512"]})
    hs = health(world.reconcile())
    assert hs["status"] == "Degraded" and "--prefill-chunk-size" in hs["message"]


def test_crash_looping_pod_is_degraded():
    world = World()
    world.reconcile()
    world.crash_loop()
    hs = health(world.reconcile())
    assert hs["status"] == "Degraded"
    assert "CrashLoopBackOff" in hs["message"] and "out of memory" in hs["message"]


def test_status_of_an_older_generation_is_progressing_whatever_it_says():
    world = World()
    world.reconcile()
    world.workload_reports(ready=1)
    assert health(world.reconcile())["status"] == "Healthy"
    world.change_spec(replicas=2)  # not reconciled yet
    assert health(world.server) == {"status": "Progressing",
                                    "message": "Waiting for the operator to observe generation 2"}
    world.change_spec(gpu={"count": 3, "product": "NVIDIA-L4"})  # an invalid spec not yet observed either
    assert health(world.server)["status"] == "Progressing"


def test_scaled_to_zero_on_purpose_is_suspended():
    world = World({"replicas": 0})
    world.reconcile()
    world.workload_reports(ready=0)
    assert health(world.reconcile()) == {"status": "Suspended", "message": "no replicas requested"}


def test_daemonset_on_no_gpu_node_is_not_suspended():
    world = World({"workload": "DaemonSet", "cache": None}, example="llama-8b-single-gpu.yaml")
    world.reconcile()
    world.workload_reports(ready=0, desired=0)
    # not Suspended (nobody asked for zero) and not Healthy (it serves nothing): waiting for a GPU
    # node, with the selector that no node matches
    h = health(world.reconcile())
    assert h["status"] == "Progressing" and "nvidia.com/gpu.product=NVIDIA-L4" in h["message"], h


# --------------------------------------------------------------------------- the interpreter and the shipped copies
def test_lua_conversion_round_trips_through_the_interpreter():
    obj = {"metadata": {"generation": 3, "name": "q\"uo\\te\n"}, "status": {"observedGeneration": 3, "conditions": [
        {"type": "Ready", "status": "True", "reason": "AllReplicasReady", "message": "ünïcode ✓ \t tab"}]}}
    assert health(obj) == {"status": "Healthy", "message": "ünïcode ✓ \t tab"}
    assert to_lua(None) == "nil" and to_lua([1, 2.5, False]) == "{1, 2.5, false}"


def test_a_broken_script_fails_loudly(tmp_path):
    bad = tmp_path / "bad.lua"
    bad.write_text("return 42\n")
    with pytest.raises(RuntimeError, match="returned number"):
        run_health_check({"metadata": {}}, script=bad)


def test_the_chart_and_the_argocd_cm_patch_ship_this_script():
    lua = HEALTH_SCRIPT.read_text()
    assert (ROOT / packaging.CHART / "files" / "argocd-health.lua").read_text() == lua
    patch = yaml.safe_load((ROOT / "manifests" / "argocd-cm-patch.yaml").read_text())
    assert patch == {"data": {"resource.customizations.health.vllm-operator.io_VLLMServer": lua}}
