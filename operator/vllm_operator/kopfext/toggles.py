"""A linear-time stand-in for kopf's ToggleSet: the operator's restart no longer waits minutes.

On start, kopf holds every handler until each index holds its initial listing. It does that
with one `ToggleSet(all)` (kopf/_cogs/aiokits/aiotoggles.py) holding a toggle per listed
object; each object's worker drops its toggle once indexed and then waits in
`ToggleSet.wait_for(True)`, an `asyncio.Condition.wait_for`. Every drop calls `notify_all`,
which wakes every worker already waiting, and each of them takes the condition's lock in
turn to re-check the set: N objects cost N^2 wake-ups. With 1,000 servers (about 5,000
watched objects: servers, StatefulSets, Services, PDBs, pods) the operator sat silent for
94-194 s after a restart before resuming anything (bench/README.md).

`ToggleSet` here keeps kopf's contract (the same constructor, methods and Toggle objects)
but its `wait_for` parks each waiter on a future, and the set re-checks its state once per
notification, resolving the futures whose state was reached: N objects cost N checks, each
stopping at the first toggle that decides it. `install()` puts it where kopf's reactor
creates its toggle sets (`aiotoggles.ToggleSet` is looked up when the operator starts);
tests/test_kopfext/toggles.py runs the same scenarios on kopf's class and this one, and
bench/toggles.py measures both side by side.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Callable, Iterable

from kopf._cogs.aiokits import aiotoggles

log = logging.getLogger("vllm_operator")

#: kopf's own class, kept for tests and benchmarks (and to undo install()).
KopfToggleSet = aiotoggles.ToggleSet


class _NotifyingCondition(asyncio.Condition):
    """The set's condition: kopf's Toggle.turn_to, make_toggle and drop_toggle all end in notify_all."""

    def __init__(self, on_notify: Callable[[], None]) -> None:
        super().__init__()
        self._on_notify = on_notify

    def notify_all(self) -> None:
        super().notify_all()
        self._on_notify()


class ToggleSet(KopfToggleSet):
    """kopf's ToggleSet, whose waiters wait on futures resolved by one check per change of the set."""

    def __init__(self, fn: Callable[[Iterable[bool]], bool]) -> None:
        super().__init__(fn)
        self._condition = _NotifyingCondition(self._settle)
        self._waiters: dict[bool, list[asyncio.Future[None]]] = {True: [], False: []}

    async def wait_for(self, __state: bool) -> None:
        state = bool(__state)
        if self.is_on() == state:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[state].append(future)
        try:
            await future
        finally:
            if future.cancelled():  # the waiter was cancelled (a resolved future has left the list already)
                self._waiters[state] = [f for f in self._waiters[state] if f is not future]

    def _settle(self) -> None:
        """After any change: release every waiter for the state the set is in now (one check, not one per waiter)."""
        if not (self._waiters[True] or self._waiters[False]):
            return
        state = self.is_on()
        released, self._waiters[state] = self._waiters[state], []
        for future in released:
            if not future.done():
                future.set_result(None)


#: Set to "kopf" to keep kopf's own class: bench/scale.py restarts the operator both ways side by side.
BASELINE_ENV = "VLLM_OPERATOR_KOPF_TOGGLESET"


def fits(base: type) -> bool:
    """Whether kopf's class still has the shape this one builds on (a condition shared with its toggles)."""
    try:
        probe = base(all)
    except Exception:
        return False
    return (isinstance(getattr(probe, "_condition", None), asyncio.Condition)
            and isinstance(getattr(probe, "_toggles", None), set)
            and all(callable(getattr(probe, m, None)) for m in ("make_toggle", "drop_toggle", "is_on", "wait_for")))


def install() -> None:
    """Make kopf's reactor create this ToggleSet (call before kopf.run; idempotent)."""
    if os.environ.get(BASELINE_ENV) == "kopf":
        log.warning("%s=kopf: kopf's own ToggleSet kept (a benchmark baseline; restarts wait quadratically)",
                    BASELINE_ENV)
        return
    if not fits(KopfToggleSet):
        log.warning("kopf's ToggleSet is not the one this module was written for: kept as it is (the start-up "
                    "wait for kopf's indices may take minutes with thousands of watched objects)")
        return
    if aiotoggles.ToggleSet is not ToggleSet:
        aiotoggles.ToggleSet = ToggleSet  # type: ignore[misc]
        log.debug("kopf's ToggleSet replaced by vllm_operator.kopfext.toggles.ToggleSet")
