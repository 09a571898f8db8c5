"""Decide the replica count from vLLM's queue. Pure: no I/O, no clock; every rule is table-tested.

The rules, in the order `decide` applies them:

1. Bounds first: a count outside [minReplicas, maxReplicas] (the spec changed) is clamped.
2. Missing data holds: no ready replica, or any ready replica without a sample (scrape
   failed, Prometheus down, stale or partial answer) -> keep the current count. Never scale
   on data we do not have; a hold is also recorded as a recommendation of the current
   count, so a scale-down needs a full window of good data after the data comes back.
3. The HPA's ratio: ``ratio = (waiting per ready replica) / targetWaitingPerReplica``;
   within the tolerance (10%) the recommendation is the current count, else
   ``ceil(ratio x ready)`` = ``ceil(total waiting / target)``. Pods still loading never
   count in the average: they have no queue yet. But never below the replicas the running
   requests need (running / --max-num-seqs): with enough replicas the queue is empty, and a
   queue-only rule would then scale down into a queue again, and up, and down (flapping).
4. Stabilization, as the HPA does it: scale up to the *lowest* recommendation of the last
   scaleUpStabilizationSeconds (0: at once), scale down only to the *highest* of the last
   scaleDownStabilizationSeconds.
5. Capacity on the way: while replicas are still starting (scheduled, loading the model),
   no further scale-up. The queue keeps growing while a model loads for minutes; acting on
   that growth would add replica after replica (a cascade) for a backlog the replicas
   already on their way will serve.
6. A bounded step: at most max(4, 100%) more replicas per decision (the HPA's default).
7. Clamp to [minReplicas, maxReplicas]; ``limited`` says the recommendation was cut.

Each rule is one function, in that order: `_bounds_first`, `_missing_data_holds`, `_the_ratio` (with
`_running_floor`), `_stabilize`, `_capacity_on_the_way`, `_bounded_step` (and `_scale_down` on the way down).

With minReplicas 0 (`decide_with_zero`, docs/scale-to-zero.md), around the rules above:

0. At zero replicas there is no queue to read: a request that found no pod at the endpoint picker (`Idle.woken`)
   scales to one replica at once; otherwise the count stays at zero.
8. Above zero the rules above run with a floor of one replica (the queue alone never empties a server), and
   the server goes to zero only when no request was running or waiting on any ready replica at every read for
   scaleToZero.idleSeconds (`Idle.idle_for`, kept by the caller), with full data (a hold never scales to zero).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from ..api import AUTOSCALING_TOLERANCE, AutoscalingSpec
from ..sources.vllm_metrics import Sample

#: Scale up by at most max(MIN_SCALE_UP_STEP replicas, SCALE_UP_PERCENT% of current) per decision.
MIN_SCALE_UP_STEP = 4
SCALE_UP_PERCENT = 100

#: Decision codes (the AutoscalingActive condition's reason).
SCALE_UP = "ScaleUp"
SCALE_DOWN = "ScaleDown"
STEADY = "Steady"
WITHIN_TOLERANCE = "WithinTolerance"
STABILIZING_UP = "ScaleUpStabilizing"
STABILIZING_DOWN = "ScaleDownStabilizing"
WAITING_FOR_STARTING = "WaitingForStartingReplicas"
AT_LIMIT = "AtLimit"
OUT_OF_BOUNDS = "OutOfBounds"
METRICS_UNAVAILABLE = "MetricsUnavailable"
NO_READY_REPLICAS = "NoReadyReplicas"
SCALE_TO_ZERO = "ScaleToZero"
SCALED_TO_ZERO = "ScaledToZero"
SCALE_FROM_ZERO = "ScaleFromZero"

History = list[tuple[float, int]]


@dataclass(frozen=True)
class Decision:
    """What to do, and why (the reason is written to status and events as is)."""

    desired: int
    reason: str
    metric_value: Optional[float]
    """Average requests waiting per ready replica; None when the metrics were missing."""
    limited: bool = False
    """The recommendation was cut to minReplicas or maxReplicas."""
    hold: bool = False
    """Metrics were missing: the count is held, not decided."""
    code: str = STEADY
    recommendation: Optional[int] = None
    """What the caller appends to its history for later stabilization (see `record`)."""
    limit_reason: str = ""
    """Why ``limited``: "at maxReplicas 4 (recommendation 9)" or the minReplicas equivalent."""


def clamp(n: int, spec: AutoscalingSpec) -> int:
    return max(spec.min_replicas, min(n, bounds(spec)[1]))


def bounds(spec: AutoscalingSpec) -> tuple[int, int]:
    lo = spec.min_replicas
    return lo, max(lo, spec.max_replicas or lo)


def record(history: History, now: float, decision: Decision, spec: AutoscalingSpec,
           interval: float = 0.0) -> History:
    """The history with this decision's recommendation appended and entries older than the
    longest stabilization window (plus one interval) dropped."""
    keep = max(spec.scale_up_stabilization_seconds, spec.scale_down_stabilization_seconds) + interval
    kept = [(t, r) for t, r in history if now - t <= keep]
    if decision.recommendation is not None:
        kept.append((now, decision.recommendation))
    return kept


def _num(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".") if x != int(x) else str(int(x))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _bounds_first(current: int, spec: AutoscalingSpec) -> Optional[Decision]:
    """Rule 1: the decision for a count outside [minReplicas, maxReplicas] (the spec changed under us), else None."""
    lo, hi = bounds(spec)
    if lo <= current <= hi:
        return None
    desired = clamp(current, spec)
    which = f"minReplicas {lo}" if current < lo else f"maxReplicas {hi}"
    reason = f"{current} replicas is outside [{lo}, {hi}]: set to {which}"
    return Decision(desired, reason, None, limited=True, code=OUT_OF_BOUNDS, recommendation=desired,
                    limit_reason=f"at {which}")


def _missing_data_holds(samples: Sequence[Sample], current: int, ready: int, starting: int) -> Optional[Decision]:
    """Rule 2: the hold at `current` when a ready replica has no good sample (or none is ready), else None."""
    failed = [s for s in samples if not s.ok]
    if ready == 0 or not samples:
        on_way = f" ({_plural(starting, 'replica')} starting)" if starting else ""
        return Decision(current, f"no ready replica to read metrics from{on_way}: holding {current}", None,
                        hold=True, code=NO_READY_REPLICAS, recommendation=current)
    if failed or len(samples) != ready:
        what = [f"{s.pod} ({s.error})" for s in failed]
        if len(samples) != ready:
            what.append(f"{ready - len(samples)} ready replica(s) without an address")
        return Decision(current, f"holding {current}: metrics missing for " + "; ".join(what)
                        + " (never scales on missing data)", None, hold=True, code=METRICS_UNAVAILABLE,
                        recommendation=current)
    return None


@dataclass(frozen=True)
class _Reading:
    """The queue as rule 3 reads it: the average, the recommendation, and the words that say how."""

    avg: float
    """Requests waiting per ready replica."""
    recommendation: int
    """The replica count the queue asks for (after the running floor)."""
    within: bool
    """The ratio was within the tolerance (the recommendation is the current count)."""
    measured: str
    """The measurement in words, the start of every reason."""


def _the_ratio(samples: Sequence[Sample], current: int, ready: int, target: float,
               slots: Optional[int]) -> _Reading:
    """Rule 3: the HPA's ratio of waiting per ready replica to the target, floored by the running requests."""
    waiting = sum(s.waiting for s in samples)
    avg = waiting / ready
    ratio = avg / target
    measured = (f"{_num(avg)} waiting per ready replica ({_num(waiting)} over {ready} ready) "
                f"vs target {_num(target)}")
    within = abs(ratio - 1.0) <= AUTOSCALING_TOLERANCE + 1e-9  # 2.2 / 2 is 1.1000000000000003
    if within:
        recommendation = current
    else:
        # ceil(ratio x ready) == ceil(total / target); round first so 6/2 is 3, not 3.0000000001.
        recommendation = math.ceil(round(waiting / target, 9))
    recommendation, measured = _running_floor(samples, current, slots, recommendation, measured)
    return _Reading(avg, recommendation, within, measured)


