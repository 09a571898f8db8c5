"""The operator's own observability: Prometheus metrics and the HTTP endpoints its probes use.

One small HTTP server on `--health-port` (HealthServer: bounded connections, deadlines, no thread per
connection) answers:

* ``/metrics``: every metric below, plus the Python process collectors; with --metrics-token-file only to a caller
  that sends that bearer token, and the series naming a tenant's server only to such a caller (MetricsAccess);
* ``/healthz`` (liveness): 200 while kopf's event loop answers within a few seconds
  (and while the operator is still starting, so a slow start is never killed);
* ``/readyz`` (readiness): 200 once kopf has run its startup handlers and begun watching.

The metrics are registered when the operator starts (`start`, in operator_main.run()), never at import:
`vllm-operator plan` and the pure core register nothing. The recording functions are plain calls with no I/O,
safe from any thread; the reconcile wrapper, the Kubernetes client layer and the autoscaler call them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any, Iterator, Optional

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import generate_latest

from . import __version__, api

NAMESPACE = "vllm_operator"
RESULTS = ("applied", "unchanged", "invalid", "gone", "error", "pending")
DIRECTIONS = ("up", "down", "hold")


class Metrics:
    """The operator's metrics, registered in `registry` when built: the operator builds them once, in
    operator_main.run() (`start`), so importing this module registers nothing."""

    def __init__(self, registry: CollectorRegistry = REGISTRY):
        self.registry = registry
        ns, r = NAMESPACE, registry
        self.reconciles = Counter(
            "reconciles", "Reconciles of a VLLMServer by result: applied (something written), unchanged, "
            "invalid (SpecValid=False), gone (deleted), error (raised and retried), pending (its chat template "
            "waits for its check).", ["result"], namespace=ns,
            registry=r)
        self.reconcile_duration = Histogram(
            "reconcile_duration_seconds", "Wall time of one reconcile, API calls included.", namespace=ns,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0), registry=r)
        self.reconcile_errors = Counter(
            "reconcile_errors", "Reconciles that raised, by cause (HTTP status of the failing API call, or the "
            "exception's class).", ["cause"], namespace=ns, registry=r)
        self.api_writes = Counter(
            "api_writes", "Writes to the Kubernetes API by resource (plural[/subresource]) and verb "
            "(apply, patch, create, delete).", ["resource", "verb"], namespace=ns, registry=r)
        self.scaling_decisions = Counter(
            "scaling_decisions", "Autoscaler decisions by VLLMServer and direction (up, down, hold).",
            ["namespace", "name", "direction"], namespace=ns, registry=r)
        self.server_ready = Gauge(
            "server_ready", "1 while a VLLMServer's Ready condition is True, 0 while it is False, as the reconciler "
            "last wrote it; the series goes with the server.", ["namespace", "name"], namespace=ns, registry=r)
        self.server_replicas = Gauge(
            "server_replicas", "Replicas a VLLMServer's workload wants (status.replicas: the StatefulSet's "
            "spec.replicas, or the nodes a DaemonSet runs on).", ["namespace", "name"], namespace=ns, registry=r)
        self.server_ready_replicas = Gauge(
            "server_ready_replicas", "Replicas of a VLLMServer that are Ready (status.readyReplicas).",
            ["namespace", "name"], namespace=ns, registry=r)
        self.autoscaler_at_max = Gauge(
            "autoscaler_at_max_replicas", "1 while the autoscaler's last decision wanted more replicas than "
            "maxReplicas (AutoscalingLimited=True, AtMaxReplicas), else 0; kept through a hold; only for "
            "autoscaling.mode Operator.", ["namespace", "name"], namespace=ns, registry=r)
        self.kopf_adaptation = Gauge(
            "kopf_adaptation", "1 while an adaptation of kopf (kopfext/) is in effect, 0 when its start-up self-test "
            "failed and kopf's own behaviour is used instead (the log says why).", ["adaptation"], namespace=ns,
            registry=r)
        self.pod_scrapes = Counter(
            "pod_scrapes", "GETs of a pod's /metrics by the operator (the autoscaler's reads, source Pods, and the "
            "KV capacity reads), by result (ok, failed).", ["result"], namespace=ns, registry=r)
        self.pod_scrape_bytes = Counter(
            "pod_scrape_bytes", "Bytes of the /metrics bodies the operator read from pods.", namespace=ns,
            registry=r)
        self.chat_template_checks = Counter(
            "chat_template_checks", "Chat templates checked in a child process, by result (ok, refused, error: the "
            "check itself failed); a template whose digest was checked before (in memory or in its server's "
            "status) is not counted.", ["result"], namespace=ns, registry=r)
        self.build_info = Gauge(
            "build_info", "The operator's version and the vLLM release its flags are checked against.",
            ["version", "vllm_version"], namespace=ns, registry=r)
        self.build_info.labels(version=__version__, vllm_version=api.VLLM_VERSION).set(1)
        for result in RESULTS:  # a rate of 0 is a value, not an absent series (dashboards, `result="error"`)
            self.reconciles.labels(result=result)


_started: dict[int, Metrics] = {}
_current: list[Metrics] = []


def start(registry: CollectorRegistry = REGISTRY) -> Metrics:
    """The operator's metrics in `registry`, registered there the first time; the recording functions below
    record into them from then on."""
    metrics = _started.get(id(registry))
    if metrics is None:
        metrics = _started[id(registry)] = Metrics(registry)
    _current[:] = [metrics]
    return metrics


def _metrics() -> Metrics:
    """Where the recording functions record: what `start` registered (in the default registry when a caller
    records before the operator started, as a reconciler driven by a test does)."""
    return _current[0] if _current else start()


# --------------------------------------------------------------------------- recording
def record_reconcile(result: str, seconds: float) -> None:
    """One reconcile finished with `result` (one of RESULTS) after `seconds`."""
    if result not in RESULTS:
        raise ValueError(f"unknown reconcile result {result!r}; expected one of {RESULTS}")
    m = _metrics()
    m.reconciles.labels(result=result).inc()
    m.reconcile_duration.observe(seconds)


def record_reconcile_error(cause: str) -> None:
    _metrics().reconcile_errors.labels(cause=cause).inc()


def record_api_write(resource: str, verb: str) -> None:
    _metrics().api_writes.labels(resource=resource, verb=verb).inc()


def record_scaling_decision(namespace: str, name: str, direction: str) -> None:
    """The autoscaler decided to scale `direction` (up, down or hold) for one VLLMServer."""
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown scaling direction {direction!r}; expected one of {DIRECTIONS}")
    _metrics().scaling_decisions.labels(namespace=namespace, name=name, direction=direction).inc()


def record_scrape(ok: bool, size: int) -> None:
    """One GET of a pod's /metrics ended: answered with `size` bytes, or failed."""
    m = _metrics()
    m.pod_scrapes.labels(result="ok" if ok else "failed").inc()
    m.pod_scrape_bytes.inc(size)


