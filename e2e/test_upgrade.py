"""An operator upgrade restarts no server nobody changed: two operator versions in turn on the same servers.

The earlier version is this repository's own code at UPGRADE_FROM (the last release of the operator before
this round's pod-template changes: non-root pods, --shutdown-timeout, FallbackToLogsOnError), taken with
`git archive` and run as a process, exactly as a cluster would run it before a `helm upgrade`. It deploys a
server; the current version then takes over. The server's StatefulSet must not change (no rollout, its
generation stays), the VLLMServer says what a re-plan would change (PlanOutdated), and the
`vllm-operator.io/replan` annotation rolls it to the new plan when the user chooses.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from e2e.testbed.convergence import wait_established
from e2e.testbed.controlplane import wait_for
from e2e.testbed.operator_install import documented_crd_step
from e2e.testbed.operator_process import ACTING, OperatorProcess
from vllm_operator.controller import replan
from vllm_operator.kube.client import Kube

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "vllmservers.vllm-operator.io.yaml"
UPGRADE_FROM = "ac6cb69"  # main at the start of this round (stop 8)


@pytest.fixture(scope="module")
def old_release(tmp_path_factory) -> Path:
    """The earlier version's operator package and CRD (a release ships both; `helm upgrade` users apply the
    new CRD with the new operator)."""
    out = tmp_path_factory.mktemp("release-" + UPGRADE_FROM)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", UPGRADE_FROM, "operator", "crds"], check=True,
                             capture_output=True).stdout
    tarfile.open(fileobj=io.BytesIO(archive)).extractall(out)
    return out


@pytest.fixture
def crd(control_plane):
    """Install a CRD version as docs/install.md's upgrade does (CRDs first); the current one is back afterwards,
    for the other tests."""
    step = documented_crd_step()

    def install(path: Path) -> None:
        control_plane.kubectl(*step, input=path.read_text())
        wait_established(control_plane, "vllmservers.vllm-operator.io")
    yield install
    install(CRD)


def get_server(kube: Kube, namespace: str, name: str) -> dict:
    return kube.request("GET", f"/apis/vllm-operator.io/v1alpha1/namespaces/{namespace}/vllmservers/{name}")


def cond(server: dict, type_: str) -> dict:
    return next((c for c in (server.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def test_an_operator_upgrade_leaves_running_servers_alone_until_asked(control_plane, k8s, namespace, tmp_path,
                                                                      old_release, crd):
    kube = Kube(k8s)
    crd(old_release / "crds" / CRD.name)
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["metadata"] = {"name": "llama", "namespace": namespace}
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(doc))

    # the earlier version deploys it
    old = OperatorProcess(control_plane.kubeconfig, tmp_path / "old.log", extra_args=["-n", namespace],
                          env={"PYTHONPATH": str(old_release / "operator")})
    with old:
        wait_for(lambda: (lambda s: s.get("status", {}).get("observedGeneration") == s["metadata"]["generation"]
                          and cond(s, "SpecValid").get("status") == "True")(get_server(kube, namespace, "llama")),
                 90, "the earlier operator version deployed the server")
        sts = wait_for(lambda: kube.get("apps/v1", "StatefulSet", namespace, "llama"), 30, "its StatefulSet")
    args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--shutdown-timeout" not in args, "the earlier version did not derive it: the plans differ"

    # the current version takes over, with its CRD: no rollout, the difference in status
    crd(CRD)
    new = OperatorProcess(control_plane.kubeconfig, tmp_path / "new.log", extra_args=["-n", namespace])
    with new:
        outdated = wait_for(lambda: cond(get_server(kube, namespace, "llama"), "PlanOutdated") or None, 90,
                            "PlanOutdated from the current version")
        assert outdated["status"] == "True" and outdated["reason"] == "PlanChanged"
        assert "--shutdown-timeout (none) ->" in outdated["message"] and "pod securityContext" in outdated["message"]
        # two more resyncs (every 3 s) and still the same StatefulSet: nothing rolled
        seen = len(ACTING.findall(new.log_tail(100000)))
        wait_for(lambda: len(ACTING.findall(new.log_tail(100000))) >= seen + 2, 60, "two more reconciles")
        server = get_server(kube, namespace, "llama")
        still = kube.get("apps/v1", "StatefulSet", namespace, "llama")
        assert still["metadata"]["generation"] == sts["metadata"]["generation"]
        assert still["spec"]["template"] == sts["spec"]["template"]
        assert server["status"]["plan"]["args"] == args, "status shows the plan the pods run"

        # the user asks: the StatefulSet rolls to the new plan, and PlanOutdated goes
        control_plane.kubectl("annotate", "vllms", "llama", "-n", namespace, f"{replan.REPLAN_ANNOTATION}=now")
        rolled = wait_for(lambda: (lambda s: s if s["metadata"]["generation"] > sts["metadata"]["generation"] else None)(
            kube.get("apps/v1", "StatefulSet", namespace, "llama")), 60, "the re-plan applied")
        assert "--shutdown-timeout" in rolled["spec"]["template"]["spec"]["containers"][0]["args"]
        assert rolled["metadata"]["annotations"][replan.REPLANNED_ANNOTATION] == "now"
        wait_for(lambda: not cond(get_server(kube, namespace, "llama"), "PlanOutdated"), 60, "PlanOutdated removed")

        # and a spec change rolls at once, as before
        doc["spec"]["image"] = "vllm/vllm-openai:v0.32.1"
        control_plane.kubectl("apply", "-f", "-", input=json.dumps(doc))
        wait_for(lambda: kube.get("apps/v1", "StatefulSet", namespace, "llama")["spec"]["template"]["spec"]
                 ["containers"][0]["image"] == "vllm/vllm-openai:v0.32.1", 60, "the spec change applied")
