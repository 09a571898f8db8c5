"""The autoscaler's loop: read the queue, decide, patch replicas, report; again soon while the server works.

One kopf daemon per VLLMServer whose ``autoscaling`` is enabled with ``mode: Operator``.
Each tick (`Autoscaler.tick`, plain blocking code run in a small thread pool):

1. read the StatefulSet's replicas and the server's pods; sort the pods into ready,
   starting (exist, not Ready, not terminating, still within their startup probe's
   budget) and stuck (not Ready for longer than that budget: not capacity on the way);
2. read the ready pods' queue from the metrics source (pods' /metrics or Prometheus);
3. `policy.decide`; when the count changes, server-side apply ``spec.replicas`` under the
   autoscaler's own field manager and record a ScaledUp/ScaledDown event;
4. server-side apply ``status.autoscaling`` and the AutoscalingActive/AutoscalingLimited
   conditions on the status subresource under the same field manager, only when they
   changed (numbers alone refresh at most every STATUS_REFRESH_SECONDS);
5. when to read again (`schedule.next_read`): every second while a replica has requests waiting or
   running, twice per intervalSeconds while idle, every intervalSeconds while holding or with
   ``source: Prometheus``.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import logging
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

import kopf

from .. import api, builders, documents, validation
from ..kube import events
from .. import telemetry
from ..informers.cache import resource_version
from ..informers.reader import DirectReader, Reader, controlled_by
from ..kube.client import Kube
from ..urlpolicy import URLPolicy
from ..conditions import Conditions
from . import policy, schedule
from ..sources.picker_metrics import PickerSource
from ..sources.vllm_metrics import (MetricsSource, Observations, PodRef, PodsSource, PrometheusSource, Sample,
                                    unscrapable)
from .ownership import CONDITIONS, FIELD_MANAGER, clear_status, has_status

log = logging.getLogger("vllm_operator.autoscaler")

COMPONENT = "vllm-operator-autoscaler"
ACTIVE, LIMITED = CONDITIONS
#: Numbers that move every tick (queue length, reason text) reach status at most this often;
#: decisions, holds and condition changes are written at once.
STATUS_REFRESH_SECONDS = 30.0
#: While the reader shows no StatefulSet of an autoscaled server (not created yet, or one of someone else's by
#: that name), a tick asks the API server who holds the name at most this often: every tick did, 1,889 GETs
#: while 1,000 servers converged (bench/scale.py).
UNCACHED_GET_SECONDS = 30.0
#: A replica the StatefulSet should have but whose pod does not exist yet counts as on its way this long.
MISSING_POD_GRACE_SECONDS = 60.0
#: Startup budget of a pod without a startup probe.
DEFAULT_STARTUP_SECONDS = 600.0
#: ``fixed``: the reads before the adaptive schedule (every intervalSeconds, the whole /metrics), the
#: baseline of bench/autoscale.py; read once, when the autoscaler's context is created.
READS_ENV = "VLLM_OPERATOR_AUTOSCALER_READS"
#: The one kind of child a tick reads: only a StatefulSet is autoscaled.
STATEFULSET = ("apps/v1", "StatefulSet")


def planned_nodes(body: dict[str, Any], spec: Any) -> int:
    """The nodes one replica spans: spec.nodes, or with spec.maxNodes the count the reconciler's plan chose
    (status.plan.estimates.nodes; 1 until a plan is written)."""
    if spec.max_nodes is None:
        return int(spec.nodes)
    estimates = (((body.get("status") or {}).get("plan") or {}).get("estimates") or {})
    nodes = estimates.get("nodes")
    return nodes if isinstance(nodes, int) and nodes >= 1 else 1


def _now_iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: Optional[str]) -> Optional[float]:
    if not text:
        return None
    try:
        return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc).timestamp()
    except ValueError:
        return None


# --------------------------------------------------------------------------- pods
def _is_ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def startup_budget(pod: dict[str, Any]) -> float:
    """How long the kubelet lets this pod's server load before giving up: its startup probe's
    initialDelaySeconds + periodSeconds x failureThreshold (the longest over containers)."""
    budgets = []
    for c in (pod.get("spec") or {}).get("containers") or []:
        probe = c.get("startupProbe")
        if probe:
            budgets.append(probe.get("initialDelaySeconds", 0)
                           + probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3))
    return float(max(budgets)) if budgets else DEFAULT_STARTUP_SECONDS


def _started_at(pod: dict[str, Any]) -> Optional[float]:
    """When the pod's server last (re)started loading: its newest container start, else its creation."""
    parsed = [_parse_time(((cs.get("state") or {}).get("running") or {}).get("startedAt"))
              for cs in (pod.get("status") or {}).get("containerStatuses") or []]
    times = [t for t in parsed if t is not None]
    return max(times) if times else _parse_time(pod["metadata"].get("creationTimestamp"))


