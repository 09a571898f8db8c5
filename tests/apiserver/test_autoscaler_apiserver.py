"""The autoscaler's writes against the test bed's real kube-apiserver (no vLLM: a scripted metrics source).

The reconciler and the autoscaler run in-process, one step at a time, so each test can say
exactly which write happened: who owns the StatefulSet's replicas when autoscaling is
switched on and off, status and conditions written by two field managers side by side,
holds on missing metrics, and the HPA/KEDA emission.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from e2e.testbed.convergence import wait_established
from e2e.testbed.controlplane import wait_for
from e2e.testbed.fakekubelet import FakeKubelet
from vllm_operator.autoscaler import actuator, ownership, policy
from vllm_operator.sources.vllm_metrics import Sample
from vllm_operator.kube.client import FIELD_MANAGER, Kube
from vllm_operator.controller.reconcile import Reconciler

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[2]
GROUP_PATH = "/apis/vllm-operator.io/v1alpha1"


@pytest.fixture
def reconciler(kube, crd_installed):
    return Reconciler(kube)


class ScriptedSource:
    """Answers what the test says each pod's queue is; pods not in `waiting` fail."""

    def __init__(self):
        self.waiting: dict[str, float] = {}
        self.running = 1.0
        self.asked: list[list[str]] = []

    def read(self, pods):
        self.asked.append([p.name for p in pods])
        return [Sample(p.name, waiting=self.waiting[p.name], running=self.running, kv_cache_usage=0.25) if p.name in self.waiting
                else Sample.failed(p.name, f"GET http://{p.ip}:{p.port}/metrics: connection refused") for p in pods]


def server_doc(name: str, ns: str, **spec) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "llama-3b-autoscaled.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": ns}
    doc["spec"].update(spec)
    return doc


def apply(cp, doc: dict) -> None:
    cp.kubectl("apply", "-f", "-", input=json.dumps(doc))


def get_server(kube: Kube, ns: str, name: str) -> dict:
    return kube.request("GET", f"{GROUP_PATH}/namespaces/{ns}/vllmservers/{name}")


def sts(kube: Kube, ns: str, name: str) -> dict:
    return kube.get("apps/v1", "StatefulSet", ns, name)


