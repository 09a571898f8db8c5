"""Keep a server on the plan it was deployed with until its own spec changes or someone asks for a re-plan.

An operator upgrade (a planner constant, a new builder field) or changed model facts (a config.json behind
configURL) would otherwise change the pod template of every server at once, and each StatefulSet would roll:
a full outage for a single replica, many at the same time across a fleet. So when the spec is the one the
running workload was made for (status.observedGeneration is the current generation) and what the operator
would now apply differs from what it applied then (the desired-hash annotation it left on the workload), the
workload is left alone and the VLLMServer says what a re-plan would change (condition PlanOutdated).

A re-plan happens when the spec changes, when a user sets the annotation `vllm-operator.io/replan` to a new
value (any text; its value is recorded on the workload), or, if the operator runs with
`--replan-outdated-per-minute N`, for at most N outdated servers a minute. Hand edits of the workload are still
repaired at once: they leave the desired-hash annotation as it was, so they are drift, not a new plan.
Pure, apart from the rate budget's clock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .. import api

REPLAN_ANNOTATION = f"{api.GROUP}/replan"
#: On the workload: the value of the replan annotation it was last applied for.
REPLANNED_ANNOTATION = f"{api.GROUP}/replanned"
WORKLOADS = ("StatefulSet", "DaemonSet")
MAX_MESSAGE = 1024


def _annotations(obj: Optional[dict[str, Any]]) -> dict[str, str]:
    return ((obj or {}).get("metadata") or {}).get("annotations") or {}


def mark_requested(body: dict[str, Any], desired: list[dict[str, Any]]) -> None:
    """Record a requested re-plan on the workload the reconciler will apply (before its hash is taken)."""
    asked = _annotations(body).get(REPLAN_ANNOTATION)
    if asked is None:
        return
    for obj in desired:
        if obj["kind"] in WORKLOADS:
            obj["metadata"].setdefault("annotations", {})[REPLANNED_ANNOTATION] = asked


def held(body: dict[str, Any], want: dict[str, Any], live: Optional[dict[str, Any]], hash_key: str) -> bool:
    """Whether applying `want` over `live` would be a re-plan nobody asked for: same generation as the one the
    operator last acted on, a different desired hash than the one it left, and no new replan annotation."""
    if want["kind"] not in WORKLOADS or live is None:
        return False
    generation = body["metadata"].get("generation")
    if generation is None or (body.get("status") or {}).get("observedGeneration") != generation:
        return False  # the spec changed since the operator last acted: the new plan is what was asked for
    left = _annotations(live).get(hash_key)
    if left is None or left == _annotations(want).get(hash_key):
        return False  # drift of the live object (or never hashed): repair it
    asked = _annotations(body).get(REPLAN_ANNOTATION)
    return asked is None or asked == _annotations(live).get(REPLANNED_ANNOTATION)


def _flags(args: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, token in enumerate(args):
        if token.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else ""
            out[token] = nxt
    return out


def difference(live: dict[str, Any], want: dict[str, Any], subset: Callable[[Any, Any], bool]) -> str:
    """What a re-plan would change in the pod template: flags with their old and new values, then the names of
    other fields that differ. `subset(want, have)`: the reconciler's comparison (the API server adds defaults)."""
    old_t, new_t = live["spec"]["template"], want["spec"]["template"]
    old_c = (old_t["spec"].get("containers") or [{}])[0]
    new_c = (new_t["spec"].get("containers") or [{}])[0]
    old_f, new_f = _flags(old_c.get("args") or []), _flags(new_c.get("args") or [])
    parts = [f"{flag} {old_f.get(flag, '(none)') or '(set)'} -> {new_f.get(flag, '(none)') or '(set)'}"
             for flag in sorted(set(old_f) | set(new_f)) if old_f.get(flag) != new_f.get(flag)]
    if (old_c.get("args") or [])[:1] != (new_c.get("args") or [])[:1]:
        parts.insert(0, "model")
    parts += [f"container {key}" for key in sorted(new_c) if key != "args" and not subset(new_c[key], old_c.get(key))]
    parts += [f"pod {key}" for key in sorted(new_t["spec"]) if key != "containers"
              and not subset(new_t["spec"][key], old_t["spec"].get(key))]
    if not subset(new_t.get("metadata") or {}, old_t.get("metadata") or {}):
        parts.append("pod labels or annotations")
    return ", ".join(parts) or "fields outside the pod template"


def message(diff: str) -> str:
    text = (f"the running pods keep the plan they were deployed with; a re-plan (a newer operator version or "
            f"changed model facts) would change: {diff}. It would restart the pods: set the annotation "
            f"{REPLAN_ANNOTATION} to a new value when that suits you, or change the spec")
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


@dataclass
class Budget:
    """At most `per_minute` automatic re-plans of outdated servers a minute (0: only when asked)."""

    per_minute: float = 0.0
    clock: Callable[[], float] = time.monotonic
    _tokens: float = field(default=0.0, repr=False)
    _last: Optional[float] = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def take(self) -> bool:
        if self.per_minute <= 0:
            return False
        with self._lock:
            now = self.clock()
            if self._last is None:
                self._tokens = 1.0
            else:
                self._tokens = min(max(1.0, self.per_minute), self._tokens + (now - self._last) * self.per_minute / 60)
            self._last = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False
