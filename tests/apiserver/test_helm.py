"""The Helm chart installed into the local kube-apiserver by Helm v4's own code (helm-sdkpy), no operator running:
upgrade changes the Deployment, uninstall removes it all, and what server-side apply needs of RBAC. The operator
under the chart's account: e2e/test_helm.py.
"""

from __future__ import annotations

import asyncio
import copy
import json
import secrets as random
import subprocess

import pytest
import yaml

from e2e.testbed.controlplane import KUBECTL, wait_for
from e2e.testbed.operator_install import ROOT, documented_crd_step
from e2e.testbed.serviceaccount import service_account_kubeconfig
from vllm_operator import generate

pytestmark = pytest.mark.apiserver

helm_sdkpy = pytest.importorskip("helm_sdkpy", reason="tools/run-tests.sh installs helm-sdkpy")

CHART = str(ROOT / generate.CHART)


class Helm:
    """helm install/upgrade/uninstall into one namespace of the test control plane."""

    def __init__(self, cp, namespace: str):
        self.config = helm_sdkpy.Configuration(namespace=namespace, kubeconfig=cp.kubeconfig)

    def install(self, release: str, values: dict, chart: str = CHART) -> dict:
        return asyncio.run(helm_sdkpy.Install(self.config).run(release, chart, values=values, wait=False, timeout=120))

    def upgrade(self, release: str, values: dict, chart: str = CHART) -> dict:
        return asyncio.run(helm_sdkpy.Upgrade(self.config).run(release, chart, values=values, wait=False, timeout=120))

    def uninstall(self, release: str) -> dict:
        return asyncio.run(helm_sdkpy.Uninstall(self.config).run(release, wait=True, timeout=120))


def release_name() -> str:
    return f"vo-{random.token_hex(3)}"  # cluster-scoped names (ClusterRole) must not collide between tests


def test_ssa_of_a_missing_object_needs_create_not_only_patch(control_plane, namespace):
    """Why the rules grant `create` next to `patch`: the first server-side apply creates."""
    cp = control_plane
    cp.kubectl("create", "serviceaccount", "probe", "-n", namespace)
    cp.kubectl("create", "role", "patch-only", "--verb=patch", "--resource=configmaps", "-n", namespace)
    cp.kubectl("create", "rolebinding", "patch-only", "--role=patch-only", f"--serviceaccount={namespace}:probe",
               "-n", namespace)
    kubeconfig = service_account_kubeconfig(cp, namespace, "probe", cp.workdir / f"probe-{namespace}.kubeconfig")
    cm = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa", "namespace": namespace}})

    def apply():
        return subprocess.run([KUBECTL, f"--kubeconfig={kubeconfig}", "apply", "--server-side",
                               "--field-manager=probe", "-f", "-"], input=cm, capture_output=True, text=True)

    p = apply()
    assert p.returncode != 0 and "forbidden" in p.stderr.lower()
    cp.kubectl("create", "role", "create", "--verb=create", "--resource=configmaps", "-n", namespace)
    cp.kubectl("create", "rolebinding", "create", "--role=create", f"--serviceaccount={namespace}:probe",
               "-n", namespace)
    wait_for(lambda: apply().returncode == 0, 30, "server-side apply with patch + create")


def test_upgrade_changes_the_deployment_and_uninstall_removes_everything(control_plane, namespace):
    cp, release = control_plane, release_name()
    helm = Helm(cp, namespace)
    helm.install(release, {})
    name = f"{release}-vllm-operator"
    before = json.loads(cp.kubectl("get", "deployment", name, "-n", namespace, "-o", "json").stdout)
    assert "--log-format=json" in before["spec"]["template"]["spec"]["containers"][0]["args"]

    result = helm.upgrade(release, {"operator": {"logFormat": "text", "watchNamespaces": [namespace]},
                                    "resources": {"limits": {"memory": "512Mi"}}})
    assert result["version"] == 2 and result["info"]["status"] == "deployed"
    after = json.loads(cp.kubectl("get", "deployment", name, "-n", namespace, "-o", "json").stdout)
    container = after["spec"]["template"]["spec"]["containers"][0]
    assert after["metadata"]["generation"] > before["metadata"]["generation"]
    assert "--log-format=text" in container["args"] and f"--namespace={namespace}" in container["args"]
    assert container["resources"]["limits"] == {"memory": "512Mi"}
    # cluster-wide RBAC became a Role: the ClusterRole is gone, the Role is there
    assert cp.kubectl("get", "clusterrole", name, check=False).returncode != 0
    cp.kubectl("get", "role", name, "-n", namespace)

    with pytest.raises(helm_sdkpy.HelmError):  # values.schema.json is enforced by Helm itself
        helm.upgrade(release, {"operator": {"logFormat": "xml"}})

    helm.uninstall(release)
    for kind, ns in (("deployment", namespace), ("serviceaccount", namespace), ("service", namespace),
                     ("role", namespace), ("rolebinding", namespace)):
        wait_for(lambda: cp.kubectl("get", kind, name, "-n", ns, check=False).returncode != 0, 60, f"{kind} gone")
    # Helm never deletes what crds/ installed: VLLMServers survive an uninstall
    cp.kubectl("get", "crd", "vllmservers.vllm-operator.io")


