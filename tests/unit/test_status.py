"""Every status the operator writes fits the CRD's status schema: the reconciler's and the autoscaler's, over the
examples and the failure cases (e2e/testbed/status_cases.py), so a misspelt key fails here instead of being
pruned silently by the API server.

Two checks: the status models in api/status.py read each status back unchanged (they refuse unknown keys), and the real
kube-apiserver, holding the CRD generated from those models, accepts each one as a server-side apply of the status
subresource (a dry run), the way the operator writes it. Measured on kube-apiserver 1.37: a server-side apply with
a key the schema does not declare is refused whole (500, "field not declared in schema", whatever fieldValidation
says), so at run time a misspelt key would fail every status write of the server; a merge patch would prune it
silently. fieldValidation=Strict is sent anyway, so the check does not rest on that; types and enums are checked
as for any write."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import pytest

from e2e.testbed.status_cases import all_statuses
from vllm_operator import api

ROOT = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=1)
def statuses() -> dict[str, list[dict]]:
    return all_statuses()  # made when a test asks (a few seconds), not when the suite is collected


def test_the_cases_cover_every_condition_and_field_the_operator_writes():
    conditions = {c["type"] for sent in statuses().values() for s in sent for c in s.get("conditions") or []}
    assert conditions == {"SpecValid", "Ready", "Progressing", "Degraded", "ExternalScaler", "Stalled",
                          "Reconciling", "PlanOutdated", "ExtraArgsUnchecked", "AdaptersReady", "AutoscalingActive",
                          "AutoscalingLimited",
                          "Routing"}
    fields = {k for sent in statuses().values() for s in sent for k in s}
    assert fields == set(api.VLLMServerStatus.model_json_schema(by_alias=True)["properties"])
    kv = {k for sent in statuses().values() for s in sent for k in s.get("kvCapacity") or {}}
    assert kv == set(api.KVCapacityStatus.model_json_schema(by_alias=True)["properties"])
    template = {k for sent in statuses().values() for s in sent for k in s.get("chatTemplate") or {}}
    assert template == set(api.ChatTemplateStatus.model_json_schema(by_alias=True)["properties"])
    adapters = {k for sent in statuses().values() for s in sent for a in s.get("adapters") or [] for k in a}
    assert adapters == set(api.AdapterStatus.model_json_schema(by_alias=True)["properties"])
    scaling = {k for sent in statuses().values() for s in sent for k in s.get("autoscaling") or {}}
    assert scaling == set(api.AutoscalingStatus.model_json_schema(by_alias=True)["properties"])


def test_the_status_models_read_every_status_back_unchanged():
    for case, sent in statuses().items():
        assert sent, f"{case}: no status was written"
        for status in sent:
            assert api.VLLMServerStatus.model_validate(status).wire() == status, case


def test_the_status_models_refuse_a_misspelt_key():
    status = copy.deepcopy(statuses()["reconciler/lifecycle/llama-8b-single-gpu.yaml"][-1])
    for where in (status, status["plan"]["estimates"], status["conditions"][0]):
        where["readyReplica"] = 1
        with pytest.raises(ValueError, match="readyReplica"):
            api.VLLMServerStatus.model_validate(status)
        del where["readyReplica"]
