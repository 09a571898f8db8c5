"""Servers across nodes against the real API server and the real LeaderWorkerSet controller (sigs.k8s.io/lws,
built from its Go module by tools/lws-build.sh; e2e/testbed/lws.py runs it with its webhooks on loopback).

The reconciler runs in-process one pass at a time; the fake kubelet (e2e/testbed/fakekubelet.py) plays scheduler
and kubelet for the pods the LWS controller creates. What is shown: the cluster without LWS gets a condition
naming what to install; with it, the operator's LeaderWorkerSet is accepted by LWS's webhooks and reconciled into
a leader and a worker pod with the LWS variables vLLM's multi-node arguments read; its status is read back in
groups; a deleted LeaderWorkerSet is repaired; replicas scale by group; a failing worker is named; the group is
garbage-collected with its server, and a LeaderWorkerSet the operator did not create is never adopted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from e2e.testbed.controlplane import wait_for
from e2e.testbed.fakekubelet import FakeKubelet, Fault
from e2e.testbed.lws import LWSController
from vllm_operator import builders
from vllm_operator.controller.reconcile import LWS_NOT_INSTALLED, Reconciler
from vllm_operator.kube.client import Kube

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[2]
GROUP_PATH = "/apis/vllm-operator.io/v1alpha1"
LWS = builders.LWS_API_VERSION


@pytest.fixture(scope="module")
def lws_controller(control_plane, tmp_path_factory):
    ctl = LWSController(control_plane, tmp_path_factory.mktemp("lws")).start()
    try:
        yield ctl
    finally:
        print(ctl.log_tail(80))
        ctl.stop()


def server_doc(name: str, ns: str, **spec) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "llama-70b-two-nodes.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": ns}
    doc["spec"].pop("cache")  # an emptyDir: the test bed has no ReadWriteMany storage
    doc["spec"].update(spec)
    return doc


def apply(cp, doc: dict) -> None:
    cp.kubectl("apply", "-f", "-", input=json.dumps(doc))


def get_server(kube: Kube, ns: str, name: str) -> dict:
    return kube.request("GET", f"{GROUP_PATH}/namespaces/{ns}/vllmservers/{name}")


def cond(server: dict, type_: str) -> dict:
    return next((c for c in (server.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def pods(kube: Kube, ns: str) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in kube.list("v1", "Pod", ns)}


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env") or []}


def ready_groups(reconciler: Reconciler, kube: Kube, ns: str, name: str, groups: int, what: str) -> dict:
    """Reconcile until the server reports `groups` ready groups (the LWS controller and the fake kubelet
    work in between)."""
    def ready():
        reconciler.reconcile(ns, name)
        server = get_server(kube, ns, name)
        st = server.get("status") or {}
        return server if st.get("readyReplicas") == groups and st.get("replicas") == groups else None
    return wait_for(ready, 180, what, interval=1.0)


def test_a_cluster_without_leaderworkerset_is_told_what_to_install(control_plane, kube, crd_installed, namespace):
    assert not kube.serves(LWS), "runs before the module's LWS controller installs the CRD"
    apply(control_plane, server_doc("no-lws", namespace))
    Reconciler(kube).reconcile(namespace, "no-lws")
    server = get_server(kube, namespace, "no-lws")
    valid = cond(server, "SpecValid")
    assert valid["status"] == "False" and valid["reason"] == LWS_NOT_INSTALLED
    assert "install LeaderWorkerSet" in valid["message"] and "nodes: 1" in valid["message"]
    assert cond(server, "Stalled")["status"] == "True"
    assert kube.get("v1", "Service", namespace, "no-lws") is None, "nothing is applied"


def test_the_real_controller_makes_a_group_that_is_repaired_scaled_and_collected(
        control_plane, kube, k8s, crd_installed, lws_controller, namespace):
    name = "llama"
    apply(control_plane, server_doc(name, namespace))
    reconciler = Reconciler(kube)
    reconciler.reconcile(namespace, name)
    lws = kube.get(LWS, "LeaderWorkerSet", namespace, name)
    assert lws is not None and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert lws["spec"]["startupPolicy"] == "LeaderCreated"  # as we sent it, through LWS's webhooks

    with FakeKubelet(k8s, namespace=namespace, node_name=f"n-{namespace}"[:60], gpu_product="NVIDIA-L40S"):
        server = ready_groups(reconciler, kube, namespace, name, 1, "one ready group")
        live = pods(kube, namespace)
        leader, worker = live[f"{name}-0"], live[f"{name}-0-1"]
        # The LWS webhook's variables, which the kubelet expands into vLLM's --node-rank and --master-addr.
        assert env_of(leader)["LWS_WORKER_INDEX"] == "0" and env_of(worker)["LWS_WORKER_INDEX"] == "1"
        assert env_of(leader)["LWS_LEADER_ADDRESS"] == env_of(worker)["LWS_LEADER_ADDRESS"]
        assert env_of(worker)["LWS_LEADER_ADDRESS"].startswith(f"{name}-0.{name}.{namespace}")
        args = leader["spec"]["containers"][0]["args"]
        assert args[args.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
        assert args[args.index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"
        assert worker["spec"]["containers"][0]["args"] == args + ["--headless"]
        assert "readinessProbe" in leader["spec"]["containers"][0]
        assert "readinessProbe" not in worker["spec"]["containers"][0]
        assert leader["metadata"]["labels"][builders.ROLE_LABEL] == "leader"
        service = kube.get("v1", "Service", namespace, name)
        assert service["spec"]["selector"][builders.ROLE_LABEL] == "leader"
        assert cond(server, "Ready")["status"] == "True" and cond(server, "Ready")["message"] == "1/1 groups ready"
        assert server["status"]["plan"]["estimates"]["nodes"] == 2
        assert reconciler.reconcile(namespace, name).applied == [], "what LWS defaults is no drift: nothing re-sent"

        # Drift: the LeaderWorkerSet deleted behind the operator's back comes back with its group.
        kube.delete(LWS, "LeaderWorkerSet", namespace, name)
        wait_for(lambda: kube.get(LWS, "LeaderWorkerSet", namespace, name) is None, 60, "the LWS gone")
        reconciler.reconcile(namespace, name)
        assert kube.get(LWS, "LeaderWorkerSet", namespace, name) is not None
        ready_groups(reconciler, kube, namespace, name, 1, "the group back after the deletion")

        # Scaling counts groups: two replicas are two leaders with a worker each.
        apply(control_plane, server_doc(name, namespace, replicas=2))
        ready_groups(reconciler, kube, namespace, name, 2, "two ready groups")
        assert {f"{name}-0", f"{name}-0-1", f"{name}-1", f"{name}-1-1"} <= set(pods(kube, namespace))
        assert kube.get("policy/v1", "PodDisruptionBudget", namespace, name) is not None

    # Garbage collection: the server's deletion takes its LeaderWorkerSet (and LWS its pods) with it.
    kube.delete("vllm-operator.io/v1alpha1", "VLLMServer", namespace, name)
    wait_for(lambda: kube.get(LWS, "LeaderWorkerSet", namespace, name) is None, 120, "the LWS collected")


def test_a_failing_worker_is_named_and_a_foreign_leaderworkerset_is_never_adopted(
        control_plane, kube, k8s, crd_installed, lws_controller, namespace):
    name = "crashy"
    apply(control_plane, server_doc(name, namespace))
    reconciler = Reconciler(kube)
    reconciler.reconcile(namespace, name)
    crash = Fault(container={"state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                             "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                                          "message": "RuntimeError: NCCL error: unhandled system "
                                                                     "error"}},
                             "restartCount": 3})
    faults = lambda pod: crash if pod.metadata.name.endswith("-0-1") else None  # noqa: E731

    with FakeKubelet(k8s, namespace=namespace, node_name=f"n-{namespace}"[:60], gpu_product="NVIDIA-L40S",
                     faults=faults):
        def named():
            reconciler.reconcile(namespace, name)
            degraded = cond(get_server(kube, namespace, name), "Degraded")
            return degraded if degraded.get("status") == "True" and f"{name}-0-1" in degraded["message"] else None
        degraded = wait_for(named, 120, "the failing worker named in Degraded", interval=1.0)
        assert "NCCL error" in degraded["message"]

    # Someone else's LeaderWorkerSet under a server's name is left alone.
    foreign = kube.get(LWS, "LeaderWorkerSet", namespace, name)
    body = {"apiVersion": LWS, "kind": "LeaderWorkerSet", "metadata": {"name": "theirs", "namespace": namespace},
            "spec": {k: v for k, v in foreign["spec"].items() if k in ("leaderWorkerTemplate", "startupPolicy")}}
    body["spec"]["replicas"] = 0
    kube.apply(body, field_manager="someone-else")
    apply(control_plane, server_doc("theirs", namespace))
    reconciler.reconcile(namespace, "theirs")
    server = get_server(kube, namespace, "theirs")
    assert cond(server, "Ready")["reason"] == "NameConflict"
    live = kube.get(LWS, "LeaderWorkerSet", namespace, "theirs")
    assert not live["metadata"].get("ownerReferences"), "never adopted"


class LeaderQueues:
    """Answers what the test says each pod's queue is; records which pods were read (a group's leaders only)."""

    def __init__(self, waiting: dict[str, float]):
        self.waiting = waiting
        self.asked: list[list[str]] = []

    def read(self, pod_refs):
        from vllm_operator.sources.vllm_metrics import Sample

        self.asked.append([p.name for p in pod_refs])
        return [Sample(p.name, waiting=self.waiting.get(p.name, 0.0), running=1.0, kv_cache_usage=0.25)
                for p in pod_refs]


def test_the_operators_autoscaler_scales_groups_on_the_leaders_queues(
        control_plane, kube, k8s, crd_installed, lws_controller, namespace):
    from vllm_operator.autoscaler import actuator, ownership

    name = "scaled"
    autoscaling = {"enabled": True, "minReplicas": 1, "maxReplicas": 3, "targetWaitingPerReplica": 2,
                   "intervalSeconds": 1}
    apply(control_plane, server_doc(name, namespace, autoscaling=autoscaling))
    reconciler = Reconciler(kube)
    reconciler.reconcile(namespace, name)
    lws = kube.get(LWS, "LeaderWorkerSet", namespace, name)
    assert lws["spec"]["replicas"] == 1 and ownership.replicas_owners(lws) == {ownership.FIELD_MANAGER}
    with FakeKubelet(k8s, namespace=namespace, node_name=f"n-{namespace}"[:60], gpu_product="NVIDIA-L40S",
                     gpus=16):  # room for 3 groups of 2 pods x 2 GPUs
        ready_groups(reconciler, kube, namespace, name, 1, "one ready group")
        # The scale subresource an HPA or KEDA drives selects the leaders: the queue is read where requests wait.
        scale = kube.request("GET", f"/apis/{LWS}/namespaces/{namespace}/leaderworkersets/{name}/scale")
        assert "leaderworkerset.sigs.k8s.io/worker-index=0" in scale["status"]["selector"]
        source = LeaderQueues({f"{name}-0": 5.0})  # 5 waiting, 2 per group: 3 groups
        scaler = actuator.Autoscaler(kube, actuator.Sources(pods=source), namespace, name)
        result = scaler.tick(get_server(kube, namespace, name))
        assert source.asked == [[f"{name}-0"]], "the worker serves no queue and is not read"
        assert result.scaled and result.decision.desired == 3
        assert kube.get(LWS, "LeaderWorkerSet", namespace, name)["spec"]["replicas"] == 3
        reconciler.reconcile(namespace, name)  # the reconciler leaves the autoscaler's count alone
        assert kube.get(LWS, "LeaderWorkerSet", namespace, name)["spec"]["replicas"] == 3
        ready_groups(reconciler, kube, namespace, name, 3, "three ready groups")


def test_an_hpa_scales_groups_through_the_leaderworkersets_scale_subresource(
        control_plane, kube, crd_installed, lws_controller, namespace):
    """HPA mode: the rendered HorizontalPodAutoscaler targets the LeaderWorkerSet, and the real HPA controller
    (the test bed's kube-controller-manager) reads and writes the group count through LWS's /scale. The test bed
    serves no custom metrics API (no prometheus-adapter), so the controller is seen acting on its bounds, which
    it enforces before any metric: a LeaderWorkerSet scaled above maxReplicas is brought back to it."""
    name = "hpa"
    auto = {"enabled": True, "mode": "HPA", "minReplicas": 1, "maxReplicas": 2, "targetWaitingPerReplica": 2}
    apply(control_plane, server_doc(name, namespace, autoscaling=auto))
    reconciler = Reconciler(kube)
    reconciler.reconcile(namespace, name)
    reconciler.reconcile(namespace, name)
    hpa = kube.get("autoscaling/v2", "HorizontalPodAutoscaler", namespace, name)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": LWS, "kind": "LeaderWorkerSet", "name": name}
    scale_path = f"/apis/{LWS}/namespaces/{namespace}/leaderworkersets/{name}/scale"

    # Someone scales the groups past the HPA's bound (kubectl scale does this write): the HPA controller takes
    # the count back through the same subresource.
    # the PATCH's answer, not a later read: the HPA controller may take the count back in between
    scaled = kube.request("PATCH", scale_path, query=[("fieldManager", "someone")], body={"spec": {"replicas": 4}},
                          content_type="application/merge-patch+json")
    assert scaled["spec"]["replicas"] == 4

    def rescaled():
        events = [e for e in kube.list("v1", "Event", namespace)
                  if e["involvedObject"].get("kind") == "HorizontalPodAutoscaler"
                  and e["involvedObject"].get("name") == name and e["reason"] == "SuccessfulRescale"]
        live = kube.get(LWS, "LeaderWorkerSet", namespace, name)
        return events if events and live["spec"]["replicas"] == 2 else None
    [event] = wait_for(rescaled, 120, "the HPA controller scaling the LeaderWorkerSet to maxReplicas", interval=1.0)
    assert event["message"] == "New size: 2; reason: Current number of replicas above Spec.MaxReplicas"
    hpa = kube.get("autoscaling/v2", "HorizontalPodAutoscaler", namespace, name)
    able = next(c for c in hpa["status"]["conditions"] if c["type"] == "AbleToScale")
    assert able["status"] == "True", able
    # The scale subresource the controller read selects the leaders (the HPA's Pods metric is read on them).
    assert "leaderworkerset.sigs.k8s.io/worker-index=0" in kube.request("GET", scale_path)["status"]["selector"]
    reconciler.reconcile(namespace, name)  # the reconciler leaves the HPA's count alone
    assert kube.get(LWS, "LeaderWorkerSet", namespace, name)["spec"]["replicas"] == 2


def _termination(kubelet: FakeKubelet, pod: str):
    return next((t for t in list(kubelet.terminations.values()) if t.name == pod and t.done), None)


def test_every_member_of_a_group_gets_its_grace_period_on_scale_down_and_rollout(
        control_plane, kube, k8s, crd_installed, lws_controller, namespace):
    """Drain of a group: the pods the real LWS controller makes carry the plan's terminationGracePeriodSeconds on
    leader and worker; a scale-down deletes the last group's pods with that grace (a kubelet that terminates as
    a kubelet does: preStop sleep, SIGTERM, the rest of the grace), the worker only once its leader has
    finished (a group's engine keeps its ranks through the leader's drain), and the group nobody changed keeps
    its pods; a rollout replaces a group the same way."""
    from vllm_operator import api, pipeline

    name = "drain"
    doc = server_doc(name, namespace, replicas=2)
    plan = pipeline.plan_server(name, namespace, api.VLLMServerSpec.model_validate(doc["spec"]))
    grace, prestop = plan.termination_grace_seconds, plan.prestop_seconds
    assert grace == prestop + plan.drain_seconds + 10 and prestop > 0
    apply(control_plane, doc)
    reconciler = Reconciler(kube)
    reconciler.reconcile(namespace, name)
    with FakeKubelet(k8s, namespace=namespace, node_name=f"n-{namespace}"[:60], gpu_product="NVIDIA-L40S",
                     gpus=16, graceful=True) as kubelet:
        ready_groups(reconciler, kube, namespace, name, 2, "two ready groups")
        live = pods(kube, namespace)
        assert set(live) == {f"{name}-0", f"{name}-0-1", f"{name}-1", f"{name}-1-1"}
        for pod in live.values():
            assert pod["spec"]["terminationGracePeriodSeconds"] == grace, pod["metadata"]["name"]
        kept = {n: p["metadata"]["uid"] for n, p in live.items() if n.startswith(f"{name}-0")}

        apply(control_plane, server_doc(name, namespace, replicas=1))
        reconciler.reconcile(namespace, name)
        leader, worker = (wait_for(lambda n=n: _termination(kubelet, n), 120 + 2 * grace, f"{n} terminated")
                          for n in (f"{name}-1", f"{name}-1-1"))
        for t in (leader, worker):
            assert t.graceful and t.grace_seconds == grace, t
            assert t.prestop_seconds == prestop, t
            assert t.stop_grace is not None and t.stop_grace >= grace - prestop - 2, t  # SIGTERM: drain + margin
            assert not t.errors, t.errors
        assert worker.stop_at is not None and leader.stopped_at is not None
        assert worker.stop_at >= leader.stopped_at, "the worker got SIGTERM while its leader was still draining"
        ready_groups(reconciler, kube, namespace, name, 1, "one group left")
        assert {n: p["metadata"]["uid"] for n, p in pods(kube, namespace).items()} == kept, \
            "the group nobody changed keeps its pods"

        # A rollout (a changed pod template) replaces the group with the same grace on each member.
        changed = server_doc(name, namespace, replicas=1)
        changed["spec"]["engine"] = {"env": [{"name": "NCCL_DEBUG", "value": "WARN"}]}
        apply(control_plane, changed)
        reconciler.reconcile(namespace, name)
        rolled = [wait_for(lambda u=u: next((t for t in list(kubelet.terminations.values())
                                             if t.uid == u and t.done), None), 120 + 2 * grace, f"{n} replaced")
                  for n, u in kept.items()]
        for t in rolled:
            assert t.graceful and t.grace_seconds == grace and t.prestop_seconds == prestop, t
        by_name = {t.name: t for t in rolled}
        assert by_name[f"{name}-0-1"].stop_at >= by_name[f"{name}-0"].stopped_at, \
            "the worker got SIGTERM while its leader was still draining"
        server = ready_groups(reconciler, kube, namespace, name, 1, "the rolled group ready")
        assert set(pods(kube, namespace)) == {f"{name}-0", f"{name}-0-1"}
        assert cond(server, "Ready")["status"] == "True"


def test_an_unschedulable_worker_is_named(control_plane, kube, k8s, crd_installed, lws_controller, namespace):
    """A worker the scheduler cannot place (its node has no GPUs left) keeps the group from starting: Ready names
    that pod and the scheduler's words while a node may still come, and Degraded does once the wait is over."""
    import datetime as dt

    from vllm_operator.controller import failures

    name = "pending"
    apply(control_plane, server_doc(name, namespace))
    reconciler = Reconciler(kube)
    reconciler.reconcile(namespace, name)
    said = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    worker = f"{name}-0-1"
    # The leader runs but is not Ready: vLLM's API server answers /health only once every worker has joined.
    # (LWS v0.8.0 counts a group ready when its leader is Ready and its workers' pods exist, Pending or not.)
    with FakeKubelet(k8s, namespace=namespace, node_name=f"n-{namespace}"[:60], gpu_product="NVIDIA-L40S",
                     unschedulable=lambda pod: said if pod.metadata.name == worker else None,
                     on_pod_start=lambda pod, ip: False):
        seen: list[dict] = []

        def named():
            reconciler.reconcile(namespace, name)
            seen[:] = [cond(get_server(kube, namespace, name), "Ready"), pods(kube, namespace).get(worker, {})]
            return seen[0] if f"pod {worker} cannot be scheduled" in seen[0].get("message", "") else None
        try:
            ready = wait_for(named, 120, "the unschedulable worker named in Ready", interval=1.0)
        except TimeoutError:
            raise AssertionError(f"Ready: {seen[0]}; the worker's status: {(seen[1] or {}).get('status')}")
        assert ready["status"] == "False" and ready["reason"] == "Unschedulable"
        assert said in ready["message"] and ready["message"].startswith("0/1 groups ready")
        assert cond(get_server(kube, namespace, name), "Degraded")["status"] == "False", "a node may still come"

        later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=failures.UNSCHEDULABLE_GRACE_SECONDS + 60)
        waited = Reconciler(kube, clock=lambda: later.strftime("%Y-%m-%dT%H:%M:%SZ"))
        waited.reconcile(namespace, name)
        degraded = cond(get_server(kube, namespace, name), "Degraded")
        assert degraded["status"] == "True" and degraded["reason"] == "Unschedulable"
        assert f"pod {worker} cannot be scheduled: {said}" in degraded["message"]


