"""Check an installed operator (Helm chart or kubectl bundle) on a control plane with no kubelet.

The installed Deployment cannot run here (no image, no kubelet), so its place is taken
by `vllm-operator run` as a local process with the Deployment's own arguments and the
installed ServiceAccount's token: the RBAC, the flags and the probes' endpoints are the
ones a cluster would use. A fake kubelet makes the vLLM pods Running and Ready.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import yaml

from e2e.testbed.controlplane import wait_for
from e2e.testbed.fakekubelet import FakeKubelet
from e2e.testbed.operator_process import OperatorProcess
from e2e.testbed.procs import free_port  # noqa: F401 - the tests take it from here
from e2e.testbed.serviceaccount import service_account_kubeconfig

ROOT = Path(__file__).resolve().parents[2]
GROUP_PATH = "/apis/vllm-operator.io/v1alpha1"
#: What the operator's log says when its RBAC is short: the API server's RBAC denial
#: ('User "system:serviceaccount:ns:sa" cannot list resource ...'), and kopf's own warning.
#: (Other 403s, such as creating into a namespace being deleted, are not about RBAC.)
RBAC_TROUBLE = re.compile(r'cannot [a-z]+ resource \\?"|Not enough permissions')  # \" in JSON logs


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def operator_deployment(cp, namespace: str) -> dict[str, Any]:
    items = json.loads(cp.kubectl("get", "deployments", "-n", namespace, "-l",
                                  "app.kubernetes.io/name=vllm-operator", "-o", "json").stdout)["items"]
    assert len(items) == 1, [d["metadata"]["name"] for d in items]
    return items[0]


@contextmanager
def run_as_installed(cp, namespace: str, workdir: Path, drop_args: tuple[str, ...] = (), tag: str = "operator"
                     ) -> Iterator[tuple[OperatorProcess, int, dict]]:
    """The installed Deployment's container as a local process: its args (less `drop_args`), its
    ServiceAccount's token, and the environment the Deployment gives it (a `fieldRef` to the
    pod's name reads `tag`, which also names the log).

    Yields (process, health port, the Deployment) once /readyz answers 200.
    """
    deployment = operator_deployment(cp, namespace)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    kubeconfig = service_account_kubeconfig(cp, namespace, pod["serviceAccountName"], workdir / "sa.kubeconfig")
    port = free_port()
    # The chart's --health-port=8080 would collide between tests: a later flag wins in argparse
    # (over OperatorProcess's own defaults too, which come first).
    env = {}
    for var in container.get("env") or []:
        field = ((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        assert "value" in var or field == "metadata.name", f"no stand-in for the env var {var}"
        env[var["name"]] = var.get("value", tag)
    proc = OperatorProcess(kubeconfig, workdir / f"{tag}.log", env=env,
                           extra_args=[*(a for a in container["args"] if a not in drop_args), f"--health-port={port}"])
    proc.start()
    try:
        wait_for(lambda: proc.alive() and http_get(port, "/readyz")[0] == 200, 60, "the operator's /readyz")
        yield proc, port, deployment
    finally:
        proc.stop()


def load_example(name: str, namespace: str, file: str = "llama-8b-single-gpu.yaml", **spec: Any) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / file).read_text())
    doc["metadata"] = {"name": name, "namespace": namespace}
    doc["spec"].update(spec)
    return doc


def condition(server: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (server.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def kubectl_apply(cp, doc: dict[str, Any]) -> None:
    """`kubectl apply` of one document, as a user would."""
    cp.kubectl("apply", "-f", "-", input=json.dumps(doc))


def wait_status(kube, namespace: str, name: str, probe, what: str, timeout: float = 60) -> dict[str, Any]:
    """Poll the VLLMServer (through the REST API) until `probe(server)` holds; returns it."""
    from e2e.testbed.convergence import get_server as get

    return wait_for(lambda: (lambda s: s if s and probe(s) else None)(get(kube, namespace, name)), timeout, what)


def events_for(kube, namespace: str, name: str) -> list[dict[str, Any]]:
    """The Events of the namespace about an object of this name."""
    return [e for e in kube.list("v1", "Event", namespace) if e["involvedObject"].get("name") == name]


def get_server(cp, namespace: str, name: str) -> dict[str, Any]:
    return json.loads(cp.kubectl("get", "vllmservers", name, "-n", namespace, "-o", "json").stdout)


def serve_example_until_ready(cp, k8s, namespace: str, name: str = "llama", replicas: int = 2,
                              timeout: float = 90) -> dict[str, Any]:
    """Apply an example VLLMServer, play the kubelet, wait until it is Ready; returns the live object."""
    doc = load_example(name, namespace, replicas=replicas)
    product = doc["spec"]["gpu"]["product"]
    with FakeKubelet(k8s, namespace=namespace, node_name=f"gpu-{namespace}"[:60], gpu_product=product):
        cp.kubectl("apply", "-f", "-", input=json.dumps(doc))

        def ready():
            server = get_server(cp, namespace, name)
            ok = (condition(server, "Ready").get("status") == "True"
                  and server["status"].get("observedGeneration") == server["metadata"]["generation"])
            return server if ok else None

        return wait_for(ready, timeout, f"VLLMServer {namespace}/{name} Ready with {replicas} replicas")


def children(cp, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    """The server's StatefulSet and Services, by kind/name."""
    out = {}
    for kind in ("statefulsets", "services"):
        items = json.loads(cp.kubectl("get", kind, "-n", namespace, "-l", f"vllm-operator.io/server={name}",
                                      "-o", "json").stdout)["items"]
        for item in items:
            out[f"{item['kind']}/{item['metadata']['name']}"] = item
    return out


def rbac_trouble(log: str) -> list[str]:
    return [line for line in log.splitlines() if RBAC_TROUBLE.search(line)]


def documented_crd_step() -> list[str]:
    """docs/install.md#upgrade's first step, the kubectl half of `helm show crds <chart> | kubectl apply ...`
    (what `helm show crds` prints is the chart's crds/ file): e2e/test_upgrade.py and tests/apiserver/test_helm.py
    run it as written."""
    text = (ROOT / "docs" / "install.md").read_text()
    found = re.search(r"^\s*\| kubectl (apply [^\n]*-f -)$", text, re.M)
    assert found, "docs/install.md has no `| kubectl apply ... -f -` CRD step"
    step = found.group(1).split()
    assert "--server-side" in step and "--force-conflicts" in step, step
    return step
