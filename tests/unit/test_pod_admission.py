"""The dry run that asks the API server's Pod Security admission (controller/pod_admission.py), with a recording
stand-in for the API server: what reaches the condition, the cache, and what happens without RBAC for it. The real
API server's answers: tests/apiserver/test_containment_apiserver.py."""

from __future__ import annotations

import json

from vllm_operator.controller.pod_admission import CACHE_SECONDS, MAX_MESSAGE, PodAdmission, dry_run_pod
from vllm_operator.kube.client import ApiError

WORKLOAD = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "srv", "namespace": "team-a"},
            "spec": {"template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "vllm"}]}},
                     "volumeClaimTemplates": [{"metadata": {"name": "cache"}}]}}


class Answers:
    """Answers each POST with the next status and message (200: admitted)."""

    def __init__(self, *answers: tuple[int, str]):
        self.answers, self.asked = list(answers), []

    def request(self, method, path, *, query=None, body=None, **_):
        self.asked.append((method, path, query, body))
        status, message = self.answers.pop(0)
        if status != 200:
            raise ApiError(status, json.dumps({"message": message}), method, path)
        return body


def test_the_pod_is_the_template_with_the_claims_and_a_generated_name():
    pod = dry_run_pod(WORKLOAD)
    assert pod["metadata"] == {"labels": {"a": "b"}, "generateName": "srv-podsecurity-", "namespace": "team-a"}
    assert pod["spec"]["volumes"] == [{"name": "cache", "persistentVolumeClaim": {"claimName": "cache-srv-0"}}]


def test_a_refusal_reaches_the_condition_as_one_bounded_line_and_is_remembered():
    clock = [0.0]
    words = 'pods "x" is forbidden: violates PodSecurity "baseline:latest":\n\x1b[31mhost namespaces\x1b[0m ' + "y" * 5000
    kube = Answers((403, words), (200, ""))
    admission = PodAdmission(monotonic=lambda: clock[0])
    why = admission.refusal(kube, WORKLOAD)
    assert why is not None and "violates PodSecurity" in why and "host namespaces" in why
    assert "\n" not in why and "\x1b" not in why and len(why) < MAX_MESSAGE + 300
    assert kube.asked[0][:3] == ("POST", "/api/v1/namespaces/team-a/pods", [("dryRun", "All")])
    assert admission.refusal(kube, WORKLOAD) == why and len(kube.asked) == 1  # cached
    clock[0] += CACHE_SECONDS + 1
    assert admission.refusal(kube, WORKLOAD) is None and len(kube.asked) == 2


def test_other_refusals_are_left_to_the_controller_and_no_rbac_turns_it_off_for_a_while():
    clock = [0.0]
    admission = PodAdmission(monotonic=lambda: clock[0])
    quota = Answers((403, 'pods "x" is forbidden: exceeded quota: gpus'))
    assert admission.refusal(quota, WORKLOAD) is None
    rbac = Answers((403, 'pods is forbidden: User "system:serviceaccount:ops:op" cannot create resource "pods"'))
    other = {**WORKLOAD, "metadata": {"name": "other", "namespace": "team-a"}}
    assert admission.refusal(rbac, other) is None
    assert admission.refusal(rbac, {**WORKLOAD, "metadata": {"name": "third", "namespace": "team-a"}}) is None
    assert len(rbac.asked) == 1, "not asked again while the grant is missing"


def test_a_server_error_is_not_remembered_and_blocks_nothing():
    admission = PodAdmission()
    kube = Answers((503, "webhook down"), (200, ""))
    assert admission.refusal(kube, WORKLOAD) is None
    assert admission.refusal(kube, WORKLOAD) is None and len(kube.asked) == 2
