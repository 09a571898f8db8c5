"""What to do when the API server refuses a request: tell the tenant, or retry, and how soon. Pure.

An apply the API server refuses with a 4xx (422 invalid, 403 forbidden, 400 bad request, 404 kind not
served) is about the tenant's own object and does not change by retrying: it becomes a condition
(Degraded=True, reason ApiRejected, the API server's message) and is retried slowly. 409 (a conflict
with a concurrent write) resolves on the next try; 429 (throttled) and 5xx (the API server or etcd in
trouble) resolve by waiting, with exponential back-off and jitter so that many servers do not retry in
step.
"""

from __future__ import annotations

import random
from typing import Callable

#: Kinds of refusal (classify).
REJECTED, CONFLICT, THROTTLED = "Rejected", "Conflict", "Throttled"
#: The Degraded reason of an apply the API server refused (REJECTED).
API_REJECTED = "ApiRejected"
#: The longest API server message quoted in a condition or Event (one line).
MESSAGE_LIMIT = 1024
#: Of which the API server's own words (the rest names the child and what to do).
QUOTE_LIMIT = 800
#: A refused apply is sent again after 60 s, 120 s, 240 s, then every REJECTED_MAX_SECONDS, while what would be
#: sent is unchanged; a spec change that changes it is sent at once (level-based).
REJECTED_FIRST_SECONDS = 60.0
REJECTED_MAX_SECONDS = 300.0
#: A 409: the next try usually succeeds (someone else's write landed in between).
CONFLICT_SECONDS = 1.0
#: 429 and 5xx: 2 s doubling to at most 120 s, each delay drawn from its upper half (jitter).
BACKOFF_FIRST_SECONDS = 2.0
BACKOFF_MAX_SECONDS = 120.0


def classify(status: int) -> str:
    """REJECTED for a 4xx other than 409 and 429, CONFLICT for 409, THROTTLED for 429 and 5xx (and anything
    else: not the tenant's fault)."""
    if status == 409:
        return CONFLICT
    if 400 <= status < 500 and status != 429:
        return REJECTED
    return THROTTLED


def rejected_backoff(attempts: int) -> float:
    """Seconds until a refused apply is sent again, after `attempts` refusals of the same object (1, 2, ...)."""
    return min(REJECTED_FIRST_SECONDS * 2 ** max(attempts - 1, 0), REJECTED_MAX_SECONDS)


def retry_delay(status: int, retries: int, rand: Callable[[], float] = random.random) -> float:
    """kopf's TemporaryError delay for a reconcile that failed with `status`, retried `retries` times so far."""
    kind = classify(status)
    if kind == CONFLICT:
        return CONFLICT_SECONDS
    if kind == REJECTED:  # not an apply (those become a condition): a status write, a GET
        return rejected_backoff(retries + 1)
    ceiling = min(BACKOFF_FIRST_SECONDS * 2 ** min(retries, 16), BACKOFF_MAX_SECONDS)
    return ceiling * (0.5 + 0.5 * rand())


def one_line(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """The API server's message as one line of at most `limit` characters."""
    flat = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


def rejected_message(kind: str, name: str, status: int, message: str) -> str:
    """The Degraded message of a refused apply: which child, the status code, the API server's own words (they
    are about the tenant's own object), and what to do."""
    quoted = one_line(message, QUOTE_LIMIT)
    return one_line(f"the API server refused {kind} {name} ({status}): {quoted}. Fix the VLLMServer's spec; the "
                    "last accepted version keeps running and the apply is retried slowly")
