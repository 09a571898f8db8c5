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

_minor_cache: dict[int, int] = {}


def _server_minor(api) -> int:
    from kubernetes import client

    if id(api) not in _minor_cache:
        v = client.VersionApi(api).get_code()
        _minor_cache[id(api)] = int("".join(ch for ch in v.minor if ch.isdigit()) or 0)
    return _minor_cache[id(api)]


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
    # Before 1.24, creating a pod fails ("No API token found for service
    # account default") until the token controller has made the default
    # ServiceAccount's Secret: wait for it, so tests may create pods at once.
    needs_secret = _server_minor(k8s) < 24

    def default_sa_ready() -> bool:
        try:
            sa = core.read_namespaced_service_account("default", name)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return bool(sa.secrets) or not needs_secret

    wait_for(default_sa_ready, 30, f"default ServiceAccount in namespace {name}", interval=0.05)
    try:
        yield name
    finally:
        try:
            core.delete_namespace(name)
        except ApiException as e:
            if e.status != 404:
                raise
