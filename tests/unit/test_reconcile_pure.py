"""Pure parts of the reconciler: subset comparison, conditions, named pod failures, workload progress."""

from __future__ import annotations

import copy
import json

from e2e.testbed.memory_world import NS, World
from vllm_operator.kube.client import ApiError
from vllm_operator.conditions import Conditions, condition
from vllm_operator.controller.drift import HASH_ANNOTATION, is_subset, up_to_date, with_hash
from vllm_operator.server_status import workload_progress


def test_subset_ignores_server_defaults_but_not_changes():
    want = {"spec": {"replicas": 2, "ports": [{"port": 8000}]}}
    assert is_subset(want, {"spec": {"replicas": 2, "ports": [{"port": 8000, "protocol": "TCP"}], "x": 1}})
    assert not is_subset(want, {"spec": {"replicas": 3, "ports": [{"port": 8000}]}})
    assert not is_subset(want, {"spec": {"replicas": 2, "ports": []}})


def test_up_to_date_notices_removed_fields_through_the_hash():
    old_plain = {"metadata": {"name": "a"}, "spec": {"nodeSelector": {"k": "v"}, "x": 1}}
    new_plain = {"metadata": {"name": "a"}, "spec": {"x": 1}}
    assert is_subset(new_plain, old_plain)  # the subset check alone would miss the removal
    old, new = with_hash(old_plain), with_hash(new_plain)
    assert up_to_date(old, old)
    assert not up_to_date(new, old)
    assert new["metadata"]["annotations"][HASH_ANNOTATION] != old["metadata"]["annotations"][HASH_ANNOTATION]


def test_condition_time_moves_only_on_status_change_and_order_is_kept():
    c = Conditions([], 1, "t1")
    c.set("Ready", "False", "NoReplicasReady", "0/1")
    c.set("SpecValid", "True", "Planned", "ok")
    c2 = Conditions([x.wire() for x in c.items], 2, "t2")
    c2.set("Ready", "False", "NoReplicasReady", "0/1")
    assert [x.type for x in c2.only(["SpecValid", "Ready"])] == ["Ready", "SpecValid"]
    assert c2.items[0].wire() == {"type": "Ready", "status": "False", "reason": "NoReplicasReady", "message": "0/1",
                                  "lastTransitionTime": "t1", "observedGeneration": 2}
    c3 = Conditions([x.wire() for x in c2.items], 2, "t3")
    c3.set("Ready", "True", "AllReplicasReady", "1/1")
    assert c3.items[0].last_transition_time == "t3"
    c3.remove("Ready")
    assert [x.type for x in c3.items] == ["SpecValid"]


def _conditions(world: World) -> dict[str, tuple[str, str, str]]:
    status = world.reconcile()["status"]
    return {t: (c["status"], c["reason"], c["message"])
            for t in ("Degraded", "Ready") for c in [condition(status, t)]}


def _container(restarts: int, last: dict, **state) -> dict:
    return {"phase": "Running", "containerStatuses": [{"name": "vllm", "ready": False, "restartCount": restarts,
                                                       "state": state or {"waiting": {"reason": "CrashLoopBackOff"}},
                                                       "lastState": {"terminated": last}}]}


def test_degraded_and_ready_name_the_failure_and_an_event_marks_each_new_one():
    world = World()
    world.reconcile()
    world.add_pod(status=_container(2, {"exitCode": 137, "reason": "OOMKilled"}))
    limit = world.kube.objects[("StatefulSet", NS, "srv")]["spec"]["template"]["spec"]["containers"][0][
        "resources"]["limits"]["memory"]
    got = _conditions(world)
    assert got["Degraded"][:2] == ("True", "OOMKilled") and f"memory limit {limit}" in got["Degraded"][2]
    assert got["Ready"] == ("False", "OOMKilled", "0/1 replicas ready: " + got["Degraded"][2])
    assert world.warning_events() == [("OOMKilled", got["Degraded"][2])]
    world.reconcile()
    assert len(world.warning_events()) == 1  # the same failure: no second Event
    world.add_pod(status=_container(3, {"exitCode": 1, "reason": "Error", "message": "ValueError: bad config\n"}))
    got = _conditions(world)
    assert got["Degraded"][:2] == ("True", "CrashLoopBackOff") and "ValueError: bad config" in got["Degraded"][2]
    assert [r for r, _ in world.warning_events()] == ["OOMKilled", "CrashLoopBackOff"]
    world.add_pod(status={"phase": "Running", "containerStatuses": [{"name": "vllm", "ready": True, "restartCount": 3,
                                                                     "state": {"running": {}}}]})
    world.workload_reports(ready=1)
    got = _conditions(world)
    assert got["Degraded"] == ("False", "AsExpected", "no pod is failing")
    assert got["Ready"] == ("True", "AllReplicasReady", "1/1 replicas ready")


