"""The kubectl bundle (manifests/vllm-operator.yaml) applied to the local control plane gives what `helm install` of
the chart gives (the same objects, field for field once the server has defaulted them). The operator under the
bundle's account: e2e/test_manifests.py.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import shlex

import pytest

from e2e.testbed.convergence import wait_established
from e2e.testbed.controlplane import wait_for
from e2e.testbed.operator_install import ROOT
from vllm_operator import generate
from vllm_operator.controller.drift import is_subset

pytestmark = pytest.mark.apiserver

BUNDLE = ROOT / "manifests" / "vllm-operator.yaml"
NS = generate.BUNDLE_NAMESPACE
OBJECTS = generate.bundle_objects(BUNDLE.read_text())
INSTALLED = [o for o in OBJECTS if o["kind"] not in ("Namespace", "CustomResourceDefinition")]


def live(cp, obj: dict) -> dict:
    meta = obj["metadata"]
    args = ["get", f"{obj['kind'].lower()}.{obj['apiVersion'].split('/')[0]}" if "/" in obj["apiVersion"]
            else obj["kind"].lower(), meta["name"], "-o", "json"]
    if meta.get("namespace"):
        args += ["-n", meta["namespace"]]
    return json.loads(cp.kubectl(*args).stdout)


def comparable(obj: dict) -> dict:
    """A live object without what differs between any two creations (ids, times, tokens, IPs, tool marks)."""
    o = copy.deepcopy(obj)
    o.pop("status", None)
    o.pop("secrets", None)  # a ServiceAccount's token Secret has a random name
    labels = dict(o["metadata"].get("labels") or {})
    labels.pop("app.kubernetes.io/managed-by", None)
    o["metadata"] = {k: v for k, v in o["metadata"].items() if k in ("name", "namespace")} | {"labels": labels}
    if o["kind"] == "Service":
        o["spec"].pop("clusterIP", None)
        o["spec"].pop("clusterIPs", None)
    return o


def delete_bundle(cp) -> None:
    """Everything the bundle made except the CRD (other tests' VLLMServers live on it)."""
    for obj in reversed(INSTALLED):
        kind = obj["kind"].lower() + ("." + obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else "")
        args = ["delete", kind, obj["metadata"]["name"], "--ignore-not-found", "--wait=false"]
        if obj["metadata"].get("namespace"):
            args += ["-n", obj["metadata"]["namespace"]]
        cp.kubectl(*args)
    cp.kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=true", "--timeout=120s")


@pytest.fixture
def clean(control_plane):
    delete_bundle(control_plane)
    yield control_plane
    delete_bundle(control_plane)


def apply_bundle(cp) -> None:
    cp.kubectl("apply", "-f", str(BUNDLE))
    wait_established(cp, "vllmservers.vllm-operator.io")


def test_bundle_gives_the_objects_helm_install_gives(clean):
    helm_sdkpy = pytest.importorskip("helm_sdkpy", reason="tools/run-tests.sh installs helm-sdkpy")
    cp = clean
    config = helm_sdkpy.Configuration(namespace=NS, kubeconfig=cp.kubeconfig)
    asyncio.run(helm_sdkpy.Install(config).run(generate.BUNDLE_RELEASE, str(ROOT / generate.CHART),
                                               create_namespace=True, wait=False, timeout=120))
    by_helm = {(o["kind"], o["metadata"]["name"]): comparable(live(cp, o)) for o in INSTALLED}
    asyncio.run(helm_sdkpy.Uninstall(config).run(generate.BUNDLE_RELEASE, wait=True, timeout=120))
    for o in INSTALLED:
        wait_for(lambda: cp.kubectl("get", o["kind"].lower(), o["metadata"]["name"], "-n", NS,
                                    check=False).returncode != 0, 60, f"{o['kind']} removed by helm uninstall")

    apply_bundle(cp)
    for o in INSTALLED:
        got = live(cp, o)
        assert is_subset(o, got), f"{o['kind']}/{o['metadata']['name']} is not what the bundle says"
        assert comparable(got) == by_helm[(o["kind"], o["metadata"]["name"])], o["kind"]
        assert got["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kubectl"


def test_the_bundle_upgrades_with_the_documented_server_side_apply(clean):
    """docs/install.md#upgrade: with the kubectl bundle, one server-side apply of the new bundle does both the CRD
    and the operator, over a client-side `kubectl apply` install (docs/install.md#install). Run as written."""
    install = (ROOT / "docs" / "install.md").read_text()
    [command] = re.findall(r"`(kubectl apply --server-side[^`]*manifests/vllm-operator\.yaml)`", install)
    apply_bundle(clean)
    argv = [str(BUNDLE) if a == "manifests/vllm-operator.yaml" else a for a in shlex.split(command)]
    p = clean.kubectl(*argv[1:], check=False)
    assert p.returncode == 0, p.stderr
    for o in INSTALLED:
        assert is_subset(o, live(clean, o)), f"{o['kind']}/{o['metadata']['name']}"
    crd = json.loads(clean.kubectl("get", "crd", "vllmservers.vllm-operator.io", "-o", "json",
                                   "--show-managed-fields").stdout)
    assert any(m["operation"] == "Apply" for m in crd["metadata"]["managedFields"]), "not applied server-side"