def cond(server: dict, type_: str) -> dict:
    return next((c for c in (server.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def events(kube: Kube, ns: str, name: str) -> list[dict]:
    return [e for e in kube.list("v1", "Event", ns) if e["involvedObject"].get("name") == name]


def converge(reconciler: Reconciler, kube: Kube, ns: str, name: str, times: int = 2) -> dict:
    for _ in range(times):
        reconciler.reconcile(ns, name)
    return get_server(kube, ns, name)


# --------------------------------------------------------------------------- replicas ownership
def test_switching_autoscaling_on_keeps_the_replicas_and_off_hands_them_back(control_plane, kube, k8s, reconciler,
                                                                            namespace):
    name = "switch"
    off = {"enabled": False, "maxReplicas": 4}
    apply(control_plane, server_doc(name, namespace, replicas=3, autoscaling=off))
    converge(reconciler, kube, namespace, name)
    assert sts(kube, namespace, name)["spec"]["replicas"] == 3
    assert ownership.replicas_owners(sts(kube, namespace, name)) == {FIELD_MANAGER}

    # On: the reconciler stops sending replicas; the live 3 stay (the autoscaler co-owned them first).
    on = {"enabled": True, "minReplicas": 1, "maxReplicas": 4, "intervalSeconds": 1}
    apply(control_plane, server_doc(name, namespace, replicas=3, autoscaling=on))
    converge(reconciler, kube, namespace, name)
    live = sts(kube, namespace, name)
    assert live["spec"]["replicas"] == 3, "turning autoscaling on must not reset the StatefulSet to 1"
    assert ownership.replicas_owners(live) == {ownership.FIELD_MANAGER}

    # The autoscaler scales; the reconciler's next passes leave its count alone.
    source = ScriptedSource()
    with FakeKubelet(k8s, namespace=namespace, node_name=f"n-{namespace}"[:60], gpu_product="NVIDIA-L4"):
        wait_for(lambda: len([p for p in kube.list("v1", "Pod", namespace) if actuator._is_ready(p)]) == 3, 60,
                 "3 ready pods")
        source.waiting = {f"{name}-{i}": 6.0 for i in range(3)}  # 18 waiting, target 4 -> 5, capped at 4
        scaler = actuator.Autoscaler(kube, actuator.Sources(pods=source), namespace, name)
        result = scaler.tick(get_server(kube, namespace, name))
        assert result.scaled and result.decision.desired == 4 and result.decision.limited
        converge(reconciler, kube, namespace, name)
        assert sts(kube, namespace, name)["spec"]["replicas"] == 4
        server = get_server(kube, namespace, name)
        assert server["status"]["autoscaling"]["desiredReplicas"] == 4
        assert cond(server, "AutoscalingLimited")["reason"] == "AtMaxReplicas"

    # Off: spec.replicas governs again, and the autoscaler's status goes away.
    apply(control_plane, server_doc(name, namespace, replicas=2, autoscaling=off))
    server = converge(reconciler, kube, namespace, name)
    live = sts(kube, namespace, name)
    assert live["spec"]["replicas"] == 2
    assert FIELD_MANAGER in ownership.replicas_owners(live)
    assert "autoscaling" not in server["status"]
    assert not cond(server, "AutoscalingActive") and not cond(server, "AutoscalingLimited")
    assert cond(server, "Ready"), "the reconciler's own conditions are untouched"


def test_a_new_autoscaled_statefulset_starts_at_min_replicas(control_plane, kube, reconciler, namespace):
    apply(control_plane, server_doc("fresh", namespace, autoscaling={"enabled": True, "minReplicas": 2,
                                                                       "maxReplicas": 4}))
    converge(reconciler, kube, namespace, "fresh", times=1)
    live = sts(kube, namespace, "fresh")
    assert live["spec"]["replicas"] == 2
    assert ownership.replicas_owners(live) == {ownership.FIELD_MANAGER}


# --------------------------------------------------------------------------- status, conditions, events
def test_status_conditions_and_events_from_two_field_managers(control_plane, kube, k8s, reconciler, namespace):
    name = "both"
    apply(control_plane, server_doc(name, namespace, autoscaling={
        "enabled": True, "minReplicas": 1, "maxReplicas": 3, "targetWaitingPerReplica": 2,
        "scaleDownStabilizationSeconds": 0, "intervalSeconds": 1}))
    converge(reconciler, kube, namespace, name)
    source = ScriptedSource()
    clock = [1_000_000.0]
    scaler = actuator.Autoscaler(kube, actuator.Sources(pods=source), namespace, name, clock=lambda: clock[0])
    with FakeKubelet(k8s, namespace=namespace, node_name=f"n-{namespace}"[:60], gpu_product="NVIDIA-L4"):
        wait_for(lambda: actuator._is_ready(kube.get("v1", "Pod", namespace, f"{name}-0")), 60, "pod 0 ready")

        # A queue: scale up, ScaledUp event, status and both conditions.
        source.waiting = {f"{name}-0": 5.0}
        r = scaler.tick(get_server(kube, namespace, name))
        assert r.scaled and r.decision.desired == 3 and r.status_written
        server = get_server(kube, namespace, name)
        au = server["status"]["autoscaling"]
        assert au["desiredReplicas"] == 3 and au["metricValue"] == 5 and au["waiting"] == 5
        assert au["kvCacheUsage"] == 0.25 and au["lastScaleTime"]
        assert au["reason"].startswith("scale up 1 -> 3: 5 waiting per ready replica")
        assert cond(server, "AutoscalingActive")["status"] == "True"
        assert cond(server, "AutoscalingActive")["reason"] == policy.SCALE_UP
        assert cond(server, "AutoscalingLimited")["status"] == "False"
        [up] = [e for e in events(kube, namespace, name) if e["reason"] == "ScaledUp"]
        assert up["message"].startswith("1 -> 3 replicas (pods' /metrics): scale up 1 -> 3")
        assert up["source"]["component"] == "vllm-operator-autoscaler"

        # The reconciler writes its own status; the autoscaler's part stays.
        converge(reconciler, kube, namespace, name)
        server = get_server(kube, namespace, name)
        assert server["status"]["autoscaling"]["desiredReplicas"] == 3
        assert {c["type"] for c in server["status"]["conditions"]} >= {
            "SpecValid", "Ready", "Progressing", "Degraded", "AutoscalingActive", "AutoscalingLimited"}

        # At maxReplicas with a longer queue: limited; the same decision again writes nothing.
        wait_for(lambda: len([p for p in kube.list("v1", "Pod", namespace) if actuator._is_ready(p)]) == 3, 60,
                 "3 ready pods")
        source.waiting = {f"{name}-0": 10.0, f"{name}-1": 0.0, f"{name}-2": 0.0}
        clock[0] += 1
        r1 = scaler.tick(get_server(kube, namespace, name))
        assert (r1.decision.desired, r1.decision.code, r1.scaled, r1.status_written) == (3, policy.AT_LIMIT, False, True)
        server = get_server(kube, namespace, name)
        assert cond(server, "AutoscalingLimited")["status"] == "True"
        assert cond(server, "AutoscalingLimited")["message"] == "at maxReplicas 3 (recommendation 5)"
        clock[0] += 1
        r2 = scaler.tick(get_server(kube, namespace, name))
        assert r2.decision.desired == 3 and not r2.status_written, "same decision, same numbers: no status write"

        # Metrics missing: hold, AutoscalingActive False with the pod and the error, one Warning event.
        source.waiting = {}
        clock[0] += 1
        r = scaler.tick(get_server(kube, namespace, name))
        assert r.decision.hold and not r.scaled and r.status_written
        server = get_server(kube, namespace, name)
        active = cond(server, "AutoscalingActive")
        assert (active["status"], active["reason"]) == ("False", "MetricsUnavailable")
        assert f"{name}-0 (GET http://" in active["message"] and "connection refused" in active["message"]
        assert "metricValue" not in server["status"]["autoscaling"]
        assert cond(server, "AutoscalingLimited")["status"] == "True", "kept as it was while holding"
        clock[0] += 1
        scaler.tick(get_server(kube, namespace, name))
        warnings = [e for e in events(kube, namespace, name) if e["reason"] == "MetricsUnavailable"]
        assert len(warnings) == 1 and warnings[0]["type"] == "Warning"
        assert sts(kube, namespace, name)["spec"]["replicas"] == 3

        # Back and idle (nothing waiting or running): scale down (window 0), ScaledDown event.
        # Running requests set a floor for scale-down, so the idle phase has none.
        source.waiting = {f"{name}-{i}": 0.0 for i in range(3)}
        source.running = 0.0
        clock[0] += 60  # past the window of the holds
        r = scaler.tick(get_server(kube, namespace, name))
        assert r.scaled and r.decision.desired == 1, r.decision.reason
        assert any(e["reason"] == "ScaledDown" for e in events(kube, namespace, name))
        server = get_server(kube, namespace, name)
        assert cond(server, "AutoscalingActive")["status"] == "True"
        assert cond(server, "AutoscalingLimited")["reason"] == "AtMinReplicas"


# --------------------------------------------------------------------------- HPA and KEDA
def test_hpa_mode_applies_an_hpa_and_switching_back_prunes_it(control_plane, kube, reconciler, namespace):
    name = "hpa"
    auto = {"enabled": True, "mode": "HPA", "minReplicas": 1, "maxReplicas": 5, "targetWaitingPerReplica": 3,
            "scaleDownStabilizationSeconds": 90}
    apply(control_plane, server_doc(name, namespace, autoscaling=auto))
    server = converge(reconciler, kube, namespace, name)
    hpa = kube.get("autoscaling/v2", "HorizontalPodAutoscaler", namespace, name)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 5)
    [metric] = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "vllm:num_requests_waiting"
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "3"}
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 90
    assert hpa["metadata"]["ownerReferences"][0]["uid"] == server["metadata"]["uid"]
    external = cond(server, "ExternalScaler")
    assert (external["status"], external["reason"]) == ("True", "HPAApplied")
    assert "autoscaling" not in server["status"], "the operator's own loop is not running for this server"

    auto["mode"] = "Operator"
    apply(control_plane, server_doc(name, namespace, autoscaling=auto))
    server = converge(reconciler, kube, namespace, name)
    assert kube.get("autoscaling/v2", "HorizontalPodAutoscaler", namespace, name) is None
    assert not cond(server, "ExternalScaler")


SCALED_OBJECT_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "scaledobjects.keda.sh"},
    "spec": {"group": "keda.sh", "scope": "Namespaced",
             "names": {"kind": "ScaledObject", "plural": "scaledobjects", "singular": "scaledobject"},
             "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def test_keda_mode_without_keda_says_so_and_applies_it_once_keda_is_there(control_plane, kube, reconciler,
                                                                          namespace):
    name = "keda"
    auto = {"enabled": True, "mode": "KEDA", "minReplicas": 1, "maxReplicas": 3,
            "prometheusURL": "http://prometheus.monitoring:9090"}
    apply(control_plane, server_doc(name, namespace, autoscaling=auto))
    server = converge(reconciler, kube, namespace, name)
    assert sts(kube, namespace, name) is not None, "everything else is applied"
    external = cond(server, "ExternalScaler")
    assert (external["status"], external["reason"]) == ("False", "KEDANotInstalled")
    assert cond(server, "SpecValid")["status"] == "True"
    [warning] = [e for e in events(kube, namespace, name) if e["reason"] == "KEDANotInstalled"]
    assert warning["type"] == "Warning" and "install KEDA" in warning["message"]

    control_plane.kubectl("apply", "-f", "-", input=json.dumps(SCALED_OBJECT_CRD))
    try:
        wait_established(control_plane, "scaledobjects.keda.sh")
        reconciler._keda = None  # forget the cached discovery answer (it is trusted for 30 s)
        wait_for(lambda: kube.serves("keda.sh/v1alpha1"), 30, "keda.sh/v1alpha1 served")
        server = converge(reconciler, kube, namespace, name)
        so = kube.get("keda.sh/v1alpha1", "ScaledObject", namespace, name)
        assert so["spec"]["scaleTargetRef"]["name"] == name
        [trigger] = so["spec"]["triggers"]
        assert trigger["type"] == "prometheus"
        assert trigger["metadata"]["serverAddress"] == "http://prometheus.monitoring:9090"
        assert trigger["metadata"]["query"] == f'sum(vllm:num_requests_waiting{{namespace="{namespace}",pod=~"{name}-[0-9]+"}})'
        assert cond(server, "ExternalScaler")["reason"] == "ScaledObjectApplied"
        auto["enabled"] = False
        apply(control_plane, server_doc(name, namespace, autoscaling=auto))
        server = converge(reconciler, kube, namespace, name)
        assert kube.get("keda.sh/v1alpha1", "ScaledObject", namespace, name) is None
        assert not cond(server, "ExternalScaler")
    finally:
        control_plane.kubectl("delete", "crd", "scaledobjects.keda.sh", "--wait=true", "--timeout=60s", check=False)


