"""toggles.ToggleSet keeps kopf's ToggleSet contract: each scenario runs on both classes.

The restart it speeds up is measured by bench/toggles.py (kopf's pre-population replayed) and
bench/scale.py (a real operator restarted with 1,000 servers); here only behaviour is checked.
"""

from __future__ import annotations

import asyncio

import pytest
from kopf._cogs.aiokits import aiotoggles

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


def test_install_makes_kopfs_reactor_build_ours(monkeypatch):
    from kopf._core.reactor import orchestration, running

    monkeypatch.setattr(aiotoggles, "ToggleSet", toggles.KopfToggleSet)
    toggles.install()
    toggles.install()
    assert aiotoggles.ToggleSet is toggles.ToggleSet
    # kopf's reactor looks the class up through the module when the operator starts
    assert orchestration.aiotoggles is aiotoggles and running.aiotoggles is aiotoggles
    assert isinstance(aiotoggles.ToggleSet(all), toggles.KopfToggleSet)


def test_install_keeps_kopfs_class_when_its_shape_changed(monkeypatch):
    class Reshaped:  # a future kopf whose ToggleSet keeps no Condition shared with its toggles
        def __init__(self, fn):
            self._fn = fn

    monkeypatch.setattr(aiotoggles, "ToggleSet", toggles.KopfToggleSet)
    assert toggles.fits(toggles.KopfToggleSet) and not toggles.fits(Reshaped)
    monkeypatch.setattr(toggles, "KopfToggleSet", Reshaped)
    toggles.install()
    assert aiotoggles.ToggleSet is not toggles.ToggleSet


def test_the_benchmark_baseline_keeps_kopfs_class(monkeypatch):
    monkeypatch.setattr(aiotoggles, "ToggleSet", toggles.KopfToggleSet)
    monkeypatch.setenv(toggles.BASELINE_ENV, "kopf")
    toggles.install()
    assert aiotoggles.ToggleSet is toggles.KopfToggleSet
