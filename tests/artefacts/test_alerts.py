"""The chart's alerts (templates/prometheusrule.yaml) under promtool, Prometheus's own rule checker.

The rules are rendered by Helm from the chart, then `promtool check rules` parses them and
`promtool test rules` evaluates every alert on synthetic series: one case where it fires, with
its labels and annotations asserted, and one where it must stay quiet (the near misses: below
the threshold, not for long enough, another server's gauge). Each alert's cases are then run
against that alert with its expression replaced by one that always fires and one that never
does: both must fail, so no case passes whatever the expression says.

Series carry the labels vLLM 0.32 gives them (model_name, engine; finished_reason on
vllm:request_success_total) plus the namespace and pod a PodMonitor adds; the operator's carry
what its ServiceMonitor (honorLabels) gives them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.testbed import monitoring

RELEASE_NS = "vllm-operator"  # the operator's namespace (rule_groups' default)
OPERATOR_POD = {"namespace": RELEASE_NS, "pod": "vllm-operator-5d9c7b-x2x4z", "job": "vllm-operator"}


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def vllm(pod: str, namespace: str = "team", model: str = "llama", engine: str = "0", **extra: str) -> dict[str, str]:
    return {"namespace": namespace, "pod": pod, "model_name": model, "engine": engine, **extra}


def operator(**extra: str) -> dict[str, str]:
    """Labels of an operator series about one server: the server's namespace (honorLabels), the operator's pod."""
    return {**OPERATOR_POD, **extra}


@dataclass
class Case:
    series: list[dict[str, str]]
    eval_time: str
    alerts: list[dict[str, Any]] = field(default_factory=list)
    """Expected firing alerts: labels (alertname left out) and summary/description; [] for a quiet case."""


def fired(labels: dict[str, str], summary: str, description: str) -> dict[str, Any]:
    return {"labels": labels, "summary": summary, "description": description}


# --------------------------------------------------------------------------- the cases, with default values
CASES: dict[str, dict[str, Case]] = {
    "VLLMServerQueueAtMaxReplicas": {
        "fires": Case([
            series("vllm:num_requests_waiting", vllm("llama-0"), "6x20"),
            series("vllm:num_requests_waiting", vllm("llama-1"), "4x20"),
            series("vllm:num_requests_waiting", vllm("llama-1", engine="1"), "2x20"),
            series("vllm_operator_autoscaler_at_max_replicas", operator(namespace="team", name="llama"), "1x20"),
            # another server queues as much but its autoscaler still has room: not this alert
            series("vllm:num_requests_waiting", vllm("gemma-0", model="gemma"), "12x20"),
            series("vllm_operator_autoscaler_at_max_replicas", operator(namespace="team", name="gemma"), "0x20"),
        ], "12m", [fired(
            {"namespace": "team", "name": "llama", "severity": "warning"},
            "team/llama: 12 requests wait at maxReplicas",
            "12 requests wait in the vLLM queues of VLLMServer team/llama, and for 10m its autoscaler has wanted "
            "more replicas than maxReplicas: the server cannot absorb its load, and every request waits longer.")]),
        "quiet": Case([
            # at max, but nothing waits (the autoscaler's last word before the queue drained)
            series("vllm:num_requests_waiting", vllm("llama-0"), "0x20"),
            series("vllm_operator_autoscaler_at_max_replicas", operator(namespace="team", name="llama"), "1x20"),
            # waiting, at max only for the last 7 minutes
            series("vllm:num_requests_waiting", vllm("gemma-0", model="gemma"), "8x20"),
            series("vllm_operator_autoscaler_at_max_replicas", operator(namespace="team", name="gemma"), "0x4 1x15"),
        ], "12m"),
    },
    "VLLMKVCacheNearlyFull": {
        "fires": Case([
            series("vllm:kv_cache_usage_perc", vllm("llama-0"), "0.98x20"),
            series("vllm:kv_cache_usage_perc", vllm("llama-0", engine="1"), "0.5x20"),  # the fullest engine counts
            series("vllm:kv_cache_usage_perc", vllm("llama-1"), "0.6x20"),
        ], "16m", [fired(
            {"namespace": "team", "pod": "llama-0", "model_name": "llama", "severity": "warning"},
            "team/llama-0: KV cache 98% full",
            "vLLM's KV cache on pod team/llama-0 (llama) is 98% full and has stayed above 95% for 15m: new requests "
            "wait for blocks to free up, and running ones get preempted and recomputed.")]),
        "quiet": Case([
            series("vllm:kv_cache_usage_perc", vllm("llama-0"), "0.94x20"),  # high, under the threshold
            series("vllm:kv_cache_usage_perc", vllm("llama-1"), "0.5x5 0.99x15"),  # full for the last 11 minutes
        ], "16m"),
    },
    "VLLMRequestsPreempted": {
        "fires": Case([
            series("vllm:num_preemptions_total", vllm("llama-0"), "0+6x30"),  # 30 in 5 minutes
            series("vllm:num_preemptions_total", vllm("llama-1"), "0x30"),
        ], "20m", [fired(
            {"namespace": "team", "pod": "llama-0", "model_name": "llama", "severity": "warning"},
            "team/llama-0: vLLM preempted 30 requests in 5 minutes",
            "vLLM on pod team/llama-0 (llama) preempted 30 running requests in the last 5 minutes, and has kept "
            "preempting for 15m: its KV cache cannot hold every running sequence, so it evicts some and computes "
            "them again, which costs latency and GPU time.")]),
        "quiet": Case([
            series("vllm:num_preemptions_total", vllm("llama-0"), "7x30"),  # preempted once, before the window
            series("vllm:num_preemptions_total", vllm("llama-1"), "0+5x5 25x25"),  # a burst, then none
        ], "25m"),
    },
    "VLLMRequestErrors": {
        "fires": Case([
            series("vllm:request_success_total", vllm("llama-0", finished_reason="stop"), "0+48x30"),
            series("vllm:request_success_total", vllm("llama-0", finished_reason="error"), "0+12x30"),
            series("vllm:request_success_total", vllm("llama-0", finished_reason="abort"), "0x30"),
            series("vllm:request_success_total", vllm("llama-0", finished_reason="length"), "0x30"),
            series("vllm:request_success_total", vllm("llama-1", finished_reason="stop"), "0+60x30"),
            series("vllm:request_success_total", vllm("llama-1", finished_reason="error"), "0x30"),
        ], "15m", [fired(
            {"namespace": "team", "name": "llama", "model_name": "llama", "finished_reason": "error",
             "severity": "critical"},
            "team/llama: 10% of requests end with error",
            "10% of the requests VLLMServer team/llama (llama) finished ended with finished_reason error (over 5 "
            "minutes, above 5% for 10m).")]),
        "quiet": Case([
            # 2% errors: under the threshold; `length` is not a failure by default
            series("vllm:request_success_total", vllm("llama-0", finished_reason="stop"), "0+39x30"),
            series("vllm:request_success_total", vllm("llama-0", finished_reason="length"), "0+20x30"),
            series("vllm:request_success_total", vllm("llama-0", finished_reason="error"), "0+1x30"),
            # every request aborted, but only for the last 6 minutes
            series("vllm:request_success_total", vllm("gemma-0", model="gemma", finished_reason="abort"),
                   "0x9 0+30x20"),
            # no traffic at all (0/0)
            series("vllm:request_success_total", vllm("idle-0", model="idle", finished_reason="error"), "0x30"),
        ], "15m"),
    },
    "VLLMServerNotReady": {
        "fires": Case([
            series("vllm_operator_server_ready", operator(namespace="team", name="llama"), "0x40"),
            series("vllm_operator_server_ready_replicas", operator(namespace="team", name="llama"), "1x40"),
            series("vllm_operator_server_ready", operator(namespace="team", name="gemma"), "1x40"),
            series("vllm_operator_server_ready_replicas", operator(namespace="team", name="gemma"), "2x40"),
        ], "35m", [fired(
            {"namespace": "team", "name": "llama", "severity": "warning"},
            "team/llama is not Ready",
            "VLLMServer team/llama has had Ready=False for 30m with 1 replica(s) ready.")]),
        "quiet": Case([
            series("vllm_operator_server_ready", operator(namespace="team", name="llama"), "0x20 1x20"),  # loaded
            series("vllm_operator_server_ready_replicas", operator(namespace="team", name="llama"), "0x20 1x20"),
            series("vllm_operator_server_ready", operator(namespace="team", name="gone"), "0x10"),  # deleted
            series("vllm_operator_server_ready_replicas", operator(namespace="team", name="gone"), "0x10"),
        ], "35m"),
    },
    "VLLMOperatorReconcileErrors": {
        "fires": Case([
            series("vllm_operator_reconcile_errors_total", operator(cause="403"), "0+3x30"),
            series("vllm_operator_reconcile_errors_total", operator(cause="409"), "0x30"),
        ], "20m", [fired(
            {"namespace": RELEASE_NS, "cause": "403", "severity": "warning"},
            f"vllm-operator in {RELEASE_NS}: reconciles fail (403)",
            f"The operator in {RELEASE_NS} failed 15 reconciles in the last 5 minutes with cause 403 (an HTTP "
            "status of the failing API call, or an exception's class), and has kept failing for 15m. The servers it "
            "cannot reconcile keep what was last applied, but changes to them wait.")]),
        "quiet": Case([
            series("vllm_operator_reconcile_errors_total", operator(cause="403"), "0+3x5 15x25"),  # fixed
            series("vllm_operator_reconcile_errors_total", operator(cause="409"), "0x18 1+1x12"),  # only lately
        ], "25m"),
    },
    "VLLMOperatorAbsent": {
        "fires": Case([
            # another release's operator does not count for this one
            series("vllm_operator_build_info", {"namespace": "elsewhere", "pod": "op-0", "version": "0.1.0",
                                                "vllm_version": "0.32.0"}, "1x20"),
        ], "11m", [fired(
            {"namespace": RELEASE_NS, "severity": "warning"},
            f"vllm-operator in {RELEASE_NS} is down or not scraped",
            f"Prometheus has had no series from the vllm-operator in namespace {RELEASE_NS} for 10m. Without the "
            "operator no VLLMServer is reconciled or autoscaled; without its series VLLMServerNotReady, "
            "VLLMServerQueueAtMaxReplicas and VLLMOperatorReconcileErrors cannot fire.")]),
        "quiet": Case([
            series("vllm_operator_build_info", operator(version="0.1.0", vllm_version="0.32.0"), "1x20"),
        ], "11m"),
    },
}


# --------------------------------------------------------------------------- running promtool
def rules_by_alert(groups: list[dict]) -> dict[str, dict]:
    return monitoring.alerts(groups)


def promtool_test(tmp_path: Path, groups: list[dict], cases: list[tuple[str, Case]]) -> tuple[bool, str]:
    """`promtool test rules` of `cases` (alert name, case) against `groups`; (passed, output)."""
    rules = rules_by_alert(groups)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    tests = []
    for alert, case in cases:
        static = {k: v for k, v in rules[alert]["annotations"].items() if k not in ("summary", "description")}
        tests.append({
            "name": f"{alert} at {case.eval_time}",
            "interval": "1m",
            "input_series": case.series,
            "alert_rule_test": [{
                "eval_time": case.eval_time,
                "alertname": alert,
                "exp_alerts": [{"exp_labels": a["labels"],
                                "exp_annotations": {"summary": a["summary"], "description": a["description"],
                                                    **static}}
                               for a in case.alerts],
            }],
        })
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}, sort_keys=False, width=200))
    p = monitoring.run_promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    return p.returncode == 0, p.stdout + p.stderr


@pytest.fixture(scope="module")
def groups() -> list[dict]:
    return monitoring.rule_groups()


def test_every_alert_has_cases_and_the_texts_operators_read(groups):
    rules = rules_by_alert(groups)
    assert sorted(rules) == sorted(CASES)
    for name, rule in rules.items():
        assert {"fires", "quiet"} == set(CASES[name]), name
        assert CASES[name]["fires"].alerts and not CASES[name]["quiet"].alerts, name
        assert set(rule["annotations"]) == {"summary", "description", "runbook"}, name  # runbook_url: opt-in
        assert len(rule["annotations"]["runbook"]) > 80, name
        assert rule["labels"]["severity"] in ("warning", "critical"), name


def test_promtool_check_rules_accepts_the_rendered_groups(groups, tmp_path):
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    p = monitoring.run_promtool("check", "rules", str(tmp_path / "rules.yaml"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"SUCCESS: {len(CASES)} rules found" in p.stdout


def test_promtool_check_rules_rejects_a_broken_expression(groups, tmp_path):
    broken = copy.deepcopy(groups)
    broken[0]["rules"][0]["expr"] = broken[0]["rules"][0]["expr"].replace(")", "", 1)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": broken}, sort_keys=False))
    p = monitoring.run_promtool("check", "rules", str(tmp_path / "rules.yaml"))
    assert p.returncode != 0 and "parse error" in p.stdout + p.stderr


def test_every_alert_fires_and_stays_quiet_as_its_cases_say(groups, tmp_path):
    ok, out = promtool_test(tmp_path, groups, [(a, c) for a, cases in CASES.items() for c in cases.values()])
    assert ok, out


@pytest.mark.parametrize("alert", sorted(CASES))
@pytest.mark.parametrize("replacement,breaks", [("vector(1)", "quiet"), ("vector(1) == 0", "fires")])
def test_the_cases_fail_when_the_expression_is_wrong(groups, tmp_path, alert, replacement, breaks):
    """An expression that always fires fails the quiet case, one that never fires the firing case."""
    mutated = copy.deepcopy(groups)
    rules_by_alert(mutated)[alert]["expr"] = replacement
    ok, out = promtool_test(tmp_path, mutated, [(alert, CASES[alert][breaks])])
    assert not ok, f"{alert}'s {breaks} case passes with expr {replacement!r}:\n{out}"


def test_only_real_metric_names(groups):
    from tests.artefacts.test_dashboard import KNOWN_METRICS

    for name, rule in rules_by_alert(groups).items():
        unknown = monitoring.metric_names(rule["expr"]) - KNOWN_METRICS
        assert not unknown, f"{name} reads metrics neither vLLM 0.32 nor the operator has: {unknown}"


# --------------------------------------------------------------------------- values reach the rules
def test_thresholds_durations_and_labels_come_from_the_values(tmp_path):
    values = {
        "alertLabels": {"team": "ml-platform"},
        "runbookBaseURL": "https://docs.example.com/vllm-operator/monitoring/",
        "kvCacheNearlyFull": {"usage": 0.8, "for": "5m", "severity": "critical"},
        "requestErrors": {"finishedReasons": ["length"], "ratio": 0.5},
        "preemptions": {"enabled": False},
    }
    groups = monitoring.rule_groups(values)
    rules = rules_by_alert(groups)
    assert "VLLMRequestsPreempted" not in rules and len(rules) == len(CASES) - 1
    kv = rules["VLLMKVCacheNearlyFull"]
    assert kv["for"] == "5m" and kv["labels"] == {"severity": "critical", "team": "ml-platform"}
    assert kv["annotations"]["runbook_url"] == "https://docs.example.com/vllm-operator/monitoring#vllmkvcachenearlyfull"
    assert all(r["labels"]["team"] == "ml-platform" and r["annotations"]["runbook_url"].endswith("#" + a.lower())
               for a, r in rules.items())
    labels = {"pod": "llama-0", "namespace": "team", "model_name": "llama", "severity": "critical", "team": "ml-platform"}
    kv_case = Case([series("vllm:kv_cache_usage_perc", vllm("llama-0"), "0.85x10")], "6m", [fired(
        {k: v for k, v in labels.items()}, "team/llama-0: KV cache 85% full",
        "vLLM's KV cache on pod team/llama-0 (llama) is 85% full and has stayed above 80% for 5m: new requests "
        "wait for blocks to free up, and running ones get preempted and recomputed.")])
    # 60% of requests hit max_tokens: a failure now, above the 50% asked for; errors no longer count
    errors_case = Case([
        series("vllm:request_success_total", vllm("llama-0", finished_reason="length"), "0+36x30"),
        series("vllm:request_success_total", vllm("llama-0", finished_reason="stop"), "0+24x30"),
    ], "15m", [fired(
        {"namespace": "team", "name": "llama", "model_name": "llama", "finished_reason": "length",
         "severity": "critical", "team": "ml-platform"},
        "team/llama: 60% of requests end with length",
        "60% of the requests VLLMServer team/llama (llama) finished ended with finished_reason length (over 5 "
        "minutes, above 50% for 10m).")])
    ok, out = promtool_test(tmp_path, groups, [("VLLMKVCacheNearlyFull", kv_case), ("VLLMRequestErrors", errors_case),
                                              ("VLLMRequestErrors", CASES["VLLMRequestErrors"]["quiet"])])
    assert ok, out


def test_disabled_groups_and_the_default_install():
    from vllm_operator import generate

    assert not [o for o in generate.render_chart(monitoring.CHART) if o["kind"] == "PrometheusRule"]
    only_operator = {k: {"enabled": False} for k in ("queueAtMaxReplicas", "kvCacheNearlyFull", "preemptions",
                                                       "requestErrors", "serverNotReady")}
    assert [g["name"] for g in monitoring.rule_groups(only_operator)] == ["vllm-operator.operator"]
    nothing = {**only_operator, "reconcileErrors": {"enabled": False}, "operatorAbsent": {"enabled": False}}
    assert monitoring.rule_groups(nothing) == []


def test_the_rule_is_labelled_for_a_prometheus_rule_selector():
    from vllm_operator import generate

    (rule,) = [o for o in generate.render_chart(monitoring.CHART, {"prometheusRule": {
        "enabled": True, "labels": {"release": "kube-prometheus-stack"}}}, namespace="ops")
               if o["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["namespace"] == "ops"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert 'absent(vllm_operator_build_info{namespace="ops"})' in str(rule["spec"])
