"""The kubectl bundle (manifests/vllm-operator.yaml) applied to the local control plane.

It must give what `helm install` of the chart gives (the same objects, field for field
once the server has defaulted them), and the operator running under the bundle's
ServiceAccount must serve a model. The bundle is cluster-wide: a test owns its names
(namespace vllm-operator, ClusterRole vllm-operator) while it runs, and removes them.
"""

from __future__ import annotations


import pytest

from e2e.testbed.operator_install import children, rbac_trouble, run_as_installed, serve_example_until_ready
from e2e.testbed.serviceaccount import can_i
from tests.apiserver.test_manifests import BUNDLE, NS, OBJECTS, apply_bundle
from tests.apiserver.test_manifests import clean  # noqa: F401 - fixtures

pytestmark = pytest.mark.apiserver


def test_operator_under_the_bundles_account_serves_a_model(clean, k8s, tmp_path, namespace):  # noqa: F811 - the fixture
    cp = clean
    apply_bundle(cp)
    assert cp.kubectl("apply", "-f", str(BUNDLE)).stdout.count("unchanged") == len(OBJECTS), "re-apply: no change"
    with run_as_installed(cp, NS, tmp_path) as (proc, _, deployment):
        sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        server = serve_example_until_ready(cp, k8s, namespace, "bundled", replicas=1)
        assert server["status"]["readyReplicas"] == 1
        assert set(children(cp, namespace, "bundled")) == {"StatefulSet/bundled", "Service/bundled",
                                                           "Service/bundled-headless"}
        log = proc.log_tail(100000)
    assert rbac_trouble(log) == []
    for verb in ("get", "list", "watch"):
        assert not can_i(cp, verb, "secrets", as_namespace=NS, as_name=sa)
