"""When to read a server's queue next: soon while it works, at a steady pace while it is idle.

Pure: no I/O; the clock is an argument. The rules, in the order `next_read` applies them:

1. Today's behaviour on request (``fixed``, the bench's baseline): every ``intervalSeconds``.
2. Missing data (a hold: a scrape failed or timed out, Prometheus down): every ``intervalSeconds``,
   as before. A failing pod costs a scrape deadline each time; reading it faster would not bring
   its numbers back sooner.
3. Busy, read every BUSY_READ_SECONDS: a ready replica has requests waiting or running
   (``vllm:num_requests_waiting``, ``vllm:num_requests_running``), or the count changed in the
   last RECENT_SCALE_SECONDS. A working server is where a queue grows; a second read shows it
   within a second. (``vllm:kv_cache_usage_perc`` adds nothing: it counts the blocks of running
   requests, and blocks kept for prefix caching count as free.)
4. The fast reads of all servers share one budget, MAX_FAST_SCRAPES_PER_SECOND scrapes
   (a token bucket over the pods read): a busy server that finds it spent is read as an idle one.
5. Idle: IDLE_READS_PER_INTERVAL reads per ``intervalSeconds`` (5 s: every 2.5 s; never more often
   than a busy server's reads). A queue on an idle server is seen only at its next read, so this
   bounds the reaction from idle: with reads every T the wait is uniform in [0, T], p95 0.95 T.
   A p95 of 3 s needs T under 3 s. The reads are
   the filtered scrape (``/metrics/?name[]=...``, the five families the autoscaler parses: 1.7 KB
   instead of vLLM's 50 KB), so an idle server sends fewer bytes than with one full scrape per
   interval, in twice the requests (docs/autoscaling.md, "Read interval").
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional, Sequence

from ..sources.vllm_metrics import Sample

#: How often a busy server's queue is read.
BUSY_READ_SECONDS = 1.0
#: Reads of an idle server per intervalSeconds.
IDLE_READS_PER_INTERVAL = 2
#: A server whose replica count changed this recently is read as a busy one (the new capacity, or the
#: lack of it, shows in its queue).
RECENT_SCALE_SECONDS = 30.0
#: Scrapes per second all servers' fast reads may add together (the scrape pool's 16 workers do several
#: hundred filtered scrapes a second); the rest is read at the idle pace.
MAX_FAST_SCRAPES_PER_SECOND = 100.0

#: Why a read comes when it does (logs, tests, the bench).
FIXED, HOLDING, BUSY, IDLE, BUDGET_SPENT = "fixed", "holding", "busy", "idle", "fast-read budget spent"


@dataclass(frozen=True)
class NextRead:
    seconds: float
    why: str


def busy(samples: Sequence[Sample], since_scale: Optional[float]) -> bool:
    """Some replica has requests waiting or running, or the count changed RECENT_SCALE_SECONDS ago or less."""
    if since_scale is not None and since_scale <= RECENT_SCALE_SECONDS:
        return True
    return any(s.ok and (s.waiting > 0 or s.running > 0) for s in samples)


def idle_seconds(interval: float) -> float:
    """An idle server's read interval: intervalSeconds / IDLE_READS_PER_INTERVAL, never below a busy one's
    (an intervalSeconds of 1 stays 1 s) nor above intervalSeconds."""
    return min(interval, max(BUSY_READ_SECONDS, interval / IDLE_READS_PER_INTERVAL))


class FastReads:
    """The token bucket of rule 4, shared by every server's loop (their ticks run in a thread pool)."""

    def __init__(self, per_second: float = MAX_FAST_SCRAPES_PER_SECOND, burst: Optional[float] = None):
        self.per_second = per_second
        self.burst = per_second if burst is None else burst
        self._tokens = self.burst
        self._at: Optional[float] = None
        self._lock = threading.Lock()

    def take(self, scrapes: int, now: float) -> bool:
        """Spend `scrapes` tokens at `now` (monotonic seconds) if there are that many."""
        with self._lock:
            if self._at is not None:
                self._tokens = min(self.burst, self._tokens + max(0.0, now - self._at) * self.per_second)
            self._at = now
            if scrapes > self._tokens:
                return False
            self._tokens -= scrapes
            return True


def next_read(samples: Sequence[Sample], interval: float, *, hold: bool, since_scale: Optional[float],
              budget: FastReads, now: float, fixed: bool = False) -> NextRead:
    """Seconds from this read to the next one, for a server read `interval` (intervalSeconds) apart today;
    `samples` and `hold` are this read's, `since_scale` the seconds since the count last changed (None: not
    seen), `now` monotonic."""
    if fixed:  # 1.
        return NextRead(interval, FIXED)
    if hold:  # 2.
        return NextRead(interval, HOLDING)
    idle = idle_seconds(interval)
    if busy(samples, since_scale):  # 3.
        if idle <= BUSY_READ_SECONDS:  # read that often anyway: nothing to spend
            return NextRead(idle, BUSY)
        if budget.take(max(1, len(samples)), now):  # 4.
            return NextRead(BUSY_READ_SECONDS, BUSY)
        return NextRead(idle, BUDGET_SPENT)
    return NextRead(idle, IDLE)  # 5.
