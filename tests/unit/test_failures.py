"""The failure classifier (failures.py): pods and Events, as the API returns them, -> (reason, message).

The shapes are copied from real clusters: the scheduler's condition message, the kubelet's
waiting reasons and Events, the StatefulSet and DaemonSet controllers' FailedCreate, and a
vLLM traceback as FallbackToLogsOnError leaves it in lastState.terminated.message.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from vllm_operator.controller import failures
from vllm_operator.controller.failures import MAX_MESSAGE, classify

from e2e.testbed.failure_cases import (
    CASES, ERR_IMAGE_PULL, IMAGE, PSA, QUOTA, T0, VLLM_LOG, crashed, event, pod, terminated, unschedulable, waiting,
)

@pytest.mark.parametrize(("pods", "events", "now", "reason", "waiting", "texts"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_classify(pods, events, now, reason, waiting, texts):
    found = classify(pods, events, now=now)
    if reason is None:
        assert found is None, found
        return
    assert found is not None
    assert (found.reason, found.waiting) == (reason, waiting), found
    for text in texts:
        assert text in found.message, (text, found.message)
    assert len(found.message) <= MAX_MESSAGE and "\n" not in found.message and "\x1b" not in found.message


# --------------------------------------------------------------------------- precedence
def test_precedence_is_the_documented_order():
    documented = re.findall(r"^\d+\. ([A-Za-z]+)", failures.__doc__, re.M)
    assert documented[:4] == ["FailedCreate", "Unschedulable", "ImagePullBackOff", "InvalidImageName"]
    assert documented[4:] == ["CreateContainerConfigError", "OOMKilled", "StartupProbeFailed", "CrashLoopBackOff"]
    assert [r for r in failures.PRECEDENCE if r != "CreateContainerError"] == documented


def test_the_earliest_stage_wins_and_the_others_are_named():
    pods = [pod("srv-0", status=crashed(terminated(1), state=waiting("ErrImagePull", ERR_IMAGE_PULL))),
            pod("srv-1", conditions=unschedulable()), pod("srv-2", status=crashed(terminated(137, "OOMKilled")))]
    found = classify(pods, [event("StatefulSet", "srv", "FailedCreate", QUOTA.replace("srv-1", "srv-3"))])
    assert found.reason == "FailedCreate" and found.subject == "StatefulSet srv"
    assert found.message.endswith("(also failing: srv-1 Unschedulable, srv-0 ImagePullBackOff, srv-2 OOMKilled)")
    found = classify(pods)  # srv-0 is named once, by its earliest stage (its crash is named no more)
    assert found.reason == "Unschedulable" and found.message.endswith("(also failing: srv-0 ImagePullBackOff, "
                                                                      "srv-2 OOMKilled)")


def test_within_a_container_the_cause_beats_the_symptom():
    # The kubelet says CrashLoopBackOff; the last termination says why.
    assert classify([pod(status=crashed(terminated(137, "OOMKilled")))]).reason == "OOMKilled"
    # An image that cannot be pulled again hides how the previous run ended.
    pulling = crashed(terminated(137, "OOMKilled"), state=waiting("ErrImagePull", ERR_IMAGE_PULL))
    assert classify([pod(status=pulling)]).reason == "ImagePullBackOff"


def test_waiting_never_beats_a_failure_and_is_returned_alone():
    pods = [pod("srv-0", conditions=unschedulable()), pod("srv-1", status=crashed(terminated(1)))]
    found = classify(pods, now="2026-01-01T10:01:00Z")
    assert found.reason == "CrashLoopBackOff" and "also failing" not in found.message
    found = classify(pods[:1], now="2026-01-01T10:01:00Z")
    assert found.reason == "Unschedulable" and found.waiting


def test_workload_narrows_its_events_to_that_object():
    sts = {"kind": "StatefulSet", "metadata": {"name": "srv", "uid": "uid-sts-2"}}
    old = event("StatefulSet", "srv", "FailedCreate", PSA, uid="uid-sts-1")  # a deleted StatefulSet of that name
    other = event("StatefulSet", "other", "FailedCreate", PSA)
    assert classify([], [old, other], workload=sts) is None
    assert classify([], [event("StatefulSet", "srv", "FailedCreate", PSA, uid="uid-sts-2")], workload=sts)


# --------------------------------------------------------------------------- bounds
def test_cluster_text_is_one_bounded_line():
    huge = "\x1b[1mdenied\x1b[0m:\n" + "\t".join(["policy violation"] * 2000)
    found = classify([], [event("DaemonSet", "qwen", "FailedCreate", "Error creating: " + huge)])
    assert len(found.message) <= MAX_MESSAGE and found.message.endswith("…")
    assert "\x1b" not in found.message and "\n" not in found.message and "\t" not in found.message


def test_log_tail_keeps_the_last_lines():
    tail = failures.log_tail(VLLM_LOG)
    assert tail.endswith("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    assert "vLLM API server version" not in tail and len(tail) <= failures.LOG_TAIL_CHARS
    lines = tail.split(" | ")
    assert 1 < len(lines) <= failures.LOG_TAIL_LINES
    assert all(len(line) <= failures.LOG_LINE_CHARS for line in lines)
    assert failures.log_tail("") == "" and failures.log_tail(None) == ""
    assert failures.log_tail("x" * 5000) == "x" * (failures.LOG_LINE_CHARS - 1) + "…"


def test_startup_budget_uses_the_kubelets_defaults():
    assert failures.startup_budget({"startupProbe": {"periodSeconds": 10, "failureThreshold": 60}}) == (600, 60, 10)
    assert failures.startup_budget({"startupProbe": {"initialDelaySeconds": 30}}) == (60, 3, 10)


GATED = "\n".join([
    "huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: Root=1-6745f0e2-3b0c)",
    "Cannot access gated repo for url https://huggingface.co/api/models/meta-llama/Llama-3.1-8B-Instruct/revision/main.",
    "Access to model meta-llama/Llama-3.1-8B-Instruct is restricted. You must have access to it and be authenticated.",
])


def with_download(p: dict[str, Any], init_status: dict[str, Any]) -> dict[str, Any]:
    """The pod with the download init container (builders.download_container) in that state; vllm waits."""
    p["spec"]["initContainers"] = [{"name": "download", "image": IMAGE, "terminationMessagePolicy":
                                    "FallbackToLogsOnError"}]
    p["status"]["initContainerStatuses"] = [{"name": "download", "image": IMAGE, "ready": False, "restartCount": 0,
                                             **init_status}]
    p["status"]["phase"] = "Pending"
    return p


def test_a_failing_download_is_named_with_its_last_lines_and_what_to_check():
    p = with_download(pod(status=waiting("PodInitializing")), crashed(terminated(1, message=GATED), restarts=2))
    trouble = classify([p], [])
    assert trouble is not None and trouble.reason == "CrashLoopBackOff"
    assert trouble.message.startswith("pod srv-0: the model's download (init container download) keeps failing "
                                      "(CrashLoopBackOff, exit code 1, 2 restarts); last log lines: ")
    assert "GatedRepoError: 401" in trouble.message and "spec.hfTokenSecretRef" in trouble.message


def test_a_download_under_way_or_done_is_no_failure():
    running = with_download(pod(status=waiting("PodInitializing")), {"state": {"running": {"startedAt": T0}}})
    done = with_download(pod(status={"state": {"running": {"startedAt": T0}}}),
                         {"ready": True, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}})
    assert classify([running], []) is None and classify([done], []) is None
