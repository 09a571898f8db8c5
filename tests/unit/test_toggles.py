"""toggles.ToggleSet keeps kopf's ToggleSet contract: each scenario runs on both classes; install() gives it
to kopf's orchestrator only, and only while its self-test passes on the installed kopf.

The restart it speeds up is measured by bench/toggles.py (kopf's pre-population replayed) and
bench/scale.py (a real operator restarted with 1,000 servers); here only behaviour is checked.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys

import kopf
import pytest
from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.structs import references
from kopf._core.reactor import orchestration, running

from vllm_operator.kopfext import toggles

CLASSES = [pytest.param(toggles.KopfToggleSet, id="kopf"), pytest.param(toggles.ToggleSet, id="ours")]


async def settle() -> None:
    """Let every task that can run, run (no I/O here, so a few loop turns decide everything)."""
    for _ in range(10):
        await asyncio.sleep(0)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


@pytest.mark.parametrize("cls", CLASSES)
def test_all_set_waits_until_every_toggle_is_on_or_dropped(cls):
    async def scenario():
        toggles = cls(all)
        await toggles.wait_for(True)  # empty: on
        a = await toggles.make_toggle(name="a")
        b = await toggles.make_toggle(True, name="b")
        assert toggles.is_off() and len(toggles) == 2 and a in toggles
        waiter = asyncio.create_task(toggles.wait_for(True))
        off_waiter = asyncio.create_task(toggles.wait_for(False))
        await settle()
        assert not waiter.done() and off_waiter.done()
        c = await toggles.make_toggle(name="c")
        await a.turn_to(True)
        await settle()
        assert not waiter.done(), "c is still off"
        await toggles.drop_toggle(c)
        await settle()
        assert waiter.done() and toggles.is_on()
        await b.turn_to(False)
        assert toggles.is_off()
        again = asyncio.create_task(toggles.wait_for(True))
        await settle()
        assert not again.done()
        await toggles.drop_toggles([b])
        await settle()
        assert again.done() and list(toggles) == [a]

    run(scenario())


@pytest.mark.parametrize("cls", CLASSES)
def test_any_set_pauses_and_resumes_like_peering(cls):
    """kopf's operator_paused is a ToggleSet(any): on while any peering toggle is on."""
    async def scenario():
        paused = cls(any)
        assert paused.is_off()
        toggle = await paused.make_toggle(name="peering")
        resumed = asyncio.create_task(paused.wait_for(False))
        await settle()
        assert resumed.done()
        await toggle.turn_to(True)
        assert paused.is_on()
        resumed = asyncio.create_task(paused.wait_for(False))
        pause_seen = asyncio.create_task(paused.wait_for(True))
        await settle()
        assert pause_seen.done() and not resumed.done()
        await toggle.turn_to(False)
        await settle()
        assert resumed.done()

    run(scenario())


@pytest.mark.parametrize("cls", CLASSES)
def test_a_cancelled_waiter_leaves_the_others_waiting_and_released(cls):
    async def scenario():
        toggles = cls(all)
        toggle = await toggles.make_toggle(name="x")
        first, second = (asyncio.create_task(toggles.wait_for(True)) for _ in range(2))
        await settle()
        first.cancel()
        await settle()
        assert first.cancelled() and not second.done()
        await toggle.turn_to(True)
        await settle()
        assert second.done() and second.exception() is None

    run(scenario())


@pytest.mark.parametrize("cls", CLASSES)
def test_kopf_prepopulation_releases_no_worker_before_the_last_object_is_indexed(cls):
    """kopf's start-up: a blocker, a toggle per kind, a toggle per object; each worker drops its own
    toggle and waits for the whole set (kopf/_core/reactor/processing.py)."""
    async def scenario():
        indexed = cls(all)
        blocker = await indexed.make_toggle(name="orchestration blocker")
        kinds = [await indexed.make_toggle(name=kind) for kind in ("servers", "pods")]
        released = []

        async def worker(i, toggle):
            await indexed.drop_toggle(toggle)
            await indexed.wait_for(True)
            released.append(i)

        workers = [asyncio.create_task(worker(i, await indexed.make_toggle(name=str(i)))) for i in range(300)]
        await settle()
        assert released == [] and len(indexed) == 3
        for toggle in kinds:
            await indexed.drop_toggle(toggle)
        await settle()
        assert released == [], "the blocker still holds"
        await indexed.drop_toggle(blocker)
        await asyncio.gather(*workers)
        assert sorted(released) == list(range(300))

    run(scenario())


