"""The local control plane (etcd + kube-apiserver + kube-controller-manager, built
from their Go modules) and the fake kubelet that the e2e tests rely on."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from e2e.testbed.controlplane import ENV_KUBECONFIG, KUBE_VERSION, ControlPlane, wait_for
from e2e.testbed.fakekubelet import FakeKubelet
from e2e.testbed.servicelb import EndpointSliceRouter

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[2]
local_only = pytest.mark.skipif(
    bool(os.environ.get(ENV_KUBECONFIG)), reason="starts its own local control plane"
)


def _pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead


def _statefulset(name: str, replicas: int) -> dict:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "main", "image": "example.invalid/none:1"}]},
            },
        },
    }


def test_version(control_plane, k8s):
    v = client.VersionApi(k8s).get_code()
    assert v.major == "1" and v.git_version
    if not os.environ.get(ENV_KUBECONFIG):
        assert v.git_version == f"v{KUBE_VERSION}"
    out = control_plane.kubectl("get", "--raw", "/version").stdout
    assert json.loads(out)["gitVersion"] == v.git_version


def test_service_account_token_request(k8s, namespace):
    """Bound ServiceAccount tokens (TokenRequest): what the chart's operator and the tests' tenants use."""
    core = client.CoreV1Api(k8s)
    answer = core.create_namespaced_service_account_token(
        "default", namespace, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=[], expiration_seconds=600)))
    token = answer.status.token
    review = client.AuthenticationV1Api(k8s).create_token_review(
        client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token)))
    assert review.status.authenticated
    assert review.status.user.username == f"system:serviceaccount:{namespace}:default"


def test_garbage_collector_deletes_owned_configmap(k8s, namespace):
    core = client.CoreV1Api(k8s)
    owner = core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "owner"}, "data": {"a": "1"}}
    )
    core.create_namespaced_config_map(
        namespace,
        {
            "metadata": {
                "name": "owned",
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
                ],
            },
            "data": {"b": "2"},
        },
    )
    core.delete_namespaced_config_map("owner", namespace)

    def owned_gone() -> bool:
        try:
            core.read_namespaced_config_map("owned", namespace)
        except ApiException as e:
            return e.status == 404
        return False

    wait_for(owned_gone, 60, "garbage collection of the owned ConfigMap")


def test_statefulset_pods_run_on_fake_kubelet(k8s, namespace):
    apps = client.AppsV1Api(k8s)
    core = client.CoreV1Api(k8s)
    started: list[tuple[str, str]] = []
    stopped: list[tuple[str, str]] = []

    kubelet = FakeKubelet(
        k8s,
        namespace=namespace,
        node_name=f"fake-{namespace}"[:63],
        on_pod_start=lambda pod, ip: started.append((pod.metadata.name, ip)),
        on_pod_stop=lambda pod, ip: stopped.append((pod.metadata.name, ip)),
    )
    with kubelet:
        node = core.read_node(kubelet.node_name)
        assert node.status.allocatable["nvidia.com/gpu"] == "8"

        apps.create_namespaced_stateful_set(namespace, _statefulset("web", 2))

        def two_ready():
            st = apps.read_namespaced_stateful_set("web", namespace).status
            return st.ready_replicas == 2

        wait_for(two_ready, 60, "StatefulSet readyReplicas == 2")

        pods = core.list_namespaced_pod(namespace, label_selector="app=web").items
        assert sorted(p.metadata.name for p in pods) == ["web-0", "web-1"]
        ips = {p.status.pod_ip for p in pods}
        assert len(ips) == 2
        for p in pods:
            assert ipaddress.ip_address(p.status.pod_ip) in ipaddress.ip_network("127.0.0.0/8")
            assert p.spec.node_name == kubelet.node_name
            assert p.status.phase == "Running"
            conds = {c.type: c.status for c in p.status.conditions}
            assert conds["Ready"] == "True" and conds["PodScheduled"] == "True"
        assert sorted(started) == sorted((p.metadata.name, p.status.pod_ip) for p in pods)

        # Readiness can be flipped later, as a failing readiness probe would.
        kubelet.set_ready(namespace, "web-1", False)
        wait_for(
            lambda: apps.read_namespaced_stateful_set("web", namespace).status.ready_replicas == 1,
            30,
            "readyReplicas == 1 after set_ready(False)",
        )
        kubelet.set_ready(namespace, "web-1", True)
        wait_for(two_ready, 30, "readyReplicas == 2 again")

        apps.patch_namespaced_stateful_set_scale("web", namespace, {"spec": {"replicas": 0}})
        wait_for(
            lambda: not core.list_namespaced_pod(namespace, label_selector="app=web").items,
            60,
            "StatefulSet pods deleted after scaling to 0",
        )
        assert sorted(stopped) == sorted(started)
        assert kubelet.running_pods == {}
        assert kubelet.errors == []


def test_node_selector_mismatch_stays_pending(k8s, namespace):
    core = client.CoreV1Api(k8s)
    with FakeKubelet(k8s, namespace=namespace, node_name=f"fake-{namespace}"[:63]) as kubelet:
        core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": "wants-h100"},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                    "containers": [{"name": "main", "image": "example.invalid/none:1"}],
                },
            },
        )

        def unschedulable():
            p = core.read_namespaced_pod("wants-h100", namespace)
            return any(
                c.type == "PodScheduled" and c.reason == "Unschedulable" for c in p.status.conditions or []
            )

        wait_for(unschedulable, 30, "PodScheduled=False/Unschedulable")
        p = core.read_namespaced_pod("wants-h100", namespace)
        assert p.spec.node_name is None and p.status.phase == "Pending"
        assert kubelet.errors == []



def test_set_ready_during_the_status_patch_is_not_lost(k8s, namespace):
    """A pod's readiness flipped by another thread while the kubelet is patching that pod's
    status reaches the API server at the next sync (the autoscaler e2e test hit this with a
    warm vLLM that answered /health within the first patch, and its pod stayed NotReady).
    The patch is wrapped to call set_ready() in the middle, so the interleaving is forced."""
    core = client.CoreV1Api(k8s)
    kubelet = FakeKubelet(k8s, namespace=namespace, node_name=f"fake-{namespace}"[:63], auto_ready=False,
                          on_pod_start=lambda pod, ip: False)
    real_patch = kubelet.core.patch_namespaced_pod_status
    flipped = []

    def patch_then_flip(name, ns, body):
        result = real_patch(name, ns, body)
        if not flipped:  # the first patch (NotReady) is on its way: the pod turns healthy now
            flipped.append(name)
            kubelet.set_ready(ns, name, True)
        return result

    kubelet.core.patch_namespaced_pod_status = patch_then_flip
    with kubelet:
        core.create_namespaced_pod(namespace, {"metadata": {"name": "warm"},
                                               "spec": {"containers": [{"name": "main", "image": "x.invalid/y:1"}]}})

        def ready():
            p = core.read_namespaced_pod("warm", namespace)
            return any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])

        wait_for(ready, 30, "the pod Ready after set_ready() during the first patch")
        assert flipped == ["warm"] and kubelet.errors == []

def _web_pod(name: str, prestop: list[str], grace: int) -> dict:
    return {"metadata": {"name": name, "labels": {"app": "web"}},
            "spec": {"terminationGracePeriodSeconds": grace,
                     "containers": [{"name": "main", "image": "x.invalid/y:1",
                                     "ports": [{"name": "http", "containerPort": 8000}],
                                     "lifecycle": {"preStop": {"exec": {"command": prestop}}}}]}}


def test_graceful_termination_leaves_the_endpoints_then_stops_with_the_grace_left(k8s, namespace):
    """graceful=True: a deleted pod's preStop sleep runs first, while the endpointslice controller takes its
    endpoint out of the Service (what EndpointSliceRouter routes by), then on_pod_stop gets the grace period
    less the sleep, then the pod is deleted; meanwhile the kubelet's loop starts other pods, and the IP is not
    handed out again. A preStop hook other than a sleep is not run, and said so."""
    core = client.CoreV1Api(k8s)
    started: dict[str, str] = {}
    stops: dict[str, tuple[float, str, float]] = {}

    def on_stop(pod, ip, grace=None):
        stops[pod.metadata.name] = (time.monotonic(), ip, grace)

    # The API server refuses loopback addresses in EndpointSlices: these pods get pod-network ones (nothing
    # listens on them here).
    kubelet = FakeKubelet(k8s, namespace=namespace, node_name=f"fake-{namespace}"[:63], graceful=True,
                          ip_pool=[f"10.244.0.{i}" for i in range(10, 20)], on_pod_stop=on_stop,
                          on_pod_start=lambda pod, ip: started.__setitem__(pod.metadata.name, ip))
    core.create_namespaced_service(namespace, {"metadata": {"name": "web"}, "spec": {
        "selector": {"app": "web"}, "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]}})
    with kubelet, EndpointSliceRouter(k8s, namespace, "web", interval=0.1) as router:
        # a's preStop sleep is the window in which the endpoint must leave and pod c must start: 10 s, not the 3 s
        # that a slow kube-controller-manager could overrun (the assertions below would then see a stopped)
        core.create_namespaced_pod(namespace, _web_pod("a", ["sleep", "10"], 16))
        core.create_namespaced_pod(namespace, _web_pod("b", ["sh", "-c", "sleep 3"], 8))
        wait_for(lambda: len(started) == 2, 30, "pods a and b started")
        wait_for(lambda: sorted(router.ready_addresses()) == sorted(started.values()), 30,
                 "both pods' IPs ready in the Service's EndpointSlices")
        assert sorted(router.urls()) == sorted(f"http://{ip}:8000" for ip in started.values())
        uid = core.read_namespaced_pod("a", namespace).metadata.uid

        core.delete_namespaced_pod("a", namespace)  # the pod's own grace period, 16 s
        wait_for(lambda: started["a"] not in router.ready_addresses(), 10, "pod a's endpoint no longer ready")
        assert "a" not in stops, "SIGTERM came before the preStop sleep was over"
        terminating = [e for e in router.endpoints if e.address == started["a"]]
        assert not terminating or (terminating[0].terminating and not terminating[0].ready), terminating
        assert router.urls() == [f"http://{started['b']}:8000"]
        core.create_namespaced_pod(namespace, _web_pod("c", ["sleep", "1"], 5))
        wait_for(lambda: "c" in started, 10, "pod c started while pod a was in its preStop")
        assert "a" not in stops and started["c"] != started["a"]

        def gone(name):
            try:
                core.read_namespaced_pod(name, namespace)
            except ApiException as e:
                return e.status == 404
            return False

        wait_for(lambda: gone("a"), 30, "pod a deleted after its containers stopped")
        rec = kubelet.terminations[uid]
        at, ip, grace = stops["a"]
        assert ip == started["a"] and rec.graceful and rec.prestop_seconds == 10 and rec.grace_seconds == 16
        # the grace left is 16 s less the sleep as measured: at most 6 s, and a late wake-up of up to 2 s allowed
        assert at - rec.seen_at >= 10 and 4 <= grace <= 6.1, (at - rec.seen_at, grace)
        assert rec.stop_at <= rec.stopped_at <= rec.deleted_at and not rec.errors

        core.delete_namespaced_pod("b", namespace)  # its hook is not a sleep: not run, the whole grace is left
        wait_for(lambda: gone("b"), 30, "pod b deleted")
        [b] = [t for t in kubelet.terminations.values() if t.name == "b"]
        assert b.prestop_seconds == 0 and stops["b"][2] >= 7.5 and "not run (only sleep N)" in b.errors[0]
        assert any("not run" in e for e in kubelet.errors)


@local_only
def test_stop_leaves_no_processes(tmp_path):
    cp = ControlPlane(tmp_path / "cp")
    cp.start()
    pids = cp.pids
    assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager"}
    assert all(_pid_alive(p) for p in pids.values())
    cp.kubectl("get", "namespaces")
    cp.stop()
    cp.stop()  # idempotent
    assert not any(_pid_alive(p) for p in pids.values()), pids


@local_only
def test_children_die_with_the_python_process(tmp_path):
    """If the test process is killed (no atexit), PDEATHSIG takes the children."""
    code = (
        "import json, sys, time\n"
        "from e2e.testbed.controlplane import ControlPlane\n"
        f"cp = ControlPlane({str(tmp_path / 'cp')!r}).start()\n"
        "print(json.dumps(cp.pids), flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        line = [None]
        reader = threading.Thread(target=lambda: line.__setitem__(0, proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(120)
        assert line[0], "control plane did not start in the child process"
        pids = json.loads(line[0])
        assert all(_pid_alive(p) for p in pids.values())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    wait_for(lambda: not any(_pid_alive(p) for p in pids.values()), 15, f"children {pids} to die")
    # Its etcd data dir on tmpfs is left behind (the next start would remove it).
    for d in Path("/dev/shm").glob(f"vllm-operator-etcd-{proc.pid}-*"):
        shutil.rmtree(d, ignore_errors=True)
