"""Status conditions as Kubernetes writes them: keyed by type, lastTransitionTime moving only when the status
changes, observedGeneration on each. Pure; shared by the reconciler and the autoscaler (which writes its own two)."""

from __future__ import annotations

from typing import Any, Iterable, Optional

from .api import Condition
from .bounds import message as clean_message


class Conditions:
    """The conditions of one status, rewritten by one reconcile or tick: the generation it acted on and the time
    are given once. Order is kept (a condition set again stays where it was, a new one goes last), so a status
    that did not change compares equal to the live one and is not written again."""

    def __init__(self, live: Iterable[dict[str, Any]], generation: Optional[int], now: str):
        self.items: list[Condition] = [Condition.from_live(c) for c in live]
        self.generation = generation
        self.now = now

    def get(self, type_: str) -> Optional[Condition]:
        return next((c for c in self.items if c.type == type_), None)

    def true(self, type_: str) -> Optional[Condition]:
        """The condition when its status is True."""
        c = self.get(type_)
        return c if c is not None and c.status == "True" else None

    def set(self, type_: str, status: str, reason: str, message: str) -> None:
        old = self.get(type_)
        since = old.last_transition_time if old is not None and old.status == status else None
        new = Condition(type=type_, status=status, reason=reason, message=clean_message(message),
                        last_transition_time=since or self.now, observed_generation=self.generation)
        if old is None:
            self.items.append(new)
        else:
            self.items = [new if c is old else c for c in self.items]

    def remove(self, type_: str) -> None:
        self.items = [c for c in self.items if c.type != type_]

    def only(self, types: Iterable[str]) -> list[Condition]:
        """The conditions of these types (the ones a writer owns), in order."""
        wanted = set(types)
        return [c for c in self.items if c.type in wanted]


def condition(status: dict[str, Any], type_: str) -> Optional[dict[str, Any]]:
    """The condition of this type in a status as the API server has it."""
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), None)


#: Present (True) while the image's vLLM release has no flag snapshot, so extraArgs were checked loosely.
EXTRA_ARGS_UNCHECKED = "ExtraArgsUnchecked"


def extra_args_unchecked(conditions: Conditions, warning: Optional[str]) -> Optional[tuple[str, str, str]]:
    """ExtraArgsUnchecked=True (reason NoFlagSnapshot, the plan's warning as message) while the loose check
    applies, absent otherwise: a warning beside SpecValid=True, never a refusal. Returns the Warning event to send
    when it appears or its message changes (None otherwise)."""
    if warning is None:
        conditions.remove(EXTRA_ARGS_UNCHECKED)
        return None
    old = conditions.get(EXTRA_ARGS_UNCHECKED)
    event = None if old is not None and old.message == clean_message(warning) else ("Warning", "NoFlagSnapshot", warning)
    conditions.set(EXTRA_ARGS_UNCHECKED, "True", "NoFlagSnapshot", warning)
    return event