def _port(pod: dict[str, Any]) -> int:
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == builders.PORT_NAME and p.get("containerPort"):
                return int(p["containerPort"])
    return builders.PORT


def max_num_seqs(pods: list[dict[str, Any]]) -> Optional[int]:
    """The requests one replica runs at once: vLLM's --max-num-seqs in the pods' args (the smallest
    when a rollout mixes values); None when no pod says."""
    found = []
    for pod in pods:
        for c in (pod.get("spec") or {}).get("containers") or []:
            args = [str(a) for a in (c.get("args") or [])]
            for i, arg in enumerate(args):
                value = arg.split("=", 1)[1] if arg.startswith("--max-num-seqs=") else (
                    args[i + 1] if arg == "--max-num-seqs" and i + 1 < len(args) else None)
                if value is not None and value.isdigit() and int(value) > 0:
                    found.append(int(value))
    return min(found) if found else None


@dataclass
class PodGroups:
    ready: list[PodRef] = field(default_factory=list)
    #: Ready pods the operator does not scrape: "name (why)" (no IP yet, or the node's network).
    ready_unscraped: list[str] = field(default_factory=list)
    starting: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)


def classify_pods(pods: list[dict[str, Any]], now: float) -> PodGroups:
    """Ready pods (with where to scrape them), pods starting within their startup budget, and
    pods not Ready for longer than that (stuck: never counted as capacity on the way).
    Terminating and finished pods are left out."""
    groups = PodGroups()
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        meta, status = pod["metadata"], pod.get("status") or {}
        if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
            continue
        if _is_ready(pod):
            why = unscrapable(pod)
            if why:
                groups.ready_unscraped.append(f"{meta['name']} ({why})")
            else:
                groups.ready.append(PodRef(meta["name"], meta["namespace"], status["podIP"], _port(pod)))
            continue
        since = _started_at(pod)
        if since is None or now - since <= startup_budget(pod):
            groups.starting.append(meta["name"])
        else:
            groups.stuck.append(meta["name"])
    return groups


# --------------------------------------------------------------------------- events
def post_event(kube: Kube, body: dict[str, Any], type_: str, reason: str, message: str, now: float) -> None:
    events.post_event(kube, body, type_, reason, message, component=COMPONENT, stamp=_now_iso(now))


# --------------------------------------------------------------------------- sources
class Sources:
    """The metrics sources, shared by every server's loop (one scrape pool for all pods)."""

    def __init__(self, default_prometheus_url: Optional[str] = None, pods: Optional[MetricsSource] = None,
                 prometheus: Callable[[str], MetricsSource] = PrometheusSource, urls: Optional[URLPolicy] = None,
                 fixed_reads: bool = False, picker: Optional[PickerSource] = None):
        self.default_prometheus_url = default_prometheus_url
        #: The prometheusURLs a spec may name (urlpolicy.py); None: any.
        self.urls = urls
        self.pods = pods or PodsSource(only_wanted=not fixed_reads, on_scrape=telemetry.record_scrape)
        #: Every read every intervalSeconds, as before the schedule (READS_ENV=fixed).
        self.fixed_reads = fixed_reads
        #: The fast reads' shared budget (schedule.py, rule 4).
        self.fast_reads = schedule.FastReads()
        self._prometheus = prometheus
        #: The endpoint pickers' count of requests with no pod (what wakes a server at zero replicas).
        self.picker = picker or PickerSource()
        #: The KV cache each pod's vLLM allocated: recorded from the ticks' pod scrapes, and scraped now and then
        #: in the same pool for the reconciler's status.kvCapacity when no tick scrapes the pod (kvcapacity.py).
        self.kv_capacity = Observations(submit=getattr(self.pods, "submit", None))

    def for_spec(self, spec: api.AutoscalingSpec) -> tuple[Optional[MetricsSource], str]:
        """The source a spec asks for, and a short description for reasons (or None and why not)."""
        if spec.source == "Pods":
            return self.pods, "pods' /metrics"
        url = spec.prometheus_url or self.default_prometheus_url
        if not url:
            return None, "source: Prometheus needs prometheusURL or the operator's --prometheus-url"
        # A new one per tick: it holds no connection, and one kept per URL grew with every URL a tenant tried.
        return self._prometheus(url), f"Prometheus {url}"


