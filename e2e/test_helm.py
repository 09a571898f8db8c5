"""The Helm chart installed into the local kube-apiserver by Helm v4's own code (helm-sdkpy).

The chart's operator Deployment cannot run here (no image, no kubelet); `vllm-operator
run` with that Deployment's arguments and the chart's ServiceAccount token stands in for
it (e2e/testbed/operator_install.py), so what is proven is the chart's RBAC and flags. Also: the
account can read no Secret, upgrade changes the Deployment, uninstall removes it all.
"""

from __future__ import annotations

import json
import re
import secrets as random
import subprocess

import pytest
import yaml

from e2e.testbed.convergence import wait_established
from e2e.testbed.controlplane import KUBECTL, wait_for
from e2e.testbed.lua_health import run_health_check
from e2e.testbed.operator_install import (ROOT, children, condition, get_server, http_get, load_example, operator_deployment,
                                  rbac_trouble, run_as_installed, serve_example_until_ready)
from e2e.testbed.operator_process import ACTING
from e2e.testbed.serviceaccount import can_i
from vllm_operator import generate
from vllm_operator.kube.client import Kube
from tests.apiserver.test_helm import Helm, release_name

pytestmark = pytest.mark.apiserver


@pytest.fixture
def extra_namespace(control_plane, request):
    """A second namespace (for the VLLMServers; the release lives in `namespace`)."""
    made = []

    def make(prefix: str = "app") -> str:
        name = f"{prefix}-{random.token_hex(3)}"
        control_plane.kubectl("create", "namespace", name)
        # pods need the namespace's default ServiceAccount (the serviceaccount controller makes it)
        wait_for(lambda: control_plane.kubectl("get", "serviceaccount", "default", "-n", name,
                                               check=False).returncode == 0, 60, f"default ServiceAccount in {name}")
        made.append(name)
        return name

    yield make
    for name in made:
        control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_install_then_the_operator_under_the_charts_account_serves_a_model(control_plane, k8s, namespace,
                                                                          extra_namespace, tmp_path):
    cp, release = control_plane, release_name()
    app = extra_namespace()
    result = Helm(cp, namespace).install(release, {"operator": {"resyncSeconds": 5}})
    assert result["info"]["status"] == "deployed" and result["version"] == 1
    # the two Helm libraries agree: what helm-sdkpy installed is what `make generate` renders
    assert [d for d in yaml.safe_load_all(result["manifest"]) if d] == generate.render_chart(
        ROOT / generate.CHART, {"operator": {"resyncSeconds": 5}}, release=release, namespace=namespace)
    wait_established(cp, "vllmservers.vllm-operator.io")
    sa = f"{release}-vllm-operator"

    with run_as_installed(cp, namespace, tmp_path) as (proc, port, deployment):
        assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == sa
        server = serve_example_until_ready(cp, k8s, app, "llama", replicas=2)
        assert server["status"]["readyReplicas"] == 2
        assert condition(server, "SpecValid")["status"] == "True"
        assert set(children(cp, app, "llama")) == {"StatefulSet/llama", "Service/llama", "Service/llama-headless"}
        assert run_health_check(server) == {"status": "Healthy", "message": "2/2 replicas ready"}

        # the operator's own endpoints, as the chart's probes and ServiceMonitor use them
        assert http_get(port, "/healthz") == (200, "ok\n")
        code, text = http_get(port, "/metrics")
        assert code == 200
        assert 'vllm_operator_api_writes_total{resource="statefulsets",verb="apply"}' in text
        assert 'vllm_operator_reconciles_total{result="applied"}' in text

        # a hand-deleted child comes back: list/watch/create on Services work under the account
        cp.kubectl("delete", "service", "llama", "-n", app)
        wait_for(lambda: "Service/llama" in children(cp, app, "llama"), 60, "the deleted Service restored")
        log = proc.log_tail(100000)

    assert rbac_trouble(log) == []
    lines = [line for line in log.splitlines() if line.strip()]
    assert lines and all(json.loads(line) for line in lines), "--log-format=json: one JSON object per line"

    # the account reads no Secret, anywhere; and it cannot do what it does not need
    for ns in (app, namespace, None):
        for verb in ("get", "list", "watch"):
            assert not can_i(cp, verb, "secrets", as_namespace=namespace, as_name=sa, namespace=ns), (verb, ns)
    # (create on pods is granted, for the Pod Security dry run only: rbac.podSecurityDryRun, docs/rbac.md)
    for verb, resource in (("delete", "pods"), ("delete", "vllmservers.vllm-operator.io"),
                           ("update", "deployments.apps"), ("get", "configmaps"), ("create", "clusterrolebindings")):
        assert not can_i(cp, verb, resource, as_namespace=namespace, as_name=sa, namespace=app), (verb, resource)
    p = subprocess.run([KUBECTL, f"--kubeconfig={tmp_path / 'sa.kubeconfig'}", "get", "secrets", "-n", app],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "forbidden" in p.stderr.lower()
    p = subprocess.run([KUBECTL, f"--kubeconfig={tmp_path / 'sa.kubeconfig'}", "auth", "can-i", "list",
                        "secrets", "--all-namespaces"], capture_output=True, text=True)
    assert p.stdout.strip() == "no"  # SelfSubjectAccessReview, asked by the account itself


def test_namespaced_install_with_roles_only(control_plane, k8s, namespace, extra_namespace, tmp_path):
    cp, release = control_plane, release_name()
    app, other = extra_namespace("team"), extra_namespace("other")
    Helm(cp, namespace).install(release, {"operator": {"watchNamespaces": [app], "resyncSeconds": 5}})
    sa = f"{release}-vllm-operator"
    assert json.loads(cp.kubectl("get", "clusterrolebindings", "-l", f"app.kubernetes.io/instance={release}",
                                 "-o", "json").stdout)["items"] == []
    # a server outside the watched namespace, there before the operator starts
    cp.kubectl("apply", "-f", "-", input=json.dumps(load_example("outside", other)))

    with run_as_installed(cp, namespace, tmp_path) as (proc, port, deployment):
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--namespace={app}" in args and "--disable-scanning" in args
        server = serve_example_until_ready(cp, k8s, app, "inside", replicas=1)
        assert run_health_check(server)["status"] == "Healthy"
        log = proc.log_tail(100000)

    assert rbac_trouble(log) == [], "Roles only, and kopf asked for nothing cluster-wide"
    assert "status" not in get_server(cp, other, "outside"), "the unwatched namespace is left alone"
    assert children(cp, other, "outside") == {}
    for verb, resource, ns in (("list", "statefulsets.apps", other), ("list", "vllmservers.vllm-operator.io", None),
                               ("list", "namespaces", None), ("list", "customresourcedefinitions", None),
                               ("get", "secrets", app)):
        assert not can_i(cp, verb, resource, as_namespace=namespace, as_name=sa, namespace=ns), (verb, resource, ns)
    assert can_i(cp, "patch", "statefulsets.apps", as_namespace=namespace, as_name=sa, namespace=app)


def test_roles_only_needs_disable_scanning(control_plane, namespace, extra_namespace, tmp_path):
    """The control for the test above: the same install without --disable-scanning is short of RBAC
    (kopf lists Namespaces and CRDs cluster-wide), and the log check sees it."""
    cp, release = control_plane, release_name()
    app = extra_namespace("team")
    Helm(cp, namespace).install(release, {"operator": {"watchNamespaces": [app]}})
    wanted = ("namespaces", "customresourcedefinitions")

    def refused(log: str) -> set[str]:
        return {resource for resource in wanted for line in rbac_trouble(log)
                if re.search(rf'cannot (list|watch) resource \\?"{resource}\\?"', line)}

    # kopf's two scanners start concurrently, so either 403 may come first: wait for both
    with run_as_installed(cp, namespace, tmp_path, drop_args=("--disable-scanning",)) as (proc, _, _):
        wait_for(lambda: refused(proc.log_tail(100000)) == set(wanted), 60,
                 "kopf's 403s on cluster-wide lists of Namespaces and CRDs")


def test_high_availability_two_replicas_under_the_charts_account(control_plane, k8s, namespace, extra_namespace,
                                                                 tmp_path):
    """highAvailability.enabled: two replicas with kopf peering under the chart's RBAC. The older
    one acts, the other stands by with its keep-alive in the peering object; when the active one
    stops (as a rolling update stops it), the other resumes and repairs drift."""
    cp, release, kube = control_plane, release_name(), Kube(k8s)
    app = extra_namespace()
    values = {"highAvailability": {"enabled": True, "peeringName": release, "lifetimeSeconds": 10},
              "operator": {"resyncSeconds": 5, "logFormat": "text"}}
    Helm(cp, namespace).install(release, values)
    deployment = operator_deployment(cp, namespace)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert f"--peering={release}" in container["args"] and "--peering-lifetime=10" in container["args"]
    assert container["env"] == [{"name": "POD_ID", "valueFrom": {"fieldRef": {"apiVersion": "v1",
                                                                              "fieldPath": "metadata.name"}}}]
    peers_path = f"/apis/kopf.dev/v1/clusterkopfpeerings/{release}"
    try:
        with run_as_installed(cp, namespace, tmp_path, tag="replica-a") as (a, _, _):
            with run_as_installed(cp, namespace, tmp_path, tag="replica-b") as (b, _, _):
                # both keep-alives, under the names the downward API gives (the pods' names)
                wait_for(lambda: set(kube.request("GET", peers_path).get("status") or {}) == {"replica-a", "replica-b"},
                         60, "both replicas' keep-alives in the ClusterKopfPeering")
                # kopf starts a peered replica paused; the older one resumes, the newer one stays paused
                wait_for(lambda: "Resuming operations" in a.log_tail(100000), 60, "the older replica acts")
                serve_example_until_ready(cp, k8s, app, "llama", replicas=1)
                standby = b.log_tail(100000)
                assert "Resuming operations" not in standby and not ACTING.search(standby), standby
                a.stop()  # SIGTERM: A withdraws its keep-alive, B resumes without waiting out its lifetime
                wait_for(lambda: "Resuming operations" in b.log_tail(100000), 30, "B resumes")
                cp.kubectl("delete", "service", "llama", "-n", app)
                wait_for(lambda: "Service/llama" in children(cp, app, "llama"), 60, "B restores the deleted Service")
                logs = a.log_tail(100000) + b.log_tail(100000)
        assert rbac_trouble(logs) == []
    finally:
        kube.request("DELETE", peers_path)

    # namespaced mode: each watched namespace's Role also grants its KopfPeering, nothing cluster-wide
    docs = generate.render_chart(ROOT / generate.CHART, {**values, "operator": {"watchNamespaces": [app]}},
                                  release=release, namespace=namespace)
    [role] = [d for d in docs if d["kind"] == "Role"]
    assert {"apiGroups": ["kopf.dev"], "resources": ["kopfpeerings"],
            "verbs": ["get", "list", "watch", "patch", "create"]} in role["rules"]
    assert not [d for d in docs if d["kind"] == "ClusterRole"]