def keda_crd() -> Path:
    from e2e.testbed.controlplane import cache_dir

    path = cache_dir() / "keda-2.21.0" / "crd" / "keda.sh_scaledobjects.yaml"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run tools/keda-crd.sh (tools/run-tests.sh does)")
    return path


def test_kedas_own_schema_admits_the_scaled_objects_of_a_server_and_of_a_group(control_plane, kube, namespace):
    """The ScaledObjects the operator renders (a StatefulSet's; a group's, whose scaleTargetRef is the
    LeaderWorkerSet) against KEDA's real CRD (v2.21.0, from its Go module): strict field validation, so a field
    KEDA's schema lacks or a wrong type is refused. KEDA itself does not run here: what it does with them is not
    shown."""
    from vllm_operator import api, builders, pipeline

    control_plane.kubectl("apply", "--server-side", "-f", str(keda_crd()))
    try:
        wait_established(control_plane, "scaledobjects.keda.sh")
        group = yaml.safe_load((ROOT / "examples" / "llama-70b-two-nodes.yaml").read_text())["spec"]
        single = yaml.safe_load((ROOT / "examples" / "llama-3b-autoscaled.yaml").read_text())["spec"]
        for spec, target in ((single, "StatefulSet"), (group, "LeaderWorkerSet")):
            spec["autoscaling"] = {"enabled": True, "mode": "KEDA", "minReplicas": 0, "maxReplicas": 3,
                                   "prometheusURL": "http://prometheus.monitoring:9090"}
            plan = pipeline.plan_server("keda-" + target.lower(), namespace, api.VLLMServerSpec.model_validate(spec))
            [so] = [o for o in builders.build_all(plan) if o["kind"] == "ScaledObject"]
            assert so["spec"]["scaleTargetRef"]["kind"] == target
            p = control_plane.kubectl("apply", "-n", namespace, "--server-side", "--field-manager=test",
                                      "--validate=strict", "-f", "-", input=json.dumps(so), check=False)
            assert p.returncode == 0, f"{target}: {p.stderr}"
            live = kube.get("keda.sh/v1alpha1", "ScaledObject", namespace, so["metadata"]["name"])
            assert live["spec"]["scaleTargetRef"] == so["spec"]["scaleTargetRef"]
            assert live["spec"]["triggers"] == so["spec"]["triggers"], "nothing pruned as unknown"
        # The schema does refuse what it lacks: the check above can fail.
        so["spec"]["scaleTargetRef"]["replicas"] = 2
        p = control_plane.kubectl("apply", "-n", namespace, "--server-side", "--field-manager=test",
                                  "--validate=strict", "-f", "-", input=json.dumps(so), check=False)
        assert p.returncode != 0 and "replicas" in p.stderr, p.stderr
    finally:
        control_plane.kubectl("delete", "crd", "scaledobjects.keda.sh", "--wait=true", "--timeout=60s", check=False)
