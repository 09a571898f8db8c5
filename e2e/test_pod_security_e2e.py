"""Pod Security through the operator as a process: a spec its namespace forbids gets
SpecValid=False/PodSecurityForbidden naming the level and the field, and no workload; a patch that breaks restricted
is refused as the API server would (tests/apiserver/test_pod_security.py checks the pods themselves).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from e2e.testbed.controlplane import wait_for
from vllm_operator.kube.client import Kube
from e2e.testbed.convergence import wait_established
from e2e.testbed.operator_install import events_for
from e2e.testbed.operator_process import OperatorProcess
from tests.apiserver.test_pod_security import CRD, label_namespace, rendered_pod

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def operator(control_plane, tmp_path_factory):
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    wait_established(control_plane, "vllmservers.vllm-operator.io")
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    proc = OperatorProcess(control_plane.kubeconfig, log, resync_seconds=3).start()
    yield proc
    proc.stop()
    print(proc.log_tail(100))


def test_a_spec_the_namespace_forbids_is_reported_not_left_pending(control_plane, k8s, operator, namespace):
    kube = Kube(k8s)
    label_namespace(control_plane, namespace, "baseline")
    doc = yaml.safe_load((ROOT / "examples" / "gemma-3-4b-2x-a2000.yaml").read_text())  # ipc: Host
    assert doc["spec"]["ipc"] == "Host"
    doc["metadata"] = {"name": "gemma", "namespace": namespace}
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(doc))

    def spec_valid():
        server = kube.request("GET", f"/apis/vllm-operator.io/v1alpha1/namespaces/{namespace}/vllmservers/gemma")
        c = next((c for c in (server.get("status") or {}).get("conditions") or [] if c["type"] == "SpecValid"), {})
        return c if c.get("reason") == "PodSecurityForbidden" else None

    cond = wait_for(spec_valid, 60, "SpecValid=False/PodSecurityForbidden")
    assert cond["status"] == "False"
    assert f"namespace {namespace}" in cond["message"] and "'baseline'" in cond["message"]
    assert "spec.ipc: Host" in cond["message"]
    assert kube.get("apps/v1", "StatefulSet", namespace, "gemma") is None, "nothing applied for a refused spec"
    # The reconcile writes the status, then posts its Events: wait for the Event, do not read it once.
    wait_for(lambda: [e for e in events_for(kube, namespace, "gemma")
                      if e["reason"] == "PodSecurityForbidden" and e["type"] == "Warning"],
             60, "a Warning Event PodSecurityForbidden")

    # the fix the message names: shared memory instead of host IPC, and the server deploys
    doc["spec"]["ipc"] = "SharedMemory"
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(doc))
    wait_for(lambda: kube.get("apps/v1", "StatefulSet", namespace, "gemma"), 60, "the StatefulSet once allowed")


def test_a_patch_that_breaks_restricted_is_refused_by_the_operator_as_the_api_server_would(control_plane, k8s,
                                                                                         operator, namespace):
    """spec.podTemplatePatch on a sidecar: the operator reports the final template's field (SpecValid=False) and
    applies nothing, in a namespace with no Pod Security label at all; the same patched pod is refused by the API
    server at restricted. Without the patch the server deploys, its sidecar a native one."""
    kube = Kube(k8s)
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-sidecar-patch.yaml").read_text())
    doc["metadata"] = {"name": "tls", "namespace": namespace}
    doc["spec"]["podTemplatePatch"]["spec"]["initContainers"][0]["securityContext"] = {"privileged": True}
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(doc))

    def spec_valid():
        server = kube.request("GET", f"/apis/vllm-operator.io/v1alpha1/namespaces/{namespace}/vllmservers/tls")
        c = next((c for c in (server.get("status") or {}).get("conditions") or [] if c["type"] == "SpecValid"), {})
        return c if c.get("status") == "False" else None

    cond = wait_for(spec_valid, 60, "SpecValid=False")
    assert "spec.podTemplatePatch.spec.initContainers[envoy].securityContext.privileged" in cond["message"]
    assert kube.get("apps/v1", "StatefulSet", namespace, "tls") is None, "nothing applied for a refused spec"

    label_namespace(control_plane, namespace, "restricted")
    _, pod = rendered_pod("llama-8b-sidecar-patch.yaml", namespace)
    pod["spec"]["initContainers"][0]["securityContext"]["privileged"] = True
    p = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    assert p.returncode != 0 and "privileged" in p.stderr, p.stderr

    del doc["spec"]["podTemplatePatch"]["spec"]["initContainers"][0]["securityContext"]
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(doc))
    sts = wait_for(lambda: kube.get("apps/v1", "StatefulSet", namespace, "tls"), 60, "the StatefulSet once allowed")
    envoy = sts["spec"]["template"]["spec"]["initContainers"][0]
    assert envoy["name"] == "envoy" and envoy["restartPolicy"] == "Always"
    assert envoy["startupProbe"]["tcpSocket"]["port"] == 8443
