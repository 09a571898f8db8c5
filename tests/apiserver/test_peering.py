"""HA's peering on the real API server without an operator process: the peering CRDs install and the objects are
created once; the default priorities favour the oldest replica (docs/ha.md). The takeover itself: e2e/test_ha.py.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from e2e.testbed.convergence import (install_crd, wait_established)
from vllm_operator import peering
from vllm_operator.kube.client import Kube

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[2]
PEERING_CRDS = ROOT / "crds" / "kopf-peering.yaml"


@pytest.fixture(scope="module")
def kube(control_plane) -> Kube:
    install_crd(control_plane)
    control_plane.kubectl("apply", "-f", str(PEERING_CRDS))
    for crd in ("clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"):
        wait_established(control_plane, f"{crd}")
    return Kube(control_plane.api_client())


def test_peering_crds_install_and_objects_are_created_once(kube, namespace):
    name = f"t-{secrets.token_hex(3)}"
    assert peering.ensure_peering(kube, name) == [f"/apis/kopf.dev/v1/clusterkopfpeerings/{name}"]
    assert peering.ensure_peering(kube, name) == []  # idempotent: a second replica finds it
    assert peering.ensure_peering(kube, name, [namespace]) == [
        f"/apis/kopf.dev/v1/namespaces/{namespace}/kopfpeerings/{name}"]
    assert kube.request("GET", f"/apis/kopf.dev/v1/namespaces/{namespace}/kopfpeerings/{name}")["metadata"]["name"]
    kube.request("DELETE", f"/apis/kopf.dev/v1/clusterkopfpeerings/{name}")


def test_default_priorities_favour_the_oldest_replica():
    older = peering.default_priority(now=1_800_000_000)
    newer = peering.default_priority(now=1_800_000_001)
    assert older > newer
    assert len({peering.default_priority(now=1_800_000_000) for _ in range(50)}) > 45  # same-second tie-break
