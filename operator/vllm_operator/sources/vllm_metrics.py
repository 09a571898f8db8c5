"""Read vLLM's metrics: the queue gauges of one server's ready pods, from the pods themselves or from
Prometheus (the autoscaler's sources), and the KV cache capacity each pod's vLLM allocated (`Observations`,
for the reconciler's status.kvCapacity).

Both sources answer one `Sample` per pod asked about, in the same order. A pod whose
numbers could not be read comes back with ``ok=False`` and the reason in ``error``: the
policy then holds the replica count instead of guessing. The reason goes to the status and an
Event, so it says what failed in words of ours ("redirect refused", "non-finite value"), never
with anything the pod or Prometheus answered.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
import urllib.parse
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Sequence

from prometheus_client.parser import text_string_to_metric_families

from . import fetch
from .. import builders
from ..api import VLLM_PORT

log = logging.getLogger("vllm_operator.controller.kvcapacity")

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
#: vLLM before 0.10 called the KV cache gauge gpu_cache_usage_perc.
KV_CACHE_USAGE_OLD = "vllm:gpu_cache_usage_perc"
#: An info gauge (value 1) whose labels are vLLM's CacheConfig, among them the KV blocks it allocated:
#: num_gpu_blocks x block_size is the KV cache's capacity in tokens (one series per engine).
CACHE_CONFIG_INFO = "vllm:cache_config_info"
_WANTED = (WAITING, RUNNING, KV_CACHE_USAGE, KV_CACHE_USAGE_OLD, CACHE_CONFIG_INFO)
#: The query that asks a pod for those families only. vLLM mounts prometheus_client's exposition at ``/metrics/``,
#: which honours ``name[]``: 1.7 KB instead of 50 KB (vLLM 0.32, one engine, measured). Its ``/metrics`` without
#: the slash is prometheus-fastapi-instrumentator's route, which answers everything whatever the query.
ONLY_WANTED_QUERY = urllib.parse.urlencode([("name[]", name) for name in _WANTED])
#: Pods (ip, port) remembered as answering ``/metrics/`` with something else: at most this many, then forgotten.
MAX_WHOLE_ONLY = 100_000
#: Longest sample line of the wanted families handed to the parser: vLLM 0.32's longest (cache_config_info,
#: 33 labels) is 1,060 bytes. prometheus_client's parser is quadratic within a line of escaped label values
#: (one 8 MiB line: minutes), so bounding each line makes the parse linear in what it reads...
MAX_LINE_BYTES = 4096
#: ... and this bounds what it reads: a pod's wanted lines, one per engine and family, are ~2 KB per engine
#: (at worst 0.4 us a byte: 0.1 s; bench/adversarial.py).
MAX_SELECTED_BYTES = 256 * 1024

#: Largest /metrics body read from a pod (vLLM's is ~30 KB; histograms per LoRA adapter can grow it).
MAX_METRICS_BYTES = 8 * 2**20
#: Largest Prometheus answer read: four series of ~250 bytes per pod is 1 MB for 1,000 replicas.
MAX_PROMETHEUS_BYTES = 8 * 2**20
#: How long a scrape may take beyond its fetch's deadline: parsing MAX_METRICS_BYTES takes ~0.2 s.
PARSE_SECONDS = 1.0


@dataclass(frozen=True)
class PodRef:
    """Where one ready pod serves: enough to scrape it or to name it in a Prometheus query."""

    name: str
    namespace: str
    ip: str
    port: int = VLLM_PORT


@dataclass(frozen=True)
class Sample:
    """vLLM's queue as one pod reported it (totals over its engines)."""

    pod: str
    waiting: float = 0.0
    running: float = 0.0
    kv_cache_usage: Optional[float] = None
    kv_capacity_tokens: Optional[int] = None
    """KV cache tokens vLLM allocated (num_gpu_blocks x block_size of vllm:cache_config_info, summed over
    engines); None when the pod does not say."""
    ok: bool = True
    error: Optional[str] = None
    scraped_at: float = 0.0
    """Wall-clock time (seconds since the epoch) the numbers were taken."""

    @classmethod
    def failed(cls, pod: str, error: str, at: Optional[float] = None) -> "Sample":
        return cls(pod=pod, ok=False, error=error, scraped_at=time.time() if at is None else at)


class MetricsSource(Protocol):
    def read(self, pods: Sequence[PodRef]) -> list[Sample]:
        """One Sample per pod, in order; never raises for an unreachable pod or backend."""
        ...


# --------------------------------------------------------------------------- pods
_NAME = re.compile(r"[^{\s]*")


