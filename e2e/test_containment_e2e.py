"""What reaches the pod, through the operator as installed (issue 18): the kubectl bundle applied (the chart's
ClusterRole and admission policy), `vllm-operator run` under the bundle's ServiceAccount, a tenant with only
vllmservers and pods (impersonated). Each attack of tests/apiserver/test_containment_apiserver.py (a projected
ServiceAccount token, another team's PersistentVolume through an ephemeral claim, an inline CSI volume,
NVIDIA_VISIBLE_DEVICES through envFrom's prefix, a non-string merge key,
SELinux spc_t, AppArmor unconfined through podAnnotations) is admitted by the policy and ends SpecValid=False naming
its field with nothing applied; on main at 6bf2599 each got a StatefulSet (as did nvidia.com/gpu.shared beside
gpu.count, which the CRD now refuses) (the merge key: a TypeError retried
forever). Meanwhile the same tenant's plain server is applied, /healthz answers, and the operator's log shows no
RBAC trouble (the Pod Security dry run included: create on pods).
"""

from __future__ import annotations

import pytest

from e2e.testbed.controlplane import wait_for
from e2e.testbed.operator_install import http_get, rbac_trouble, run_as_installed
from e2e.testbed.serviceaccount import can_i
from tests.apiserver.test_admission_policy import Tenant
from tests.apiserver.test_containment_apiserver import ATTACKS, create_as_tenant, get_server, server, spec_valid
from tests.apiserver.test_manifests import NS, apply_bundle
from tests.apiserver.test_manifests import clean  # noqa: F401 - fixtures
from vllm_operator.kube.client import Kube

pytestmark = pytest.mark.apiserver


def test_the_installed_operator_refuses_each_attack_and_serves_the_rest(clean, k8s, tmp_path,  # noqa: F811
                                                                        namespace):
    cp = clean
    apply_bundle(cp)
    tenant = Tenant(cp, namespace)
    tenant.grant("pods", "create")
    tenant.grant("configmaps", "get", name="app-settings")
    cp.kubectl("create", "configmap", "app-settings", "-n", namespace, "--from-literal=VISIBLE_DEVICES=all")
    kube = Kube(k8s)
    with run_as_installed(cp, NS, tmp_path) as (proc, port, deployment):
        account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        assert can_i(cp, "create", "pods", as_namespace=NS, as_name=account, namespace=namespace)
        for _, doc, _ in ATTACKS:
            create_as_tenant(cp, namespace, doc)
        create_as_tenant(cp, namespace, server("plain"))
        for name, _, field in ATTACKS:
            cond = wait_for(lambda: spec_valid(get_server(kube, namespace, name)) or None, 120, f"{name}'s SpecValid")
            assert cond["status"] == "False" and field in cond["message"], (name, cond)
        wait_for(lambda: kube.get("apps/v1", "StatefulSet", namespace, "plain"), 120, "the plain server's StatefulSet")
        assert all(kube.get("apps/v1", "StatefulSet", namespace, name) is None for name, _, _ in ATTACKS)
        assert proc.alive() and http_get(port, "/healthz")[0] == 200
        log = proc.log_tail(100000)
    assert rbac_trouble(log) == []
    assert "TypeError" not in log and "Traceback" not in log
