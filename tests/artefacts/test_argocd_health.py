"""The Argo CD health check (operator/vllm_operator/argocd_health.lua) under a real Lua 5.1
and under Argo CD's own runtime (argocd-health: Argo CD's util/lua from its Go module, the
release tools/testbed/argocd/go.mod pins).

The VLLMServer objects are not written by hand: the real Reconciler writes their status
(through an in-memory API, below) for each state Argo CD must tell apart, so the check is
tested against the conditions and reasons the operator actually produces. Each state runs in
both runtimes, and in Argo CD's the result must also equal lua5.1's for the same object.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.testbed.lua_health import (HEALTH_SCRIPT, RUNTIMES, argocd_versions, pinned_argocd_version, run_argocd_health_check,
                            run_health_check, to_lua)
from e2e.testbed.memory_world import World
from vllm_operator import generate

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=RUNTIMES)
def runtime(request) -> str:
    return request.param


@pytest.fixture
def health(runtime):
    """The health check of an object in `runtime`; in Argo CD's, lua5.1 must say the same."""
    def check(obj: dict[str, Any]) -> dict[str, str]:
        hs = run_health_check(obj, runtime=runtime)
        if runtime != "lua5.1":
            assert hs == run_health_check(obj, runtime="lua5.1"), f"{runtime} and lua5.1 disagree on {obj}"
        return hs
    return check


# --------------------------------------------------------------------------- states
def test_new_object_without_status_is_progressing(health):
    world = World()
    assert health(world.server) == {"status": "Progressing", "message": "Waiting for the operator to report status"}


def test_created_but_no_replica_ready_is_progressing(health):
    world = World()
    srv = world.reconcile()
    hs = health(srv)
    assert hs["status"] == "Progressing"
    assert "0/1 replicas ready" in hs["message"]


def test_all_replicas_ready_and_settled_is_healthy(health):
    world = World({"replicas": 2})
    world.reconcile()
    world.workload_reports(ready=2)
    srv = world.reconcile()
    assert health(srv) == {"status": "Healthy", "message": "2/2 replicas ready"}


def test_partially_ready_is_progressing(health):
    world = World({"replicas": 3})
    world.reconcile()
    world.workload_reports(ready=1)
    hs = health(world.reconcile())
    assert hs == {"status": "Progressing", "message": "1/3 replicas ready"}


def test_rolling_update_while_serving_is_progressing(health):
    world = World({"replicas": 2})
    world.reconcile()
    world.workload_reports(ready=2, updated=1)
    hs = health(world.reconcile())
    assert hs["status"] == "Progressing" and "1/2 updated" in hs["message"]


def test_invalid_spec_is_degraded_with_the_operators_message(health):
    world = World({"gpu": {"count": 3, "product": "NVIDIA-L4"}})  # 32 heads do not split over 3 GPUs
    srv = world.reconcile()
    hs = health(srv)
    assert hs["status"] == "Degraded"
    assert hs["message"].startswith("Invalid spec (InvalidSpec): ") and "spec.gpu.count" in hs["message"]


