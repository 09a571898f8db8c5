"""The autoscaling policy, rule by rule (policy.decide is pure: samples in, a decision out)."""

from __future__ import annotations

import pytest

from vllm_operator.api import AutoscalingSpec
from vllm_operator.autoscaler import policy
from vllm_operator.sources.vllm_metrics import Sample

NOW = 1000.0


def spec(**kw) -> AutoscalingSpec:
    base = dict(enabled=True, min_replicas=1, max_replicas=10, target_waiting_per_replica=2.0,
                scale_up_stabilization_seconds=0, scale_down_stabilization_seconds=60)
    base.update(kw)
    return AutoscalingSpec(**base)


def pods(*waiting: float, running: float = 2.0) -> list[Sample]:
    return [Sample(f"s-{i}", waiting=w, running=running, kv_cache_usage=0.5, scraped_at=NOW)
            for i, w in enumerate(waiting)]


def hist(*recs: tuple[float, int]) -> policy.History:
    """(seconds ago, recommendation) pairs."""
    return [(NOW - ago, r) for ago, r in recs]


# Each case: id, samples, current, ready, starting, spec, history, expected desired, code, limited, hold
CASES = [
    # ---- the ratio (rule 3)
    ("idle at min stays at min", pods(0), 1, 1, 0, spec(), [], 1, policy.AT_LIMIT, True, False),
    ("queue above target scales up to ceil(total/target)", pods(5), 1, 1, 0, spec(), [], 3, policy.SCALE_UP,
     False, False),
    ("the average is over ready replicas", pods(6, 0), 2, 2, 0, spec(), [], 3, policy.SCALE_UP, False, False),
    ("exactly 6/2 is 3, not 4 (no float creep)", pods(3, 3), 2, 2, 0, spec(), [], 3, policy.SCALE_UP, False,
     False),
    ("within 10% tolerance keeps the count", pods(2.2, 2.2), 2, 2, 0, spec(), [], 2, policy.WITHIN_TOLERANCE,
     False, False),
    ("just outside the tolerance acts", pods(2.3, 2.3), 2, 2, 0, spec(), [], 3, policy.SCALE_UP, False, False),
    ("at the target: steady", pods(2, 2), 2, 2, 0, spec(), [], 2, policy.WITHIN_TOLERANCE, False, False),
    ("a fractional target", pods(1), 1, 1, 0, spec(target_waiting_per_replica=0.5), [], 2, policy.SCALE_UP,
     False, False),
    # ---- scale-up stabilization (rule 4)
    ("up window 0: at once", pods(4), 1, 1, 0, spec(), hist((1, 1), (2, 1)), 2, policy.SCALE_UP, False, False),
    ("up window: the lowest recommendation in it wins", pods(8), 1, 1, 0,
     spec(scale_up_stabilization_seconds=30), hist((10, 2), (20, 4)), 2, policy.SCALE_UP, False, False),
    ("up window: a low recommendation in it holds", pods(8), 1, 1, 0,
     spec(scale_up_stabilization_seconds=30), hist((10, 1)), 1, policy.STABILIZING_UP, False, False),
    ("up window: recommendations older than it are ignored", pods(8), 1, 1, 0,
     spec(scale_up_stabilization_seconds=30), hist((31, 1), (10, 4)), 4, policy.SCALE_UP, False, False),
    # ---- scale-down stabilization (rule 4)
    ("down: held by a higher recommendation in the window", pods(0, 0, 0), 3, 3, 0, spec(),
     hist((30, 3), (10, 0)), 3, policy.STABILIZING_DOWN, False, False),
    ("down: to the highest recommendation in the window", pods(0, 0, 0), 3, 3, 0, spec(),
     hist((30, 2), (10, 0)), 2, policy.SCALE_DOWN, False, False),
    ("down: after a whole window of low recommendations", pods(0, 0, 0), 3, 3, 0, spec(),
     hist((61, 3), (30, 0), (10, 0)), 1, policy.SCALE_DOWN, True, False),
    ("down window 0: at once", pods(0, 0), 2, 2, 0, spec(scale_down_stabilization_seconds=0), hist((1, 2)),
     1, policy.SCALE_DOWN, True, False),
    ("down stops at minReplicas", pods(0, 0, 0), 3, 3, 0, spec(min_replicas=2), hist((61, 3)), 2,
     policy.SCALE_DOWN, True, False),
    ("down to a count above min is not limited", pods(1, 1, 1, 1), 4, 4, 0, spec(), hist((61, 4)), 2,
     policy.SCALE_DOWN, False, False),
    # ---- capacity on the way (rule 5)
    ("a starting replica blocks a further scale-up", pods(10), 2, 1, 1, spec(), [], 2,
     policy.WAITING_FOR_STARTING, False, False),
    ("starting replicas do not block a scale-down", pods(0, 0), 4, 2, 2, spec(), hist((61, 4)), 1,
     policy.SCALE_DOWN, True, False),
    ("without starting replicas the same queue scales up", pods(10), 2, 1, 0, spec(), [], 5, policy.SCALE_UP,
     False, False),
    # ---- bounded step (rule 6)
    ("at most +4 from a small count", pods(40), 1, 1, 0, spec(max_replicas=50), [], 5, policy.SCALE_UP, False,
     False),
    ("at most +100% from a large count", pods(*[20] * 10), 10, 10, 0, spec(max_replicas=200), [], 20,
     policy.SCALE_UP, False, False),
    # ---- clamp (rule 7)
    ("capped at maxReplicas", pods(20, 20), 2, 2, 0, spec(max_replicas=3), [], 3, policy.SCALE_UP, True, False),
    ("at maxReplicas already", pods(40, 40), 2, 2, 0, spec(max_replicas=2), [], 2, policy.AT_LIMIT, True, False),
    ("at max with a starting replica: limited, not waiting", pods(40), 2, 1, 1, spec(max_replicas=2), [], 2,
     policy.AT_LIMIT, True, False),
    # ---- bounds first (rule 1)
    ("above a lowered maxReplicas", pods(0), 5, 5, 0, spec(max_replicas=3), [], 3, policy.OUT_OF_BOUNDS, True,
     False),
    ("below a raised minReplicas", pods(0), 1, 1, 0, spec(min_replicas=2), [], 2, policy.OUT_OF_BOUNDS, True,
     False),
    ("out of bounds even without metrics", [], 0, 0, 0, spec(), [], 1, policy.OUT_OF_BOUNDS, True, False),
    # ---- missing data holds (rule 2)
    ("no ready replica: hold", [], 1, 0, 1, spec(), [], 1, policy.NO_READY_REPLICAS, False, True),
    ("one pod's scrape failed: hold, even with a long queue elsewhere",
     [*pods(50), Sample.failed("s-1", "GET http://10.0.0.2:8000/metrics: timed out", NOW)], 2, 2, 0, spec(), [],
     2, policy.METRICS_UNAVAILABLE, False, True),
    ("every scrape failed: hold, never scale down", [Sample.failed("s-0", "connection refused", NOW),
                                                     Sample.failed("s-1", "connection refused", NOW)], 2, 2, 0,
     spec(scale_down_stabilization_seconds=0), hist((120, 0)), 2, policy.METRICS_UNAVAILABLE, False, True),
    ("fewer samples than ready replicas (partial): hold", pods(0), 2, 2, 0, spec(), [], 2,
     policy.METRICS_UNAVAILABLE, False, True),
]


