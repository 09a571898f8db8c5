"""The chart's Grafana dashboard (files/vllm-operator-dashboard.json, templates/grafana-dashboard.yaml).

Every panel's PromQL must parse (promtool; e2e/testbed/monitoring.py) and select only metrics that
exist: vLLM 0.32's, listed below with where vLLM declares them, and the operator's, read from
operator/vllm_operator/telemetry.py itself.
"""

from __future__ import annotations

import json
import re
from itertools import combinations

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from e2e.testbed import monitoring, vllm_env
from vllm_operator import generate, telemetry

# --------------------------------------------------------------------------- the metric names that exist
#: vLLM 0.32.0's metrics the alerts and the dashboard read, by their declared name and kind, all
#: declared in vllm/v1/metrics/loggers.py (PrometheusStatLogger) with the labels model_name and
#: engine (request_success adds finished_reason: stop, length, abort, error, repetition, from
#: FinishReason in vllm/v1/engine/__init__.py). Prometheus exposes a counter as <name>_total and a
#: histogram as <name>_bucket, _sum and _count. test_vllm_names_match_vllms_own_source checks this
#: list against the installed vLLM's source when the e2e vLLM virtualenv is there.
VLLM_DECLARED = {
    "vllm:num_requests_waiting": "gauge",
    "vllm:num_requests_running": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:num_preemptions": "counter",
    "vllm:request_success": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
}

