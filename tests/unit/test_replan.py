"""replan.py: when the reconciler keeps a workload's plan, what it says, and the automatic re-plan budget."""

from __future__ import annotations

import copy

import pytest

from vllm_operator.controller import replan
from vllm_operator.controller.drift import HASH_ANNOTATION, is_subset, with_hash


def workload(args: list[str], **pod) -> dict:
    return with_hash({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "s", "namespace": "n"},
                      "spec": {"template": {"metadata": {"labels": {"a": "b"}},
                                            "spec": {"containers": [{"name": "vllm", "args": args}], **pod}}}})


def server(generation: int = 2, observed: int = 2, replan_value=None) -> dict:
    meta = {"name": "s", "namespace": "n", "generation": generation}
    if replan_value is not None:
        meta["annotations"] = {replan.REPLAN_ANNOTATION: replan_value}
    return {"metadata": meta, "status": {"observedGeneration": observed}}


OLD = workload(["m", "--max-model-len", "31664"])
NEW = workload(["m", "--max-model-len", "31120", "--shutdown-timeout", "30"], securityContext={"runAsUser": 1000})


@pytest.mark.parametrize("body,live,held", [
    (server(), OLD, True),                       # same spec, new plan: keep the running one
    (server(generation=3, observed=2), OLD, False),   # the spec changed: apply
    (server(), None, False),                     # nothing there yet: create
    (server(replan_value="now"), OLD, False),   # asked for, not yet done
])
def test_held_only_when_nobody_changed_or_asked(body, live, held):
    assert replan.held(body, NEW, live, HASH_ANNOTATION) is held


def test_hand_edits_are_drift_and_repaired():
    edited = copy.deepcopy(NEW)
    edited["spec"]["template"]["spec"]["containers"][0]["args"] = ["bogus"]  # the hash annotation stays
    assert replan.held(server(), NEW, edited, HASH_ANNOTATION) is False


def test_a_done_replan_is_not_asked_again():
    body = server(replan_value="now")
    want = copy.deepcopy(NEW)
    replan.mark_requested(body, [want])
    done = with_hash({k: v for k, v in want.items()})
    assert done["metadata"]["annotations"][replan.REPLANNED_ANNOTATION] == "now"
    newer = workload(["m", "--max-model-len", "30000"])
    assert replan.held(body, newer, done, HASH_ANNOTATION) is True


def test_the_difference_names_flags_with_both_values_and_other_fields():
    diff = replan.difference(OLD, NEW, is_subset)
    assert "--max-model-len 31664 -> 31120" in diff and "--shutdown-timeout (none) -> 30" in diff
    assert "pod securityContext" in diff
    assert replan.REPLAN_ANNOTATION in replan.message(diff)


def test_budget_allows_at_most_per_minute_automatic_replans():
    now = [0.0]
    budget = replan.Budget(per_minute=2, clock=lambda: now[0])
    assert [budget.take() for _ in range(3)] == [True, False, False]
    now[0] += 30  # one more token a half minute later
    assert [budget.take() for _ in range(2)] == [True, False]
    assert replan.Budget().take() is False  # default: only when asked
