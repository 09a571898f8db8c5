"""Read vLLM's queue gauges for one server's ready pods, from the pods themselves or from Prometheus.

Both sources answer one `Sample` per pod asked about, in the same order. A pod whose
numbers could not be read comes back with ``ok=False`` and the reason in ``error``: the
policy then holds the replica count instead of guessing.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence

from prometheus_client.parser import text_string_to_metric_families

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
#: vLLM before 0.10 called the KV cache gauge gpu_cache_usage_perc.
KV_CACHE_USAGE_OLD = "vllm:gpu_cache_usage_perc"
#: An info gauge (value 1) whose labels are vLLM's CacheConfig, among them the KV blocks it allocated:
#: num_gpu_blocks x block_size is the KV cache's capacity in tokens (one series per engine).
CACHE_CONFIG_INFO = "vllm:cache_config_info"

#: Largest /metrics body read from a pod (vLLM's is ~30 KB; histograms per LoRA adapter can grow it).
MAX_METRICS_BYTES = 8 * 2**20


@dataclass(frozen=True)
class PodRef:
    """Where one ready pod serves: enough to scrape it or to name it in a Prometheus query."""

    name: str
    namespace: str
    ip: str
    port: int = 8000


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
def kv_capacity_tokens(labels: dict[str, str]) -> Optional[int]:
    """num_gpu_blocks x block_size from one vllm:cache_config_info series (None when either is missing or
    not a positive integer, as vLLM writes "None" before the cache is allocated)."""
    try:
        blocks, size = int(labels.get("num_gpu_blocks", "")), int(labels.get("block_size", ""))
    except ValueError:
        return None
    return blocks * size if blocks > 0 and size > 0 else None


def parse_vllm_metrics(pod: str, text: str, at: float) -> Sample:
    """The queue gauges from a Prometheus text exposition: waiting/running summed over the
    `engine` (and model) labels, KV cache usage averaged over engines, and the KV cache's capacity
    in tokens (vllm:cache_config_info) summed over engines."""
    capacity: dict[str, int] = {}
    waiting: list[float] = []
    running: list[float] = []
    kv: list[float] = []
    kv_old: list[float] = []
    wanted = {WAITING: waiting, RUNNING: running, KV_CACHE_USAGE: kv, KV_CACHE_USAGE_OLD: kv_old}
    try:
        for family in text_string_to_metric_families(text):
            if family.name == CACHE_CONFIG_INFO:
                for s in family.samples:
                    tokens = kv_capacity_tokens(s.labels)
                    if tokens is not None:
                        capacity[s.labels.get("engine", "")] = tokens
                continue
            bucket = wanted.get(family.name)
            if bucket is None:
                continue
            bucket.extend(s.value for s in family.samples if s.name == family.name)
    except ValueError as e:
        return Sample.failed(pod, f"/metrics is not in the Prometheus text format: {e}", at)
    if not waiting:
        return Sample.failed(pod, f"/metrics has no {WAITING} (is this a vLLM server?)", at)
    kv = kv or kv_old
    return Sample(pod=pod, waiting=sum(waiting), running=sum(running),
                  kv_cache_usage=(sum(kv) / len(kv)) if kv else None,
                  kv_capacity_tokens=sum(capacity.values()) if capacity else None, scraped_at=at)


def _http_get(url: str, timeout: float) -> str:
    # No proxy: pod IPs are reached directly, whatever HTTP(S)_PROXY the operator's pod has.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as resp:
        return resp.read(MAX_METRICS_BYTES).decode("utf-8", "replace")


def _describe(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code}"
    if isinstance(e, urllib.error.URLError):
        e = e.reason if isinstance(e.reason, BaseException) else e
    if isinstance(e, TimeoutError) or "timed out" in str(e):
        return "timed out"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    return str(e) or type(e).__name__


class PodsSource:
    """Scrape ``http://{podIP}:{port}/metrics`` of every ready pod at once, with a short timeout.

    One instance serves the whole operator: its thread pool bounds the concurrent scrapes.
    """

    def __init__(self, timeout: float = 1.0, max_workers: int = 16,
                 fetch: Callable[[str, float], str] = _http_get):
        self.timeout = timeout
        self.fetch = fetch
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="vllm-scrape")

    def read(self, pods: Sequence[PodRef]) -> list[Sample]:
        futures = [self._pool.submit(self._scrape, pod) for pod in pods]
        return [f.result() for f in futures]

    def submit(self, pod: PodRef) -> "Future[Sample]":
        """Scrape one pod in the same bounded pool without waiting for it (kvcapacity.py's light scrape)."""
        return self._pool.submit(self._scrape, pod)

    def _scrape(self, pod: PodRef) -> Sample:
        url = f"http://{pod.ip}:{pod.port}/metrics"
        try:
            text = self.fetch(url, self.timeout)
        except Exception as e:  # noqa: BLE001 - any failure is a missing sample, reported as such
            return Sample.failed(pod.name, f"GET {url}: {_describe(e)}")
        return parse_vllm_metrics(pod.name, text, time.time())

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


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
    """Instant queries through prometheus-api-client, scoped to the server's namespace and pods.

    A pod missing from the answer (not scraped yet, target down: Prometheus marks its series
    stale) or whose newest sample is older than ``stale_seconds`` is reported as not ok.
    """

    def __init__(self, url: str, timeout: float = 2.0, stale_seconds: float = 60.0, connect=None):
        from prometheus_api_client import PrometheusConnect
        from urllib3.util.retry import Retry

        self.url = url.rstrip("/")
        self.timeout = timeout
        self.stale_seconds = stale_seconds
        # No retries: the next tick is the retry, and a hold must not wait for backoffs.
        self.prom = (connect or PrometheusConnect)(self.url, retry=Retry(total=0), timeout=timeout)

    def read(self, pods: Sequence[PodRef]) -> list[Sample]:
        if not pods:
            return []
        now = time.time()
        try:
            result = self.prom.custom_query(queue_query(pods))
        except Exception as e:  # noqa: BLE001 - unreachable or failing Prometheus: every pod is missing
            reason = f"Prometheus {self.url} did not answer: {_describe_prometheus(e)}"
            return [Sample.failed(p.name, reason, now) for p in pods]
        values: dict[str, dict[str, float]] = {}
        for item in result or []:
            labels = item.get("metric", {})
            try:
                values.setdefault(labels.get("pod", ""), {})[labels.get("q", "")] = float(item["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
        samples = []
        for p in pods:
            v = values.get(p.name, {})
            if "waiting" not in v:
                samples.append(Sample.failed(p.name, f"Prometheus {self.url} has no {WAITING} for this pod "
                                             "(not scraped yet, or its target is down)", now))
            elif v.get("age", 0.0) > self.stale_seconds:
                samples.append(Sample.failed(p.name, f"Prometheus's newest {WAITING} for this pod is "
                                             f"{v['age']:.0f}s old (stale after {self.stale_seconds:.0f}s)", now))
            else:
                samples.append(Sample(pod=p.name, waiting=v["waiting"], running=v.get("running", 0.0),
                                      kv_cache_usage=v.get("kv"), scraped_at=now - v.get("age", 0.0)))
        return samples


def _describe_prometheus(e: BaseException) -> str:
    text = str(e)
    if "Connection refused" in text or "NewConnectionError" in text:
        return "connection refused"
    if "timed out" in text.lower():
        return "timed out"
    return text[:300] or type(e).__name__
