"""The operator against a real kube-apiserver + kube-controller-manager (e2e/testbed/controlplane.py).

One operator process for the module (`vllm-operator run`, resync every 3 s), a fresh
namespace per test, polling with deadlines. Pods come from the controller-manager's
StatefulSet controller; the fake kubelet (e2e/testbed/fakekubelet.py) plays the node where a
test needs running pods.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from e2e.testbed.controlplane import wait_for
from e2e.testbed.convergence import get_server
from e2e.testbed.operator_install import condition as cond
from e2e.testbed.operator_install import events_for
from e2e.testbed.operator_install import kubectl_apply as apply_server
from e2e.testbed.operator_install import load_example as example
from e2e.testbed.operator_install import wait_status
from e2e.testbed.fakekubelet import FakeKubelet
from vllm_operator import builders, pipeline
from vllm_operator.api import VLLMServer
from vllm_operator.controller.drift import is_subset

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[1]
GROUP_PATH = "/apis/vllm-operator.io/v1alpha1"


def expected_objects(doc: dict, owner: dict) -> list[dict]:
    server = VLLMServer.model_validate(doc)
    plan = pipeline.plan_server(server.metadata.name, server.metadata.namespace, server.spec)
    return builders.build_all(plan, owner)


# --------------------------------------------------------------------------- tests
def test_create_applies_exactly_the_builders_objects(control_plane, operator, kube, namespace):
    doc = example("llama", namespace, replicas=2)
    apply_server(control_plane, doc)
    server = wait_status(kube, namespace, "llama", lambda s: cond(s, "SpecValid").get("status") == "True",
                         "SpecValid=True")
    for want in expected_objects(doc, server):
        live = wait_for(lambda: kube.get(want["apiVersion"], want["kind"], namespace, want["metadata"]["name"]),
                        30, f"{want['kind']}/{want['metadata']['name']}")
        assert is_subset(want, live), f"{want['kind']} differs from the builder's output"
        assert live["metadata"]["ownerReferences"][0]["uid"] == server["metadata"]["uid"]
    st = server["status"]
    assert st["observedGeneration"] == server["metadata"]["generation"]
    assert st["selector"] == builders.selector_string("llama")
    assert st["endpoint"] == f"http://llama.{namespace}.svc:8000/v1"
    assert st["plan"]["args"][0] == "meta-llama/Llama-3.1-8B-Instruct"
    assert st["plan"]["estimates"]["maxModelLen"] == 16384
    # the StatefulSet controller of the real controller-manager creates the pods
    wait_for(lambda: len(kube.list("v1", "Pod", namespace, label_selector=st["selector"])) == 2, 30, "2 pods")
    # the reconcile writes the status, then posts its Events: wait for the Event, not for one list of them
    wait_for(lambda: "Applied" in {e["reason"] for e in events_for(kube, namespace, "llama")}, 30,
             "the Applied Event")


def test_kopf_adaptations_pass_their_self_tests_and_kopf_writes_only_its_finalizer(control_plane, operator, kube,
                                                                                    namespace):
    """kopfext.install() applied every adaptation in the real process (their self-tests passed on the installed
    kopf); a handled server carries kopf's finalizer and no annotation of kopf's: the diff base is in memory and
    the lone kopf-managed marker is not written (kopfext/persistence.py)."""
    wait_for(lambda: "adaptations: toggles applied, progress applied, diffbase applied, session applied"
             in operator.log_tail(10**6), 60, "the adaptations' log line")
    doc = example("kopfext", namespace)
    apply_server(control_plane, doc)
    wait_status(kube, namespace, "kopfext", lambda s: cond(s, "SpecValid").get("status") == "True", "SpecValid")
    # kopf handles one object's events in turn, each ending with its patch: once a later change (a label) is
    # handled, whatever kopf meant to write after the creation's handling is on the server
    updates = operator.log_tail(10**6).count("Updating is processed")
    doc["metadata"]["labels"] = {"touched": "yes"}
    apply_server(control_plane, doc)
    wait_for(lambda: operator.log_tail(10**6).count("Updating is processed") > updates, 60, "the label's update")
    meta = get_server(kube, namespace, "kopfext")["metadata"]
    assert "vllm-operator.io/finalizer" in meta["finalizers"]
    assert [k for k in meta.get("annotations") or {} if k.startswith("vllm-operator.io/")] == []


def test_update_rolls_into_the_workload_template(control_plane, operator, kube, namespace):
    doc = example("srv", namespace)
    apply_server(control_plane, doc)
    wait_for(lambda: kube.get("apps/v1", "StatefulSet", namespace, "srv"), 30, "StatefulSet")
    doc["spec"]["model"] = {"name": "Qwen/Qwen2.5-7B-Instruct", "servedName": "qwen"}
    doc["spec"]["image"] = "vllm/vllm-openai:v0.32.1"
    apply_server(control_plane, doc)

    def rolled():
        sts = kube.get("apps/v1", "StatefulSet", namespace, "srv")
        c = sts["spec"]["template"]["spec"]["containers"][0]
        return c["args"][0] == "Qwen/Qwen2.5-7B-Instruct" and c["image"] == "vllm/vllm-openai:v0.32.1"

    wait_for(rolled, 30, "template updated with the new model and image")
    server = get_server(kube, namespace, "srv")
    wait_status(kube, namespace, "srv", lambda s: s["status"].get("observedGeneration") == s["metadata"]["generation"],
                "observedGeneration current")
    assert server["metadata"]["generation"] >= 2


def test_daemonset_mode_and_switching_workload_prunes(control_plane, operator, kube, namespace):
    doc = example("per-node", namespace)
    apply_server(control_plane, doc)
    wait_for(lambda: kube.get("apps/v1", "StatefulSet", namespace, "per-node"), 30, "StatefulSet")
    wait_for(lambda: kube.get("v1", "Service", namespace, "per-node-headless"), 30, "headless Service")
    doc["spec"]["workload"] = "DaemonSet"
    doc["spec"].pop("cache")  # a DaemonSet cannot make a claim per pod
    doc["spec"]["gpu"]["product"] = "NVIDIA-H100-80GB-HBM3"  # no node of this test bed carries it
    apply_server(control_plane, doc)
    ds = wait_for(lambda: kube.get("apps/v1", "DaemonSet", namespace, "per-node"), 30, "DaemonSet")
    assert "replicas" not in ds["spec"]
    wait_for(lambda: kube.get("apps/v1", "StatefulSet", namespace, "per-node") is None, 30, "StatefulSet pruned")
    wait_for(lambda: kube.get("v1", "Service", namespace, "per-node-headless") is None, 30, "headless pruned")
    assert kube.get("v1", "Service", namespace, "per-node") is not None
    # No GPU node of that product: not "ready with zero replicas" but a reason naming the selector.
    ready = wait_for(lambda: (lambda c: c if c.get("reason") == "NoMatchingNodes" else None)(
        cond(get_server(kube, namespace, "per-node"), "Ready")), 60, "Ready=False/NoMatchingNodes")
    assert ready["status"] == "False" and "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3" in ready["message"]


def test_delete_garbage_collects_children(control_plane, operator, kube, namespace):
    apply_server(control_plane, example("gone", namespace, replicas=2))
    wait_for(lambda: kube.get("policy/v1",
                              "PodDisruptionBudget", namespace, "gone"), 30, "PDB")
    control_plane.kubectl("delete", "vllms", "gone", "-n", namespace, "--wait=true", "--timeout=60s")
    for api_version, kind, name in (("apps/v1", "StatefulSet", "gone"), ("v1", "Service", "gone"),
                                    ("v1", "Service", "gone-headless"), ("policy/v1", "PodDisruptionBudget", "gone")):
        wait_for(lambda: kube.get(api_version, kind, namespace, name) is None, 60, f"{kind}/{name} collected")


def test_hand_edited_and_deleted_children_are_restored(control_plane, operator, kube, namespace):
    apply_server(control_plane, example("drift", namespace))
    sts = wait_for(lambda: kube.get("apps/v1", "StatefulSet", namespace, "drift"), 30, "StatefulSet")
    args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
    control_plane.kubectl("patch", "statefulset", "drift", "-n", namespace, "--type=json", "-p",
                          json.dumps([{"op": "replace", "path": "/spec/template/spec/containers/0/args",
                                       "value": ["bogus", "--swap-space", "4"]}]))
    control_plane.kubectl("delete", "service", "drift", "-n", namespace)
    wait_for(lambda: kube.get("apps/v1", "StatefulSet", namespace, "drift")["spec"]["template"]["spec"]
             ["containers"][0]["args"] == args, 30, "args restored")
    wait_for(lambda: kube.get("v1", "Service", namespace, "drift"), 30, "Service recreated")


def test_invalid_spec_sets_condition_applies_nothing_and_recovers(control_plane, operator, kube, namespace):
    bad = example("bad", namespace)
    bad["spec"]["gpu"] = {"count": 3, "product": "NVIDIA-L4"}  # 32 heads are not divisible by 3
    apply_server(control_plane, bad)
    server = wait_status(kube, namespace, "bad", lambda s: cond(s, "SpecValid").get("status") == "False",
                         "SpecValid=False")
    c = cond(server, "SpecValid")
    assert c["reason"] == "InvalidSpec"
    assert "spec.gpu.count" in c["message"] and "attention heads" in c["message"]
    assert c["observedGeneration"] == server["metadata"]["generation"]
    stalled = cond(server, "Stalled")  # what kstatus (Flux) reads as failed
    assert stalled["status"] == "True" and stalled["reason"] == "InvalidSpec" and stalled["message"] == c["message"]
    assert kube.get("apps/v1", "StatefulSet", namespace, "bad") is None
    assert kube.get("v1", "Service", namespace, "bad") is None
    wait_for(lambda: any(e["reason"] == "InvalidSpec" and e["type"] == "Warning"
                         for e in events_for(kube, namespace, "bad")), 30, "a Warning event")
    bad["spec"]["gpu"]["count"] = 2
    apply_server(control_plane, bad)
    server = wait_status(kube, namespace, "bad", lambda s: cond(s, "SpecValid").get("status") == "True", "recovered")
    assert cond(server, "Stalled") == {}, "Stalled is removed once the spec is valid"
    wait_for(lambda: kube.get("apps/v1", "StatefulSet", namespace, "bad"), 30, "StatefulSet after the fix")


def test_invalid_update_keeps_the_running_children(control_plane, operator, kube, namespace):
    doc = example("keep", namespace)
    apply_server(control_plane, doc)
    before = wait_for(lambda: kube.get("apps/v1", "StatefulSet", namespace, "keep"), 30, "StatefulSet")
    doc["spec"]["engine"] = {"extraArgs": ["--prefill-chunk-size", "512"]}
    apply_server(control_plane, doc)
    server = wait_status(kube, namespace, "keep", lambda s: cond(s, "SpecValid").get("status") == "False",
                         "SpecValid=False")
    assert "--prefill-chunk-size" in cond(server, "SpecValid")["message"]
    assert cond(server, "Degraded")["status"] == "True"
    after = kube.get("apps/v1", "StatefulSet", namespace, "keep")
    assert after["spec"]["template"] == before["spec"]["template"], "nothing of the last valid spec is lost"
    assert server["status"]["plan"]["args"] == before["spec"]["template"]["spec"]["containers"][0]["args"]


def test_printer_columns_and_kubectl_scale(control_plane, operator, kube, namespace):
    apply_server(control_plane, example("cols", namespace))
    wait_status(kube, namespace, "cols", lambda s: s.get("status", {}).get("plan"), "plan in status")
    out = control_plane.kubectl("get", "vllms", "-n", namespace).stdout
    header = out.splitlines()[0].split()
    assert header == ["NAME", "MODEL", "WORKLOAD", "DESIRED", "READY-REPLICAS", "MAX-CONTEXT", "READY", "REASON", "AGE"]
    row = out.splitlines()[1].split()
    assert row[:3] == ["cols", "meta-llama/Llama-3.1-8B-Instruct", "StatefulSet"] and row[5] == "16384"
    control_plane.kubectl("scale", "vllms", "cols", "-n", namespace, "--replicas", "3")
    wait_for(lambda: kube.get("apps/v1", "StatefulSet", namespace, "cols")["spec"]["replicas"] == 3, 30,
             "StatefulSet scaled to 3")
    wait_status(kube, namespace, "cols", lambda s: s["status"].get("replicas") == 3, "status.replicas 3")
    scale = kube.request("GET", f"{GROUP_PATH}/namespaces/{namespace}/vllmservers/cols/scale")
    assert scale["spec"]["replicas"] == 3 and scale["status"]["selector"] == builders.selector_string("cols")


def test_ready_follows_pod_readiness(control_plane, operator, kube, k8s, namespace):
    with FakeKubelet(k8s, namespace=namespace, node_name=f"node-{namespace}"[:60], gpu_product="NVIDIA-L4") as kubelet:
        apply_server(control_plane, example("live", namespace, replicas=2))
        server = wait_status(kube, namespace, "live", lambda s: cond(s, "Ready").get("status") == "True",
                             "Ready=True with 2 ready pods", timeout=60)
        assert server["status"]["readyReplicas"] == 2
        assert cond(server, "Progressing")["status"] == "False"
        kubelet.set_ready(namespace, "live-0", False)
        server = wait_status(kube, namespace, "live", lambda s: cond(s, "Ready").get("status") == "False",
                             "Ready=False after a pod lost readiness", timeout=60)
        assert cond(server, "Ready")["reason"] == "PartiallyReady"
        kubelet.set_ready(namespace, "live-0", True)
        wait_status(kube, namespace, "live", lambda s: cond(s, "Ready").get("status") == "True", "Ready again")


def test_operator_restart_converges_without_duplicates(control_plane, operator, kube, namespace):
    apply_server(control_plane, example("a", namespace))
    wait_for(lambda: kube.get("apps/v1", "StatefulSet", namespace, "a"), 30, "first StatefulSet")
    operator.kill()
    try:
        apply_server(control_plane, example("b", namespace, replicas=2))
        doc = example("a", namespace)
        doc["spec"]["model"]["servedName"] = "renamed"
        apply_server(control_plane, doc)
    finally:
        operator.start()
    wait_for(lambda: kube.get("policy/v1",
                              "PodDisruptionBudget", namespace, "b"), 60, "b converged after restart")
    wait_for(lambda: "renamed" in kube.get("apps/v1", "StatefulSet", namespace, "a")["spec"]["template"]["spec"]
             ["containers"][0]["args"], 60, "a's change applied after restart")
    for kind, api_version in (("StatefulSet", "apps/v1"), ("Service", "v1")):
        names = sorted(o["metadata"]["name"] for o in kube.list(api_version, kind, namespace))
        assert len(names) == len(set(names))
    assert sorted(o["metadata"]["name"] for o in kube.list("apps/v1", "StatefulSet", namespace)) == ["a", "b"]
    assert sorted(o["metadata"]["name"] for o in kube.list("v1", "Service", namespace)) == [
        "a", "a-headless", "b", "b-headless"]
