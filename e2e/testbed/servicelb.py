"""Send requests the way they reach a Service, and count what happens to each one.

``EndpointSliceRouter`` is what kube-proxy does for a ClusterIP Service, for a client on this host: it
reads the Service's EndpointSlices from the API server (the kube-controller-manager's endpointslice
controller writes them from the pods' podIP, Ready condition and deletionTimestamp) every ``interval``
seconds, and each new connection goes to one of the ready endpoints, round robin (IPVS's default
scheduler). A terminating pod's endpoint is not ready (``terminating: true``); only when no endpoint is
ready does it fall back to the serving terminating ones, as kube-proxy does. Until the first answer, or
when an answer fails, it keeps what it had (as kube-proxy keeps its rules).

``StreamingLoad`` is a closed loop of ``clients``, each sending its next streaming ``/v1/completions``
(``stream: true``, ``ignore_eos``, ``max_tokens`` tokens, a new connection each) when the last one ended,
to whatever endpoint the router picks at that moment. Every request is recorded (where it went, when it
started and ended, the tokens received, counted one by one from the chunks' logprobs, the
finish_reason, the usage) and ends as one of:

* ``completed``: finish_reason ``length`` with every token asked for (or ``stop``), the usage agreeing;
* ``lost``: it could not connect, the Service had no endpoint, an HTTP error, the stream broke, or it
  ended with fewer tokens than asked and no ``length``/``stop`` finish (vLLM's abort ends a stream
  with ``data: [DONE]`` and no finish_reason: a client that only waits for ``[DONE]`` would miss it);
* ``cancelled``: stopped by ``stop()`` (the test's own end, never a scale-down's doing).

Bounded like ``loadgen.LoadGenerator``: a request count and a time limit, and only to addresses of this
host (loopback, or pod addresses on the loopback interface of an ``e2e.testbed.netns`` namespace).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Callable, Optional

import aiohttp
from kubernetes import client

from e2e.testbed.netns import is_local

SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def check_local(url: str) -> None:
    host = urllib.parse.urlparse(url).hostname or ""
    if not is_local(host):
        raise ValueError(f"load only goes to addresses of this host, not {url}")


@dataclass(frozen=True)
class Endpoint:
    address: str
    pod: Optional[str]
    ready: bool
    serving: bool
    terminating: bool


class EndpointSliceRouter:
    """The ready endpoints of a Service, re-read from its EndpointSlices every `interval` seconds."""

    def __init__(self, api_client: client.ApiClient, namespace: str, service: str, *, port_name: str = "http",
                 interval: float = 0.25, scheme: str = "http"):
        self.discovery = client.DiscoveryV1Api(api_client)
        self.namespace = namespace
        self.service = service
        self.port_name = port_name
        self.interval = interval
        self.scheme = scheme
        self.endpoints: tuple[Endpoint, ...] = ()
        self.port: Optional[int] = None
        self.reads = 0
        self.errors: list[str] = []
        #: (time.monotonic(), ready addresses, terminating addresses) at every change.
        self.history: list[tuple[float, tuple[str, ...], tuple[str, ...]]] = []
        self._rr = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # ---- the endpoints
    def read(self) -> None:
        """One read of the Service's EndpointSlices (the thread does it every `interval`)."""
        slices = self.discovery.list_namespaced_endpoint_slice(
            self.namespace, label_selector=f"{SERVICE_NAME_LABEL}={self.service}").items
        endpoints: dict[str, Endpoint] = {}
        port = None
        for s in slices:
            if s.address_type not in ("IPv4", "IPv6"):
                continue
            ports = {p.name or "": p.port for p in s.ports or []}
            if self.port_name not in ports:
                continue
            port = ports[self.port_name]
            for e in s.endpoints or []:
                c = e.conditions
                # The API: an unset ready/serving means unknown, to be read as ready; terminating as not.
                ready = c is None or c.ready is None or bool(c.ready)
                serving = c is None or c.serving is None or bool(c.serving)
                terminating = bool(c is not None and c.terminating)
                pod = e.target_ref.name if e.target_ref is not None else None
                for a in e.addresses or []:
                    endpoints[a] = Endpoint(a, pod, ready, serving, terminating)
        with self._lock:
            self.reads += 1
            self.endpoints = tuple(sorted(endpoints.values(), key=lambda e: e.address))
            self.port = port
            ready = tuple(e.address for e in self.endpoints if e.ready)
            term = tuple(e.address for e in self.endpoints if e.terminating)
            if not self.history or self.history[-1][1:] != (ready, term):
                self.history.append((time.monotonic(), ready, term))

    def ready_addresses(self) -> list[str]:
        with self._lock:
            return [e.address for e in self.endpoints if e.ready]

    def urls(self) -> list[str]:
        """Where a new connection may go: the ready endpoints, else the serving terminating ones."""
        with self._lock:
            if self.port is None:
                return []
            chosen = [e for e in self.endpoints if e.ready] or [e for e in self.endpoints if e.serving and e.terminating]
            return [f"{self.scheme}://{e.address}:{self.port}" for e in chosen]

    def pick(self) -> Optional[str]:
        """The next connection's endpoint, round robin; None when the Service has none (kube-proxy rejects)."""
        urls = self.urls()
        if not urls:
            return None
        with self._lock:
            self._rr += 1
            return urls[self._rr % len(urls)]

    # ---- the thread
    def start(self) -> "EndpointSliceRouter":
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=f"router-{self.service}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.read()
            except Exception as e:  # noqa: BLE001 - keep the last endpoints, as kube-proxy keeps its rules
                if len(self.errors) < 50:
                    self.errors.append(f"{type(e).__name__}: {e}")
            self._stop.wait(self.interval)

    def __enter__(self) -> "EndpointSliceRouter":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --------------------------------------------------------------------------- the load
