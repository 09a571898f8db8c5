"""The Argo CD health check (operator/vllm_operator/argocd_health.lua) under a real Lua 5.1.

The VLLMServer objects are not written by hand: the real Reconciler writes their status
(through an in-memory API, below) for each state Argo CD must tell apart, so the check is
tested against the conditions and reasons the operator actually produces.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.lua_health import HEALTH_SCRIPT, run_health_check, to_lua
from e2e.memory_world import World
from vllm_operator import packaging

ROOT = Path(__file__).resolve().parents[1]


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
