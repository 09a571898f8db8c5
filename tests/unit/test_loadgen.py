"""The e2e load generator stays bounded: a request count, a time limit, stop() cancels, loopback only."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from e2e.testbed.loadgen import LoadGenerator, check_loopback


class _Slow(BaseHTTPRequestHandler):
    delay = 0.0
    seen: list = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(body)
        time.sleep(self.delay)
        try:
            out = b'{"choices": []}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
        except OSError:
            pass

    def log_message(self, *a):
        pass


@pytest.fixture
def server():
    made = []

    def start(delay):
        handler = type("H", (_Slow,), {"delay": delay, "seen": []})
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads, srv.block_on_close = True, False
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        made.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}", handler

    yield start
    for srv in made:
        srv.shutdown()
        srv.server_close()


def test_fixed_count_at_a_fixed_rate(server):
    url, handler = server(0.0)
    gen = LoadGenerator(lambda: [url], rate=50, max_requests=10, duration=30, max_tokens=7)
    t0 = time.monotonic()
    gen.start()
    while gen.running and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    stats = gen.stop()
    assert (stats.sent, stats.ok, stats.failed) == (10, 10, 0)
    assert 0.15 < stats.stopped_at - stats.started_at < 5
    assert handler.seen[0] == {"model": "tiny", "prompt": "hello world", "max_tokens": 7, "ignore_eos": True,
                               "temperature": 0}


def test_time_limit_and_stop_cancel_requests_in_flight(server):
    url, _ = server(30.0)  # never answers in time
    gen = LoadGenerator(lambda: [url], rate=20, max_requests=1000, duration=1.0).start()
    while gen.running:
        time.sleep(0.05)
    s = gen.stats
    assert 10 <= s.sent <= 25 and s.cancelled == s.sent, s
    gen = LoadGenerator(lambda: [url], rate=20, max_requests=1000, duration=60).start()
    time.sleep(0.5)
    t0 = time.monotonic()
    s = gen.stop()
    assert time.monotonic() - t0 < 5 and s.cancelled == s.sent > 0


def test_loopback_only():
    check_loopback("http://127.0.0.11:8000")
    check_loopback("http://localhost:8000")
    with pytest.raises(ValueError, match="loopback"):
        check_loopback("http://10.0.0.1:8000")
    with pytest.raises(ValueError, match="bounded"):
        LoadGenerator(lambda: [], rate=1, max_requests=0, duration=1)


def test_closed_loop_keeps_a_constant_number_in_flight(server):
    url, handler = server(0.2)
    gen = LoadGenerator(lambda: [url], concurrency=3, max_requests=12, duration=30).start()
    t0 = time.monotonic()
    while gen.running and time.monotonic() - t0 < 20:
        time.sleep(0.05)
    s = gen.stop()
    assert (s.sent, s.ok) == (12, 12)
    assert 0.7 < s.stopped_at - s.started_at < 5, "4 rounds of 3 requests of 0.2 s"
    with pytest.raises(ValueError):
        LoadGenerator(lambda: [url], rate=1, concurrency=2, max_requests=1, duration=1)


def test_closed_loop_concurrency_can_be_raised(server):
    url, _ = server(30.0)  # requests stay in flight
    gen = LoadGenerator(lambda: [url], concurrency=2, max_requests=100, duration=20).start()
    deadline = time.monotonic() + 5
    while gen.stats.sent < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gen.stats.sent == 2
    gen.set_concurrency(5)
    deadline = time.monotonic() + 5
    while gen.stats.sent < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    s = gen.stop()
    assert s.sent == 5 and s.cancelled == 5
    with pytest.raises(ValueError):
        LoadGenerator(lambda: [url], rate=1, max_requests=1, duration=1).set_concurrency(3)