@pytest.mark.parametrize("samples,current,ready,starting,sp,history,desired,code,limited,hold",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(samples, current, ready, starting, sp, history, desired, code, limited, hold):
    d = policy.decide(samples, current, ready, starting, sp, history, NOW)
    assert (d.desired, d.code, d.limited, d.hold) == (desired, code, limited, hold), d.reason
    assert d.reason
    if hold:
        assert d.metric_value is None
        assert d.recommendation == current, "a hold is recorded as the current count"
    elif code != policy.OUT_OF_BOUNDS:
        assert d.metric_value == pytest.approx(sum(s.waiting for s in samples) / ready)
    if limited:
        assert d.limit_reason.startswith(("at maxReplicas", "at minReplicas"))


def test_reasons_say_why_in_numbers():
    d = policy.decide(pods(5), 1, 1, 0, spec(max_replicas=2), [], NOW)
    assert d.reason == "scale up 1 -> 2: 5 waiting per ready replica (5 over 1 ready) vs target 2 " \
                       "(capped at maxReplicas 2)"
    assert d.limit_reason == "at maxReplicas 2 (recommendation 3)"
    d = policy.decide(pods(10), 2, 1, 1, spec(), [], NOW)
    assert "1 replica still starting count as capacity on the way" in d.reason and "recommends 5" in d.reason
    d = policy.decide([Sample.failed("s-0", "GET http://1.2.3.4:8000/metrics: connection refused", NOW)],
                      1, 1, 0, spec(), [], NOW)
    assert d.reason == ("holding 1: metrics missing for s-0 (GET http://1.2.3.4:8000/metrics: connection refused)"
                        " (never scales on missing data)")
    d = policy.decide(pods(0, 0, 0), 3, 3, 0, spec(), hist((61, 3)), NOW)
    assert d.reason.startswith("scale down 3 -> 1: 0 waiting per ready replica") and d.reason.endswith("for 60s")


def test_missing_data_then_recovery_needs_a_whole_window_before_scaling_down():
    """Holds are recorded as the current count: data that comes back low does not scale down at once."""
    sp = spec(scale_down_stabilization_seconds=20)
    history: policy.History = []
    t = NOW
    for _ in range(10):  # 20 s of failed scrapes at 2 replicas
        d = policy.decide([Sample.failed("s-0", "timed out", t), *pods(0)[:0]], 2, 1, 0, sp, history, t)
        assert d.hold and d.desired == 2
        history = policy.record(history, t, d, sp, 2)
        t += 2
    replicas, first_down = 2, None
    for _ in range(15):  # data is back and says 0
        d = policy.decide(pods(0, 0), replicas, 2, 0, sp, history, t)
        history = policy.record(history, t, d, sp, 2)
        if d.desired < replicas and first_down is None:
            first_down = t
        replicas = d.desired
        t += 2
    assert replicas == 1
    assert first_down - (NOW + 20) >= 20, "the scale-down waited a full window after the data came back"


def test_a_slow_model_load_does_not_cascade():
    """A queue that keeps growing while the new replica loads for 80 s asks for one step, not one per tick."""
    sp = spec(max_replicas=10, target_waiting_per_replica=4, scale_down_stabilization_seconds=60)
    history: policy.History = []
    replicas, ready, t, waiting = 1, 1, NOW, 0.0
    decisions = []
    for tick in range(60):  # 120 s at a 2 s interval; the queue grows by 1.2 per tick
        waiting += 1.2
        starting = replicas - ready
        d = policy.decide(pods(waiting) + pods(*[0] * (ready - 1)), replicas, ready, starting, sp, history, t)
        history = policy.record(history, t, d, sp, 2)
        decisions.append(d)
        replicas = d.desired
        if tick == 45:  # the new replica finished loading
            ready = replicas
        t += 2
    changes = [(i, d.desired) for i, d in enumerate(decisions) if d.code == policy.SCALE_UP]
    assert changes[0] == (3, 2), "scaled up once the queue first passed the target (+10%)"
    assert all(i > 45 for i, _ in changes[1:]), f"no scale-up while the replica was loading: {changes}"
    assert any(d.code == policy.WAITING_FOR_STARTING for d in decisions[4:45])


def test_record_keeps_the_longest_window_only():
    sp = spec(scale_up_stabilization_seconds=10, scale_down_stabilization_seconds=30)
    d = policy.Decision(2, "x", 1.0, recommendation=2)
    h = policy.record(hist((100, 5), (35, 4), (31, 3), (5, 1)), NOW, d, sp, interval=2)
    assert h == [(NOW - 31, 3), (NOW - 5, 1), (NOW, 2)]
    assert policy.record([], NOW, policy.Decision(1, "x", None, recommendation=None), sp) == []


def test_bounds_default_max_to_min():
    assert policy.bounds(spec(min_replicas=2, max_replicas=None)) == (2, 2)
    assert policy.clamp(7, spec(max_replicas=4)) == 4
    assert policy.clamp(0, spec()) == 1


# Rule 3b: the running requests set a floor for scale-down (slots = vLLM's --max-num-seqs).
FLOOR_CASES = [
    # id, waiting per pod, running per pod, current, slots, expected desired, reason part
    ("closed loop at 2 replicas: 2 waiting each would say 1, the 4 running need 2", [2, 2], [2, 2], 2, 2, 2,
     "the 4 running need 2 replicas at --max-num-seqs 2"),
    ("the same without knowing the slots scales down", [2, 2], [2, 2], 2, None, 1, "scale down 2 -> 1"),
    ("down to what the running need, not further", [0, 0, 0], [2, 2, 0], 3, 2, 2, "scale down 3 -> 2"),
    ("idle: no floor", [0, 0], [0, 0], 2, 2, 1, "scale down 2 -> 1"),
    ("the floor never scales up (more running than the slots say)", [0], [5], 1, 2, 1, "the 5 running need 1"),
]


@pytest.mark.parametrize("waiting,running,current,slots,desired,reason",
                         [c[1:] for c in FLOOR_CASES], ids=[c[0] for c in FLOOR_CASES])
def test_running_requests_floor(waiting, running, current, slots, desired, reason):
    samples = [Sample(f"s-{i}", waiting=w, running=r) for i, (w, r) in enumerate(zip(waiting, running))]
    sp = spec(target_waiting_per_replica=4)
    d = policy.decide(samples, current, current, 0, sp, hist((61, current)), NOW, slots=slots)
    assert d.desired == desired and reason in d.reason, d.reason


def test_closed_loop_load_does_not_flap():
    """8 clients back to back, --max-num-seqs 2, target 4: 1 replica queues 6 -> 2 replicas; at 2
    each queues 2 (below target) but runs 2: it stays at 2 instead of going down and up again."""
    sp = spec(target_waiting_per_replica=4, scale_down_stabilization_seconds=20)
    history: policy.History = []
    replicas, t, changes = 1, NOW, []
    for _ in range(300):  # 10 minutes at a 2 s interval
        per = 8 / replicas
        samples = [Sample(f"s-{i}", waiting=max(0.0, per - 2), running=min(2.0, per)) for i in range(replicas)]
        d = policy.decide(samples, replicas, replicas, 0, sp, history, t, slots=2)
        history = policy.record(history, t, d, sp, 2)
        if d.desired != replicas:
            changes.append((t - NOW, replicas, d.desired))
        replicas = d.desired
        t += 2
    assert changes == [(0, 1, 2)], changes
