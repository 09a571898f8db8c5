"""How API errors are handled: which become a condition, which are retried and how soon (pure)."""

from __future__ import annotations

import pytest

from vllm_operator.kube import apierrors
from vllm_operator.kube.apierrors import CONFLICT, REJECTED, THROTTLED


@pytest.mark.parametrize("status, kind", [
    (400, REJECTED), (403, REJECTED), (404, REJECTED), (422, REJECTED),
    (409, CONFLICT),
    (429, THROTTLED), (500, THROTTLED), (503, THROTTLED), (504, THROTTLED),
])
def test_classify(status, kind):
    assert apierrors.classify(status) == kind


def test_a_conflict_is_retried_at_once():
    assert apierrors.retry_delay(409, 0) == apierrors.retry_delay(409, 7) == apierrors.CONFLICT_SECONDS


def test_throttling_and_server_errors_back_off_exponentially_with_jitter():
    low = [apierrors.retry_delay(503, r, rand=lambda: 0.0) for r in range(10)]
    high = [apierrors.retry_delay(429, r, rand=lambda: 1.0) for r in range(10)]
    assert high[:4] == [2.0, 4.0, 8.0, 16.0] and high[-1] == apierrors.BACKOFF_MAX_SECONDS
    assert low == [h / 2 for h in high]  # jitter draws from the upper half of each step
    assert apierrors.retry_delay(500, 10_000, rand=lambda: 1.0) == apierrors.BACKOFF_MAX_SECONDS


def test_a_refusal_is_retried_slowly_growing_to_a_few_minutes():
    assert [apierrors.rejected_backoff(n) for n in range(1, 6)] == [60, 120, 240, 300, 300]
    assert apierrors.retry_delay(403, 0) == 60 and apierrors.retry_delay(422, 3) == 300


def test_the_rejected_message_quotes_the_api_server_bounded_on_one_line():
    words = ('StatefulSet.apps "rej" is invalid: spec.template.spec.affinity.nodeAffinity.'
             "requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].values: "
             "Required value: must be specified when `operator` is 'In' or 'NotIn'")
    msg = apierrors.rejected_message("StatefulSet", "rej", 422, words)
    assert msg.startswith("the API server refused StatefulSet rej (422): " + words)
    assert msg.endswith("retried slowly")
    long = apierrors.rejected_message("Service", "x", 422, "bad\n\x1b[31m" + "y" * 5000)
    assert len(long) <= apierrors.MESSAGE_LIMIT and "\n" not in long and "\x1b" not in long
    assert "..." in long and long.endswith("retried slowly"), "the advice survives a long message"
