"""Every failure named, for real: the operator process on the real API server and controller-manager.

Each case is one VLLMServer whose pods fail the way a cluster makes them fail. The StatefulSet controller
(real kube-controller-manager) creates the pods or cannot (a ResourceQuota: its own FailedCreate Event); the
fake kubelet (e2e/testbed/fakekubelet.py) plays kube-scheduler and kubelet and reports what they report: a node
selector nobody matches, an image it cannot pull, a missing Secret, an OOM kill, a crash loop with vLLM's
last log lines as the termination message, a startup probe's kill, with the kubelet's own Events; the test
plays the cluster autoscaler for a pod waiting for a node. Each failure must reach, with its reason:
the conditions (Ready, Degraded, Stalled), `kubectl get vllms` (the Reason column), `kubectl describe`, a
Warning Event on the VLLMServer, the Argo CD health check (in Lua 5.1 and in Argo CD's own runtime) and kstatus
(cli-utils', as Flux reads it).
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from typing import Any, Optional

import pytest
from kubernetes import client

from e2e.testbed.controlplane import wait_for
from e2e.testbed.fakekubelet import Fault, FakeKubelet
from e2e.testbed.kstatus import kstatus
from e2e.testbed.lua_health import run_health_check
from e2e.testbed.operator_install import condition, events_for, kubectl_apply, load_example
from vllm_operator.kube.client import Kube

pytestmark = [pytest.mark.apiserver]

GROUP_PATH = "/apis/vllm-operator.io/v1alpha1"
MISSING = "vllm/vllm-openai:v9.9.9"
ERR_IMAGE_PULL = (f'rpc error: code = NotFound desc = failed to pull and unpack image "docker.io/{MISSING}": failed to '
                  f'resolve reference "docker.io/{MISSING}": docker.io/{MISSING}: not found')
VLLM_LOG = "\n".join([
    "(EngineCore_DP0 pid=180) INFO 01-01 10:00:40 [gpu_model_runner.py:2912] Model loading took 14.99 GiB",
    "(EngineCore_DP0 pid=180) ERROR 01-01 10:01:10 [core.py:708] EngineCore failed to start.",
    "(EngineCore_DP0 pid=180) ERROR 01-01 10:01:10 [core.py:708] torch.OutOfMemoryError: CUDA out of memory. "
    "Tried to allocate 1.96 GiB. GPU 0 has a total capacity of 22.05 GiB of which 1.02 GiB is free.",
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
])


def _now(minus: int = 0) -> str:
    return (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=minus)).strftime("%Y-%m-%dT%H:%M:%SZ")


def terminated(code: int, reason: str = "Error", message: str = "") -> dict[str, Any]:
    """The last run: 10 minutes, ended now (a kill's Events come from within it)."""
    return {"exitCode": code, "reason": reason, "startedAt": _now(600), "finishedAt": _now(),
            "containerID": "containerd://4f2c", **({"message": message} if message else {})}


def back_off(pod: client.V1Pod) -> dict[str, Any]:
    return {"waiting": {"reason": "CrashLoopBackOff", "message": f"back-off 1m20s restarting failed container=vllm "
                        f"pod={pod.metadata.name}_{pod.metadata.namespace}({pod.metadata.uid})"}}


PROBE_FAILED = ('Startup probe failed: Get "http://10.244.1.7:8000/health": dial tcp 10.244.1.7:8000: connect: '
                "connection refused")


#: server name -> what the kubelet reports for its pods
FAULTS = {
    "pull": lambda pod: Fault({"state": {"waiting": {"reason": "ErrImagePull", "message": ERR_IMAGE_PULL}},
                               "restartCount": 0},
                              (("Warning", "Failed", f'Failed to pull image "{MISSING}": {ERR_IMAGE_PULL}'),),
                              phase="Pending"),
    "secret": lambda pod: Fault({"state": {"waiting": {"reason": "CreateContainerConfigError",
                                                       "message": 'secret "hf-token" not found'}},
                                 "restartCount": 0}, phase="Pending"),
    "oom": lambda pod: Fault({"restartCount": 3, "state": back_off(pod),
                              "lastState": {"terminated": terminated(137, "OOMKilled")}}),
    "crash": lambda pod: Fault({"restartCount": 3, "state": back_off(pod),
                                "lastState": {"terminated": terminated(1, message=VLLM_LOG)}}),
    "probe": lambda pod: Fault({"restartCount": 2, "state": back_off(pod),
                                "lastState": {"terminated": terminated(137)}},
                               (("Warning", "Unhealthy", PROBE_FAILED),
                                ("Normal", "Killing", "Container vllm failed startup probe, will be restarted"))),
}

#: (server, spec changes, Ready's and Degraded's reason, whether Degraded, texts the message holds)
CASES = [
    ("pull", {"image": MISSING}, "ImagePullBackOff", True,
     [f"cannot pull image '{MISSING}' (ErrImagePull)", "v9.9.9: not found"]),
    ("secret", {}, "CreateContainerConfigError", True, ['secret "hf-token" not found', "spec.hfTokenSecretRef"]),
    ("oom", {}, "OOMKilled", True, ["was OOMKilled (3 restarts)", "spec.resources.limits.memory"]),
    ("crash", {}, "CrashLoopBackOff", True, ["exit code 1, 3 restarts", "torch.OutOfMemoryError: CUDA out of memory",
                                             "Engine core initialization failed"]),
    ("probe", {}, "StartupProbeFailed", True, ["did not answer /health within its startup probe's", "2 restarts"]),
    ("nogpu", {"gpu": {"count": 1, "product": "NVIDIA-H100-80GB-HBM3"}}, "Unschedulable", False,
     ["cannot be scheduled", "didn't match Pod's node affinity/selector", "spec.gpu.product"]),
]


@pytest.fixture(scope="module")
def cluster(control_plane, k8s, operator):
    core = client.CoreV1Api(k8s)
    ns, quota_ns = (f"fail-{secrets.token_hex(3)}", f"quota-{secrets.token_hex(3)}")
    for name in (ns, quota_ns):
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        wait_for(lambda name=name: core.read_namespaced_service_account("default", name), 60, "default ServiceAccount")
    # No pod may be created in this namespace: the StatefulSet controller's FailedCreate is all there is.
    core.create_namespaced_resource_quota(quota_ns, {"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}})

    def fault(pod: client.V1Pod) -> Optional[Fault]:
        make = FAULTS.get((pod.metadata.labels or {}).get("app.kubernetes.io/instance", ""))
        return make(pod) if make else None

    kubelet = FakeKubelet(k8s, namespace=ns, node_name=f"gpu-{ns}", gpu_product="NVIDIA-L4", faults=fault).start()
    for name, changes, *_ in CASES:
        kubectl_apply(control_plane, load_example(name, ns, **changes))
    kubectl_apply(control_plane, load_example("quota", quota_ns))
    try:
        yield {"ns": ns, "quota_ns": quota_ns, "kube": Kube(k8s), "cp": control_plane, "kubelet": kubelet}
    finally:
        kubelet.stop()
        for name in (ns, quota_ns):
            core.delete_namespace(name)


def get(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    return kube.request("GET", f"{GROUP_PATH}/namespaces/{ns}/vllmservers/{name}")


def wait_reason(kube: Kube, ns: str, name: str, reason: str, timeout: float = 90) -> dict[str, Any]:
    seen: list[dict[str, Any]] = [{}]

    def probe() -> Optional[dict[str, Any]]:
        server = get(kube, ns, name)
        seen[0] = condition(server, "Ready")
        return server if seen[0].get("reason") == reason else None
    try:
        return wait_for(probe, timeout, f"{ns}/{name}: Ready reason {reason}")
    except TimeoutError as e:
        raise AssertionError(f"{e}; Ready was {seen[0]}") from None


def assert_visible_everywhere(world: dict[str, Any], ns: str, name: str, reason: str, degraded: bool,
                              texts: list[str]) -> None:
    kube, cp = world["kube"], world["cp"]
    server = wait_reason(kube, ns, name, reason)
    ready = condition(server, "Ready")
    assert ready["status"] == "False" and ready["message"].startswith("0/1 replicas ready: "), ready
    for text in texts:
        assert text in ready["message"], (text, ready["message"])
    if degraded:
        server = wait_for(lambda: (lambda s: s if condition(s, "Degraded").get("reason") == reason else None)(
            get(kube, ns, name)), 30, f"{name}: Degraded {reason}")
        assert condition(server, "Degraded")["status"] == "True"
        assert (condition(server, "Stalled")["status"], condition(server, "Stalled")["reason"]) == ("True", reason)
        warning = wait_for(lambda: [e for e in events_for(kube, ns, name)
                                    if e["reason"] == reason and e["type"] == "Warning"
                                    and e["involvedObject"]["kind"] == "VLLMServer"], 30, f"{reason} Event")
        assert texts[0] in warning[0]["message"]
        for runtime in ("lua5.1", "argocd"):  # Debian's Lua 5.1 and Argo CD's own runtime (its sandbox)
            health = run_health_check(server, runtime=runtime)
            assert health["status"] == "Degraded" and texts[0] in health["message"], (runtime, health)
        [verdict] = kstatus([server])  # Flux: Failed at once, not InProgress until its timeout
        assert verdict["status"] == "Failed" and texts[0] in verdict["message"], verdict
    else:  # waiting for a node is not a failure
        assert condition(server, "Degraded")["status"] == "False" and not condition(server, "Stalled")
        assert {run_health_check(server, runtime=r)["status"] for r in ("lua5.1", "argocd")} == {"Progressing"}
        assert kstatus([server])[0]["status"] == "InProgress"
    # kubectl get vllms: READY False, REASON the failure's.
    table = cp.kubectl("get", "vllms", name, "-n", ns, "--no-headers",
                       "-o", "custom-columns=READY:.status.conditions[?(@.type==\"Ready\")].status,"
                       "REASON:.status.conditions[?(@.type==\"Ready\")].reason").stdout.split()
    assert table == ["False", reason], table
    wide = cp.kubectl("get", "vllms", name, "-n", ns).stdout
    assert "REASON" in wide.splitlines()[0] and reason in wide.splitlines()[1], wide
    described = cp.kubectl("describe", "vllms", name, "-n", ns).stdout
    assert reason in described and texts[0] in " ".join(described.split()), described


@pytest.mark.parametrize("name, changes, reason, degraded, texts", CASES, ids=[c[0] for c in CASES])
def test_a_pod_failure_is_named_everywhere(cluster, name, changes, reason, degraded, texts):
    assert_visible_everywhere(cluster, cluster["ns"], name, reason, degraded, texts)


def test_pods_the_controller_cannot_create_are_named_with_its_message(cluster):
    assert_visible_everywhere(cluster, cluster["quota_ns"], "quota", "FailedCreate", True,
                              ["StatefulSet quota cannot create its pods", "exceeded quota: no-pods"])


def test_a_pod_waiting_for_a_node_the_autoscaler_adds_says_so(cluster, k8s):
    ns, kube = cluster["ns"], cluster["kube"]
    [pod] = wait_for(lambda: kube.list("v1", "Pod", ns, label_selector="app.kubernetes.io/instance=nogpu"), 30,
                     "the nogpu pod")
    # The cluster autoscaler's Normal event on the pod (what it posts when it adds a node for it).
    client.CoreV1Api(k8s).create_namespaced_event(ns, {
        "metadata": {"generateName": "nogpu-0."}, "type": "Normal", "reason": "TriggeredScaleUp",
        "message": "pod triggered scale-up: [{gpu-pool 0->1 (max: 4)}]", "count": 1,
        "firstTimestamp": _now(), "lastTimestamp": _now(), "source": {"component": "cluster-autoscaler"},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"], "namespace": ns,
                           "uid": pod["metadata"]["uid"]}})
    server = wait_for(lambda: (lambda s: s if "gpu-pool 0->1" in condition(s, "Ready").get("message", "") else None)(
        get(kube, ns, "nogpu")), 60, "Ready names the node being added")
    assert condition(server, "Ready")["reason"] == "Unschedulable"
    assert "waits for a node being added" in condition(server, "Ready")["message"]
    assert condition(server, "Degraded")["status"] == "False"
    print(json.dumps([condition(server, t) for t in ("Ready", "Degraded")], indent=1))
