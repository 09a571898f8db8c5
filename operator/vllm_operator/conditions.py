"""Status conditions as Kubernetes writes them: keyed by type, lastTransitionTime moving only when the status
changes, observedGeneration on each. Pure; shared by the reconciler and the autoscaler (which writes its own two)."""

from __future__ import annotations

from typing import Any, Optional


def set_condition(conditions: list[dict], type_: str, status: str, reason: str, message: str,
                  generation: Optional[int], now: str) -> list[dict]:
    """Conditions keyed by type; lastTransitionTime moves only when status changes."""
    old = next((c for c in conditions if c.get("type") == type_), None)
    since = old.get("lastTransitionTime") if old and old.get("status") == status else now
    new = {"type": type_, "status": status, "reason": reason, "message": message[:32768],
           "lastTransitionTime": since or now, "observedGeneration": generation}
    if old is None:
        return [*conditions, new]
    return [new if c is old else c for c in conditions]  # keep the order: no spurious status writes


def condition(status: dict[str, Any], type_: str) -> Optional[dict[str, Any]]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), None)
