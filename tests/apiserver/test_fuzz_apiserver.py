"""Fuzzed VLLMServer specs that render (tests/unit/test_fuzz.py's generators), sent to the real API server: the server
and every child pass a server-side dry-run.
"""

from __future__ import annotations

import copy
import json

import pytest

from vllm_operator import api, builders
from tests.unit.test_fuzz import plausible, extreme, LONG, sample_rendered


@pytest.mark.apiserver
def test_a_sample_of_rendered_specs_is_accepted_by_the_api_server(control_plane, k8s, namespace, stress_report):
    """Server-side dry-run: the VLLMServer against the CRD schema, every child against the API's validation."""
    from e2e.testbed.convergence import install_crd
    from vllm_operator.kube.client import ApiError, Kube

    install_crd(control_plane)
    kube = Kube(k8s)
    size = 100 if LONG else 30
    samples = sample_rendered(plausible(), size) + sample_rendered(extreme(), size)
    rejected = []
    for doc, _, plan in samples:
        doc = copy.deepcopy(doc)
        doc["metadata"]["namespace"] = namespace
        try:
            kube.request("POST", f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{namespace}/{api.PLURAL}",
                         query=[("dryRun", "All")], body=doc)
        except ApiError as e:
            rejected.append(f"VLLMServer {doc['metadata']['name']}: {e.message}\n  spec: {json.dumps(doc['spec'])}")
            continue
        plan.namespace = namespace
        owner = {"metadata": {"name": doc["metadata"]["name"], "uid": "00000000-0000-0000-0000-000000000001"}}
        for obj in builders.build_all(plan, owner):
            try:
                kube.request("PATCH", _path(obj), query=[("dryRun", "All"), ("fieldManager", "fuzz"),
                                                         ("force", "true")],
                             body=obj, content_type="application/apply-patch+yaml")
            except ApiError as e:
                rejected.append(f"{obj['kind']} of {doc['metadata']['name']}: {e.message}\n"
                                f"  spec: {json.dumps(doc['spec'])}")
    stress_report("fuzz", "server-side dry-runs (rendered samples)", len(samples))
    assert not rejected, f"{len(rejected)} of {len(samples)} rejected:\n" + "\n".join(rejected[:10])


def _path(obj: dict) -> str:
    from vllm_operator.kube.client import path_for

    return path_for(obj["apiVersion"], obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