def record_server(namespace: str, name: str, ready: bool, replicas: int, ready_replicas: int) -> None:
    """What the reconciler just wrote into one VLLMServer's status: Ready, replicas, readyReplicas."""
    m = _metrics()
    m.server_ready.labels(namespace=namespace, name=name).set(1 if ready else 0)
    m.server_replicas.labels(namespace=namespace, name=name).set(replicas)
    m.server_ready_replicas.labels(namespace=namespace, name=name).set(ready_replicas)


def forget_server(namespace: str, name: str) -> None:
    """The VLLMServer is gone: its series go too (a deleted server is not an unready one)."""
    m = _metrics()
    for gauge in (m.server_ready, m.server_replicas, m.server_ready_replicas):
        _remove(gauge, namespace, name)


def record_at_max_replicas(namespace: str, name: str, at_max: bool) -> None:
    """The autoscaler's last decision for one VLLMServer was (or was not) cut to maxReplicas."""
    _metrics().autoscaler_at_max.labels(namespace=namespace, name=name).set(1 if at_max else 0)


def forget_autoscaler(namespace: str, name: str) -> None:
    """The server's autoscaler loop stopped (autoscaling off, handed to an HPA/KEDA, server deleted)."""
    _remove(_metrics().autoscaler_at_max, namespace, name)


def _remove(gauge: Gauge, namespace: str, name: str) -> None:
    try:
        gauge.remove(namespace, name)
    except KeyError:  # never set in this process
        pass


