"""The operator's metrics and its /metrics, /healthz, /readyz server (pure: no cluster)."""

from __future__ import annotations

import asyncio
import logging
import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from vllm_operator import telemetry
from vllm_operator.operator_main import reconcile_result
from vllm_operator.controller.reconcile import Result


@pytest.mark.parametrize("method,path,content_type,expected", [
    ("PATCH", "/apis/apps/v1/namespaces/ns/statefulsets/x", "application/apply-patch+yaml", ("statefulsets", "apply")),
    ("PATCH", "/apis/vllm-operator.io/v1alpha1/namespaces/ns/vllmservers/x/status", "application/apply-patch+yaml",
     ("vllmservers/status", "apply")),
    ("PATCH", "/apis/apps/v1/namespaces/ns/statefulsets/x/scale", "application/merge-patch+json",
     ("statefulsets/scale", "patch")),
    ("POST", "/api/v1/namespaces/ns/events", "application/json", ("events", "create")),
    ("DELETE", "/api/v1/namespaces/ns/services/x", "application/json", ("services", "delete")),
    ("DELETE", "/apis/policy/v1/namespaces/ns/poddisruptionbudgets/x", "", ("poddisruptionbudgets", "delete")),
    ("POST", "/api/v1/namespaces", "application/json", ("namespaces", "create")),
    ("PUT", "/api/v1/namespaces/ns", "application/json", ("namespaces", "update")),
    ("GET", "/api/v1/namespaces/ns/pods", "", None),
])
def test_api_write_labels(method, path, content_type, expected):
    assert telemetry.api_write_labels(method, path, content_type) == expected


def sample(name: str, labels: dict[str, str]) -> float:
    return telemetry.REGISTRY.get_sample_value(name, labels) or 0.0


def test_recording_functions_count():
    before = sample("vllm_operator_scaling_decisions_total", {"namespace": "ns", "name": "a", "direction": "up"})
    telemetry.record_scaling_decision("ns", "a", "up")
    assert sample("vllm_operator_scaling_decisions_total",
                  {"namespace": "ns", "name": "a", "direction": "up"}) == before + 1
    with pytest.raises(ValueError):
        telemetry.record_scaling_decision("ns", "a", "sideways")
    with pytest.raises(ValueError):
        telemetry.record_reconcile("fine", 0.1)
    count = sample("vllm_operator_reconcile_duration_seconds_count", {})
    telemetry.record_reconcile("unchanged", 0.02)
    assert sample("vllm_operator_reconcile_duration_seconds_count", {}) == count + 1


def test_every_reconcile_result_is_a_series_before_it_happens():
    body = telemetry.generate_latest(telemetry.Metrics(CollectorRegistry()).registry).decode()
    for result in telemetry.RESULTS:
        assert f'vllm_operator_reconciles_total{{result="{result}"}}' in body


def test_server_gauges_follow_the_reconciles_and_go_with_the_server():
    from e2e.testbed.memory_world import NS, World
    from vllm_operator import operator_main

    world = World({"replicas": 2})
    op = operator_main.Operator(world.reconciler)
    labels = {"namespace": NS, "name": "srv"}
    log = logging.getLogger("test")

    def gauges():
        return tuple(telemetry.REGISTRY.get_sample_value(f"vllm_operator_server_{g}", labels)
                     for g in ("ready", "replicas", "ready_replicas"))

    op.reconcile(NS, "srv", log)
    assert gauges() == (0, 2, 0)
    world.workload_reports(ready=1)
    op.reconcile(NS, "srv", log)
    assert gauges() == (0, 2, 1)  # PartiallyReady is not Ready
    world.workload_reports(ready=2)
    op.reconcile(NS, "srv", log)
    assert gauges() == (1, 2, 2)
    del world.kube.objects[("VLLMServer", NS, "srv")]
    op.reconcile(NS, "srv", log)
    assert gauges() == (None, None, None)


def test_at_max_replicas_gauge_mirrors_the_autoscaling_limited_condition():
    from vllm_operator.autoscaler import actuator, policy

    at_max = policy.Decision(4, "r", 9.0, limited=True, code=policy.AT_LIMIT, limit_reason="at maxReplicas 4 (recommendation 9)")
    at_min = policy.Decision(1, "r", 0.0, limited=True, code=policy.AT_LIMIT, limit_reason="at minReplicas 1 (recommendation 0)")
    assert actuator.at_max_replicas(at_max) and not actuator.at_max_replicas(at_min)
    assert not actuator.at_max_replicas(policy.Decision(2, "r", 1.0))
    labels = {"namespace": "ns", "name": "m"}
    telemetry.record_at_max_replicas("ns", "m", True)
    assert telemetry.REGISTRY.get_sample_value("vllm_operator_autoscaler_at_max_replicas", labels) == 1
    telemetry.record_at_max_replicas("ns", "m", False)
    assert telemetry.REGISTRY.get_sample_value("vllm_operator_autoscaler_at_max_replicas", labels) == 0
    telemetry.forget_autoscaler("ns", "m")
    telemetry.forget_autoscaler("ns", "m")  # twice: no error
    assert telemetry.REGISTRY.get_sample_value("vllm_operator_autoscaler_at_max_replicas", labels) is None


