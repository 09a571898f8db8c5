"""Pod Security Admission on the real kube-apiserver: the generated pods pass `baseline` and `restricted` unless the
spec asks for host IPC or host networking.

The API server enforces Pod Security on pods only (a StatefulSet in an enforcing namespace is admitted and its
controller's pod creations fail), so each example's pod template is sent as a Pod (server-side dry run) into
namespaces labelled `pod-security.kubernetes.io/enforce`. What the operator reports: e2e/test_pod_security_e2e.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vllm_operator import podsecurity

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "vllmservers.vllm-operator.io.yaml"
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.yaml"))


def rendered_pod(example: str, namespace: str, role: str = "leader") -> tuple[dict, dict]:
    """The example's VLLMServer and a Pod made of its workload's template, as the controller would make it (for a
    LeaderWorkerSet, the `role`'s template: leader or worker)."""
    doc = yaml.safe_load((ROOT / "examples" / example).read_text())
    out = subprocess.run([sys.executable, "-m", "vllm_operator.cli", "render", str(ROOT / "examples" / example)],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    workload = next(o for o in yaml.safe_load_all(out)
                    if o and o["kind"] in ("StatefulSet", "DaemonSet", "LeaderWorkerSet"))
    if workload["kind"] == "LeaderWorkerSet":
        template = workload["spec"]["leaderWorkerTemplate"][f"{role}Template"]
    else:
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
    roles = ["leader", "worker"] if yaml.safe_load((ROOT / "examples" / example).read_text())["spec"].get(
        "nodes", 1) > 1 else ["leader"]
    for role in roles:  # a group's leader and worker pods alike
        doc, pod = rendered_pod(example, namespace, role)
        asks_host = doc["spec"].get("ipc") == "Host" or doc["spec"].get("hostNetwork")
        p = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
        if asks_host:
            assert p.returncode != 0 and "violates PodSecurity" in p.stderr, p.stderr
            # ... and the operator's own reading of the level agrees with the API server's
            assert podsecurity.violations(pod["spec"], level)
        else:
            assert p.returncode == 0, f"{example} {role} under {level}: {p.stderr}"
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


