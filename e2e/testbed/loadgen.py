"""A bounded load generator for vLLM's OpenAI API: it makes vllm:num_requests_waiting rise, then stops.

Open loop (``rate``): requests start at a fixed rate whether or not earlier ones finished
(a queue builds once the rate is above what the servers serve). Closed loop
(``concurrency``): that many clients, each sending its next request when the last one
returns (a constant load). Both stop at a fixed number of requests or a time limit,
whichever comes first; `stop()` ends it at once and cancels the requests in flight (vLLM
aborts a request whose client went away, so its queue drains). Loopback addresses only.

    gen = LoadGenerator(lambda: ["http://127.0.0.11:8000"], rate=1.0, max_requests=100, duration=120)
    gen.start()          # a background thread with its own event loop
    ...
    gen.stop(); gen.stats
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import aiohttp


def check_loopback(url: str) -> None:
    host = urllib.parse.urlparse(url).hostname or ""
    if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
        raise ValueError(f"load only goes to loopback addresses, not {url}")


@dataclass
class LoadStats:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    cancelled: int = 0
    errors: list[str] = field(default_factory=list)
    started_at: Optional[float] = None
    stopped_at: Optional[float] = None


class LoadGenerator:
    """Open-loop /v1/completions load over the URLs `targets()` returns at each send (round robin)."""

    def __init__(self, targets: Callable[[], Sequence[str]], *, rate: float = 0.0, concurrency: int = 0,
                 max_requests: int, duration: float, max_tokens: int = 600, model: str = "tiny",
                 prompt: str = "hello world", timeout: float = 300):
        if (rate <= 0) == (concurrency <= 0) or max_requests <= 0 or duration <= 0:
            raise ValueError("one of rate or concurrency, and max_requests and duration, must be positive: "
                             "the load is bounded")
        self.concurrency = concurrency
        self.targets = targets
        self.rate = rate
        self.max_requests = max_requests
        self.duration = duration
        self.max_tokens = max_tokens
        self.model = model
        self.prompt = prompt
        self.timeout = timeout
        self.stats = LoadStats()
        self._stop: Optional[asyncio.Event] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._ready = threading.Event()

    # ---- threaded use
    def start(self) -> "LoadGenerator":
        self._thread = threading.Thread(target=lambda: asyncio.run(self.run()), name="loadgen", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self, timeout: float = 30) -> LoadStats:
        if self._loop is not None and self._stop is not None and self.running:
            try:
                self._loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:  # the loop ended on its own meanwhile (count or time limit)
                pass
        if self._thread is not None:
            self._thread.join(timeout)
        return self.stats

    def set_concurrency(self, n: int) -> None:
        """Closed loop: raise the number of clients (more requests in flight from now on)."""
        if not self.concurrency or n < self.concurrency:
            raise ValueError("only a closed-loop load's concurrency can be raised")
        self.concurrency = n

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> "LoadGenerator":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- the load
    async def run(self) -> LoadStats:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._ready.set()
        stats = self.stats
        stats.started_at = time.monotonic()
        deadline = stats.started_at + self.duration
        rr = itertools.count()
        tasks: set[asyncio.Task] = set()
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            if self.concurrency:
                await self._closed_loop(session, deadline, rr)
                stats.stopped_at = time.monotonic()
                return stats
            for i in range(self.max_requests):
                due = stats.started_at + i / self.rate
                now = time.monotonic()
                if due > deadline:
                    break
                if due > now:
                    try:
                        await asyncio.wait_for(self._stop.wait(), due - now)
                    except asyncio.TimeoutError:
                        pass
                if self._stop.is_set() or time.monotonic() > deadline:
                    break
                urls = list(self.targets())
                if not urls:
                    continue
                url = urls[next(rr) % len(urls)]
                check_loopback(url)
                task = asyncio.create_task(self._one(session, url))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                stats.sent += 1
            # The requests in flight run until they finish, the deadline or stop(); then they are cancelled.
            stopper = asyncio.create_task(self._stop.wait())
            while tasks and not self._stop.is_set() and time.monotonic() < deadline:
                await asyncio.wait([stopper, *tasks], timeout=deadline - time.monotonic(),
                                   return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            for task in list(tasks):
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
        stats.stopped_at = time.monotonic()
        return stats

    async def _closed_loop(self, session: aiohttp.ClientSession, deadline: float, rr) -> None:
        async def client() -> None:
            while not self._stop.is_set() and time.monotonic() < deadline and self.stats.sent < self.max_requests:
                urls = list(self.targets())
                if not urls:
                    await asyncio.sleep(0.1)
                    continue
                url = urls[next(rr) % len(urls)]
                check_loopback(url)
                self.stats.sent += 1
                await self._one(session, url)

        clients: list[asyncio.Task] = []
        stopper = asyncio.create_task(self._stop.wait())
        while not self._stop.is_set() and time.monotonic() < deadline:
            while len(clients) < self.concurrency:  # set_concurrency() may have raised it
                clients.append(asyncio.create_task(client()))
            if all(c.done() for c in clients):
                break
            await asyncio.wait([stopper, *clients], timeout=min(0.2, max(0.0, deadline - time.monotonic())),
                               return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        for c in clients:
            c.cancel()
        await asyncio.gather(*clients, return_exceptions=True)

    async def _one(self, session: aiohttp.ClientSession, base: str) -> None:
        body = {"model": self.model, "prompt": self.prompt, "max_tokens": self.max_tokens, "ignore_eos": True,
                "temperature": 0}
        try:
            async with session.post(base.rstrip("/") + "/v1/completions", json=body) as resp:
                await resp.read()
                if resp.status == 200:
                    self.stats.ok += 1
                else:
                    self.stats.failed += 1
                    self._error(f"{base}: HTTP {resp.status}")
        except asyncio.CancelledError:
            self.stats.cancelled += 1
            raise
        except Exception as e:  # noqa: BLE001 - counted, reported, never raised into the loop
            self.stats.failed += 1
            self._error(f"{base}: {type(e).__name__}: {e}")

    def _error(self, msg: str) -> None:
        if len(self.stats.errors) < 20:
            self.stats.errors.append(msg)