def _running_floor(samples: Sequence[Sample], current: int, slots: Optional[int], recommendation: int,
                   measured: str) -> tuple[int, str]:
    """Rule 3's floor: the recommendation raised to what the running requests need at `slots` each, and the
    measurement saying so when it was raised."""
    # A short queue says capacity suffices, not that fewer replicas would: never go below
    # what the running requests need at `slots` each (it never asks for more than `current`).
    running = sum(s.running for s in samples)
    floor = min(current, math.ceil(round(running / slots, 9))) if slots else 0
    if recommendation < floor:
        recommendation = floor
        measured += f"; the {_num(running)} running need {floor} replicas at --max-num-seqs {slots}"
    return recommendation, measured


def _stabilize(recommendation: int, current: int, spec: AutoscalingSpec, history: History,
               now: float) -> tuple[int, int]:
    """Rule 4: the stabilized count (the lowest recommendation of the up window when above `current`, the
    highest of the down window when below), and that highest of the down window."""
    up_window = [r for t, r in history if now - t <= spec.scale_up_stabilization_seconds] + [recommendation]
    down_window = [r for t, r in history if now - t <= spec.scale_down_stabilization_seconds] + [recommendation]
    up, down = min(up_window), max(down_window)
    if up > current:
        stabilized = up
    elif down < current:
        stabilized = down
    else:
        stabilized = current
    return stabilized, down