def test_failed_create_comes_from_the_workloads_events_read_only_while_a_replica_is_missing():
    world = World(read_events=True)
    world.reconcile()
    sts = world.kube.objects[("StatefulSet", NS, "srv")]
    world.cluster_events.append({
        "involvedObject": {"kind": "StatefulSet", "name": "srv", "namespace": NS, "uid": sts["metadata"]["uid"]},
        "reason": "FailedCreate", "type": "Warning", "lastTimestamp": "2026-01-01T00:00:00Z",
        "message": 'create Pod srv-0 in StatefulSet srv failed error: pods "srv-0" is forbidden: exceeded quota: '
                   "gpus, requested: requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=2, limited: "
                   "requests.nvidia.com/gpu=2"})
    got = _conditions(world)
    assert got["Degraded"][:2] == ("True", "FailedCreate") and "exceeded quota: gpus" in got["Degraded"][2]
    assert got["Ready"][:2] == ("False", "FailedCreate")
    assert world.event_reads[-1] == ["StatefulSet/srv"]
    world.add_pod(status={"phase": "Running", "containerStatuses": [{"name": "vllm", "ready": True,
                                                                     "state": {"running": {}}}]})
    world.workload_reports(ready=1)
    reads = len(world.event_reads)
    assert _conditions(world)["Degraded"][0] == "False"
    assert len(world.event_reads) == reads  # all replicas ready: no Events are read


def test_an_unschedulable_pod_is_named_at_once_and_degraded_after_the_grace():
    world = World(now="2026-01-01T10:00:30Z")
    world.reconcile()
    world.add_pod(status={"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": "2026-01-01T10:00:00Z",
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]})
    got = _conditions(world)
    assert got["Degraded"][0] == "False"  # a GPU node may be on its way
    assert got["Ready"][:2] == ("False", "Unschedulable") and "3 Insufficient nvidia.com/gpu" in got["Ready"][2]
    assert world.warning_events() == []
    world.now = "2026-01-01T10:05:00Z"
    got = _conditions(world)
    assert got["Degraded"][:2] == ("True", "Unschedulable")
    assert [r for r, _ in world.warning_events()] == ["Unschedulable"]


def test_workload_progress():
    sts = {"kind": "StatefulSet", "metadata": {"generation": 2}, "spec": {"replicas": 2},
           "status": {"observedGeneration": 2, "replicas": 2, "readyReplicas": 2, "updatedReplicas": 2,
                      "currentRevision": "r2", "updateRevision": "r2"}}
    assert workload_progress(sts)["settled"]
    sts["status"]["observedGeneration"] = 1
    assert not workload_progress(sts)["settled"]
    ds = {"kind": "DaemonSet", "metadata": {"generation": 1},
          "status": {"observedGeneration": 1, "desiredNumberScheduled": 3, "numberReady": 2, "updatedNumberScheduled": 3}}
    p = workload_progress(ds)
    assert (p["desired"], p["ready"], p["settled"]) == (3, 2, False)
    assert workload_progress(None)["desired"] == 0



# --------------------------------------------------------------------------- never adopt; refused applies
def _foreign_service(world: World, name: str = "srv") -> dict:
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": name, "namespace": NS, "uid": "uid-helm", "resourceVersion": "7",
        "labels": {"app.kubernetes.io/managed-by": "Helm"}}, "spec": {"selector": {"app": "helm"}}}
    world.kube.objects[("Service", NS, name)] = copy.deepcopy(svc)
    return svc


def test_a_name_taken_by_someone_else_is_never_adopted_and_nothing_is_applied():
    world = World()
    foreign = _foreign_service(world)
    applies = []
    real_apply = world.kube.apply
    world.kube.apply = lambda obj, **kw: applies.append((obj["kind"], kw.get("subresource"))) or real_apply(obj, **kw)
    status = world.reconcile()["status"]
    assert world.kube.objects[("Service", NS, "srv")] == foreign, "not patched"
    assert applies == [("VLLMServer", "status")], "no child applied: all or nothing"
    degraded = condition(status, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "NameConflict")
    assert degraded["message"].startswith("Service srv already exists") and "rename the VLLMServer" in degraded["message"]
    assert condition(status, "Ready")["reason"] == "NameConflict"
    assert "endpoint" not in status, "the endpoint would be someone else's Service"
    assert world.warning_events() == [("NameConflict", degraded["message"])]
    world.reconcile()
    assert len(world.warning_events()) == 1, "one Event per transition"
    del world.kube.objects[("Service", NS, "srv")]  # the other object is gone: the server deploys
    status = world.reconcile()["status"]
    assert condition(status, "Degraded")["reason"] != "NameConflict"
    assert ("StatefulSet", NS, "srv") in world.kube.objects