def test_an_umbrella_chart_installs_this_one_as_a_dependency(control_plane, namespace, tmp_path):
    """A platform team's chart with this one under charts/, global values and a fullnameOverride (issue 20): Helm
    validates each chart's values against its schema with the globals included, then installs."""
    from tests.artefacts.test_packaging import _umbrella

    cp, release = control_plane, release_name()
    helm = Helm(cp, namespace)
    result = helm.install(release, {"vllm-operator": {"fullnameOverride": release}}, chart=str(_umbrella(tmp_path)))
    assert result["info"]["status"] == "deployed"
    deployment = json.loads(cp.kubectl("get", "deployment", release, "-n", namespace, "-o", "json").stdout)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "mirror.example.com/vllm-operator/vllm-operator:0.1.0"
    assert "vllm-operator.io/v1alpha1" in cp.kubectl("api-versions").stdout, "the subchart's CRD is installed"
    helm.uninstall(release)
    gone = cp.kubectl("get", "deployment", release, "-n", namespace, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def _crd_chart(path, version: str, crd_object: dict):
    """A chart of one CRD in crds/, as this chart ships it."""
    (path / "crds").mkdir(parents=True)
    (path / "templates").mkdir()
    (path / "Chart.yaml").write_text(yaml.safe_dump({"apiVersion": "v2", "name": "crd-release", "version": version}))
    (path / "crds" / "crd.yaml").write_text(yaml.safe_dump(crd_object, sort_keys=False))
    return path


def test_the_documented_crd_upgrade_takes_over_the_crd_helm_installed(control_plane, namespace, tmp_path):
    """docs/install.md#upgrade: Helm installs a chart's crds/ once and `helm upgrade` leaves the CRD as it was, so
    the new release's CRD is applied first with the documented `helm show crds <chart> | kubectl apply
    --server-side --force-conflicts -f -`, over the CRD Helm created. Done on a copy of the CRD under a group of
    its own (the suite's CRD stays as it is): the earlier release is the current CRD less one field."""
    from e2e.testbed.convergence import wait_established
    from vllm_operator import crd

    group = "upgrade-test.vllm-operator.io"
    new = crd.crd()
    new["metadata"]["name"] = f"{new['spec']['names']['plural']}.{group}"
    new["spec"]["group"] = group
    old = copy.deepcopy(new)
    cache = old["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["cache"]
    del cache["properties"]["persistentVolumeClaimRetentionPolicy"]
    name = new["metadata"]["name"]

    def field_served() -> bool:
        live = json.loads(control_plane.kubectl("get", "crd", name, "-o", "json").stdout)
        live_cache = live["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
            "cache"]
        return "persistentVolumeClaimRetentionPolicy" in live_cache["properties"]

    helm, release = Helm(control_plane, namespace), release_name()
    try:
        helm.install(release, {}, chart=str(_crd_chart(tmp_path / "old", "1.0.0", old)))
        wait_established(control_plane, name)
        assert not field_served()
        new_chart = _crd_chart(tmp_path / "new", "1.0.1", new)
        assert helm.upgrade(release, {}, chart=str(new_chart))["info"]["status"] == "deployed"
        assert not field_served(), "helm upgrade changed a CRD: docs/install.md says it never does"

        with generate.helm_python().Chart.load(str(new_chart)) as chart:  # what `helm show crds` prints
            shown = "\n---\n".join(c["data"] for c in chart.crds)
        control_plane.kubectl(*documented_crd_step(), input=shown)
        assert field_served()
        live = json.loads(control_plane.kubectl("get", "crd", name, "-o", "json", "--show-managed-fields").stdout)
        appliers = {m["manager"] for m in live["metadata"]["managedFields"] if m["operation"] == "Apply"}
        assert "kubectl" in appliers, live["metadata"]["managedFields"]
    finally:
        control_plane.kubectl("delete", "crd", name, "--ignore-not-found", check=False)