def kv_capacity_tokens(labels: dict[str, str]) -> Optional[int]:
    """num_gpu_blocks x block_size from one vllm:cache_config_info series (None when either is missing or
    not a positive integer, as vLLM writes "None" before the cache is allocated)."""
    try:
        blocks, size = int(labels.get("num_gpu_blocks", "")), int(labels.get("block_size", ""))
    except ValueError:
        return None
    return blocks * size if blocks > 0 and size > 0 else None


def wanted_lines(text: str) -> Optional[str]:
    """The sample lines of the families we read, or None when one of them is longer than MAX_LINE_BYTES or
    all of them together longer than MAX_SELECTED_BYTES.

    A linear scan: the body is whatever the tenant's pod answers (up to MAX_METRICS_BYTES), and only what
    it selects, each line bounded, reaches prometheus_client's parser. Lines end at '\n' only, the format's
    line end (splitlines also splits at \x1c, \x85, ... inside a label value)."""
    kept, size = [], 0
    for line in text.split("\n"):
        if not line.startswith(_WANTED):
            continue
        name = _NAME.match(line)  # matches "" at worst
        if name is None or name.group() not in _WANTED:
            continue  # e.g. vllm:num_requests_waiting_by_reason
        size += len(line) + 1
        if len(line) > MAX_LINE_BYTES or size > MAX_SELECTED_BYTES:
            return None
        kept.append(line)
    return "\n".join(kept) + "\n"


def parse_vllm_metrics(pod: str, text: str, at: float) -> Sample:
    """The queue gauges from a Prometheus text exposition: waiting/running summed over the
    `engine` (and model) labels, KV cache usage averaged over engines, and the KV cache's capacity
    in tokens (vllm:cache_config_info) summed over engines.

    prometheus_client's parser reads the lines `wanted_lines` selects. A failure is a category, never a
    quote of the body; a NaN or infinite value fails the sample: the policy then holds."""
    selected = wanted_lines(text)
    if selected is None:
        return Sample.failed(pod, f"/metrics: vLLM's gauges take more than {MAX_SELECTED_BYTES} bytes "
                             f"or a line more than {MAX_LINE_BYTES}", at)
    values: dict[str, list[float]] = {name: [] for name in _WANTED}
    capacity: dict[str, int] = {}
    try:
        for family in text_string_to_metric_families(selected):
            for s in family.samples:
                if s.name == CACHE_CONFIG_INFO:
                    tokens = kv_capacity_tokens(s.labels)
                    if tokens is not None:
                        capacity[s.labels.get("engine", "")] = tokens
                elif s.name in values:
                    values[s.name].append(s.value)
    except Exception:  # noqa: BLE001 - whatever the parser raises, its message may quote the body
        return Sample.failed(pod, "/metrics: not Prometheus text", at)
    if not values[WAITING]:
        return Sample.failed(pod, f"/metrics has no {WAITING} (is this a vLLM server?)", at)
    kv = values[KV_CACHE_USAGE] or values[KV_CACHE_USAGE_OLD]
    sample = Sample(pod=pod, waiting=sum(values[WAITING]), running=sum(values[RUNNING]),
                    kv_cache_usage=(sum(kv) / len(kv)) if kv else None,
                    kv_capacity_tokens=sum(capacity.values()) if capacity else None, scraped_at=at)
    if not _finite(sample.waiting, sample.running, sample.kv_cache_usage):
        return Sample.failed(pod, "/metrics: non-finite value", at)
    return sample


def _finite(*values: Optional[float]) -> bool:
    return all(v is None or math.isfinite(v) for v in values)


def _answered_otherwise(sample: Sample) -> bool:
    """The pod answered /metrics/?name[]=... but not with vLLM's gauges: an HTTP error or redirect, or a page
    without them. A timeout or a refused connection is not that: /metrics would fail the same."""
    error = sample.error or ""
    return (error.endswith("redirect refused") or ": HTTP " in error
            or error.startswith("/metrics") and "non-finite" not in error)  # parse_vllm_metrics's failures


def _metrics_url(pod: PodRef) -> str:
    host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip  # an IPv6 pod IP
    return f"http://{host}:{pod.port}/metrics"