def _decided(reading: _Reading, spec: AutoscalingSpec, desired: int, reason: str, code: str,
             wanted: Optional[int] = None) -> Decision:
    """A decision on a full reading; `wanted`: what the queue asked for when a bound cut it (None: not cut)."""
    lo, hi = bounds(spec)
    limit = ""
    if wanted is not None and wanted > hi:
        limit = f"at maxReplicas {hi} (recommendation {wanted})"
    elif wanted is not None and wanted < lo:
        limit = f"at minReplicas {lo} (recommendation {wanted})"
    return Decision(desired, reason, reading.avg, limited=bool(limit), code=code,
                    recommendation=reading.recommendation, limit_reason=limit)


def _keep(reading: _Reading, current: int, down: int, spec: AutoscalingSpec) -> Decision:
    """The decision when stabilization keeps `current`: at a bound, stabilizing, or steady."""
    lo, hi = bounds(spec)
    recommendation, measured = reading.recommendation, reading.measured
    if recommendation > current == hi:
        return _decided(reading, spec, current, f"{measured}: recommends {recommendation}; at maxReplicas {hi}",
                        AT_LIMIT, recommendation)
    if recommendation < current == lo:
        return _decided(reading, spec, current, f"{measured}: recommends {recommendation}; at minReplicas {lo}",
                        AT_LIMIT, recommendation)
    if recommendation > current:
        return _decided(reading, spec, current, f"{measured}: recommends {recommendation}, but not for the whole "
                        f"{spec.scale_up_stabilization_seconds}s scale-up window; keeping {current}", STABILIZING_UP)
    if recommendation < current:
        return _decided(reading, spec, current, f"{measured}: recommends {recommendation}, but {down} within "
                        f"the last {spec.scale_down_stabilization_seconds}s; keeping {current}", STABILIZING_DOWN)
    code = WITHIN_TOLERANCE if reading.within else STEADY
    return _decided(reading, spec, current, f"{measured}: keeping {current}", code)


def _scale_up(reading: _Reading, current: int, stabilized: int, starting: int, spec: AutoscalingSpec) -> Decision:
    """The decision when stabilization asks for more than `current`: rules 5 to 7."""
    hi = bounds(spec)[1]
    measured = reading.measured
    if current >= hi:
        return _decided(reading, spec, current, f"{measured}: recommends {stabilized}; at maxReplicas {hi}",
                        AT_LIMIT, stabilized)
    if starting > 0:
        return _capacity_on_the_way(reading, current, stabilized, starting, spec)
    return _bounded_step(reading, current, stabilized, spec)


def _capacity_on_the_way(reading: _Reading, current: int, stabilized: int, starting: int,
                         spec: AutoscalingSpec) -> Decision:
    """Rule 5: the hold at `current` while `starting` replicas are still on their way."""
    hi = bounds(spec)[1]
    return _decided(reading, spec, current, f"{reading.measured}: recommends {min(stabilized, hi)}, but "
                    f"{_plural(starting, 'replica')} still starting count as capacity on the way; no further "
                    f"scale-up until {'it is' if starting == 1 else 'they are'} ready", WAITING_FOR_STARTING)


def _bounded_step(reading: _Reading, current: int, stabilized: int, spec: AutoscalingSpec) -> Decision:
    """Rules 6 and 7: the scale-up, at most max(4, 100%) more replicas, clamped to maxReplicas."""
    hi = bounds(spec)[1]
    step = max(MIN_SCALE_UP_STEP, math.ceil(current * SCALE_UP_PERCENT / 100))
    desired = min(stabilized, current + step, hi)
    why = ""
    if desired < min(stabilized, hi):
        why = f" (at most +{step} per decision)"
    elif stabilized > hi:
        why = f" (capped at maxReplicas {hi})"
    return _decided(reading, spec, desired, f"scale up {current} -> {desired}: {reading.measured}{why}", SCALE_UP,
                    stabilized if stabilized > hi else None)