SUFFIXES = {"gauge": ("",), "counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


def exposed(name: str, kind: str) -> set[str]:
    return {name + s for s in SUFFIXES[kind]}


VLLM_METRICS = set().union(*(exposed(n, k) for n, k in VLLM_DECLARED.items()))


def operator_metrics() -> set[str]:
    """The operator's metric names, as its /metrics exposes them, from telemetry.py's own objects."""
    names = set()
    for obj in vars(telemetry.Metrics(CollectorRegistry())).values():
        if isinstance(obj, MetricWrapperBase):
            for family in obj.describe():
                names |= exposed(family.name, family.type)
    return names


OPERATOR_METRICS = operator_metrics()
KNOWN_METRICS = VLLM_METRICS | OPERATOR_METRICS


def test_operator_metric_names_are_read_from_its_source():
    assert {"vllm_operator_reconciles_total", "vllm_operator_reconcile_errors_total",
            "vllm_operator_reconcile_duration_seconds_bucket", "vllm_operator_scaling_decisions_total",
            "vllm_operator_server_ready", "vllm_operator_server_replicas", "vllm_operator_server_ready_replicas",
            "vllm_operator_autoscaler_at_max_replicas", "vllm_operator_build_info"} <= OPERATOR_METRICS


def test_vllm_names_match_vllms_own_source():
    found = sorted(vllm_env.venv_dir().glob("lib/python3*/site-packages/vllm/v1/metrics/loggers.py"))
    if not found:
        pytest.skip(f"no vLLM {vllm_env.VLLM_VERSION} virtualenv at {vllm_env.venv_dir()} (tools/vllm-env.sh builds it)")
    source = found[0].read_text()
    declared = dict((name, kind) for kind, name in
                    re.findall(r'_(gauge|counter|histogram)_cls\(\s*name="(vllm:[^"]+)"', source))
    assert {n: declared.get(n) for n in VLLM_DECLARED} == VLLM_DECLARED
    reasons = found[0].parents[1] / "engine" / "__init__.py"
    assert '("stop", "length", "abort", "error", "repetition")' in reasons.read_text()


# --------------------------------------------------------------------------- metric_names, the extractor
@pytest.mark.parametrize("expr,names", [
    ('sum by (namespace, name) (label_replace(vllm:num_requests_waiting{pod=~"a-[^-]+"}, "name", "$1", "pod", '
     '"(.+)-[^-]+")) > 0 and on (namespace, name) max by (namespace, name) (x_at_max) == 1',
     {"vllm:num_requests_waiting", "x_at_max"}),
    ('histogram_quantile(0.95, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket[5m])))',
     {"vllm:e2e_request_latency_seconds_bucket"}),
    ("a / ignoring (finished_reason) group_left b offset 5m > 1e+06", {"a", "b"}),
    ('absent(up{job="by"}) or vector(0) unless on() sum without (instance) (rate(c[1m:10s]))', {"up", "c"}),
])
def test_metric_names(expr, names):
    assert monitoring.metric_names(expr) == names


# --------------------------------------------------------------------------- the dashboard
@pytest.fixture(scope="module")
def dash():
    return monitoring.dashboard()


@pytest.fixture(scope="module")
def queries():
    return monitoring.dashboard_queries()


def test_every_panel_has_queries_on_the_chosen_data_source(dash):
    panels = [p for p in monitoring.panels(dash) if p["type"] != "row"]
    assert len(panels) >= 10
    for p in panels:
        assert p["targets"] and all(t.get("expr") for t in p["targets"]), p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert all(t["datasource"] == p["datasource"] for t in p["targets"]), p["title"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"]), p["title"]
        assert p.get("description"), p["title"]
    ids = [p["id"] for p in monitoring.panels(dash)]
    assert len(ids) == len(set(ids))
    assert dash["uid"] == "vllm-operator" and dash.get("id") is None  # the sidecar's import keeps the uid


def test_panels_do_not_overlap(dash):
    def cells(p):
        g = p["gridPos"]
        return {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}

    for a, b in combinations(list(monitoring.panels(dash)), 2):
        assert not cells(a) & cells(b), (a["title"], b["title"])
    assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in monitoring.panels(dash))


def test_every_query_is_valid_promql(queries):
    errors = monitoring.promql_errors([q.expr for q in queries])
    assert not errors, "\n".join(f"{e}\n  {msg}" for e, msg in errors.items())


def test_an_invalid_query_is_noticed():
    errors = monitoring.promql_errors(["sum(rate(vllm:num_preemptions_total[5m])", "up"])
    assert list(errors) == ["sum(rate(vllm:num_preemptions_total[5m])"]


def test_every_query_reads_only_metrics_that_exist(queries):
    for q in queries:
        names = monitoring.metric_names(q.expr)
        assert names, q
        assert names <= KNOWN_METRICS, f"{q.panel} {q.ref_id} reads {names - KNOWN_METRICS}, which neither " \
                                       f"vLLM {vllm_env.VLLM_VERSION} nor the operator exposes"
        assert "__name__" not in q.expr, q  # a name the check above could not see


def test_the_dashboard_shows_what_operators_look_for(queries):
    shown = set().union(*(monitoring.metric_names(q.expr) for q in queries))
    assert {
        "vllm:num_requests_waiting", "vllm:num_requests_running",  # the queue per server
        "vllm_operator_server_replicas", "vllm_operator_server_ready_replicas",  # desired vs ready
        "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total", "vllm:request_success_total",
        "vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
        "vllm_operator_reconciles_total", "vllm_operator_reconcile_errors_total",
    } <= shown
    by_reason = [q for q in queries if "vllm:request_success_total" in q.expr]
    assert by_reason and all("finished_reason" in q.expr for q in by_reason)


def test_variables_are_the_dashboards_own(dash, queries):
    defined = {v["name"] for v in dash["templating"]["list"]}
    assert defined == {"datasource", "namespace", "server"}
    used = {m.group(1) or m.group(2) for q in queries
            for m in re.finditer(r"\$\{(\w+)[^}]*\}|\$(\w+)", q.template)} - {"1"}
    assert used <= defined | {"__rate_interval"}
    for q in queries:
        assert not re.search(r"\$(?!1\b)", q.expr), q  # nothing left for Prometheus to choke on
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            assert v["datasource"]["uid"] == "${datasource}" and v["allValue"] == ".+"
            selector = re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"]).group(1)
            assert monitoring.metric_names(selector) <= KNOWN_METRICS, v["name"]
            assert not monitoring.promql_errors([monitoring.substitute(selector, monitoring.DEFAULT_VARIABLES)])


def test_queries_take_variables():
    one = monitoring.dashboard_queries({"namespace": "team", "server": "llama", "__rate_interval": "1m"})
    waiting = next(q for q in one if "vllm:num_requests_waiting" in q.expr)
    assert 'namespace=~"team", pod=~"llama-[^-]+"' in waiting.expr
    assert all("[1m]" in q.expr for q in one if "rate(" in q.template)
    with pytest.raises(KeyError):
        monitoring.substitute("sum(x{a=~\"$nope\"})", {})


# --------------------------------------------------------------------------- the chart
def test_the_configmap_is_opt_in_labelled_for_the_sidecar_and_holds_the_file():
    chart = monitoring.CHART
    assert not [o for o in generate.render_chart(chart) if o["kind"] == "ConfigMap"]
    objects = generate.render_chart(chart, {"grafanaDashboard": {
        "enabled": True, "namespace": "monitoring", "annotations": {"grafana_folder": "LLM"}}}, namespace="ops")
    (cm,) = [o for o in objects if o["kind"] == "ConfigMap"]
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "LLM"}
    (key,) = cm["data"]
    assert key.endswith(".json") and json.loads(cm["data"][key]) == monitoring.dashboard()
    assert len(cm["data"][key]) < 256 * 1024  # far from a ConfigMap's 1 MiB, and from kubectl apply's annotation
