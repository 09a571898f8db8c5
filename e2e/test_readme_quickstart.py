"""The README's quickstart run for real: its kubectl commands on the test bed's API server with the operator, its curl
against a real vLLM (tests/artefacts/test_readme_quickstart.py checks the rest offline).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.artefacts.test_readme_quickstart import one, positional, the_example, plan_of, served_name
from tests.artefacts.test_readme_quickstart import commands  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- for real
@pytest.mark.apiserver
def test_the_kubectl_commands_on_the_api_server(control_plane, operator, commands, k8s):  # noqa: F811 - the fixture
    """Secret, apply and wait as the README writes them, with the built kubectl and the operator."""
    from e2e.testbed.controlplane import KUBECTL
    from e2e.testbed.fakekubelet import FakeKubelet

    cp = control_plane
    path, example = the_example(commands)
    namespace, name = example["metadata"]["namespace"], example["metadata"]["name"]
    create = one(commands, "kubectl", "create", "secret", "generic")
    secret = positional(create)[3]

    def kubectl(argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([KUBECTL, f"--kubeconfig={cp.kubeconfig}", *argv[1:]], cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout)

    def clean():
        cp.kubectl("delete", "vllms", name, "-n", namespace, "--ignore-not-found", "--wait=true", check=False)
        cp.kubectl("delete", "secret", secret, "-n", namespace, "--ignore-not-found", check=False)

    clean()
    try:
        with FakeKubelet(k8s, namespace=namespace, node_name="quickstart-l4",
                         gpu_product=example["spec"]["gpu"]["product"]):
            for argv in (create, one(commands, "kubectl", "apply")):
                p = kubectl(argv)
                assert p.returncode == 0, p.stderr
            wait = one(commands, "kubectl", "wait")
            p = kubectl([*wait, "--timeout=120s"], timeout=150)  # the README's 30m is for a real download
            assert p.returncode == 0, p.stderr
            assert p.stdout.strip() == f"vllmserver.vllm-operator.io/{name} condition met"

            # what the port-forward would reach: the client Service's port, its named target on a ready pod
            forward = one(commands, "kubectl", "port-forward")
            svc_name = positional(forward)[1].split("/")[1]
            remote = int(positional(forward)[2].split(":")[1])
            svc = json.loads(cp.kubectl("get", "service", svc_name, "-n", namespace, "-o", "json").stdout)
            (port,) = [p for p in svc["spec"]["ports"] if p["port"] == remote]
            selector = ",".join(f"{k}={v}" for k, v in svc["spec"]["selector"].items())
            pods = json.loads(cp.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout)["items"]
            assert pods, "the client Service selects no pod"
            for pod in pods:
                (vllm,) = [c for c in pod["spec"]["containers"] if c["name"] == "vllm"]
                assert port["targetPort"] in [c.get("name") for c in vllm["ports"]]
                (env,) = [e for e in vllm["env"] if e["name"] == "HF_TOKEN"]
                ref = env["valueFrom"]["secretKeyRef"]
                data = json.loads(cp.kubectl("get", "secret", ref["name"], "-n", namespace, "-o", "json").stdout)["data"]
                assert ref["key"] in data, f"the pod reads key {ref['key']} of a Secret that has {sorted(data)}"
    finally:
        clean()


@pytest.mark.vllm
def test_the_curl_gets_a_chat_completion_from_vllm(commands, tmp_path):  # noqa: F811 - the fixture
    """The README's curl, verbatim but for the address, against a real vLLM serving the example's model name."""
    from e2e.testbed.vllm_env import free_port, start_vllm

    path, _ = the_example(commands)
    name = served_name(plan_of(path))
    curl = one(commands, "curl")
    host = "127.0.0.33"
    port = free_port(host)
    server = start_vllm(host, port, served_name=name, log_path=tmp_path / "vllm.log", stop_grace=5)
    try:
        server.wait_healthy()
        (url,) = positional(curl)
        argv = [a if a != url else url.replace(urlsplit(f"http://{url}").netloc, f"{host}:{port}") for a in curl]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "NO_PROXY": "*", "no_proxy": "*"})
        assert p.returncode == 0, p.stderr
        answer = json.loads(p.stdout)
        assert answer.get("object") == "chat.completion" and answer.get("model") == name, answer
        assert answer["choices"][0]["message"]["content"], answer
    finally:
        server.stop()