def record_chat_template_check(result: str) -> None:
    """One chat template was checked in a child: ok, refused or error."""
    _metrics().chat_template_checks.labels(result=result).inc()


def record_kopf_adaptation(name: str, applied: bool) -> None:
    _metrics().kopf_adaptation.labels(adaptation=name).set(1 if applied else 0)


def api_write_labels(method: str, path: str, content_type: str = "") -> Optional[tuple[str, str]]:
    """(resource, verb) of a write request to the API server, None for reads.

    `path` is a REST path such as /apis/apps/v1/namespaces/ns/statefulsets/x or
    /apis/vllm-operator.io/v1alpha1/namespaces/ns/vllmservers/x/status.
    """
    method = method.upper()
    if method in ("GET", "HEAD", "OPTIONS"):
        return None
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    # strip /api/v1 or /apis/group/version, then an optional namespaces/<ns>
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) != 2:
        rest = rest[2:]
    resource = rest[0] if rest else "unknown"
    if len(rest) >= 3:
        resource += "/" + rest[2]
    if method == "PATCH":
        verb = "apply" if "apply-patch" in content_type else "patch"
    else:
        verb = {"POST": "create", "PUT": "update", "DELETE": "delete"}.get(method, method.lower())
    return resource, verb


# --------------------------------------------------------------------------- health
@dataclass
class Health:
    """What /healthz and /readyz look at."""

    loop: Optional[asyncio.AbstractEventLoop] = None
    """kopf's event loop, once it runs (set from an async startup handler)."""
    ready: threading.Event = field(default_factory=threading.Event)
    """Set by kopf (its ready_flag) after the startup handlers ran."""
    loop_timeout: float = 5.0

    def live(self) -> tuple[bool, str]:
        loop = self.loop
        if loop is None:
            return True, "starting"
        if loop.is_closed():
            return False, "event loop closed"
        future = asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop)
        try:
            future.result(timeout=self.loop_timeout)
        except Exception:  # noqa: BLE001 - a timeout or a loop that stopped: not live either way
            future.cancel()
            return False, f"event loop did not answer within {self.loop_timeout:g}s"
        return True, "ok"

    def is_ready(self) -> tuple[bool, str]:
        return (True, "ok") if self.ready.is_set() else (False, "starting")


#: The series that name a tenant's server (labels namespace and name): served only to an authenticated caller,
#: unless the operator's settings make them public (MetricsAccess).
PER_SERVER = frozenset({"vllm_operator_scaling_decisions", "vllm_operator_server_ready",
                        "vllm_operator_server_replicas", "vllm_operator_server_ready_replicas",
                        "vllm_operator_autoscaler_at_max_replicas"})
#: Connections at once, in all and from one address. Beyond the first, the connection that has waited longest for
#: its request is closed for the new one; beyond the second, the new one is closed at once.
MAX_CONNECTIONS = 256
MAX_CONNECTIONS_PER_PEER = 16
#: Seconds a connection may take to send its request's head, and to take the answer.
READ_TIMEOUT = 5.0
WRITE_TIMEOUT = 10.0
#: The longest request head read (request line and headers).
MAX_HEAD_BYTES = 8192


@dataclass
class MetricsAccess:
    """Who may read what on /metrics (--metrics-token-file, --metrics-public-server-series)."""

    token_file: Optional[str] = None
    """A file holding the bearer token /metrics asks for (read at each request: a rotated Secret applies); None:
    /metrics asks for none."""
    public_server_series: bool = False
    """Serve the per-server series (PER_SERVER) to callers without the token too."""

    def check(self, authorization: str) -> tuple[bool, bool]:
        """(may read /metrics, may see the per-server series) for a request's Authorization header."""
        if self.token_file is None:
            return True, self.public_server_series
        try:
            token = Path(self.token_file).read_text().strip()
        except OSError:
            return False, False
        scheme, _, given = authorization.partition(" ")
        ok = bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())
        return ok, ok


class _Without:
    """A registry's metrics less some families (what generate_latest reads)."""

    def __init__(self, registry: CollectorRegistry, names: frozenset[str]):
        self.registry, self.names = registry, names

    def collect(self) -> Iterator[Any]:
        return (m for m in self.registry.collect() if m.name not in self.names)