def test_a_refused_apply_is_a_condition_retried_slowly_unless_the_spec_changes():
    world = World()
    clock = [1000.0]
    world.reconciler.monotonic = lambda: clock[0]
    sent = []
    real_apply = world.kube.apply

    def apply(obj, **kw):
        if obj["kind"] == "StatefulSet":
            sent.append(obj["metadata"]["annotations"])
            if obj["spec"]["template"]["spec"].get("affinity"):
                raise ApiError(422, json.dumps({"message": 'StatefulSet.apps "srv" is invalid: spec.template.spec.'
                                                "affinity: Required value"}), "PATCH", "/apis/apps/v1/...")
        return real_apply(obj, **kw)

    world.kube.apply = apply
    world.change_spec(affinity={"nodeAffinity": {}})
    status = world.reconcile()["status"]
    degraded = condition(status, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ApiRejected")
    assert "refused StatefulSet srv (422)" in degraded["message"] and "affinity: Required value" in degraded["message"]
    assert condition(status, "SpecValid")["status"] == "True"
    assert [r for r, _ in world.warning_events()] == ["ApiRejected"]
    assert len(sent) == 1
    clock[0] += 59
    world.reconcile()
    assert len(sent) == 1, "held back: the same refused object is not sent again before 60 s"
    clock[0] += 2
    world.reconcile()
    assert len(sent) == 2 and len(world.warning_events()) == 1
    clock[0] += 61
    world.reconcile()
    assert len(sent) == 2, "the second refusal holds for 120 s"
    world.change_spec(affinity=None)  # fixed: what would be sent changed, so it is sent at once
    status = world.reconcile()["status"]
    assert len(sent) == 3 and condition(status, "Degraded")["reason"] != "ApiRejected"
    assert not world.reconciler._refused


def test_a_conflict_or_throttling_is_raised_for_the_caller_to_retry():
    world = World()
    world.kube.apply = lambda obj, **kw: (_ for _ in ()).throw(ApiError(429, "{}", "PATCH", "/x"))
    try:
        world.reconcile()
    except ApiError as e:
        assert e.status == 429
    else:
        raise AssertionError("a 429 must reach the caller (kopf retries with back-off)")


def test_a_failing_server_resynced_later_writes_no_status():
    """Stalled (kstatus's Failed) is updated in place: its lastTransitionTime stays, a resync of a crash-looping
    server sends no status write (it used to be dropped and re-added, with a new time, on every reconcile)."""
    world = World()
    world.reconcile()
    world.crash_loop()
    status = world.reconcile()["status"]
    world.now = "2026-01-01T00:10:00Z"
    assert not world.reconciler.reconcile(NS, "srv").status_written
    assert world.server["status"] == status
    assert condition(status, "Stalled")["lastTransitionTime"] == "2026-01-01T00:00:00Z"


def test_reconciling_is_true_only_while_a_rollout_replaces_serving_pods():
    """Reconciling=True (kstatus's InProgress) mirrors Progressing=True while Ready=True; Ready=False already
    says InProgress with what keeps the replicas from serving, and Stalled=True (Failed) excludes it."""
    world = World({"replicas": 2})
    world.reconcile()
    world.workload_reports(ready=0)
    assert condition(world.reconcile()["status"], "Reconciling") is None  # loading: Ready=False says it
    world.workload_reports(ready=2, updated=1)
    status = world.reconcile()["status"]
    rec, prog = condition(status, "Reconciling"), condition(status, "Progressing")
    assert (rec["status"], rec["reason"], rec["message"]) == ("True", "RollingOut", prog["message"])
    world.now = "2026-01-01T00:10:00Z"
    assert not world.reconciler.reconcile(NS, "srv").status_written  # stable while nothing changes
    world.add_pod("srv-1", status=_container(3, {"exitCode": 1, "reason": "Error", "message": "bad\n"}))
    status = world.reconcile()["status"]
    assert condition(status, "Stalled")["status"] == "True" and condition(status, "Reconciling") is None
    world.add_pod("srv-1", status={"phase": "Running", "containerStatuses": [
        {"name": "vllm", "ready": True, "restartCount": 3, "state": {"running": {}}}]})
    world.workload_reports(ready=2)
    status = world.reconcile()["status"]
    assert condition(status, "Reconciling") is None and condition(status, "Stalled") is None


def test_an_image_release_without_a_flag_snapshot_is_a_warning_condition_not_a_refusal():
    """ExtraArgsUnchecked=True beside SpecValid=True while the image's vLLM release has no snapshot (the
    workload is applied all the same), one Warning event when it appears, gone with a release that has one."""
    world = World({"image": "vllm/vllm-openai:v0.35.1", "engine": {"extraArgs": ["--a-flag-of-0-35", "1"]}})
    status = world.reconcile()["status"]
    assert condition(status, "SpecValid")["status"] == "True"
    loose = condition(status, "ExtraArgsUnchecked")
    assert (loose["status"], loose["reason"]) == ("True", "NoFlagSnapshot")
    assert loose["message"].startswith("image vllm/vllm-openai:v0.35.1 runs vLLM 0.35.1")
    assert loose["message"].endswith("passed unchecked: --a-flag-of-0-35")
    sts = world.kube.objects[("StatefulSet", NS, "srv")]
    assert sts["spec"]["template"]["spec"]["containers"][0]["args"][-2:] == ["--a-flag-of-0-35", "1"]
    assert world.warning_events() == [("NoFlagSnapshot", loose["message"])]
    world.reconcile()
    assert len(world.warning_events()) == 1, "one Event per new message"
    world.change_spec(image="vllm/vllm-openai:v0.33.0", engine={"extraArgs": ["--seed", "1"]})
    status = world.reconcile()["status"]
    assert condition(status, "ExtraArgsUnchecked") is None and condition(status, "SpecValid")["status"] == "True"


def test_the_claims_refusal_is_recognised_in_both_wordings_and_nothing_else():
    from vllm_operator.controller.apply import immutable_claims_refused

    def err(status, message):
        return ApiError(status, json.dumps({"message": message}), "PATCH", "/apis/apps/v1/namespaces/ns/statefulsets/s")

    # Kubernetes 1.37 (declarative validation) and the releases before it
    assert immutable_claims_refused(err(422, 'StatefulSet.apps "s" is invalid: spec.volumeClaimTemplates: Invalid '
                                             'value: null: field is immutable'))
    assert immutable_claims_refused(err(422, 'StatefulSet.apps "s" is invalid: spec: Forbidden: updates to '
                                             "statefulset spec for fields other than 'replicas' ... are forbidden"))
    assert not immutable_claims_refused(err(422, 'spec.template.spec.containers[0].image: Required value'))
    assert not immutable_claims_refused(err(409, "volumeClaimTemplates field is immutable"))


def test_an_invalid_new_server_names_its_cause_in_ready_and_never_a_last_valid_version():
    """The first hour (issue 20): `kubectl get vllms` shows Ready's reason, so an invalid spec names its cause
    there (DoesNotFit, ModelUnknown, GPUUnknown, InvalidSpec), and an object that never had a valid version is not
    told that one keeps running."""
    cases = {
        "DoesNotFit": {"model": {"name": "meta-llama/Llama-3.1-70B-Instruct"}},
        "ModelUnknown": {"model": {"name": "acme/not-in-the-catalog"}},
        "GPUUnknown": {"gpu": {"count": 1, "product": "H100x"}},
        "InvalidSpec": {"gpu": {"count": 3, "product": "NVIDIA-L4"}},
    }
    for reason, changes in cases.items():
        conditions = _conditions(World(changes))
        for type_ in ("Ready", "Degraded"):
            status, got, message = conditions[type_]
            assert (status, got) == ("True" if type_ == "Degraded" else "False", reason), (changes, type_, got)
            assert "last valid" not in message and "spec." in message, message
        assert "nothing has been deployed" in conditions["Degraded"][2]


def test_an_invalid_change_to_a_serving_server_shows_the_cause_while_the_last_valid_version_serves():
    world = World()
    world.reconcile()
    world.workload_reports(ready=1)
    assert _conditions(world)["Ready"][:2] == ("True", "AllReplicasReady")
    world.change_spec(gpu={"count": 1, "product": "H100x"})
    conditions = _conditions(world)
    status, reason, message = conditions["Ready"]
    assert (status, reason) == ("True", "GPUUnknown"), "the replicas of the last valid version still serve"
    assert "the last valid version keeps running" in message and "spec.gpu.product" in message
    assert "the last valid version keeps running" in conditions["Degraded"][2]
