"""Pure parts of the reconciler: subset comparison, conditions, pod trouble, workload progress."""

from __future__ import annotations

from vllm_operator.kube import minor_version
from vllm_operator.reconcile import (HASH_ANNOTATION, is_subset, pod_trouble, set_condition, up_to_date,
                                     with_hash, workload_progress)


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
    c = set_condition([], "Ready", "False", "NoReplicasReady", "0/1", 1, "t1")
    c = set_condition(c, "SpecValid", "True", "Planned", "ok", 1, "t1")
    c2 = set_condition(c, "Ready", "False", "NoReplicasReady", "0/1", 2, "t2")
    assert [x["type"] for x in c2] == ["Ready", "SpecValid"]
    assert c2[0]["lastTransitionTime"] == "t1" and c2[0]["observedGeneration"] == 2
    c3 = set_condition(c2, "Ready", "True", "AllReplicasReady", "1/1", 2, "t3")
    assert c3[0]["lastTransitionTime"] == "t3"


def test_pod_trouble_reports_crash_loops_with_exit_code():
    pod = {"metadata": {"name": "s-0"}, "status": {"containerStatuses": [{
        "name": "vllm", "restartCount": 4,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 2, "message": "vllm: error: unrecognized arguments: --swap-space"}},
    }]}}
    msg = pod_trouble([pod])
    assert "s-0" in msg and "CrashLoopBackOff" in msg and "exit code 2" in msg and "--swap-space" in msg
    assert pod_trouble([{"metadata": {"name": "ok"}, "status": {"containerStatuses": [{"state": {"running": {}}}]}}]) is None


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


def test_minor_version_reads_what_distributions_write():
    assert minor_version({"major": "1", "minor": "20", "gitVersion": "v1.20.15"}) == 20
    assert minor_version({"major": "1", "minor": "22+", "gitVersion": "v1.22.17-eks-0a21954"}) == 22
    assert minor_version({}) == 0 and minor_version({"minor": ""}) == 0
