"""Pod Security Admission on the real kube-apiserver: the generated pods pass `baseline` and `restricted`
unless the spec asks for host IPC or host networking, and then the VLLMServer says so.

The API server enforces Pod Security on pods only (a StatefulSet in an enforcing namespace is admitted and
its controller's pod creations fail), so each example's pod template is sent as a Pod (server-side dry
run) into namespaces labelled `pod-security.kubernetes.io/enforce`. The last test runs the operator: a
spec its namespace forbids gets SpecValid=False/PodSecurityForbidden naming the level and the field, and
no workload.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.harness.convergence import wait_established
from tests.harness.controlplane import wait_for
from tests.harness.operator_process import OperatorProcess
from vllm_operator import podsecurity
from vllm_operator.kube.client import Kube

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "vllmservers.vllm-operator.io.yaml"
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.yaml"))


def rendered_pod(example: str, namespace: str) -> tuple[dict, dict]:
    """The example's VLLMServer and a Pod made of its workload's template, as the controller would make it."""
    doc = yaml.safe_load((ROOT / "examples" / example).read_text())
    out = subprocess.run([sys.executable, "-m", "vllm_operator.cli", "render", str(ROOT / "examples" / example)],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    workload = next(o for o in yaml.safe_load_all(out) if o and o["kind"] in ("StatefulSet", "DaemonSet"))
    template = workload["spec"]["template"]
    for claim in workload["spec"].get("volumeClaimTemplates") or []:  # the StatefulSet controller adds these
        name = claim["metadata"]["name"]
        template["spec"]["volumes"].append({"name": name, "persistentVolumeClaim": {"claimName": f"{name}-x-0"}})
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{workload['metadata']['name']}-0",
                                                            "namespace": namespace, **template["metadata"]},
           "spec": template["spec"]}
    return doc, pod


def label_namespace(cp, namespace: str, level: str) -> None:
    cp.kubectl("label", "namespace", namespace, f"{podsecurity.ENFORCE_LABEL}={level}", "--overwrite")


@pytest.mark.parametrize("level", ["baseline", "restricted"])
@pytest.mark.parametrize("example", EXAMPLES)
def test_generated_pods_are_admitted_unless_the_spec_asks_for_host_namespaces(control_plane, namespace, example,
                                                                              level):
    label_namespace(control_plane, namespace, level)
    doc, pod = rendered_pod(example, namespace)
    asks_host = doc["spec"].get("ipc") == "Host" or doc["spec"].get("hostNetwork")
    p = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    if asks_host:
        assert p.returncode != 0 and "violates PodSecurity" in p.stderr, p.stderr
        # ... and the operator's own reading of the level agrees with the API server's
        assert podsecurity.violations(pod["spec"], level)
    else:
        assert p.returncode == 0, f"{example} under {level}: {p.stderr}"
        assert podsecurity.violations(pod["spec"], level) == []


def test_our_reading_of_restricted_matches_the_api_servers(control_plane, namespace):
    """Each restricted rule the module checks, broken one at a time on a pod that passes: the API server
    refuses it too (so the operator never calls a pod admissible that the API server refuses, or the
    reverse, for these fields)."""
    label_namespace(control_plane, namespace, "restricted")
    _, base = rendered_pod("llama-8b-single-gpu.yaml", namespace)
    breaks = {
        "allowPrivilegeEscalation": lambda s: s["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
        "capabilities": lambda s: s["containers"][0]["securityContext"].pop("capabilities"),
        "runAsNonRoot": lambda s: s["securityContext"].pop("runAsNonRoot"),
        "seccompProfile": lambda s: s["securityContext"].pop("seccompProfile"),
        "hostIPC": lambda s: s.__setitem__("hostIPC", True),
        "hostPath": lambda s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
    }
    for what, breaking in breaks.items():
        pod = json.loads(json.dumps(base))
        breaking(pod["spec"])
        p = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
        assert p.returncode != 0 and "violates PodSecurity" in p.stderr, (what, p.stderr)
        assert podsecurity.violations(pod["spec"], "restricted"), what


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
    events = [e for e in kube.list("v1", "Event", namespace) if e["involvedObject"].get("name") == "gemma"]
    assert any(e["reason"] == "PodSecurityForbidden" and e["type"] == "Warning" for e in events)

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