@pytest.mark.parametrize("reason,changes", [
    ("DoesNotFit", {"model": {"name": "meta-llama/Llama-3.1-70B-Instruct"}}),  # 70B on one L4
    ("ModelUnknown", {"model": {"name": "acme/not-in-the-catalog"}}),
    ("GPUUnknown", {"gpu": {"count": 1, "product": "H100x"}}),
])
def test_an_invalid_new_server_is_degraded_with_the_cause_kubectl_get_shows(health, reason, changes):
    """The same cause as Ready's reason (kubectl get's REASON column), and no last valid version it never had."""
    srv = World(changes).reconcile()
    ready = next(c for c in srv["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == reason
    hs = health(srv)
    assert hs["status"] == "Degraded" and hs["message"].startswith(f"Invalid spec ({reason}): spec."), hs
    assert "last valid" not in hs["message"]


def test_invalid_update_of_a_running_server_is_degraded(health):
    world = World()
    world.reconcile()
    world.workload_reports(ready=1)
    assert health(world.reconcile())["status"] == "Healthy"
    world.change_spec(engine={"extraArgs": ["--prefill-chunk-size", "512"]})
    hs = health(world.reconcile())
    assert hs["status"] == "Degraded" and "--prefill-chunk-size" in hs["message"]


def test_crash_looping_pod_is_degraded(health):
    world = World()
    world.reconcile()
    world.crash_loop()
    hs = health(world.reconcile())
    assert hs["status"] == "Degraded"
    assert "CrashLoopBackOff" in hs["message"] and "out of memory" in hs["message"]


def test_status_of_an_older_generation_is_progressing_whatever_it_says(health):
    world = World()
    world.reconcile()
    world.workload_reports(ready=1)
    assert health(world.reconcile())["status"] == "Healthy"
    world.change_spec(replicas=2)  # not reconciled yet
    assert health(world.server) == {"status": "Progressing",
                                    "message": "Waiting for the operator to observe generation 2"}
    world.change_spec(gpu={"count": 3, "product": "NVIDIA-L4"})  # an invalid spec not yet observed either
    assert health(world.server)["status"] == "Progressing"


def test_scaled_to_zero_on_purpose_is_suspended(health):
    world = World({"replicas": 0})
    world.reconcile()
    world.workload_reports(ready=0)
    assert health(world.reconcile()) == {"status": "Suspended", "message": "no replicas requested"}


def test_daemonset_on_no_gpu_node_is_not_suspended(health):
    world = World({"workload": "DaemonSet", "cache": None}, example="llama-8b-single-gpu.yaml")
    world.reconcile()
    world.workload_reports(ready=0, desired=0)
    # not Suspended (nobody asked for zero) and not Healthy (it serves nothing): waiting for a GPU
    # node, with the selector that no node matches
    h = health(world.reconcile())
    assert h["status"] == "Progressing" and "nvidia.com/gpu.product=NVIDIA-L4" in h["message"], h


# --------------------------------------------------------------------------- the interpreter and the shipped copies
def test_lua_conversion_round_trips_through_the_interpreter(health):
    obj = {"apiVersion": "vllm-operator.io/v1alpha1", "kind": "VLLMServer",
           "metadata": {"generation": 3, "name": "q\"uo\\te\n"}, "status": {"observedGeneration": 3, "conditions": [
        {"type": "Ready", "status": "True", "reason": "AllReplicasReady", "message": "ünïcode ✓ \t tab"}]}}
    assert health(obj) == {"status": "Healthy", "message": "ünïcode ✓ \t tab"}
    assert to_lua(None) == "nil" and to_lua([1, 2.5, False]) == "{1, 2.5, false}"


def test_a_broken_script_fails_loudly(tmp_path, runtime):
    bad = tmp_path / "bad.lua"
    bad.write_text("return 42\n")
    said = {"lua5.1": "returned number", "argocd": "expect table output from Lua script, not number"}[runtime]
    with pytest.raises(RuntimeError, match=said):
        run_health_check({"apiVersion": "vllm-operator.io/v1alpha1", "kind": "VLLMServer", "metadata": {}},
                         script=bad, runtime=runtime)


def test_the_chart_and_the_argocd_cm_patch_ship_this_script():
    lua = HEALTH_SCRIPT.read_text()
    assert (ROOT / generate.CHART / "files" / "argocd-health.lua").read_text() == lua
    patch = yaml.safe_load((ROOT / "manifests" / "argocd-cm-patch.yaml").read_text())
    assert patch == {"data": {"resource.customizations.health.vllm-operator.io_VLLMServer": lua}}


# --------------------------------------------------------------------------- what only Argo CD's runtime notices
def _server(ready: int = 1) -> dict[str, Any]:
    world = World()
    world.reconcile()
    world.workload_reports(ready=ready)
    return world.reconcile()


@pytest.mark.parametrize("call, error", [
    ('string.format("%d/%d", 1, 1)', "with key 'format'"),   # Argo CD opens no string library
    ('os.getenv("HOME")', "with key 'getenv'"),               # nor the os library (a time/date-only os is preloaded)
    ('io.write("")', "with key 'write'"),                     # nor io
])
def test_a_library_outside_argo_cds_sandbox_is_noticed_by_the_argocd_runtime_only(tmp_path, call, error):
    script = tmp_path / "uses-a-library.lua"
    script.write_text(HEALTH_SCRIPT.read_text().replace("local hs = {}\n", f"local hs = {{}}\nlocal _ = {call}\n", 1))
    srv = _server()
    expected = {"status": "Healthy", "message": "1/1 replicas ready"}
    assert run_health_check(srv, script=script, runtime="lua5.1") == expected  # Lua 5.1 has every library open
    with pytest.raises(RuntimeError, match=f"attempt to index a non-table object\\(nil\\) {error}") as e:
        run_argocd_health_check(srv, script=script)
    assert "Argo CD shows Unknown" in str(e.value)
    # the sandbox is what fails it: with argocd-cm's resource.customizations.useOpenLibs.<group>_<kind>: true it runs
    assert run_argocd_health_check(srv, script=script, use_open_libs=True) == expected
    assert run_argocd_health_check(srv) == expected


def test_a_script_slower_than_argo_cds_deadline_is_noticed_by_the_argocd_runtime(tmp_path):
    slow = tmp_path / "slow.lua"
    slow.write_text("while true do end\n")
    with pytest.raises(RuntimeError, match="context deadline exceeded"):
        run_argocd_health_check(_server(), script=slow, timeout=20)


def test_argo_cd_finds_the_script_under_the_key_the_argocd_cm_patch_ships():
    patch = yaml.safe_load((ROOT / "manifests" / "argocd-cm-patch.yaml").read_text())
    argocd_cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "argocd-cm", "namespace": "argocd"},
                 "data": {"url": "https://argocd.example.com", **patch["data"]}}
    for srv in (World().server, _server(ready=0), _server(ready=1)):
        assert run_argocd_health_check(srv, argocd_cm=argocd_cm) == run_argocd_health_check(srv)
    # a key Argo CD does not match against vllm-operator.io/VLLMServer runs nothing: the test above has teeth
    (key, lua), = patch["data"].items()
    argocd_cm["data"] = {key.replace("_VLLMServer", "_VLLMServers"): lua}
    with pytest.raises(RuntimeError, match="no health check for vllm-operator.io/VLLMServer"):
        run_argocd_health_check(_server(), argocd_cm=argocd_cm)


