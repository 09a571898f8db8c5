"""pytest fixtures for tests against a real control plane.

Loaded from tests/conftest.py with ``pytest_plugins = ["e2e.testbed.pytest_fixtures"]``.

* ``control_plane`` (session): ``ControlPlane.from_env()`` started once; an
  existing cluster when $VLLM_OPERATOR_TEST_KUBECONFIG is set.
* ``k8s`` (session): a kubernetes.client.ApiClient for it.
* ``namespace`` (function): a fresh namespace per test, deleted afterwards.
* ``crd_installed`` (module): the VLLMServer CRD installed and established.
* ``operator`` (module): ``vllm-operator run`` as a process, resync every 3 s, its log printed at the end.
* ``kube`` (function): the operator's own thin REST client on the session's ApiClient.
"""

from __future__ import annotations

import re
import secrets

import pytest

from e2e.testbed.controlplane import ControlPlane, wait_for

@pytest.fixture(scope="session")
def control_plane():
    cp = ControlPlane.from_env()
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def k8s(control_plane):
    api = control_plane.api_client()
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def namespace(k8s, request):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{base}-{secrets.token_hex(3)}"
    core = client.CoreV1Api(k8s)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    # The ServiceAccount admission plugin refuses a pod whose ServiceAccount does not exist yet: wait for the
    # serviceaccount controller to make "default", so tests may create pods at once.
    def default_sa_ready() -> bool:
        try:
            core.read_namespaced_service_account("default", name)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    wait_for(default_sa_ready, 30, f"default ServiceAccount in namespace {name}", interval=0.05)
    try:
        yield name
    finally:
        try:
            core.delete_namespace(name)
        except ApiException as e:
            if e.status != 404:
                raise


@pytest.fixture(scope="module")
def crd_installed(control_plane):
    from e2e.testbed.convergence import install_crd

    install_crd(control_plane)
    return True


@pytest.fixture(scope="module")
def operator(control_plane, crd_installed, tmp_path_factory):
    from e2e.testbed.operator_process import OperatorProcess

    log = tmp_path_factory.mktemp("operator") / "operator.log"
    proc = OperatorProcess(control_plane.kubeconfig, log, resync_seconds=3).start()
    yield proc
    proc.stop()
    print(proc.log_tail(200))


@pytest.fixture
def kube(k8s):
    from vllm_operator.kube.client import Kube

    return Kube(k8s)
