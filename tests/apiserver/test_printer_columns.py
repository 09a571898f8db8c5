"""What `kubectl get vllms` shows, with the test bed's own kubectl against its real API server (issue 20: the cause
of an invalid spec where people look). The reconciler runs in-process and writes the status through the status
subresource, as the operator does; kubectl reads the CRD's printer columns.

This is also the reconcile smoke test of the oldest claimed Kubernetes: tools/run-tests.sh runs tests/apiserver on
it too (VLLM_OPERATOR_KUBE_MODULE=kube-1.30)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from vllm_operator.controller.reconcile import Reconciler

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[2]


def _create(control_plane, namespace: str, name: str, **spec) -> None:
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": namespace}
    doc["spec"].update(spec)
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(doc))


def _table(control_plane, namespace: str, *flags: str) -> dict[str, dict[str, str]]:
    """`kubectl get vllms` as {name: {column: value}} (kubectl's own columns, split on its alignment)."""
    out = control_plane.kubectl("get", "vllms", "-n", namespace, *flags).stdout.splitlines()
    header = out[0]
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
    bounds = list(zip(starts, starts[1:] + [None]))
    rows = [{header[a:b].strip(): line[a:b].strip() for a, b in bounds} for line in out[1:]]
    return {row["NAME"]: row for row in rows}


@pytest.mark.parametrize("reason,spec", [
    ("DoesNotFit", {"model": {"name": "meta-llama/Llama-3.1-70B-Instruct"}}),  # 70B on one L4
    ("ModelUnknown", {"model": {"name": "acme/not-in-the-catalog"}}),
    ("GPUUnknown", {"gpu": {"count": 1, "product": "H100x"}}),
    ("InvalidSpec", {"gpu": {"count": 3, "product": "NVIDIA-L4"}}),  # 32 attention heads over 3 GPUs
    ("InvalidSpec", {"engine": {"extraArgs": ["--no-such-flag"]}}),  # README: a flag the image's vLLM lacks
])
def test_kubectl_get_names_the_cause_of_an_invalid_spec(control_plane, crd_installed, namespace, kube, reason, spec):
    _create(control_plane, namespace, "srv", **spec)
    Reconciler(kube).reconcile(namespace, "srv")
    row = _table(control_plane, namespace)["srv"]
    assert (row["READY"], row["REASON"]) == ("False", reason), row
    wide = _table(control_plane, namespace, "-o", "wide")["srv"]
    assert wide["MESSAGE"].startswith("the spec cannot be deployed: spec."), wide
    assert "last valid" not in wide["MESSAGE"]


def test_a_valid_server_reconciles_and_kubectl_shows_its_plan(control_plane, crd_installed, namespace, kube):
    """The smoke test: the CRD installed, a server planned and its children applied, the status written."""
    _create(control_plane, namespace, "srv")
    Reconciler(kube).reconcile(namespace, "srv")
    row = _table(control_plane, namespace)["srv"]
    assert row["MODEL"] == "meta-llama/Llama-3.1-8B-Instruct" and row["WORKLOAD"] == "StatefulSet", row
    assert row["MAX-CONTEXT"] == "16384" and row["READY"] == "False", row
    kinds = control_plane.kubectl("get", "statefulsets,services", "-n", namespace, "-o", "name").stdout.split()
    assert "statefulset.apps/srv" in kinds and "service/srv" in kinds, kinds


# kubectl explain: tests/apiserver/test_explain.py