COMPLETED, LOST, CANCELLED = "completed", "lost", "cancelled"


@dataclass
class StreamRecord:
    id: int
    url: Optional[str]
    max_tokens: int
    started: float
    ended: Optional[float] = None
    first_token_at: Optional[float] = None
    status: Optional[int] = None
    tokens: int = 0
    finish_reason: Optional[str] = None
    usage_tokens: Optional[int] = None
    done_marker: bool = False
    error: Optional[str] = None
    outcome: Optional[str] = None
    """None while in flight, then COMPLETED, LOST or CANCELLED."""
    why: str = ""

    @property
    def host(self) -> Optional[str]:
        return urllib.parse.urlparse(self.url).hostname if self.url else None

    def in_flight_at(self, t: float) -> bool:
        return self.started <= t and (self.ended is None or self.ended > t)

    def classify(self) -> None:
        if self.outcome == CANCELLED:
            return
        if self.error is not None:
            self.outcome, self.why = LOST, self.error
        elif self.status != 200:
            self.outcome, self.why = LOST, f"HTTP {self.status}"
        elif self.finish_reason == "length" and self.tokens != self.max_tokens:
            self.outcome, self.why = LOST, f"finish_reason length after {self.tokens} of {self.max_tokens} tokens"
        elif self.finish_reason in ("length", "stop") and self.usage_tokens not in (None, self.tokens):
            self.outcome, self.why = LOST, f"{self.tokens} tokens received, the usage says {self.usage_tokens}"
        elif self.finish_reason in ("length", "stop") and self.tokens > 0:
            self.outcome, self.why = COMPLETED, self.finish_reason
        else:
            self.outcome = LOST
            self.why = (f"cut after {self.tokens} of {self.max_tokens} tokens (finish_reason {self.finish_reason}, "
                        f"{'[DONE]' if self.done_marker else 'no [DONE]'})")

    def brief(self) -> dict:
        return {"id": self.id, "host": self.host, "tokens": self.tokens, "outcome": self.outcome, "why": self.why,
                "seconds": round((self.ended or time.monotonic()) - self.started, 1)}


@dataclass
class LoadSummary:
    sent: int = 0
    completed: int = 0
    lost: int = 0
    cancelled: int = 0
    in_flight: int = 0
    by_host: dict = field(default_factory=dict)
    lost_requests: list = field(default_factory=list)
    tokens_per_second: Optional[float] = None
    """Median decode speed of the streams (tokens after the first / seconds, lost ones until cut); per host in
    by_host."""