class PodsSource:
    """Scrape ``http://{podIP}:{port}/metrics`` of every ready pod at once, each within a total deadline.

    One instance serves the whole operator: its thread pool bounds the concurrent scrapes, and since every
    scrape ends within its deadline and every wait for one too, a tenant's slow pods hold it that long at most.
    Pod IPs are reached directly, whatever HTTP(S)_PROXY the operator's pod has.
    """

    def __init__(self, timeout: float = 1.0, max_workers: int = 16, only_wanted: bool = True,
                 on_scrape: Optional[Callable[[bool, int], None]] = None):
        self.timeout = timeout
        #: Called after each GET with (answered, bytes read): the operator counts its scrapes (telemetry).
        self.on_scrape = on_scrape or _not_counted
        #: Ask for the five families only (ONLY_WANTED_QUERY); False: the whole /metrics (the bench's baseline).
        self.only_wanted = only_wanted
        #: Pods whose /metrics/ answered without vLLM's gauges (another server, another vLLM): read whole.
        self._whole_only: set[tuple[str, int]] = set()
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="vllm-scrape")

    def read(self, pods: Sequence[PodRef]) -> list[Sample]:
        futures = [self._pool.submit(self._scrape, pod) for pod in pods]
        until = time.monotonic() + self.timeout + PARSE_SECONDS
        return [self._wait(future, pod, until) for future, pod in zip(futures, pods)]

    def _wait(self, future: "Future[Sample]", pod: PodRef, until: float) -> Sample:
        try:
            return future.result(timeout=max(0.0, until - time.monotonic()))
        except TimeoutError:
            # Still queued: other servers' scrapes held every worker. Cancelled, so it never runs late.
            why = "not scraped in time: every scraper was busy" if future.cancel() else "timed out"
            return Sample.failed(pod.name, f"GET {_metrics_url(pod)}: {why}")

    def submit(self, pod: PodRef) -> "Future[Sample]":
        """Scrape one pod in the same bounded pool without waiting for it (kvcapacity.py's light scrape)."""
        return self._pool.submit(self._scrape, pod)

    def _scrape(self, pod: PodRef) -> Sample:
        url = _metrics_url(pod)
        if self.only_wanted and (pod.ip, pod.port) not in self._whole_only:
            sample = self._get(pod, f"{url}/?{ONLY_WANTED_QUERY}", url)
            if sample.ok or not _answered_otherwise(sample):
                return sample  # the gauges, or the pod did not answer at all (the same at /metrics)
            if len(self._whole_only) >= MAX_WHOLE_ONLY:
                self._whole_only.clear()
            self._whole_only.add((pod.ip, pod.port))
        return self._get(pod, url, url)

    def _get(self, pod: PodRef, url: str, shown: str) -> Sample:
        """One GET of `url`; a failure names `shown` (the pod's /metrics, without our query)."""
        try:
            body = fetch.get(url, seconds=self.timeout, max_bytes=MAX_METRICS_BYTES, accept="text/plain")
        except fetch.FetchError as e:
            self.on_scrape(False, 0)
            return Sample.failed(pod.name, f"GET {shown}: {e}")
        self.on_scrape(True, len(body))
        return parse_vllm_metrics(pod.name, body.decode("utf-8", "replace"), time.time())

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _not_counted(ok: bool, size: int) -> None:
    pass


# --------------------------------------------------------------------------- prometheus
def pod_selector(pods: Sequence[PodRef]) -> str:
    """PromQL label matchers for exactly these pods (names are DNS labels: no regex metacharacters
    but '.', which is escaped)."""
    namespace = pods[0].namespace
    names = "|".join(sorted(p.name.replace(".", "\\\\.") for p in pods))
    return f'namespace="{namespace}",pod=~"{names}"'


def queue_query(pods: Sequence[PodRef]) -> str:
    """One instant query for every number the policy needs, per pod, tagged by a `q` label
    (one round trip, one evaluation time): waiting and running summed over engines, the
    KV cache usage averaged, and the age of the newest waiting sample (staleness)."""
    sel = pod_selector(pods)

    def tag(expr: str, q: str) -> str:
        return f'label_replace({expr}, "q", "{q}", "", "")'

    parts = [
        tag(f"sum by (pod) ({WAITING}{{{sel}}})", "waiting"),
        tag(f"sum by (pod) ({RUNNING}{{{sel}}})", "running"),
        tag(f"avg by (pod) ({KV_CACHE_USAGE}{{{sel}}})", "kv"),
        tag(f"time() - max by (pod) (timestamp({WAITING}{{{sel}}}))", "age"),
    ]
    return " or ".join(parts)