@pytest.fixture
def kopf_as_shipped(monkeypatch):
    """kopf's modules as the package left them, restored after the test."""
    monkeypatch.setattr(aiotoggles, "ToggleSet", toggles.KopfToggleSet)
    monkeypatch.setattr(orchestration, "aiotoggles", aiotoggles)
    monkeypatch.delenv(toggles.BASELINE_ENV, raising=False)
    yield


def captured_index_wait(monkeypatch) -> object:
    """Run kopf's own orchestrator (no resources) until it has built its index wait; return that set."""
    built = []

    class Capturing(orchestration.Ensemble):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            built.append(self.operator_indexed)

    monkeypatch.setattr(orchestration, "Ensemble", Capturing)

    async def scenario():
        task = asyncio.create_task(orchestration.orchestrator(
            processor=lambda **_: None, settings=kopf.OperatorSettings(), identity="test",
            insights=references.Insights(), operator_paused=aiotoggles.ToggleSet(any)))
        while not built:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    run(scenario())
    return built[0]


def test_the_self_test_passes_on_the_installed_kopf():
    assert toggles.self_test() is None


def test_install_gives_kopfs_orchestrator_ours_and_the_rest_of_kopf_its_own(kopf_as_shipped, monkeypatch):
    assert type(captured_index_wait(monkeypatch)) is toggles.KopfToggleSet
    assert toggles.install() is None and toggles.install() is None  # idempotent
    assert toggles.installed()
    assert type(captured_index_wait(monkeypatch)) is toggles.ToggleSet  # kopf's own orchestrator builds ours
    # peering's pause (kopf's operator_paused, built in running.py) and anything else keep kopf's class
    assert running.aiotoggles.ToggleSet is toggles.KopfToggleSet is aiotoggles.ToggleSet
    assert orchestration.aiotoggles.Toggle is aiotoggles.Toggle
    toggles.uninstall()
    assert orchestration.aiotoggles is aiotoggles


def load_against(monkeypatch, kopf_class: type):
    """A fresh copy of toggles.py imported while kopf's aiotoggles.ToggleSet is `kopf_class` (a future kopf)."""
    monkeypatch.setattr(aiotoggles, "ToggleSet", kopf_class)
    spec = importlib.util.spec_from_file_location("reshaped_toggles", toggles.__file__)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "reshaped_toggles", module)
    spec.loader.exec_module(module)
    return module


class ConditionRenamed(toggles.KopfToggleSet):
    """A future kopf whose set and toggles share a condition kept under another name: kopf's own waits still
    work, ours would never be notified."""

    def __init__(self, fn):
        super().__init__(fn)
        self._shared = self._condition

    async def make_toggle(self, __val=False, *, name=None):
        toggle = aiotoggles.Toggle(__val, name=name, condition=self._shared)
        async with self._shared:
            self._toggles.add(toggle)
            self._shared.notify_all()
        return toggle

    async def drop_toggle(self, toggle):
        async with self._shared:
            self._toggles.discard(toggle)
            self._shared.notify_all()

    async def wait_for(self, __state):
        async with self._shared:
            await self._shared.wait_for(lambda: self.is_on() == bool(__state))


class ArgumentsChanged(toggles.KopfToggleSet):
    """A future kopf whose ToggleSet takes its function by keyword only."""

    def __init__(self, *, fn=all):
        super().__init__(fn)


@pytest.mark.parametrize("reshaped", [ConditionRenamed, ArgumentsChanged])
def test_a_reshaped_toggleset_keeps_kopfs_class_in_the_orchestrator(kopf_as_shipped, monkeypatch, reshaped):
    module = load_against(monkeypatch, reshaped)
    reason = module.self_test()
    assert reason is not None and "scenario" in reason
    assert module.install() == reason
    assert orchestration.aiotoggles is aiotoggles and not module.installed()
    if reshaped is ConditionRenamed:  # kopf's own class still passes its half of the scenario: ours failed
        assert reason.startswith("reshaped_toggles.ToggleSet")
        assert run(toggles._scenario(reshaped)) == toggles.EXPECTED_TRACE


def test_an_orchestrator_that_builds_its_wait_otherwise_keeps_kopfs_class(kopf_as_shipped, monkeypatch):
    async def orchestrator(**_):  # a future kopf: the set is built elsewhere
        return None

    monkeypatch.setattr(orchestration, "orchestrator", orchestrator)
    assert "orchestrator" in (toggles.install() or "")
    assert not toggles.installed()


def test_the_benchmark_baseline_keeps_kopfs_class(kopf_as_shipped, monkeypatch):
    monkeypatch.setenv(toggles.BASELINE_ENV, "kopf")
    assert toggles.BASELINE_ENV in (toggles.install() or "")
    assert orchestration.aiotoggles is aiotoggles