def test_reconcile_result_labels():
    assert reconcile_result(None) == "gone"
    assert reconcile_result(Result(valid=False)) == "invalid"
    assert reconcile_result(Result(applied=["Service/x"])) == "applied"
    assert reconcile_result(Result(status_written=True)) == "applied"
    assert reconcile_result(Result()) == "unchanged"


def get(port: int, path: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


@pytest.fixture
def loop_thread():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def test_http_endpoints_follow_the_event_loop_and_the_ready_flag(loop_thread):
    registry = CollectorRegistry()
    Counter("probe_things", "a test counter", registry=registry).inc(3)
    health = telemetry.Health(loop_timeout=0.5)
    server = telemetry.serve(0, health, host="127.0.0.1", registry=registry)
    port = server.server_address[1]
    try:
        assert get(port, "/healthz")[:1] == (200,)  # starting: never killed before kopf runs
        assert get(port, "/readyz")[0] == 503
        code, ctype, body = get(port, "/metrics")
        assert code == 200 and ctype.startswith("text/plain") and "probe_things_total 3.0" in body
        health.loop = loop_thread
        health.ready.set()
        assert get(port, "/healthz") == (200, "text/plain; charset=utf-8", "ok\n")
        assert get(port, "/readyz")[0] == 200
        # a blocked event loop (a sync call stuck in it) fails liveness
        unblock = threading.Event()
        loop_thread.call_soon_threadsafe(unblock.wait, 5)
        code, _, body = get(port, "/healthz")
        unblock.set()
        assert code == 503 and "did not answer" in body
        assert get(port, "/nope")[0] == 404
    finally:
        server.shutdown()


# --------------------------------------------------------------------------- the server's bounds (issue 18 (c))
def idle_connections(port: int, count: int, source: str) -> list:
    import socket
    out = []
    for _ in range(count):
        s = socket.socket()
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
        out.append(s)
    return out


def test_idle_connections_cost_no_thread_are_capped_and_time_out(monkeypatch):
    import time
    monkeypatch.setattr(telemetry, "READ_TIMEOUT", 3.0)
    health = telemetry.Health()
    server = telemetry.serve(0, health, host="127.0.0.1", registry=CollectorRegistry())
    port = server.server_address[1]
    threads = threading.active_count()
    sockets = []
    try:
        # 20 addresses x 16 idle connections: more than the server keeps (256 in all, 16 from one address).
        for i in range(20):
            sockets += idle_connections(port, telemetry.MAX_CONNECTIONS_PER_PEER + 2, f"127.0.1.{i + 1}")
        assert threading.active_count() <= threads + 2  # no thread per connection
        deadline = time.monotonic() + 5
        while server.active + server.refused < len(sockets) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.peak == telemetry.MAX_CONNECTIONS and server.refused >= len(sockets) - server.peak
        assert get(port, "/healthz")[0] == 200, "at the cap, the longest idle connection gives way to a new one"
        deadline = time.monotonic() + 10
        while server.active and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.active == 0, "idle connections are closed after READ_TIMEOUT"
        assert get(port, "/healthz")[0] == 200
    finally:
        for s in sockets:
            s.close()
        server.shutdown()


def test_a_probe_answers_while_another_address_holds_its_share():
    health = telemetry.Health()
    server = telemetry.serve(0, health, host="127.0.0.1", registry=CollectorRegistry())
    port = server.server_address[1]
    sockets = idle_connections(port, 3 * telemetry.MAX_CONNECTIONS_PER_PEER, "127.0.2.1")
    try:
        assert get(port, "/healthz") == (200, "text/plain; charset=utf-8", "starting\n")
    finally:
        for s in sockets:
            s.close()
        server.shutdown()


def test_metrics_need_the_token_when_one_is_set_and_never_name_servers_to_anyone_else(tmp_path):
    registry = CollectorRegistry()
    metrics = telemetry.Metrics(registry)
    metrics.server_ready.labels(namespace="team-a", name="secret-project").set(1)
    token = tmp_path / "token"
    token.write_text("s3cret\n")

    def fetch(port: int, auth: str = "") -> tuple[int, str]:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                         headers={"Authorization": auth} if auth else {})
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    protected = telemetry.serve(0, telemetry.Health(), host="127.0.0.1", registry=registry,
                                access=telemetry.MetricsAccess(token_file=str(token)))
    open_ = telemetry.serve(0, telemetry.Health(), host="127.0.0.1", registry=registry,
                            access=telemetry.MetricsAccess())
    try:
        p = protected.server_address[1]
        assert fetch(p)[0] == 401 and fetch(p, "Bearer wrong")[0] == 401
        code, body = fetch(p, "Bearer s3cret")
        assert code == 200 and 'name="secret-project"' in body
        assert get(p, "/healthz")[0] == 200  # the probes need no token and learn nothing
        code, body = fetch(open_.server_address[1])
        assert code == 200 and "vllm_operator_reconciles_total" in body and "secret-project" not in body
        assert "vllm_operator_server_ready" not in body
    finally:
        protected.shutdown()
        open_.shutdown()