class StreamingLoad:
    """A closed loop of `clients` streaming /v1/completions, each to the endpoint `pick()` names at its send."""

    def __init__(self, pick: Callable[[], Optional[str]], *, clients: int, max_tokens: int, model: str = "tiny",
                 prompt: str = "hello", max_requests: int = 2000, duration: float = 1800,
                 connect_timeout: float = 5, read_timeout: float = 120, retry_pause: float = 0.2):
        if clients <= 0 or max_tokens <= 0 or max_requests <= 0 or duration <= 0:
            raise ValueError("clients, max_tokens, max_requests and duration must be positive: the load is bounded")
        self.pick = pick
        self.clients = clients
        self.max_tokens = max_tokens
        self.model = model
        self.prompt = prompt
        self.max_requests = max_requests
        self.duration = duration
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.retry_pause = retry_pause
        self.records: list[StreamRecord] = []
        self._sending = True
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._tasks: list[asyncio.Task] = []
        self._thread: Optional[threading.Thread] = None
        self._ready = threading.Event()

    # ---- control (from any thread)
    def start(self) -> "StreamingLoad":
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="streaming-load", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop_sending(self) -> None:
        """Each client ends once its request in flight has ended."""
        self._sending = False

    def wait_idle(self, timeout: float) -> bool:
        """Whether every client ended (no request in flight) within `timeout` seconds."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.running

    def stop(self, timeout: float = 30) -> None:
        """Cancel everything in flight (recorded as cancelled)."""
        self._sending = False
        loop = self._loop
        if loop is not None and self.running:
            def cancel():
                for t in self._tasks:
                    t.cancel()
            try:
                loop.call_soon_threadsafe(cancel)
            except RuntimeError:
                pass
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ---- reading the records
    def snapshot(self) -> list[StreamRecord]:
        return list(self.records)

    def in_flight(self, host: Optional[str] = None, at: Optional[float] = None) -> list[StreamRecord]:
        at = time.monotonic() if at is None else at
        return [r for r in self.snapshot() if r.in_flight_at(at) and (host is None or r.host == host)]

    def summary(self) -> LoadSummary:
        s = LoadSummary()
        speeds: dict[Optional[str], list[float]] = {}
        for r in self.snapshot():
            s.sent += 1
            h = s.by_host.setdefault(r.host, {"sent": 0, COMPLETED: 0, LOST: 0, CANCELLED: 0, "in_flight": 0})
            h["sent"] += 1
            if r.outcome is None:
                s.in_flight += 1
                h["in_flight"] += 1
                continue
            h[r.outcome] += 1
            setattr(s, r.outcome, getattr(s, r.outcome) + 1)
            if r.outcome == LOST:
                s.lost_requests.append(r.brief())
            if r.first_token_at is not None and r.ended > r.first_token_at and r.tokens > 1:
                speeds.setdefault(r.host, []).append((r.tokens - 1) / (r.ended - r.first_token_at))

        def median(xs: list[float]) -> float:
            return round(sorted(xs)[len(xs) // 2], 1)

        for host, xs in speeds.items():
            s.by_host[host]["tokens_per_second"] = median(xs)
        every = [x for xs in speeds.values() for x in xs]
        if every:
            s.tokens_per_second = median(every)
        return s

    # ---- the loop
    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._ready.set()
        deadline = time.monotonic() + self.duration
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout, sock_read=self.read_timeout)
        # A new connection per request: a kept-alive connection would stay on the pod it was opened to
        # (conntrack keeps an established connection on its endpoint), whatever the EndpointSlices say since.
        connector = aiohttp.TCPConnector(force_close=True, limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            async def client() -> None:
                while self._sending and time.monotonic() < deadline and len(self.records) < self.max_requests:
                    r = await self._one(session)
                    if r.outcome == LOST:
                        await asyncio.sleep(self.retry_pause)

            self._tasks = [asyncio.create_task(client()) for _ in range(self.clients)]
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for r in self.records:  # a cancelled client leaves its request cancelled
            if r.outcome is None:
                r.outcome, r.why = CANCELLED, "stopped by the test"
                r.ended = r.ended or time.monotonic()

    async def _one(self, session: aiohttp.ClientSession) -> StreamRecord:
        url = self.pick()
        r = StreamRecord(len(self.records), url, self.max_tokens, time.monotonic())
        self.records.append(r)
        if url is None:
            r.error = "no ready endpoint (the Service rejects the connection)"
            r.ended = time.monotonic()
            r.classify()
            return r
        body = {"model": self.model, "prompt": self.prompt, "max_tokens": self.max_tokens, "ignore_eos": True,
                "temperature": 0, "stream": True, "logprobs": 0, "stream_options": {"include_usage": True}}
        try:
            check_local(url)
            async with session.post(url.rstrip("/") + "/v1/completions", json=body) as resp:
                r.status = resp.status
                if resp.status != 200:
                    await resp.read()
                else:
                    async for raw in resp.content:
                        self._line(r, raw)
        except asyncio.CancelledError:
            r.outcome, r.why = CANCELLED, "stopped by the test"
            r.ended = time.monotonic()
            raise
        except Exception as e:  # noqa: BLE001 - a failed request is counted, never raised into the loop
            r.error = f"{type(e).__name__}: {e}"[:300]
        r.ended = time.monotonic()
        r.classify()
        return r

    @staticmethod
    def _line(r: StreamRecord, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            return
        data = line[5:].strip()
        if data == "[DONE]":
            r.done_marker = True
            return
        event = json.loads(data)
        if event.get("usage"):
            r.usage_tokens = event["usage"].get("completion_tokens")
        for choice in event.get("choices") or []:
            got = len((choice.get("logprobs") or {}).get("tokens") or [])
            if got:
                if r.first_token_at is None:
                    r.first_token_at = time.monotonic()
                r.tokens += got
            if choice.get("finish_reason"):
                r.finish_reason = choice["finish_reason"]
