"""pytest fixtures for tests against a real control plane.

Loaded from tests/conftest.py with ``pytest_plugins = ["e2e.pytest_fixtures"]``.

* ``control_plane`` (session): ``ControlPlane.from_env()`` started once; an
  existing cluster when $VLLM_OPERATOR_TEST_KUBECONFIG is set.
* ``k8s`` (session): a kubernetes.client.ApiClient for it.
* ``namespace`` (function): a fresh namespace per test, deleted afterwards.
"""

from __future__ import annotations

import re
import secrets

import pytest

from e2e.controlplane import ControlPlane, wait_for

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
