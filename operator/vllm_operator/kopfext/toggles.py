"""A linear-time stand-in for kopf's start-up index wait: the operator's restart no longer waits minutes.

On start, kopf holds every handler until each index holds its initial listing (in-memory
indices, nolar/kopf#661; the wait is `operator_indexed.wait_for(True)` in
kopf/_core/reactor/processing.py, described in nolar/kopf#1243). It does that with one
`ToggleSet(all)` (kopf/_cogs/aiokits/aiotoggles.py), built by kopf's orchestrator
(kopf/_core/reactor/orchestration.py), holding a toggle per listed object; each object's
worker drops its toggle once indexed and then waits in `ToggleSet.wait_for(True)`, an
`asyncio.Condition.wait_for`. Every drop calls `notify_all`, which wakes every worker
already waiting, and each of them takes the condition's lock in turn to re-check the set:
N objects cost N^2 wake-ups. With 1,000 servers (about 5,000 watched objects: servers,
StatefulSets, Services, PDBs, pods) the operator sat silent for 88-194 s after a restart
before resuming anything (bench/README.md). No upstream issue reports the quadratic cost
(searched nolar/kopf issues, 2026-12-01).

`ToggleSet` here keeps kopf's contract (the same constructor, methods and Toggle objects)
but its `wait_for` parks each waiter on a future, and the set re-checks its state once per
notification, resolving the futures whose state was reached: N objects cost N checks. One
difference: kopf's waiter re-checks the set when it wakes, ours is released by the change
that reached the state, even if the set left it again before the waiter ran. For the index
wait that is the same (every object it waits for was indexed); for kopf's other toggle sets
(the pause of peering, `operator_paused`) it is not, so only the index wait gets it:

`install()` points the one name kopf's orchestrator builds that set through,
`orchestration.aiotoggles`, at a view of kopf's module whose `ToggleSet` is this one; the
rest of kopf (peering's pause included) keeps kopf's class. It first runs `self_test()`: the
same small scenario on kopf's class and on this one, with kopf's own Toggle objects, must
release the same waiters at the same steps, and the orchestrator must still build its set
through that name. When it fails, kopf's class is kept, with a warning (the wait is then
quadratic again, not wrong). Written against kopf 1.45.2. tests/unit/test_toggles.py runs the
contract scenarios on both classes; bench/toggles.py measures both side by side.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any, Awaitable, Callable, Iterable, Optional

from kopf._cogs.aiokits import aiotoggles
from kopf._core.reactor import orchestration

#: kopf's own class, kept for tests and benchmarks (and to undo install()).
KopfToggleSet = aiotoggles.ToggleSet

#: Set to "kopf" to keep kopf's own class: bench/scale.py restarts the operator both ways side by side.
BASELINE_ENV = "VLLM_OPERATOR_KOPF_TOGGLESET"


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


class _OrchestrationToggles:
    """kopf's aiotoggles module as kopf's orchestrator sees it after install(): ToggleSet is ours."""

    ToggleSet = ToggleSet

    def __getattr__(self, name: str) -> Any:
        return getattr(aiotoggles, name)


# --------------------------------------------------------------------------- self-test
#: What the scenario below must see, step by step, on kopf's class and on ours.
EXPECTED_TRACE = [("empty set is on", True), ("one toggle off", False), ("waiter held", False),
                  ("second toggle made off", False), ("first turned on, second off", False),
                  ("second dropped: released", True), ("turned off again", False), ("re-held", False),
                  ("turned on: released", True), ("any-set off while its toggle is off", True)]


async def _scenario(cls: type) -> list[tuple[str, bool]]:
    """A waiter's life in an all-set (kopf's index wait) plus the any-set's off state, as a trace."""
    async def turns() -> None:
        for _ in range(5):
            await asyncio.sleep(0)

    trace: list[tuple[str, bool]] = []
    indexed = cls(all)
    trace.append(("empty set is on", indexed.is_on()))
    first = await indexed.make_toggle(name="first")
    trace.append(("one toggle off", indexed.is_on()))
    waiter = asyncio.ensure_future(indexed.wait_for(True))
    await turns()
    trace.append(("waiter held", waiter.done()))
    second = await indexed.make_toggle(name="second")
    trace.append(("second toggle made off", indexed.is_on()))
    await first.turn_to(True)
    await turns()
    trace.append(("first turned on, second off", waiter.done()))
    await indexed.drop_toggle(second)
    await turns()
    trace.append(("second dropped: released", waiter.done()))
    await first.turn_to(False)
    again = asyncio.ensure_future(indexed.wait_for(True))
    trace.append(("turned off again", indexed.is_on()))
    await turns()
    trace.append(("re-held", again.done()))
    await first.turn_to(True)
    await turns()
    trace.append(("turned on: released", again.done()))
    paused = cls(any)
    await paused.make_toggle(name="peering")
    trace.append(("any-set off while its toggle is off", paused.is_off()))
    for task in (waiter, again):
        task.cancel()
    return trace


