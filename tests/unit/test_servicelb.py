"""The streaming load's bookkeeping (e2e/testbed/servicelb.py), against small local SSE servers: a whole stream is
completed, and every way a stream is lost (refused, HTTP error, broken, cut with [DONE] but no finish, fewer
tokens than asked, no endpoint at all) is counted lost with its reason; stop() counts what it cancels apart."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from e2e.testbed.controlplane import wait_for
from e2e.testbed.servicelb import CANCELLED, COMPLETED, LOST, StreamingLoad

TOKENS = 5


def _handler(mode: str):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert body["stream"] is True and body["ignore_eos"] is True
            n = body["max_tokens"]
            if mode == "503":
                out = b'{"error": "busy"}'
                self.send_response(503)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()

            def event(obj):
                self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                self.wfile.flush()

            sent = {"whole": n, "short": n - 1, "cut": 2, "broken": 2, "slow": n}[mode]
            for i in range(sent):
                last = i == sent - 1 and mode in ("whole", "short")
                event({"choices": [{"text": "x", "logprobs": {"tokens": ["x"]},
                                    "finish_reason": "length" if last else None}]})
                if mode == "slow":
                    time.sleep(5)
            if mode == "broken":
                return  # the connection closes mid-stream: no [DONE]
            if mode in ("whole", "short"):
                event({"choices": [], "usage": {"completion_tokens": sent}})
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *a):
            pass

    return H


@pytest.fixture
def servers():
    made = []

    def start(mode: str) -> str:
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _handler(mode))
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        made.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for s in made:
        s.shutdown()
        s.server_close()


def _run(pick, requests: int) -> StreamingLoad:
    load = StreamingLoad(pick, clients=1, max_tokens=TOKENS, max_requests=requests, duration=60, retry_pause=0)
    load.start()
    assert load.wait_idle(30)
    return load


def test_a_whole_stream_is_completed(servers):
    url = servers("whole")
    load = _run(lambda: url, 3)
    s = load.summary()
    assert (s.sent, s.completed, s.lost) == (3, 3, 0), s
    assert all(r.tokens == TOKENS and r.finish_reason == "length" and r.done_marker for r in load.records)
    assert s.by_host["127.0.0.1"][COMPLETED] == 3


@pytest.mark.parametrize("mode, why", [
    ("cut", "cut after 2 of 5 tokens (finish_reason None, [DONE])"),   # vLLM's abort: [DONE], no finish
    ("short", "finish_reason length after 4 of 5 tokens"),
    ("broken", "cut after 2 of 5 tokens (finish_reason None, no [DONE])"),  # the connection closed mid-stream
    ("503", "HTTP 503"),
])
def test_every_way_a_stream_fails_is_lost(servers, mode, why):
    url = servers(mode)
    load = _run(lambda: url, 1)
    [r] = load.records
    assert r.outcome == LOST and why in r.why, r
    assert load.summary().lost == 1


def test_refused_and_no_endpoint_are_lost(servers):
    url = servers("whole")
    host, port = url.rsplit(":", 1)
    picks = iter([f"{host}:{int(port) + 1 if int(port) < 65535 else 1}", None])
    load = _run(lambda: next(picks), 2)
    refused, none = load.records
    assert refused.outcome == LOST and "Connect" in refused.why, refused
    assert none.outcome == LOST and "no ready endpoint" in none.why


def test_stop_cancels_what_is_in_flight_apart_from_the_lost(servers):
    url = servers("slow")
    load = StreamingLoad(lambda: url, clients=2, max_tokens=TOKENS, max_requests=10, duration=60).start()
    wait_for(lambda: len([r for r in load.records if r.tokens]) == 2, 10, "two streams under way")
    assert len(load.in_flight("127.0.0.1")) == 2
    load.stop()
    assert not load.running
    s = load.summary()
    assert (s.sent, s.cancelled, s.lost, s.completed) == (2, 2, 0, 0), s
    assert all(r.outcome == CANCELLED for r in load.records)


def test_load_goes_to_addresses_of_this_host_only():
    load = _run(lambda: "http://198.51.100.7:8000", 1)  # TEST-NET-2: no interface of this host has it
    [r] = load.records
    assert r.outcome == LOST and "only goes to addresses of this host" in r.why, r