class HealthServer:
    """/metrics, /healthz and /readyz on one port, bounded by design: one asyncio loop on its own thread (not
    kopf's, so /healthz can judge kopf's), a connection cap in all (the longest idle gives way) and per address, a
    deadline to send the request and one to take the answer, one request per connection, and two threads for the
    work (the metrics' text, the event loop check)."""

    def __init__(self, host: str, port: int, health: Health, registry: CollectorRegistry, access: MetricsAccess):
        self.health, self.registry, self.access = health, registry, access
        self.active = self.peak = self.refused = 0
        self._peers: dict[str, int] = {}
        self._waiting: "OrderedDict[int, asyncio.Transport]" = OrderedDict()
        self._evicted: set[int] = set()
        self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="vllm-operator-http")
        self._loop = asyncio.new_event_loop()
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._connection, host, port, limit=MAX_HEAD_BYTES, backlog=128))
        self.server_address = self._server.sockets[0].getsockname()[:2]
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-operator-http", daemon=True)
        self._thread.start()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = str((writer.get_extra_info("peername") or ("?",))[0])
        if self._peers.get(peer, 0) >= MAX_CONNECTIONS_PER_PEER:
            writer.transport.abort()
            self.refused += 1
            return
        if self.active >= MAX_CONNECTIONS and self._waiting:  # the one that waited longest gives way: a probe
            key, oldest = self._waiting.popitem(last=False)    # always gets in, the memory stays bounded
            oldest.abort()
            self._evicted.add(key)
            self.active -= 1
            self.refused += 1
        self.active += 1
        self.peak = max(self.peak, self.active)
        self._peers[peer] = self._peers.get(peer, 0) + 1
        self._waiting[id(writer)] = writer.transport  # type: ignore[assignment]  # a TCP transport
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
            self._waiting.pop(id(writer), None)
            code, body, content_type = await self._answer(head.decode("latin-1"))
            writer.write(f"HTTP/1.1 {code} {HTTPStatus(code).phrase}\r\nContent-Type: {content_type}\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError,
                UnicodeError):
            pass
        finally:
            self._waiting.pop(id(writer), None)
            if id(writer) in self._evicted:  # counted out when it gave way
                self._evicted.discard(id(writer))
            else:
                self.active -= 1
            self._peers[peer] -= 1
            if not self._peers[peer]:
                del self._peers[peer]
            if writer.transport.get_write_buffer_size():  # a reader that does not read: not waited for
                writer.transport.abort()
            else:
                writer.close()

    async def _answer(self, head: str) -> tuple[int, bytes, str]:
        lines = head.split("\r\n")
        method, _, rest = lines[0].partition(" ")
        path = rest.split(" ", 1)[0].split("?", 1)[0]
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        loop = asyncio.get_running_loop()
        if method != "GET":
            return 405, b"GET only\n", "text/plain; charset=utf-8"
        if path == "/metrics":
            allowed, per_server = self.access.check(headers.get("authorization", ""))
            if not allowed:
                return 401, b"a bearer token is required (--metrics-token-file)\n", "text/plain; charset=utf-8"
            view = self.registry if per_server else _Without(self.registry, PER_SERVER)
            return 200, await loop.run_in_executor(self._pool, generate_latest, view), CONTENT_TYPE_LATEST
        if path in ("/healthz", "/livez", "/readyz"):
            check = self.health.is_ready if path == "/readyz" else self.health.live
            ok, message = await loop.run_in_executor(self._pool, check)
            return 200 if ok else 503, (message + "\n").encode(), "text/plain; charset=utf-8"
        return 404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain; charset=utf-8"

    def shutdown(self) -> None:
        async def stop() -> None:
            self._server.close()
            await self._server.wait_closed()
        try:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        except Exception:  # noqa: BLE001 - stopping anyway
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._pool.shutdown(wait=False)


def serve(port: int, health: Health, host: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY,
          access: Optional[MetricsAccess] = None) -> HealthServer:
    """Start the HTTP server on its own thread; `port` 0 picks a free one (see `server_address`)."""
    return HealthServer(host, port, health, registry, access or MetricsAccess(public_server_series=True))