def test_a_server_being_deleted_is_progressing_in_argo_cd_whatever_the_script_says():
    # gitops-engine's own rule, applied to the script's answer: what users see while the operator's finalizer runs
    srv = _server()
    assert run_argocd_health_check(srv)["status"] == "Healthy"
    srv["metadata"].update(deletionTimestamp="2026-01-01T00:01:00Z", finalizers=["vllm-operator.io/finalizer"])
    assert run_argocd_health_check(srv) == {
        "status": "Progressing", "message": "Pending deletion; blocked by finalizers: vllm-operator.io/finalizer"}


def test_the_argocd_runtime_is_the_pinned_release_and_the_docs_name_it():
    linked = argocd_versions()
    version = pinned_argocd_version()
    assert linked["argo-cd"] == linked["gitops-engine"] == f"v{version}"
    gomod = (ROOT / "tools" / "testbed" / "argocd" / "go.mod").read_text().split()
    assert linked["gopher-lua"] == gomod[gomod.index("github.com/yuin/gopher-lua") + 1]
    assert f"Argo CD v{version}" in (ROOT / "docs" / "argocd.md").read_text()


def test_idle_and_scaled_to_zero_by_the_autoscaler_is_healthy(health):
    """autoscaling.minReplicas 0: zero replicas while idle is the server working as asked (docs/scale-to-zero.md),
    Healthy, unlike replicas: 0 (Suspended)."""
    world = World({"autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 2},
                   "routing": {"inferencePool": {"enabled": True}}}, example="llama-3b-autoscaled.yaml")
    world.kube.serves = lambda gv: True  # the Inference Extension's CRDs are installed
    # the in-memory API keeps one owner per object (no field managers): the autoscaler's co-ownership of
    # replicas is left out here (tests/apiserver/test_autoscaler_apiserver.py has it on a real API server)
    world.reconciler._adopt_replicas = lambda *args: None  # type: ignore[method-assign]
    world.reconcile()
    world.kube.objects[("StatefulSet", world.server["metadata"]["namespace"], "srv")]["spec"]["replicas"] = 0
    world.workload_reports(ready=0, desired=0)  # the autoscaler took it to zero
    h = health(world.reconcile())
    assert h["status"] == "Healthy" and h["message"].startswith("idle: scaled to zero after 300s"), h
