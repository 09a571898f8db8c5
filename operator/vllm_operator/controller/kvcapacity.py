"""Plan vs reality: the KV cache capacity vLLM allocated on each ready pod, beside the plan's estimate.

vLLM exports ``vllm:cache_config_info``, an info gauge whose labels include ``num_gpu_blocks`` and
``block_size``: their product is the KV cache's capacity in tokens, what the planner estimated as
``status.plan.estimates.kvCacheTokens``. The number is fixed when a server starts, so it is read rarely:

* the autoscaler (``source: Pods``) scrapes every ready pod each tick anyway and records what it saw
  (`Observations.record`), at no extra cost;
* otherwise the reconciler asks (`Observations.measure`) and a pod with no reading younger than
  ``refresh_seconds`` (5 minutes) gets one scrape in the autoscaler's bounded scrape pool, in the
  background; the reconcile never waits for it, its result is reported by the next reconcile (the
  periodic resync: a minute by default).

Only numbers are kept: no response bytes reach status or events.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from .. import builders
from ..autoscaler.metrics import PodRef, Sample

log = logging.getLogger("vllm_operator.controller.kvcapacity")

#: A pod's reading is trusted this long (vLLM allocates its KV cache once, at start-up).
REFRESH_SECONDS = 300.0
#: Readings of pods not asked about for this long are forgotten (the pod is gone).
FORGET_SECONDS = 3 * REFRESH_SECONDS
#: Measured below this fraction of the plan: the plan was optimistic (a Warning event, once per transition).
BELOW_PLAN_RATIO = 0.9
EVENT_REASON = "KVCapacityBelowPlan"


@dataclass
class Reading:
    ip: str
    tokens: Optional[int]
    """None: the scrape failed or the pod does not export vllm:cache_config_info."""
    at: float


def unscrapable(pod: dict[str, Any]) -> Optional[str]:
    """Why the operator will not GET this pod's /metrics, or None. Only pod IPs of pods on the pod network are
    scraped: a pod on the node's network has the node's IP, where whatever listens on the port is the node's,
    not the pod's (a tenant able to create pods could point the operator at a node's local services)."""
    if (pod.get("spec") or {}).get("hostNetwork"):
        return "host network: the operator scrapes pod IPs only"
    if not (pod.get("status") or {}).get("podIP"):
        return "no IP yet"
    return None


def ready_pods(pods: Sequence[dict[str, Any]]) -> list[PodRef]:
    """The pods that serve (Ready, with an IP on the pod network, not terminating), where to scrape them."""
    out = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if meta.get("deletionTimestamp") or unscrapable(pod):
            continue
        if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []):
            continue
        port = builders.PORT
        for c in (pod.get("spec") or {}).get("containers") or []:
            for p in c.get("ports") or []:
                if p.get("name") == builders.PORT_NAME and p.get("containerPort"):
                    port = int(p["containerPort"])
        out.append(PodRef(meta["name"], meta.get("namespace", ""), status["podIP"], port))
    return sorted(out, key=lambda r: r.name)


class Observations:
    """What each pod's vLLM allocated, shared by the autoscaler (which records) and the reconciler (which asks)."""

    def __init__(self, submit: Optional[Callable[[PodRef], Any]] = None, clock: Callable[[], float] = time.monotonic,
                 refresh_seconds: float = REFRESH_SECONDS):
        #: Starts one scrape in the background and returns a Future of its Sample (PodsSource.submit); None: the
        #: reconciler never scrapes (readings come from the autoscaler only).
        self.submit = submit
        self.clock = clock
        self.refresh_seconds = refresh_seconds
        self._readings: dict[tuple[str, str], Reading] = {}
        self._asked: dict[tuple[str, str], float] = {}
        self._pending: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._last_forget = clock()

    def record(self, refs: Sequence[PodRef], samples: Sequence[Sample]) -> None:
        """Readings from a scrape someone else made (the autoscaler's tick); failed samples are not readings."""
        now = self.clock()
        with self._lock:
            for ref, sample in zip(refs, samples):
                if sample.ok and sample.kv_capacity_tokens is not None:
                    self._readings[(ref.namespace, ref.name)] = Reading(ref.ip, sample.kv_capacity_tokens, now)

    def measure(self, refs: Sequence[PodRef]) -> dict[str, int]:
        """The known capacity of each of these pods (pod name -> tokens); scrapes, in the background, those
        whose reading is missing, older than refresh_seconds or from another IP (a new pod)."""
        now = self.clock()
        found: dict[str, int] = {}
        due: list[PodRef] = []
        with self._lock:
            for ref in refs:
                key = (ref.namespace, ref.name)
                self._asked[key] = now
                reading = self._readings.get(key)
                fresh = reading is not None and reading.ip == ref.ip and now - reading.at < self.refresh_seconds
                if reading is not None and reading.ip == ref.ip and reading.tokens is not None:
                    found[ref.name] = reading.tokens
                if not fresh and key not in self._pending and self.submit is not None:
                    self._pending.add(key)
                    due.append(ref)
            self._forget(now)
        for ref in due:
            assert self.submit is not None  # nothing is due without it
            try:
                future = self.submit(ref)
            except RuntimeError as e:  # the pool is shut down (the operator stops)
                log.debug("no KV capacity scrape of %s: %s", ref.name, e)
                with self._lock:
                    self._pending.discard((ref.namespace, ref.name))
                continue
            future.add_done_callback(lambda f, ref=ref: self._done(ref, f))
        return found

    def _done(self, ref: PodRef, future: Any) -> None:
        key = (ref.namespace, ref.name)
        try:
            sample = future.result()
            tokens = sample.kv_capacity_tokens if sample.ok else None
        except Exception:  # noqa: BLE001 - a failed scrape is no reading; retried after refresh_seconds
            tokens = None
        with self._lock:
            self._pending.discard(key)
            old = self._readings.get(key)
            if tokens is None and old is not None and old.ip == ref.ip:
                tokens = old.tokens  # a pod that answered before keeps its number through a failed scrape
            self._readings[key] = Reading(ref.ip, tokens, self.clock())

    def _forget(self, now: float) -> None:
        if now - self._last_forget < 60:
            return
        self._last_forget = now
        for key in [k for k, t in self._asked.items() if now - t > FORGET_SECONDS]:
            self._asked.pop(key, None)
            self._readings.pop(key, None)


