"""policy.decide held to the rules' behaviour on generated inputs: the same Decisions as the single-function
decide it was cut from (a verbatim copy below, `reference_decide`), and the invariants the module docstring
promises, whatever the queue, history and spec.

When a rule changes on purpose, change `reference_decide` with it (or drop the comparison); the invariants stay.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_operator.api import AUTOSCALING_TOLERANCE, AutoscalingSpec
from vllm_operator.autoscaler import policy
from vllm_operator.sources.vllm_metrics import Sample

NOW = 10_000.0


# --------------------------------------------------------------------------- the decide that was cut (verbatim)
def reference_decide(samples: Sequence[Sample], current: int, ready: int, starting: int, spec: AutoscalingSpec,
                     history: policy.History, now: float, slots: Optional[int] = None) -> policy.Decision:
    """The replica count to run now, for a StatefulSet at `current` replicas of which `ready`
    serve (one sample each, in `samples`) and `starting` are still on their way; `slots` is
    the requests one replica runs at once (vLLM's --max-num-seqs), when known."""
    lo, hi = policy.bounds(spec)
    target = spec.target_waiting_per_replica

    # 1. bounds (the spec changed under us)
    if current < lo or current > hi:
        desired = policy.clamp(current, spec)
        which = f"minReplicas {lo}" if current < lo else f"maxReplicas {hi}"
        reason = f"{current} replicas is outside [{lo}, {hi}]: set to {which}"
        return policy.Decision(desired, reason, None, limited=True, code=policy.OUT_OF_BOUNDS, recommendation=desired,
                        limit_reason=f"at {which}")

    # 2. missing data holds
    failed = [s for s in samples if not s.ok]
    if ready == 0 or not samples:
        on_way = f" ({policy._plural(starting, 'replica')} starting)" if starting else ""
        return policy.Decision(current, f"no ready replica to read metrics from{on_way}: holding {current}", None,
                        hold=True, code=policy.NO_READY_REPLICAS, recommendation=current)
    if failed or len(samples) != ready:
        what = [f"{s.pod} ({s.error})" for s in failed]
        if len(samples) != ready:
            what.append(f"{ready - len(samples)} ready replica(s) without an address")
        return policy.Decision(current, f"holding {current}: metrics missing for " + "; ".join(what)
                        + " (never scales on missing data)", None, hold=True, code=policy.METRICS_UNAVAILABLE,
                        recommendation=current)

    # 3. the ratio
    waiting = sum(s.waiting for s in samples)
    avg = waiting / ready
    ratio = avg / target
    measured = (f"{policy._num(avg)} waiting per ready replica ({policy._num(waiting)} over {ready} ready) "
                f"vs target {policy._num(target)}")
    within = abs(ratio - 1.0) <= AUTOSCALING_TOLERANCE + 1e-9  # 2.2 / 2 is 1.1000000000000003
    if within:
        recommendation = current
    else:
        # ceil(ratio x ready) == ceil(total / target); round first so 6/2 is 3, not 3.0000000001.
        recommendation = math.ceil(round(waiting / target, 9))
    # 3b. a short queue says capacity suffices, not that fewer replicas would: never go below
    # what the running requests need at `slots` each (it never asks for more than `current`).
    running = sum(s.running for s in samples)
    floor = min(current, math.ceil(round(running / slots, 9))) if slots else 0
    if recommendation < floor:
        recommendation = floor
        measured += f"; the {policy._num(running)} running need {floor} replicas at --max-num-seqs {slots}"

    # 4. stabilization
    up_window = [r for t, r in history if now - t <= spec.scale_up_stabilization_seconds] + [recommendation]
    down_window = [r for t, r in history if now - t <= spec.scale_down_stabilization_seconds] + [recommendation]
    up, down = min(up_window), max(down_window)
    if up > current:
        stabilized = up
    elif down < current:
        stabilized = down
    else:
        stabilized = current

    def result(desired: int, reason: str, code: str, wanted: Optional[int] = None) -> policy.Decision:
        # `wanted`: what the queue asked for when a bound cut it (None: not cut).
        limit = ""
        if wanted is not None and wanted > hi:
            limit = f"at maxReplicas {hi} (recommendation {wanted})"
        elif wanted is not None and wanted < lo:
            limit = f"at minReplicas {lo} (recommendation {wanted})"
        return policy.Decision(desired, reason, avg, limited=bool(limit), code=code, recommendation=recommendation,
                        limit_reason=limit)

    if stabilized == current:
        if recommendation > current == hi:
            return result(current, f"{measured}: recommends {recommendation}; at maxReplicas {hi}", policy.AT_LIMIT,
                          recommendation)
        if recommendation < current == lo:
            return result(current, f"{measured}: recommends {recommendation}; at minReplicas {lo}", policy.AT_LIMIT,
                          recommendation)
        if recommendation > current:
            return result(current, f"{measured}: recommends {recommendation}, but not for the whole "
                          f"{spec.scale_up_stabilization_seconds}s scale-up window; keeping {current}", policy.STABILIZING_UP)
        if recommendation < current:
            return result(current, f"{measured}: recommends {recommendation}, but {down} within "
                          f"the last {spec.scale_down_stabilization_seconds}s; keeping {current}", policy.STABILIZING_DOWN)
        code = policy.WITHIN_TOLERANCE if within else policy.STEADY
        return result(current, f"{measured}: keeping {current}", code)

    if stabilized > current:
        if current >= hi:
            return result(current, f"{measured}: recommends {stabilized}; at maxReplicas {hi}", policy.AT_LIMIT, stabilized)
        # 5. capacity on the way
        if starting > 0:
            return result(current, f"{measured}: recommends {min(stabilized, hi)}, but {policy._plural(starting, 'replica')} "
                          f"still starting count as capacity on the way; no further scale-up until "
                          f"{'it is' if starting == 1 else 'they are'} ready", policy.WAITING_FOR_STARTING)
        # 6. bounded step, 7. clamp
        step = max(policy.MIN_SCALE_UP_STEP, math.ceil(current * policy.SCALE_UP_PERCENT / 100))
        desired = min(stabilized, current + step, hi)
        why = ""
        if desired < min(stabilized, hi):
            why = f" (at most +{step} per decision)"
        elif stabilized > hi:
            why = f" (capped at maxReplicas {hi})"
        return result(desired, f"scale up {current} -> {desired}: {measured}{why}", policy.SCALE_UP,
                      stabilized if stabilized > hi else None)

    desired = max(stabilized, lo)
    if desired == current:
        return result(current, f"{measured}: recommends {stabilized}; at minReplicas {lo}", policy.AT_LIMIT, stabilized)
    window = (f" for {spec.scale_down_stabilization_seconds}s" if spec.scale_down_stabilization_seconds else "")
    return result(desired, f"scale down {current} -> {desired}: {measured}{window}", policy.SCALE_DOWN,
                  stabilized if stabilized < lo else None)


# --------------------------------------------------------------------------- generated inputs
def _spec(draw) -> AutoscalingSpec:
    lo = draw(st.integers(0, 5))
    return AutoscalingSpec(enabled=True, min_replicas=lo,
                           max_replicas=draw(st.one_of(st.none(), st.integers(max(1, lo), lo + 9), st.integers(1, 12))),
                           target_waiting_per_replica=draw(st.sampled_from([0.5, 1.0, 2.0, 2.2, 3.3, 4.0, 7.5])),
                           scale_up_stabilization_seconds=draw(st.sampled_from([0, 10, 30, 120])),
                           scale_down_stabilization_seconds=draw(st.sampled_from([0, 20, 60, 300])),
                           interval_seconds=draw(st.sampled_from([1, 2, 5, 30])))


_waiting = st.one_of(st.integers(0, 40).map(float), st.sampled_from([0.1, 1.9, 2.2, 2.3, 4.4, 6.6]),
                     st.floats(0, 100, allow_nan=False))


@st.composite
def _sample(draw, i: int) -> Sample:
    if draw(st.integers(0, 19)) == 0:
        return Sample.failed(f"s-{i}", draw(st.sampled_from(["timed out", "connection refused"])), NOW)
    return Sample(f"s-{i}", waiting=draw(_waiting), running=draw(st.integers(0, 8).map(float)), scraped_at=NOW)


@st.composite
def situations(draw) -> dict:
    """A spec, a replica count, the ready pods' samples (mostly one per ready pod, sometimes not), the starting
    replicas, a history of recommendations and --max-num-seqs."""
    sp = _spec(draw)
    lo, hi = policy.bounds(sp)
    current = draw(st.integers(lo, hi)) if draw(st.integers(0, 9)) else draw(st.integers(0, 14))  # mostly in bounds
    n = draw(st.integers(0, min(current + 1, 8)))
    samples = [draw(_sample(i)) for i in range(n)]
    ready = n if draw(st.integers(0, 9)) else draw(st.integers(0, 8))  # mostly one sample per ready pod
    up, down = sp.scale_up_stabilization_seconds, sp.scale_down_stabilization_seconds
    ages = st.one_of(st.sampled_from([up, down, up + 0.5, down + 0.5, max(0, down - 1)]),  # at a window's edge
                     st.floats(0, 400, allow_nan=False))
    history = [(NOW - ago, r) for ago, r in draw(st.lists(st.tuples(ages, st.integers(0, 14)), max_size=6))]
    return dict(samples=samples, current=current, ready=ready, starting=draw(st.integers(0, 3)), spec=sp,
                history=sorted(history), now=NOW, slots=draw(st.one_of(st.none(), st.integers(1, 8))))


# --------------------------------------------------------------------------- the same decisions as before the cut
@settings(max_examples=500, deadline=None)
@given(situations())
def test_decide_decides_as_the_function_it_was_cut_from(s):
    assert policy.decide(**s) == reference_decide(**s)


@settings(max_examples=200, deadline=None)
@given(situations(), st.floats(0, 600), st.booleans())
def test_decide_with_zero_decides_as_before_the_cut(s, idle_for, woken):
    sp = s["spec"].model_copy(update={"min_replicas": 0})
    args = dict(s, spec=sp, idle=policy.Idle(idle_for, woken))
    new = policy.decide_with_zero(**args)
    with mock.patch.object(policy, "decide", reference_decide):  # decide_with_zero's rules 1-7, as they were
        old = policy.decide_with_zero(**args)
    assert new == old


# --------------------------------------------------------------------------- what the rules promise
def _window_max(history: policy.History, window: int, recommendation: int) -> int:
    return max([r for t, r in history if NOW - t <= window] + [recommendation])


@settings(max_examples=500, deadline=None)
@given(situations())
def test_the_rules_hold_whatever_the_input(s):
    d = policy.decide(**s)
    sp, current, samples, ready = s["spec"], s["current"], s["samples"], s["ready"]
    lo, hi = policy.bounds(sp)
    # 7 (and 1): the count decided is always within [minReplicas, maxReplicas]
    assert lo <= d.desired <= hi
    if not lo <= current <= hi:
        assert d.code == policy.OUT_OF_BOUNDS and d.limited
        return
    # 2: never scales on data it does not have, and says it holds
    missing = ready == 0 or not samples or any(not x.ok for x in samples) or len(samples) != ready
    assert d.hold == missing
    if d.hold:
        assert d.desired == current and d.metric_value is None and d.recommendation == current
        return
    assert d.metric_value == sum(x.waiting for x in samples) / ready
    # 5 and 6: up by at most max(4, 100%) per decision, and not at all while replicas are starting
    if d.desired > current:
        assert s["starting"] == 0 and d.code == policy.SCALE_UP
        assert d.desired <= current + max(policy.MIN_SCALE_UP_STEP, math.ceil(current * policy.SCALE_UP_PERCENT / 100))
    # 4: down only to the highest recommendation of the down window (this decision's included)
    if d.desired < current:
        assert d.code == policy.SCALE_DOWN
        assert d.desired == max(lo, _window_max(s["history"], sp.scale_down_stabilization_seconds,
                                                d.recommendation))
        # 3: never below what the running requests need at --max-num-seqs each
        if s["slots"]:
            assert d.desired >= min(current, math.ceil(round(sum(x.running for x in samples) / s["slots"], 9)))
    # every decision on data leaves a recommendation for the history (rule 4 reads it next time)
    assert d.recommendation is not None and d.recommendation >= 0
    if d.limited:
        assert d.limit_reason.startswith(("at maxReplicas", "at minReplicas"))
