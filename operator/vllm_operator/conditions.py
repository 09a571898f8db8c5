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


#: Present (True) while the image's vLLM release has no flag snapshot, so extraArgs were checked loosely.
EXTRA_ARGS_UNCHECKED = "ExtraArgsUnchecked"


def extra_args_unchecked(conditions: list[dict], warning: Optional[str], generation: Optional[int],
                         now: str) -> tuple[list[dict], Optional[tuple[str, str, str]]]:
    """ExtraArgsUnchecked=True (reason NoFlagSnapshot, the plan's warning as message) while the loose check
    applies, absent otherwise: a warning beside SpecValid=True, never a refusal. Also the Warning event to send
    when it appears or its message changes (None otherwise)."""
    if warning is None:
        return [c for c in conditions if c.get("type") != EXTRA_ARGS_UNCHECKED], None
    old = condition({"conditions": conditions}, EXTRA_ARGS_UNCHECKED)
    event = None if old is not None and old.get("message") == warning[:32768] else (
        "Warning", "NoFlagSnapshot", warning)
    return set_condition(conditions, EXTRA_ARGS_UNCHECKED, "True", "NoFlagSnapshot", warning, generation, now), event