# --------------------------------------------------------------------------- one server's loop
@dataclass
class TickResult:
    """What one tick saw and did (for logs and tests)."""

    decision: Optional[policy.Decision] = None
    current: Optional[int] = None
    scaled: bool = False
    status_written: bool = False
    note: str = ""
    next_read: Optional[schedule.NextRead] = None
    """When to read again; None: in intervalSeconds."""


def at_max_replicas(decision: policy.Decision) -> bool:
    """The decision was cut to maxReplicas: the queue asks for more replicas than the server may have."""
    return decision.limited and decision.limit_reason.startswith("at max")


def autoscaling_problems(name: str, spec: api.VLLMServerSpec, default_prometheus_url: Optional[str],
                         urls: Optional[URLPolicy] = None) -> list[str]:
    return [str(p) for p in validation.check_spec(name, spec, default_prometheus_url=default_prometheus_url, urls=urls)
            if p.field.startswith("spec.autoscaling")]


@dataclass(frozen=True)
class _QueueRead:
    """What one tick read: the server's pods (its workers left out) sorted, the replicas on their way, the metrics
    source and its description, and the ready pods' samples."""

    pods: list[dict[str, Any]]
    groups: PodGroups
    starting: int
    """Pods still starting, plus replicas whose pod does not exist yet."""
    source: MetricsSource
    described: str
    """The source in words, for reasons and events."""
    samples: list[Sample]
    ready: int
    """Ready pods, scraped or not."""