def _scale_down(reading: _Reading, current: int, stabilized: int, spec: AutoscalingSpec) -> Decision:
    """Rule 7 on the way down: the scale-down to the stabilized count, clamped to minReplicas."""
    lo = bounds(spec)[0]
    desired = max(stabilized, lo)
    if desired == current:
        return _decided(reading, spec, current, f"{reading.measured}: recommends {stabilized}; at minReplicas {lo}",
                        AT_LIMIT, stabilized)
    window = (f" for {spec.scale_down_stabilization_seconds}s" if spec.scale_down_stabilization_seconds else "")
    return _decided(reading, spec, desired, f"scale down {current} -> {desired}: {reading.measured}{window}",
                    SCALE_DOWN, stabilized if stabilized < lo else None)


def decide(samples: Sequence[Sample], current: int, ready: int, starting: int, spec: AutoscalingSpec,
           history: History, now: float, slots: Optional[int] = None) -> Decision:
    """The replica count to run now, for a StatefulSet at `current` replicas of which `ready`
    serve (one sample each, in `samples`) and `starting` are still on their way; `slots` is
    the requests one replica runs at once (vLLM's --max-num-seqs), when known."""
    early = _bounds_first(current, spec) or _missing_data_holds(samples, current, ready, starting)
    if early is not None:
        return early
    reading = _the_ratio(samples, current, ready, spec.target_waiting_per_replica, slots)
    stabilized, down = _stabilize(reading.recommendation, current, spec, history, now)
    if stabilized == current:
        return _keep(reading, current, down, spec)
    if stabilized > current:
        return _scale_up(reading, current, stabilized, starting, spec)
    return _scale_down(reading, current, stabilized, spec)


@dataclass(frozen=True)
class Idle:
    """What scale to zero decides on besides the queue (the caller keeps the clock)."""

    idle_for: float
    """Seconds every read has shown no request running or waiting on any ready replica (0: busy now)."""
    woken: bool = False
    """A request arrived that found no pod (the endpoint picker's count of them rose since the last read)."""
    wake_source: str = "the endpoint picker"


def busy(samples: Sequence[Sample]) -> bool:
    """Whether any replica runs or queues a request (or did not answer: never idle on missing data)."""
    return any(not s.ok or s.waiting > 0 or s.running > 0 for s in samples)


def decide_with_zero(samples: Sequence[Sample], current: int, ready: int, starting: int, spec: AutoscalingSpec,
                     history: History, now: float, idle: Idle, slots: Optional[int] = None) -> Decision:
    """`decide` for minReplicas 0: rules 0 and 8 (the module's docstring) around the others."""
    if spec.min_replicas > 0:
        return decide(samples, current, ready, starting, spec, history, now, slots=slots)
    window = spec.scale_to_zero.idle_seconds
    # 0. at zero
    if current == 0:
        if idle.woken:
            return Decision(1, f"scale up 0 -> 1: a request arrived at zero replicas ({idle.wake_source})", None,
                            code=SCALE_FROM_ZERO, recommendation=1)
        return Decision(0, f"scaled to zero: no request since; {idle.wake_source} wakes it", None,
                        code=SCALED_TO_ZERO, recommendation=0)
    floor_one = spec.model_copy(update={"min_replicas": 1})
    decision = decide(samples, current, ready, starting, floor_one, history, now, slots=slots)
    # 8. scale to zero after a whole idle window
    if decision.hold or decision.desired > current or busy(samples) or starting > 0 or not samples:
        return decision
    if idle.idle_for < window:
        if decision.code == AT_LIMIT and decision.desired == 1:  # the floor of one, not minReplicas 0
            return Decision(1, f"{decision.reason.split(': recommends')[0]}: idle for {_num(idle.idle_for)}s of "
                            f"the {window}s before scale to zero", decision.metric_value, code=STEADY,
                            recommendation=decision.recommendation)
        return decision
    return Decision(0, f"scale to zero {current} -> 0: no request running or waiting for {_num(idle.idle_for)}s "
                    f"(scaleToZero.idleSeconds {window})", 0.0, code=SCALE_TO_ZERO, recommendation=0)
