"""Metrics sources and the actuator's pure parts: parsing vLLM's /metrics, the Prometheus query,
sorting pods into ready/starting/stuck, and who owns a StatefulSet's replicas."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from e2e.testbed.hostile_http import HostileServer, Reply
from e2e.testbed.vllm_metrics_text import VLLM_METRICS
from vllm_operator.autoscaler import actuator, ownership
from vllm_operator.sources.vllm_metrics import PodRef, PodsSource, PrometheusSource, parse_vllm_metrics, queue_query


def test_parse_sums_over_engines_and_averages_kv_cache():
    s = parse_vllm_metrics("p", VLLM_METRICS, 7.0)
    assert (s.ok, s.waiting, s.running, s.kv_cache_usage, s.scraped_at) == (True, 8.0, 3.0, 0.375, 7.0)


def test_parse_old_kv_cache_name_and_missing_gauges():
    old = VLLM_METRICS.replace("kv_cache_usage_perc", "gpu_cache_usage_perc")
    assert parse_vllm_metrics("p", old, 0).kv_cache_usage == 0.375
    s = parse_vllm_metrics("p", "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.0\n", 0)
    assert not s.ok and "no vllm:num_requests_waiting" in s.error
    s = parse_vllm_metrics("p", "vllm:num_requests_waiting{engine=0 5\n", 0)
    assert not s.ok and s.error == "/metrics: not Prometheus text"


class _Handler(BaseHTTPRequestHandler):
    delay = 0.0

    def do_GET(self):  # noqa: N802
        time.sleep(self.delay)
        found = self.path.split("?", 1)[0] in ("/metrics", "/metrics/")  # as vLLM; the query is its to honour
        body = VLLM_METRICS.encode() if found else b"no"
        try:
            self.send_response(200 if found else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the scraper gave up (timeout): nothing to answer
            pass

    def log_message(self, *a):
        pass


@pytest.fixture
def metrics_server():
    servers = []

    def start(delay=0.0):
        handler = type("H", (_Handler,), {"delay": delay})
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads, srv.block_on_close = True, False
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return srv.server_address[1]

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def test_pods_source_scrapes_concurrently_and_reports_each_failure(metrics_server):
    fast, slow = metrics_server(), metrics_server(delay=3.0)
    another = metrics_server()
    source = PodsSource(timeout=1.0)
    pods = [PodRef("a", "ns", "127.0.0.1", fast), PodRef("b", "ns", "127.0.0.1", slow),
            PodRef("c", "ns", "127.0.0.1", 1), PodRef("d", "ns", "127.0.0.1", another)]
    t0 = time.monotonic()
    a, b, c, d = source.read(pods)
    took = time.monotonic() - t0
    source.close()
    assert took < 2.5, "scrapes run at once, each bounded by the timeout"
    assert (a.pod, a.ok, a.waiting, a.running) == ("a", True, 8.0, 3.0)
    assert not b.ok and b.error == f"GET http://127.0.0.1:{slow}/metrics: timed out"
    assert not c.ok and c.error == "GET http://127.0.0.1:1/metrics: connection refused"
    assert d.ok


def test_prometheus_query_is_scoped_to_namespace_and_pods():
    q = queue_query([PodRef("srv-1", "team-a", "x"), PodRef("srv-0", "team-a", "y")])
    sel = 'namespace="team-a",pod=~"srv-0|srv-1"'
    assert f"sum by (pod) (vllm:num_requests_waiting{{{sel}}})" in q
    assert f"sum by (pod) (vllm:num_requests_running{{{sel}}})" in q
    assert f"avg by (pod) (vllm:kv_cache_usage_perc{{{sel}}})" in q
    assert f"time() - max by (pod) (timestamp(vllm:num_requests_waiting{{{sel}}}))" in q
    assert q.count(" or ") == 3


def _series(pod, q, value):
    return {"metric": {"pod": pod, "q": q}, "value": [1700000000.0, str(value)]}


def _prometheus(*series, status="success") -> Reply:
    return Reply(200, json.dumps({"status": status, "data": {"resultType": "vector", "result": list(series)}}).encode())


def test_prometheus_source_marks_missing_and_stale_pods_not_ok():
    answer = _prometheus(_series("s-0", "waiting", 4), _series("s-0", "running", 2), _series("s-0", "kv", 0.3),
                         _series("s-0", "age", 1.5), _series("s-1", "waiting", 0), _series("s-1", "age", 300))
    with HostileServer({"/api/v1/query": answer}) as prom:
        source = PrometheusSource(prom.base + "/")
        s0, s1, s2 = source.read([PodRef("s-0", "ns", "ip"), PodRef("s-1", "ns", "ip"), PodRef("s-2", "ns", "ip")])
    assert (s0.ok, s0.waiting, s0.running, s0.kv_cache_usage) == (True, 4.0, 2.0, 0.3)
    assert not s1.ok and "300s old" in s1.error
    assert not s2.ok and "has no vllm:num_requests_waiting for this pod" in s2.error
    [query] = prom.requests
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(query).query)["query"] == [
        queue_query([PodRef("s-0", "ns", "ip"), PodRef("s-1", "ns", "ip"), PodRef("s-2", "ns", "ip")])]


def test_prometheus_down_fails_every_pod_with_the_reason():
    source = PrometheusSource("http://127.0.0.1:1", timeout=1.0)
    t0 = time.monotonic()
    samples = source.read([PodRef("s-0", "ns", "ip"), PodRef("s-1", "ns", "ip")])
    assert [s.ok for s in samples] == [False, False]
    assert samples[0].error == "Prometheus http://127.0.0.1:1: connection refused"
    assert time.monotonic() - t0 < 1.0, "no retries with backoff: the next tick is the retry"
    assert source.read([]) == []


# --------------------------------------------------------------------------- pods
def _pod(name, ready=None, ip="10.0.0.1", age=10.0, now=10_000.0, deleting=False, probe=(10, 30), phase="Running"):
    stamp = actuator._now_iso(now - age)
    pod = {"metadata": {"name": name, "namespace": "ns", "creationTimestamp": stamp},
           "spec": {"containers": [{"name": "vllm", "ports": [{"name": "http", "containerPort": 8000}]}]},
           "status": {"phase": phase}}
    if probe:
        pod["spec"]["containers"][0]["startupProbe"] = {"periodSeconds": probe[0], "failureThreshold": probe[1]}
    if ready is not None:
        pod["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
        pod["status"]["podIP"] = ip
    if deleting:
        pod["metadata"]["deletionTimestamp"] = stamp
    return pod


def test_classify_pods():
    now = 10_000.0
    pods = [_pod("s-0", ready=True, ip="10.0.0.7"), _pod("s-1", ready=False, age=100),
            _pod("s-2", ready=False, age=400), _pod("s-3", ready=None, age=5), _pod("s-4", ready=True, deleting=True),
            _pod("s-5", ready=False, phase="Failed"), _pod("s-6", ready=False, age=700, probe=None)]
    g = actuator.classify_pods(pods, now)
    assert g.ready == [PodRef("s-0", "ns", "10.0.0.7", 8000)]
    assert g.starting == ["s-1", "s-3"], "within 10 s x 30 of the startup probe"
    assert g.stuck == ["s-2", "s-6"], "not Ready beyond the startup budget (600 s without a probe)"


def test_replicas_owners_from_managed_fields():
    sts = {"metadata": {"managedFields": [
        {"manager": "vllm-operator", "operation": "Apply",
         "fieldsV1": {"f:spec": {"f:replicas": {}, "f:template": {}}}},
        {"manager": ownership.FIELD_MANAGER, "operation": "Apply", "fieldsV1": {"f:spec": {"f:replicas": {}}}},
        {"manager": "kube-controller-manager", "operation": "Update", "fieldsV1": {"f:status": {}}},
    ]}}
    assert ownership.replicas_owners(sts) == {"vllm-operator", ownership.FIELD_MANAGER}
    assert ownership.replicas_owners({"metadata": {}}) == set()


def test_has_status():
    assert not ownership.has_status({"conditions": [{"type": "Ready"}]})
    assert ownership.has_status({"conditions": [{"type": "AutoscalingActive"}]})
    assert ownership.has_status({"autoscaling": {}})


def test_daemon_filter():
    f = ownership.runs_operator_loop
    assert f({"autoscaling": {"enabled": True}})
    assert f({"autoscaling": {"enabled": True, "mode": "Operator"}, "workload": "StatefulSet"})
    assert not f({"autoscaling": {"enabled": True, "mode": "HPA"}})
    assert not f({"autoscaling": {"enabled": False}})
    assert not f({"autoscaling": {"enabled": True}, "workload": "DaemonSet"})
    assert not f({})


def test_max_num_seqs_from_the_pods_args():
    def pod(*args):
        return {"spec": {"containers": [{"name": "vllm", "args": list(args)}]}}
    assert actuator.max_num_seqs([pod("m", "--max-num-seqs", "32"), pod("m", "--max-num-seqs=16")]) == 16
    assert actuator.max_num_seqs([pod("m", "--max-model-len", "4096")]) is None
    assert actuator.max_num_seqs([pod("m", "--max-num-seqs")]) is None
    assert actuator.max_num_seqs([]) is None


def test_pods_source_asks_a_prometheus_client_exposition_for_the_five_families_only():
    """vLLM serves /metrics with prometheus_client's make_asgi_app, which honours ``name[]``: the scrape
    reads the gauges it parses, not the histograms (here the same exposition, prometheus_client's WSGI app).
    Without the query (the bench's baseline) the whole registry comes back, and parses the same."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client import CollectorRegistry, Gauge, Histogram, make_wsgi_app

    registry = CollectorRegistry()
    waiting = Gauge("vllm:num_requests_waiting", "w", ["engine"], registry=registry)
    waiting.labels(engine="0").set(6)
    Gauge("vllm:num_requests_running", "r", ["engine"], registry=registry).labels(engine="0").set(2)
    Gauge("vllm:kv_cache_usage_perc", "kv", ["engine"], registry=registry).labels(engine="0").set(0.25)
    latency = Histogram("vllm:e2e_request_latency_seconds", "h", ["engine"], registry=registry,
                        buckets=[0.1 * i for i in range(1, 60)])
    latency.labels(engine="0").observe(1.0)
    asked = []

    class Quiet(WSGIRequestHandler):
        def log_message(self, *a):
            pass

    app = make_wsgi_app(registry)

    def recording(environ, start_response):
        asked.append(environ.get("QUERY_STRING", ""))
        return app(environ, start_response)

    server = make_server("127.0.0.1", 0, recording, handler_class=Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    from vllm_operator.sources import fetch
    from vllm_operator.sources.vllm_metrics import ONLY_WANTED_QUERY
    try:
        pod = PodRef("p", "ns", "127.0.0.1", server.server_address[1])
        filtered, full = PodsSource(timeout=2.0), PodsSource(timeout=2.0, only_wanted=False)
        (a,), (b,) = filtered.read([pod]), full.read([pod])
        url = f"http://127.0.0.1:{pod.port}/metrics"
        small = fetch.get(f"{url}?{ONLY_WANTED_QUERY}", seconds=2, max_bytes=2**20)
        large = fetch.get(url, seconds=2, max_bytes=2**20)
        filtered.close(), full.close()
    finally:
        server.shutdown()
        server.server_close()
    assert asked[:2] == [ONLY_WANTED_QUERY, ""]
    assert urllib.parse.parse_qs(asked[0]) == {"name[]": [
        "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc", "vllm:cache_config_info"]}
    assert (a.ok, a.waiting, a.running, a.kv_cache_usage) == (b.ok, b.waiting, b.running, b.kv_cache_usage) == (
        True, 6.0, 2.0, 0.25)
    assert b"e2e_request_latency" not in small and b"e2e_request_latency" in large
    assert len(small) * 10 < len(large)


def test_the_operator_counts_its_pod_scrapes_and_their_bytes(metrics_server):
    from vllm_operator import telemetry

    def counts():
        get = telemetry.REGISTRY.get_sample_value
        return (get("vllm_operator_pod_scrapes_total", {"result": "ok"}) or 0,
                get("vllm_operator_pod_scrapes_total", {"result": "failed"}) or 0,
                get("vllm_operator_pod_scrape_bytes_total") or 0)

    port = metrics_server()
    source = PodsSource(timeout=1.0, on_scrape=telemetry.record_scrape)
    before = counts()
    source.read([PodRef("a", "ns", "127.0.0.1", port), PodRef("b", "ns", "127.0.0.1", 1)])
    source.close()
    after = counts()
    assert (after[0] - before[0], after[1] - before[1], after[2] - before[2]) == (1, 1, len(VLLM_METRICS.encode()))


def test_a_pod_without_the_filtered_exposition_is_read_whole_from_then_on():
    """A server answering /metrics only (404 at /metrics/, or a page without vLLM's gauges there) is read at
    /metrics within the same read, and at /metrics alone afterwards; a pod that does not answer at all is
    not retried at /metrics (it would fail the same)."""
    text = VLLM_METRICS.encode()
    with HostileServer({"/metrics": Reply(200, text)}) as plain, HostileServer(
            {"/metrics": Reply(200, text), "/metrics/": Reply(200, b"<html>hello</html>")}) as other:
        source = PodsSource(timeout=1.0)
        pods = [PodRef("a", "ns", "127.0.0.1", plain.port), PodRef("b", "ns", "127.0.0.1", other.port),
                PodRef("c", "ns", "127.0.0.1", 1)]
        first, second = source.read(pods), source.read(pods)
        source.close()
        paths = [[r.split("?", 1)[0] for r in pod.requests] for pod in (plain, other)]
    assert [(s.ok, s.waiting) for s in first + second] == [(True, 8.0), (True, 8.0), (False, 0.0)] * 2
    assert first[2].error == second[2].error == "GET http://127.0.0.1:1/metrics: connection refused"
    assert paths == [["/metrics/", "/metrics", "/metrics"]] * 2