class Autoscaler:
    """The state of one server's loop (recommendation history) and its tick."""

    def __init__(self, kube: Kube, sources: Sources, namespace: str, name: str,
                 clock: Callable[[], float] = time.time, reader: Optional[Reader] = None,
                 monotonic: Optional[Callable[[], float]] = None):
        """`clock` is the wall clock: the times written to the API (status, events) and compared with the API's
        (a pod's start). `monotonic` times what this loop keeps in memory (its recommendation history, the idle
        window, the status refresh, the fast-read budget), so that a step of the wall clock (NTP, a VM resumed)
        never shortens or stretches a window, as Go's monotonic readings keep the HPA's. Without `monotonic`,
        time.monotonic with the real wall clock, else the `clock` given (a test's one fake clock drives both)."""
        self.kube = kube
        #: What a tick reads its StatefulSet and pods through (informers/reader.py): in the operator the
        #: reconciler's watch-fed copies, not a GET and a LIST (200 autoscaled servers polled 80 requests/s:
        #: bench/scale.py); by default the API server itself.
        self.reader: Reader = reader if reader is not None else DirectReader(kube)
        self.sources = sources
        self.namespace = namespace
        self.name = name
        self.clock = clock
        self.monotonic: Callable[[], float] = monotonic or (time.monotonic if clock is time.time else clock)
        #: (monotonic time, recommendation) of the recent decisions.
        self.history: policy.History = []
        self._missing_since: dict[str, float] = {}
        self._last_written: Optional[dict[str, Any]] = None
        self._last_write_at = -math.inf  # monotonic; never written yet
        #: (when, answer) of the last GET of a StatefulSet the reader did not show as this server's.
        self._uncached: Optional[tuple[float, Optional[dict[str, Any]]]] = None
        #: The server as our last status write's answer: the body a tick gets (kopf's) may lag behind it.
        self._last_answer: Optional[dict[str, Any]] = None
        #: When this loop last changed the replica count (monotonic).
        self._scaled_at: Optional[float] = None
        #: minReplicas 0: when a read last showed a request (or no data; monotonic), and the picker's last
        #: unserved count.
        self._busy_at: Optional[float] = None
        self._unserved: Optional[float] = None

    # ---- the tick
    def tick(self, body: dict[str, Any]) -> TickResult:
        """One pass of the loop for the server `body` (the module's steps 1 to 5): what it saw and did."""
        now = self.clock()
        body = self._fresher(body)
        spec = self._checked_spec(body, now)
        if isinstance(spec, TickResult):
            return spec
        a = spec.autoscaling
        # A server across nodes scales by group: its LeaderWorkerSet's replicas, on its leaders' queues.
        # With maxNodes the node count is the reconciler's plan's, which its status says.
        api_version, kind = (builders.LWS_API_VERSION, builders.LWS_KIND) if planned_nodes(body, spec) > 1 \
            else STATEFULSET
        sts = self._workload(body, api_version, kind, now)
        if isinstance(sts, TickResult):
            return sts
        current = (sts.get("spec") or {}).get("replicas", 1)
        read = self._read_queue(body, a, current, now)
        if isinstance(read, TickResult):
            return read
        decision = self._decide(spec, read, current)

        result = TickResult(decision=decision, current=current)
        direction = "hold" if decision.desired == current else ("up" if decision.desired > current else "down")
        telemetry.record_scaling_decision(self.namespace, self.name, direction)
        if not decision.hold:  # like AutoscalingLimited, a hold keeps what the last decision said
            telemetry.record_at_max_replicas(self.namespace, self.name, at_max_replicas(decision))
        last_scale = (body.get("status") or {}).get("autoscaling", {}).get("lastScaleTime")
        if decision.desired != current:
            last_scale = self._scale(body, decision, current, (api_version, kind), read.described, now)
            result.scaled = True
        status = self._status(decision, read.samples, last_scale)
        result.status_written = self._write(body, status, decision, now, read.described)
        result.next_read = self._next_read(read.samples, decision, a, read.source, scaled=result.scaled)
        return result

    def _checked_spec(self, body: dict[str, Any], now: float) -> Union[api.VLLMServerSpec, TickResult]:
        """The spec when the operator runs its autoscaling and it is valid; else what the tick did instead (the
        InvalidSpec report, or nothing)."""
        spec, errors = documents.parse_spec(body.get("spec") or {})
        if spec is None:
            return self._report(body, None, now, "InvalidSpec", "; ".join(errors))
        a = spec.autoscaling
        if not (a.enabled and a.mode == "Operator"):
            return TickResult(note="autoscaling is not run by the operator for this spec")
        problems = autoscaling_problems(self.name, spec, self.sources.default_prometheus_url, self.sources.urls)
        if spec.workload != "StatefulSet":
            problems.append("autoscaling needs workload: StatefulSet")
        if problems:
            return self._report(body, None, now, "InvalidSpec", "; ".join(problems))
        return spec

    def _workload(self, body: dict[str, Any], api_version: str, kind: str,
                  now: float) -> Union[dict[str, Any], TickResult]:
        """Step 1's workload: this server's StatefulSet (or LeaderWorkerSet), from the reader, or from the API
        server at most every UNCACHED_GET_SECONDS while the reader shows none; else the NoWorkload report."""
        uid = body["metadata"]["uid"]
        sts = self.reader.children(self.namespace, self.name, uid, kinds=[(api_version, kind)]).get(
            (kind, self.name))
        if sts is not None:
            self._uncached = None
        elif self._uncached is not None and self.monotonic() - self._uncached[0] < UNCACHED_GET_SECONDS:
            sts = self._uncached[1]  # asked a moment ago; the reader shows ours as soon as it exists
        else:  # not created yet, or someone else's: ask the API server who holds the name
            sts = self.kube.get(api_version, kind, self.namespace, self.name)
            self._uncached = (self.monotonic(), sts)
        if sts is None or sts["metadata"].get("deletionTimestamp"):
            return self._report(body, None, now, "NoWorkload", f"the {kind} does not exist yet")
        if not controlled_by(sts, uid):
            return self._report(body, None, now, "NoWorkload",
                                f"{kind} {self.name} is not controlled by this VLLMServer; not touching it")
        return sts

    def _read_queue(self, body: dict[str, Any], a: api.AutoscalingSpec, current: int,
                    now: float) -> Union[_QueueRead, TickResult]:
        """Steps 1 and 2: the server's pods sorted, and the ready ones' queue from the metrics source the spec
        asks for (or the InvalidSpec report when there is none)."""
        pods = [p for p in self.reader.pods(self.namespace, self.name)  # a group's workers serve no queue
                if (p["metadata"].get("labels") or {}).get(builders.ROLE_LABEL) != "worker"]
        groups = classify_pods(pods, now)
        starting = len(groups.starting) + self._missing_replicas(current, pods)
        source, described = self.sources.for_spec(a)
        if source is None:
            return self._report(body, None, now, "InvalidSpec", described)
        samples: list[Sample] = source.read(groups.ready) if groups.ready else []
        if source is self.sources.pods:
            self.sources.kv_capacity.record(groups.ready, samples)
        ready = len(groups.ready) + len(groups.ready_unscraped)
        return _QueueRead(pods, groups, starting, source, described, samples, ready)

    def _decide(self, spec: api.VLLMServerSpec, read: _QueueRead, current: int) -> policy.Decision:
        """Step 3's decision (policy.decide, or decide_with_zero for minReplicas 0), recorded in the history."""
        a, mono = spec.autoscaling, self.monotonic()
        if not self.history:
            # After a (re)start the past window is unknown: count it as a recommendation of the current
            # count made just before the scale-up window, so it delays a scale-down (never on no data)
            # but not a scale-up.
            self.history = [(mono - a.scale_up_stabilization_seconds - 0.001, current)]
        samples, ready, starting = read.samples, read.ready, read.starting
        if a.min_replicas == 0:
            decision = policy.decide_with_zero(samples, current, ready, starting, a, self.history, mono,
                                               self._idle(spec, samples, current, mono), slots=max_num_seqs(read.pods))
        else:
            decision = policy.decide(samples, current, ready, starting, a, self.history, mono,
                                     slots=max_num_seqs(read.pods))
        if decision.hold and read.groups.ready_unscraped:
            decision = policy.Decision(decision.desired, decision.reason + f"; ready but not scraped: "
                                       f"{', '.join(read.groups.ready_unscraped)}", None, hold=True,
                                       code=decision.code, recommendation=decision.recommendation)
        self.history = policy.record(self.history, mono, decision, a, a.interval_seconds)
        return decision

    def _scale(self, body: dict[str, Any], decision: policy.Decision, current: int, workload: tuple[str, str],
               described: str, now: float) -> str:
        """Step 3's act: the workload's replicas applied under the autoscaler's field manager, and the
        ScaledUp/ScaledDown event; the time of the scale, for status.autoscaling.lastScaleTime."""
        api_version, kind = workload
        self.kube.apply({"apiVersion": api_version, "kind": kind,
                         "metadata": {"name": self.name, "namespace": self.namespace},
                         "spec": {"replicas": decision.desired}}, field_manager=FIELD_MANAGER)
        last_scale = _now_iso(now)
        up = decision.desired > current
        post_event(self.kube, body, "Normal", "ScaledUp" if up else "ScaledDown",
                   f"{current} -> {decision.desired} replicas ({described}): {decision.reason}", now)
        log.info("%s/%s: %s", self.namespace, self.name, decision.reason)
        return last_scale

    def _idle(self, spec: api.VLLMServerSpec, samples: list[Sample], current: int, mono: float) -> policy.Idle:
        """minReplicas 0: how long every read has been idle, and whether a request found no pod since the last
        read (the pool's endpoint picker's count rose)."""
        pool = api.pool_name(self.name, spec.routing)
        source = f"endpoint picker {builders.picker_name(pool)}"
        count: Optional[float] = None
        if spec.routing.inference_pool.enabled:
            count, why = self.sources.picker.read(self.namespace, pool)
            if count is None:
                log.info("%s/%s: %s", self.namespace, self.name, why)
        woken = count is not None and self._unserved is not None and count > self._unserved
        if count is not None:
            self._unserved = count
        if self._busy_at is None or woken or current == 0 or not samples or policy.busy(samples):
            self._busy_at = mono
        return policy.Idle(mono - self._busy_at, woken, f"{source}'s count of requests with no pod")

    def _next_read(self, samples: list[Sample], decision: policy.Decision, a: api.AutoscalingSpec,
                   source: MetricsSource, scaled: bool) -> schedule.NextRead:
        mono = self.monotonic()
        if scaled:
            self._scaled_at = mono
        # Prometheus's numbers move once per its scrape interval (15 s by default): reading it faster
        # than intervalSeconds would mostly re-read them.
        fixed = self.sources.fixed_reads or source is not self.sources.pods
        since = None if self._scaled_at is None else mono - self._scaled_at
        return schedule.next_read(samples, float(a.interval_seconds), hold=decision.hold, since_scale=since,
                                  budget=self.sources.fast_reads, now=mono, fixed=fixed)

    def _missing_replicas(self, current: int, pods: list[dict[str, Any]]) -> int:
        """Replicas the StatefulSet wants whose pod does not exist yet (the controller creates
        them within a second or so); on their way for MISSING_POD_GRACE_SECONDS at most."""
        names = {p["metadata"]["name"] for p in pods}
        wanted = {f"{self.name}-{i}" for i in range(current)}
        missing, mono = wanted - names, self.monotonic()
        self._missing_since = {n: self._missing_since.get(n, mono) for n in missing}
        return sum(1 for t in self._missing_since.values() if mono - t <= MISSING_POD_GRACE_SECONDS)

    def _fresher(self, body: dict[str, Any]) -> dict[str, Any]:
        """The body with the status of our last write when the body is older than that write's answer.

        kopf updates a daemon's body when the server's own event worker gets to the event, which
        can take many ticks while the operator is busy: without this, every tick saw its condition
        missing and wrote the same status again (bench/scale.py: 5-6 status writes per autoscaled
        server while 300 servers converged)."""
        answer = self._last_answer
        if answer is None or resource_version(answer) <= resource_version(body) or (answer.get("metadata") or {}).get("uid") != (
                body.get("metadata") or {}).get("uid"):
            return body
        return {**body, "status": answer.get("status") or {}}

    # ---- status
    @staticmethod
    def _status(decision: policy.Decision, samples: list[Sample], last_scale: Optional[str]) -> api.AutoscalingStatus:
        st = api.AutoscalingStatus(desired_replicas=decision.desired, reason=decision.reason,
                                   last_scale_time=last_scale or None)
        ok = [s for s in samples if s.ok]
        if decision.metric_value is not None and not decision.hold:
            st.metric_value = round(decision.metric_value, 3)
            st.waiting = round(sum(s.waiting for s in ok), 3)
            st.running = round(sum(s.running for s in ok), 3)
            kv = [s.kv_cache_usage for s in ok if s.kv_cache_usage is not None]
            if kv:
                st.kv_cache_usage = round(sum(kv) / len(kv), 4)
        return st

    def _conditions(self, body: dict[str, Any], decision: Optional[policy.Decision], now: float,
                    code: str, message: str) -> list[api.Condition]:
        conds = Conditions((body.get("status") or {}).get("conditions") or [], body["metadata"].get("generation"),
                           _now_iso(now))
        conds.set(ACTIVE, "False" if decision is None or decision.hold else "True", code, message)
        if decision is not None and not decision.hold:
            if decision.limited:
                at = "AtMaxReplicas" if at_max_replicas(decision) else "AtMinReplicas"
                conds.set(LIMITED, "True", at, decision.limit_reason)
            else:
                conds.set(LIMITED, "False", "WithinRange",
                          f"{decision.desired} replicas is within [minReplicas, maxReplicas]")
        # While holding, AutoscalingLimited keeps what it said (it is sent again as it is, so it stays).
        return conds.only(CONDITIONS)

    def _report(self, body: dict[str, Any], decision: Optional[policy.Decision], now: float, code: str,
                message: str) -> TickResult:
        """Status when the loop cannot decide at all (invalid spec, no workload): the last decision's replicas
        and scale time stay."""
        prior = api.AutoscalingStatus.from_live((body.get("status") or {}).get("autoscaling") or {})
        status = api.AutoscalingStatus(reason=message, desired_replicas=prior.desired_replicas,
                                       last_scale_time=prior.last_scale_time)
        return TickResult(note=message, status_written=self._write(body, status, decision, now, "", code=code,
                                                                   message=message))

    def _write(self, body: dict[str, Any], autoscaling: api.AutoscalingStatus, decision: Optional[policy.Decision],
               now: float, described: str, code: str = "", message: str = "") -> bool:
        if decision is not None:
            code = decision.code
            message = decision.reason + (f" (metrics: {described})" if described else "")
        conditions = self._conditions(body, decision, now, code, message)
        new = api.VLLMServerStatus(autoscaling=autoscaling, conditions=conditions).wire()
        live_status = body.get("status") or {}
        live = {"autoscaling": live_status.get("autoscaling") or {},
                "conditions": [c for c in live_status.get("conditions") or [] if c.get("type") in CONDITIONS]}

        def signature(s: dict[str, Any]) -> tuple:
            au = s["autoscaling"]
            return (au.get("desiredReplicas"), au.get("lastScaleTime"), "metricValue" in au,
                    tuple(sorted((c["type"], c.get("status"), c.get("reason")) for c in s["conditions"])))

        since_write = self.monotonic() - self._last_write_at
        if new == live or new == self._last_written and since_write < STATUS_REFRESH_SECONDS:
            return False
        if signature(new) == signature(live) and since_write < STATUS_REFRESH_SECONDS:
            return False  # only numbers moved: refresh later
        old_active = next((c for c in live["conditions"] if c["type"] == ACTIVE), None)
        new_active = next((c for c in new["conditions"] if c["type"] == ACTIVE), None)
        meta = body["metadata"]
        answer = self.kube.apply({"apiVersion": api.API_VERSION, "kind": api.KIND,
                                  "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                                  "status": new}, subresource="status", field_manager=FIELD_MANAGER)
        self._last_written, self._last_write_at = new, self.monotonic()
        self._last_answer = answer if isinstance(answer, dict) else None
        if (new_active and new_active["status"] == "False" and new_active["reason"] == policy.METRICS_UNAVAILABLE
                and (old_active is None or old_active.get("reason") != policy.METRICS_UNAVAILABLE)):
            post_event(self.kube, body, "Warning", policy.METRICS_UNAVAILABLE, new_active["message"], now)
        return True


# --------------------------------------------------------------------------- the kopf daemon
@dataclass
class Context:
    """What every server's loop shares: the API client under the autoscaler's field manager, the metrics
    sources, the thread pool the ticks run in, and the reader (the reconciler's watch-fed copies)."""

    kube: Kube
    sources: Sources
    executor: ThreadPoolExecutor
    reader: Reader

    @classmethod
    def create(cls, kube: Kube, reader: Reader, default_prometheus_url: Optional[str] = None, *, workers: int = 4,
               urls: Optional[URLPolicy] = None) -> "Context":
        return cls(kube=Kube(kube.api, field_manager=FIELD_MANAGER, timeout=10.0),
                   sources=Sources(default_prometheus_url, urls=urls,
                                   fixed_reads=os.environ.get(READS_ENV, "") == "fixed"),
                   executor=ThreadPoolExecutor(max_workers=workers, thread_name_prefix="autoscaler"),
                   reader=reader)

    async def daemon(self, stopped: Any, namespace: str, name: str, body: Any, logger: Any, **_: Any) -> None:
        """One server's loop, until autoscaling is switched off, the server deleted, or the operator stops
        (registered as a kopf daemon filtered by ownership.runs_operator_loop: operator_main.register_handlers)."""
        scaler = Autoscaler(self.kube, self.sources, namespace, name, reader=self.reader)
        loop = asyncio.get_running_loop()
        logger.info("autoscaler started for %s/%s", namespace, name)
        try:
            while not stopped:
                started = loop.time()
                snapshot = copy.deepcopy(dict(body))  # kopf updates `body` in place on this thread
                result: Optional[TickResult] = None
                try:
                    result = await loop.run_in_executor(self.executor, scaler.tick, snapshot)  # logs its scalings
                except Exception as e:  # noqa: BLE001 - a failed tick (a copy not readable) is retried next time
                    logger.warning("autoscaler tick for %s/%s failed: %s", namespace, name, e)
                interval = float(((body.get("spec") or {}).get("autoscaling") or {}).get("intervalSeconds", 5))
                wait = result.next_read.seconds if result is not None and result.next_read is not None else interval
                await stopped.wait(max(0.05, wait - (loop.time() - started)))
        finally:
            telemetry.forget_autoscaler(namespace, name)  # no loop, no "at maxReplicas" (nor a stale one)
        reason = getattr(stopped, "reason", None)
        if reason is not None and reason & kopf.DaemonStoppingReason.FILTERS_MISMATCH:
            # Autoscaling was switched off (or handed to an HPA/KEDA): its status no longer applies.
            try:
                if has_status(dict(body).get("status") or {}):
                    await loop.run_in_executor(self.executor, clear_status, self.kube, copy.deepcopy(dict(body)))
            except Exception as e:  # noqa: BLE001 - the reconciler clears it at its next pass too
                logger.warning("could not clear the autoscaler's status: %s", e)
        logger.info("autoscaler stopped for %s/%s", namespace, name)
