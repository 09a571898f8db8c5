"""When the autoscaler reads a server's queue next (autoscaler/schedule.py, pure): one test per rule."""

from __future__ import annotations

import pytest

from vllm_operator.autoscaler import schedule
from vllm_operator.sources.vllm_metrics import Sample

IDLE = [Sample("s-0", waiting=0, running=0, kv_cache_usage=0.0)]


def read(samples, interval=5.0, *, hold=False, since_scale=None, budget=None, now=0.0, fixed=False):
    return schedule.next_read(samples, interval, hold=hold, since_scale=since_scale,
                              budget=budget or schedule.FastReads(), now=now, fixed=fixed)


@pytest.mark.parametrize("samples", [
    [Sample("s-0", waiting=3)],
    [Sample("s-0", running=1)],
    [Sample("s-0"), Sample("s-1", waiting=0.5)],  # one working replica is enough
], ids=["waiting", "running", "one-of-two"])
def test_a_server_with_requests_waiting_or_running_is_read_every_second(samples):
    assert read(samples) == schedule.NextRead(1.0, schedule.BUSY)


def test_an_idle_server_is_read_twice_per_interval_and_never_faster_than_a_busy_one():
    assert read(IDLE) == schedule.NextRead(2.5, schedule.IDLE)
    assert read(IDLE, interval=60).seconds == 30
    assert read(IDLE, interval=1).seconds == 1  # intervalSeconds 1: as often as before, not 0.5 s
    assert read(IDLE, interval=1.5).seconds == 1
    assert read([Sample("s-0", running=2)], interval=1) == schedule.NextRead(1.0, schedule.BUSY)


def test_a_recent_scale_reads_fast_until_it_is_older_than_the_window():
    assert read(IDLE, since_scale=0.0).why == schedule.BUSY
    assert read(IDLE, since_scale=schedule.RECENT_SCALE_SECONDS).why == schedule.BUSY
    assert read(IDLE, since_scale=schedule.RECENT_SCALE_SECONDS + 0.1).why == schedule.IDLE


def test_holding_and_fixed_read_every_interval_whatever_the_queue():
    failed = [Sample.failed("s-0", "timed out"), Sample("s-1", waiting=9)]
    assert read(failed, hold=True) == schedule.NextRead(5.0, schedule.HOLDING)
    assert read(failed, hold=True, since_scale=1.0).seconds == 5.0
    assert read([Sample("s-0", waiting=9)], fixed=True) == schedule.NextRead(5.0, schedule.FIXED)
    assert read(IDLE, interval=7, fixed=True).seconds == 7
    # A failed sample is no evidence of work.
    assert not schedule.busy([Sample.failed("s-0", "timed out")], None)


def test_the_fast_reads_share_a_budget_of_scrapes_per_second():
    budget = schedule.FastReads(per_second=10)
    four = [Sample(f"s-{i}", running=1) for i in range(4)]
    assert [read(four, budget=budget, now=100.0).why for _ in range(3)] == [
        schedule.BUSY, schedule.BUSY, schedule.BUDGET_SPENT]  # 4 + 4 of 10; 4 more would be 12
    assert read(four, budget=budget, now=100.0).seconds == 2.5  # read as an idle one meanwhile
    assert read(four, budget=budget, now=100.1).why == schedule.BUDGET_SPENT  # 2 + 0.1 s x 10/s = 3 tokens
    assert read(four, budget=budget, now=100.2).why == schedule.BUSY  # 3 + 1 = 4
    # Idle reads, holds and busy reads at the idle pace never spend it.
    spent = schedule.FastReads(per_second=1, burst=1)
    assert spent.take(1, 0.0) and not spent.take(1, 0.0)
    assert read(IDLE, budget=spent).why == schedule.IDLE
    assert read(four, budget=spent, interval=1).why == schedule.BUSY
    assert read(four, budget=spent, hold=True).why == schedule.HOLDING


def test_the_budget_refills_at_its_rate_up_to_its_burst_and_ignores_a_clock_going_back():
    budget = schedule.FastReads(per_second=10, burst=20)
    assert budget.take(20, 0.0) and not budget.take(1, 0.0)
    assert budget.take(10, 1.0) and not budget.take(1, 1.0)
    assert not budget.take(1, 0.5)  # the clock went back: nothing refilled
    assert budget.take(20, 100.0) and not budget.take(1, 100.0)  # at most the burst after a long pause
