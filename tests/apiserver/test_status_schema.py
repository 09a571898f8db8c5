"""Every status the operator writes (e2e/testbed/status_cases.py) fits the CRD's schema on the real API server."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from vllm_operator import api
from vllm_operator.kube.client import ApiError, path_for
from tests.unit.test_status import statuses

ROOT = Path(__file__).resolve().parents[2]


def _strict_status_apply(kube, namespace: str, status: dict, *, manager: str) -> None:
    """A server-side apply of the status subresource that stores nothing and refuses unknown fields."""
    query = [("fieldManager", manager), ("force", "true"), ("dryRun", "All"), ("fieldValidation", "Strict")]
    kube.request("PATCH", path_for(api.API_VERSION, api.KIND, namespace, "srv", "status"), query=query,
                 body={"apiVersion": api.API_VERSION, "kind": api.KIND,
                       "metadata": {"name": "srv", "namespace": namespace}, "status": status},
                 content_type="application/apply-patch+yaml")


@pytest.mark.apiserver
def test_every_status_fits_the_crds_schema_on_the_api_server(control_plane, crd_installed, namespace, kube):
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["metadata"] = {"name": "srv", "namespace": namespace}
    kube.request("POST", path_for(api.API_VERSION, api.KIND, namespace), body=doc)
    refused = {}
    for case, sent in sorted(statuses().items()):
        manager = "vllm-operator-autoscaler" if case.startswith("autoscaler/") else "vllm-operator"
        for i, status in enumerate(sent):
            try:
                _strict_status_apply(kube, namespace, status, manager=manager)
            except ApiError as e:
                refused[f"{case}[{i}]"] = e.message
    assert not refused, json.dumps(refused, indent=1)
    # The check can fail: an unknown key, a wrong type and a condition status outside the enum are refused.
    good = statuses()["reconciler/lifecycle/llama-8b-single-gpu.yaml"][-1]
    bad_key, bad_type, bad_enum = copy.deepcopy(good), copy.deepcopy(good), copy.deepcopy(good)
    bad_key["plan"]["estimates"]["kvCacheToken"] = 1
    bad_type["readyReplicas"] = "one"
    bad_enum["conditions"][0]["status"] = "Yes"
    for bad, words in ((bad_key, ".status.plan.estimates.kvCacheToken: field not declared in schema"),
                       (bad_type, "status.readyReplicas"), (bad_enum, "supported values")):
        with pytest.raises(ApiError) as caught:
            _strict_status_apply(kube, namespace, bad, manager="vllm-operator")
        assert words in caught.value.message