def _run_isolated(make: Callable[[], Awaitable[Any]], timeout: float = 5.0) -> Any:
    """Run a coroutine on a loop of its own in a thread of its own (the caller's thread keeps its event-loop
    state, whether or not it runs a loop), bounded in time."""
    async def bounded() -> Any:
        return await asyncio.wait_for(make(), timeout)

    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = asyncio.run(bounded())
        except BaseException as e:  # carried to the caller's thread
            box["error"] = e

    thread = threading.Thread(target=target, name="kopfext-toggles-self-test", daemon=True)
    thread.start()
    thread.join(timeout + 5)
    if "error" in box:
        raise box["error"]
    if "result" not in box:
        raise TimeoutError(f"the scenario's thread did not end within {timeout + 5:.0f} s")
    return box["result"]


def self_test(kopf_class: Optional[type] = None, ours: Optional[type] = None) -> Optional[str]:
    """None when this ToggleSet may replace kopf's in the index wait; else what failed."""
    kopf_class = KopfToggleSet if kopf_class is None else kopf_class
    ours = ToggleSet if ours is None else ours
    code = getattr(getattr(orchestration, "orchestrator", None), "__code__", None)
    if code is None or not {"aiotoggles", "ToggleSet"} <= set(code.co_names):
        return "kopf's orchestrator no longer builds its index wait through aiotoggles.ToggleSet"
    if getattr(orchestration, "aiotoggles", None) not in (aiotoggles, _ORCHESTRATION_TOGGLES):
        return "kopf's orchestration module no longer imports aiotoggles"
    if not issubclass(ours, kopf_class):
        return f"kopf's ToggleSet is {kopf_class.__module__}.{kopf_class.__qualname__}, not the class ours extends"
    for cls in (kopf_class, ours):
        try:
            trace = _run_isolated(lambda: _scenario(cls))
        except Exception as e:  # a hang (the timeout) or kopf's API changed
            return f"{cls.__module__}.{cls.__qualname__}: the waiter scenario failed ({type(e).__name__}: {e})"
        if trace != EXPECTED_TRACE:
            wrong = [step for step, want in zip(trace, EXPECTED_TRACE) if step != want]
            return f"{cls.__module__}.{cls.__qualname__}: the waiter scenario went otherwise at {wrong[:2]}"
    return None


_ORCHESTRATION_TOGGLES = _OrchestrationToggles()


def installed() -> bool:
    return getattr(orchestration, "aiotoggles", None) is _ORCHESTRATION_TOGGLES


def install() -> Optional[str]:
    """Make kopf's orchestrator build its index wait from this ToggleSet (before kopf.run; idempotent).

    Returns None when installed, else why kopf's own class was kept."""
    if os.environ.get(BASELINE_ENV) == "kopf":
        return f"{BASELINE_ENV}=kopf (a benchmark baseline)"
    failed = self_test()
    if failed is not None:
        return failed
    orchestration.aiotoggles = _ORCHESTRATION_TOGGLES  # type: ignore[assignment]
    return None


def uninstall() -> None:
    """kopf's own class again (tests)."""
    if installed():
        orchestration.aiotoggles = aiotoggles