def status(planned: Optional[int], measured: dict[str, int], ready: int,
           previous: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """status.kvCapacity: the plan's tokens, the smallest measured over the ready pods, how many pods reported.

    With no reading now, the previous measurement stays while the plan is the same (a rollout or a restart
    does not blank it, nor re-emit its event)."""
    if not planned:
        return None
    if not measured:
        if previous and previous.get("planned") == planned and previous.get("measured"):
            return previous
        return {"planned": planned}
    smallest = min(measured.values())
    return {"planned": planned, "measured": smallest, "ratio": round(smallest / planned, 3),
            "pods": len(measured), "readyPods": ready}


def below_plan(kv: Optional[dict[str, Any]]) -> bool:
    return bool(kv and kv.get("measured") and kv["measured"] < BELOW_PLAN_RATIO * kv["planned"])


def warning(kv: dict[str, Any]) -> str:
    return (f"vLLM allocated {kv['measured']} KV cache tokens (vllm:cache_config_info num_gpu_blocks x block_size, "
            f"the smallest of {kv['pods']} pod(s)), {kv['ratio']:.0%} of the plan's {kv['planned']}: the plan was "
            "optimistic, so the server holds fewer or shorter requests at once than planned (queueing and "
            "preemption start earlier). Check gpu.memory and gpu.reservedMemory against the GPU's real free memory, "
            "or pin engine.gpuMemoryUtilization")