class PrometheusSource:
    """One instant query (GET /api/v1/query), scoped to the server's namespace and pods.

    A pod missing from the answer (not scraped yet, target down: Prometheus marks its series
    stale) or whose newest sample is older than ``stale_seconds`` is reported as not ok.

    The URL may be a tenant's (spec.autoscaling.prometheusURL), so the query goes through the fetch helper
    like a pod scrape, not prometheus-api-client: that client mounts its own requests adapter on the URL
    (redirects followed), reads whole bodies, times out per socket read, and quotes the body in its errors.
    """

    def __init__(self, url: str, timeout: float = 2.0, stale_seconds: float = 60.0):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.stale_seconds = stale_seconds

    def read(self, pods: Sequence[PodRef]) -> list[Sample]:
        if not pods:
            return []
        now = time.time()
        try:
            values = self._query(queue_query(pods))
        except fetch.FetchError as e:  # unreachable or failing Prometheus: every pod is missing
            return [Sample.failed(p.name, f"Prometheus {self.url}: {e}", now) for p in pods]
        return [self._sample(p, values.get(p.name, {}), now) for p in pods]

    def _query(self, query: str) -> dict[str, dict[str, float]]:
        # No retries: the next tick is the retry, and a hold must not wait for backoffs.
        body = fetch.get(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': query})}",
                         seconds=self.timeout, max_bytes=MAX_PROMETHEUS_BYTES, accept="application/json",
                         use_proxy=True)
        return query_values(fetch.load_json(body))

    def _sample(self, pod: PodRef, v: dict[str, float], now: float) -> Sample:
        if "waiting" not in v:
            return Sample.failed(pod.name, f"Prometheus {self.url} has no {WAITING} for this pod "
                                 "(not scraped yet, or its target is down)", now)
        if not _finite(*v.values()):
            return Sample.failed(pod.name, f"Prometheus {self.url}: non-finite value", now)
        if v.get("age", 0.0) > self.stale_seconds:
            return Sample.failed(pod.name, f"Prometheus's newest {WAITING} for this pod is "
                                 f"{v['age']:.0f}s old (stale after {self.stale_seconds:.0f}s)", now)
        return Sample(pod=pod.name, waiting=v["waiting"], running=v.get("running", 0.0),
                      kv_cache_usage=v.get("kv"), scraped_at=now - v.get("age", 0.0))


def query_values(answer: Any) -> dict[str, dict[str, float]]:
    """{pod: {q: value}} from an instant query's answer; series of another shape are skipped, and an
    answer without data.result is FetchError("not a Prometheus answer")."""
    data = answer.get("data") if isinstance(answer, dict) else None
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(result, list):
        raise fetch.FetchError("not a Prometheus answer")
    values: dict[str, dict[str, float]] = {}
    for item in result:
        series = _series(item)
        if series is not None:
            pod, q, value = series
            values.setdefault(pod, {})[q] = value
    return values


def _series(item: Any) -> Optional[tuple[str, str, float]]:
    """(pod, q, value) of one vector element: {"metric": {"pod": ..., "q": ...}, "value": [time, "1.5"]}."""
    labels = item.get("metric") if isinstance(item, dict) else None
    value = item.get("value") if isinstance(item, dict) else None
    if not (isinstance(labels, dict) and isinstance(value, list) and len(value) == 2 and isinstance(value[1], str)):
        return None
    pod, q = labels.get("pod"), labels.get("q")
    if not (isinstance(pod, str) and isinstance(q, str)):
        return None
    try:
        return pod, q, float(value[1])
    except ValueError:
        return None


# --------------------------------------------------------------------------- KV capacity reads
# vllm:cache_config_info's num_gpu_blocks x block_size is fixed when a server starts, so it is read rarely:
# the autoscaler (source: Pods) scrapes every ready pod each tick anyway and records what it saw
# (`Observations.record`), at no extra cost; otherwise the reconciler asks (`Observations.measure`) and a pod
# with no reading younger than refresh_seconds (5 minutes) gets one scrape in the autoscaler's bounded scrape
# pool, in the background; the reconcile never waits for it, its result is reported by the next reconcile (the
# periodic resync: a minute by default). Only numbers are kept: no response bytes reach status or events.
#: A pod's reading is trusted this long (vLLM allocates its KV cache once, at start-up).
REFRESH_SECONDS = 300.0
#: Readings of pods not asked about for this long are forgotten (the pod is gone).
FORGET_SECONDS = 3 * REFRESH_SECONDS


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


def ready_pods(pods: Sequence[dict[str, Any]], conditions: tuple[str, ...] = ("Ready",)) -> list[PodRef]:
    """The pods that serve (Ready, with an IP on the pod network, not terminating), where to scrape them.
    `conditions` ("Ready", "ContainersReady"): the pods whose vLLM answers, Ready or still held back by a readiness
    gate (any of the conditions True)."""
    out = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if meta.get("deletionTimestamp") or unscrapable(pod):
            continue
        if not any(c.get("type") in conditions and c.get("status") == "True" for c in status.get("conditions") or []):
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
