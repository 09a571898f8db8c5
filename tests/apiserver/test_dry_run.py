"""The chart's objects, the kubectl bundle and the operator's output for every example pass the real API server's
server-side dry-run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from e2e.testbed import epp
from e2e.testbed.convergence import wait_established
from vllm_operator import generate
from tests.artefacts.test_packaging import BUNDLE, render

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- the API server accepts it all
#: Other projects' CRDs: not served by the test cluster (a LeaderWorkerSet's admission by LWS's own webhooks is
#: tests/apiserver/test_leaderworkerset.py's).
EXTERNAL_GROUPS = ("monitoring.coreos.com/", "keda.sh/", "leaderworkerset.x-k8s.io/")
#: Groups whose CRDs the test bed builds (tools/epp-build.sh): installed for the examples that use them.
ROUTING_GROUPS = ("inference.networking.k8s.io/", "gateway.networking.k8s.io/")


def server_dry_run(cp, objects: list[dict]) -> str:
    p = cp.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(objects), check=False)
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.mark.apiserver
@pytest.mark.parametrize("mode", ["cluster-wide", "namespaced", "namespaced+discovery"])
def test_chart_objects_pass_server_side_dry_run(control_plane, namespace, mode):
    values = {"argocd": {"healthCheckConfigMap": True}, "operator": {"prometheusURL": "http://p:9090"}}
    if mode != "cluster-wide":
        values["operator"]["watchNamespaces"] = [namespace]
        values["rbac"] = {"clusterDiscovery": mode.endswith("discovery")}
    objects = render(values, namespace=namespace, release="dry-" + mode.replace("+", "-"), include_crds=True)
    out = server_dry_run(control_plane, objects)
    assert out.count("(server dry run)") == len(objects)


@pytest.mark.apiserver
def test_bundle_passes_server_side_dry_run(control_plane):
    control_plane.kubectl("create", "namespace", "vllm-operator", check=False)  # dry-run cannot create into it
    p = control_plane.kubectl("apply", "--dry-run=server", "-f", str(BUNDLE), check=False)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("(server dry run)") == len(generate.bundle_objects(BUNDLE.read_text()))


@pytest.mark.apiserver
@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "examples").glob("*.yaml")))
def test_operator_output_for_every_example_passes_server_side_dry_run(control_plane, namespace, example):
    p = subprocess.run([sys.executable, "-m", "vllm_operator.cli", "render", str(ROOT / "examples" / example)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    objects = [o for o in yaml.safe_load_all(p.stdout) if o]
    assert objects
    for o in objects:
        o["metadata"]["namespace"] = namespace
    checked = [o for o in objects if not o["apiVersion"].startswith(EXTERNAL_GROUPS)]
    assert {o["kind"] for o in objects} & {"StatefulSet", "DaemonSet", "LeaderWorkerSet"}
    if any(o["apiVersion"].startswith(ROUTING_GROUPS) for o in checked):
        # spec.routing: the pool and the route against the extension's and the Gateway API's own CRDs
        epp.install_crds(control_plane)
        epp.install_gateway_crds(control_plane)
    out = server_dry_run(control_plane, checked)
    assert out.count("(server dry run)") == len(checked)
    # the VLLMServer itself, against the CRD's schema
    doc = yaml.safe_load((ROOT / "examples" / example).read_text())
    doc["metadata"]["namespace"] = namespace
    control_plane.kubectl("apply", "-f", str(ROOT / "crds" / generate.CRD_FILE))
    wait_established(control_plane, "vllmservers.vllm-operator.io")
    server_dry_run(control_plane, [doc])