def test_max_nodes_reconciles_into_the_group_the_planner_chose(
        control_plane, kube, crd_installed, lws_controller, namespace):
    """maxNodes on the real API server: the reconciler applies the layout the planner chose (70B on nodes of
    2 x L40S: two), the real LWS controller accepts it, and status says the count and why."""
    name = "chosen"
    doc = server_doc(name, namespace, maxNodes=4)
    doc["spec"].pop("nodes")
    apply(control_plane, doc)
    Reconciler(kube).reconcile(namespace, name)
    lws = kube.get(LWS, "LeaderWorkerSet", namespace, name)
    assert lws is not None and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    server = get_server(kube, namespace, name)
    assert cond(server, "SpecValid")["status"] == "True"
    assert server["status"]["plan"]["estimates"]["nodes"] == 2
    [layout] = [n for n in server["status"]["plan"]["notes"] if n.startswith("layout: ")]
    assert layout.startswith("layout: 2 nodes x 2 GPU(s), one LeaderWorkerSet group per replica, chosen by "
                             "maxNodes 4: the fewest that fit; 1 node(s): spec.gpu: the model does not fit")
    assert wait_for(lambda: kube.get("apps/v1", "StatefulSet", namespace, name), 60,
                    "the LWS controller's leader StatefulSet")["spec"]["replicas"] == 1
