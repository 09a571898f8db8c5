"""A tenant who may create VLLMServers can neither read what the operator reaches nor stop it.

Every test is one attack, through the field a tenant controls, against a local server that answers as the
tenant would (e2e/testbed/hostile_http.py): SECRET stands for a page only the operator reaches, and must never come
back in a Sample, a plan problem, a status or an Event.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from e2e.testbed.hostile_http import SECRET, HostileServer, Reply, redirect_to, secret_page
from vllm_operator import api, documents, pipeline
from vllm_operator.sources import model_facts
from vllm_operator.autoscaler import actuator
from vllm_operator.sources import vllm_metrics as metrics
from vllm_operator.sources.vllm_metrics import (MAX_METRICS_BYTES, PARSE_SECONDS, PodRef, PodsSource, PrometheusSource,
    parse_vllm_metrics)
from tests.unit.test_autoscaler_actuator import ROOT, FakeKube
from e2e.testbed.vllm_metrics_text import VLLM_METRICS
from tests.unit.test_catalog import LLAMA_31_8B

SLOW = Reply(200, VLLM_METRICS.encode(), trickle=0.1)  # a byte every 0.1 s: no single read is slow


def scrape(server: HostileServer, path: str = "/metrics", **kwargs):
    source = PodsSource(**kwargs)
    try:
        [sample] = source.read([PodRef("p", "ns", "127.0.0.1", server.port)])
    finally:
        source.close()
    assert SECRET not in (sample.error or "")
    return sample


# --------------------------------------------------------------------------- a pod's /metrics
def test_a_pod_redirecting_its_metrics_elsewhere_is_refused():
    with HostileServer({"/metrics": redirect_to("/secret"), "/secret": secret_page()}) as pod:
        sample = scrape(pod)
        assert [r.split("?", 1)[0] for r in pod.requests] == ["/metrics/", "/metrics"]  # never /secret
    assert not sample.ok and sample.error == f"GET http://127.0.0.1:{pod.port}/metrics: redirect refused"


def test_a_pod_answering_garbage_is_not_quoted():
    with HostileServer({"/metrics": secret_page()}) as pod:
        sample = scrape(pod)
    assert sample.error == "/metrics has no vllm:num_requests_waiting (is this a vLLM server?)"
    with HostileServer({"/metrics": Reply(200, f"vllm:num_requests_waiting {SECRET}\n".encode())}) as pod:
        assert scrape(pod).error == "/metrics: not Prometheus text"


def test_a_trickling_pod_ends_at_the_scrape_deadline():
    with HostileServer({"/metrics": SLOW}) as pod:
        t0 = time.monotonic()
        sample = scrape(pod, timeout=1.0)
        assert time.monotonic() - t0 < 3.0, "one deadline for the scrape, not one per socket read"
    assert sample.error == f"GET http://127.0.0.1:{pod.port}/metrics: timed out"


def test_a_huge_metrics_body_is_refused_not_truncated_and_parsed():
    huge = VLLM_METRICS.encode() + b"#" * MAX_METRICS_BYTES
    with HostileServer({"/metrics": Reply(200, huge, unsized=True)}) as pod:
        assert scrape(pod).error.endswith(f": response larger than {MAX_METRICS_BYTES} bytes")


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "1e309"])
def test_a_non_finite_queue_fails_the_sample(value):
    text = VLLM_METRICS.replace('vllm:num_requests_waiting{engine="1",model_name="tiny"} 3.0',
                                f'vllm:num_requests_waiting{{engine="1",model_name="tiny"}} {value}')
    with HostileServer({"/metrics": Reply(200, text.encode())}) as pod:
        sample = scrape(pod)
    assert not sample.ok and sample.error == "/metrics: non-finite value"


def test_only_bounded_lines_of_vllms_gauges_reach_the_parser(monkeypatch):
    # prometheus_client's parser is quadratic in escaped label values: one 2 MiB line took it about 26 s.
    parsed: list[int] = []
    real = metrics.text_string_to_metric_families
    monkeypatch.setattr(metrics, "text_string_to_metric_families", lambda text: parsed.append(len(text)) or real(text))
    escaped = 'vllm:num_requests_waiting{engine="0",x="' + '\\"' * 2**20 + '"} 4\n'
    sample = parse_vllm_metrics("p", escaped, 0.0)
    assert not sample.ok and sample.error.startswith("/metrics: vLLM's gauges take more than")
    many = 'vllm:num_requests_waiting{engine="0"} 1\n' * (metrics.MAX_SELECTED_BYTES // 30)
    assert parse_vllm_metrics("p", many, 0.0).error == sample.error
    assert parsed == []  # neither reached the parser
    other = 'vllm:other_family{x="' + '\\"' * 2**20 + '"} 1\nvllm:num_requests_waiting{engine="0"} 3\n'
    assert parse_vllm_metrics("p", other, 0.0).waiting == 3.0  # other families' lines are skipped unread
    assert parsed == [len('vllm:num_requests_waiting{engine="0"} 3\n')]
    within = 'vllm:num_requests_waiting{engine="0",x="' + '\\"' * 1000 + '"} 4\n'
    assert parse_vllm_metrics("p", within, 0.0).waiting == 4.0


def test_a_tenants_slow_pods_hold_the_shared_scrape_pool_for_a_bounded_time():
    source = PodsSource(timeout=0.5, max_workers=2)
    took: dict[str, float] = {}
    results: dict[str, list] = {}

    def read(who: str, pods: list[PodRef]) -> None:
        t0 = time.monotonic()
        results[who] = source.read(pods)
        took[who] = time.monotonic() - t0

    with HostileServer({"/metrics": SLOW}) as slow, HostileServer({"/metrics": Reply(200, VLLM_METRICS.encode())}) as fast:
        tenant = threading.Thread(target=read, args=("tenant", [PodRef(f"t-{i}", "a", "127.0.0.1", slow.port)
                                                               for i in range(6)]))
        tenant.start()
        time.sleep(0.1)
        other = threading.Thread(target=read, args=("other", [PodRef("o-0", "b", "127.0.0.1", fast.port)]))
        other.start()
        for thread in (tenant, other):
            thread.join(timeout=0.5 + PARSE_SECONDS + 3.0)
        assert not tenant.is_alive() and not other.is_alive(), "a read waits for its scrapes a bounded time"
        assert max(took.values()) < 0.5 + PARSE_SECONDS + 1.0
        assert {s.error.rsplit(": ", 1)[1] for s in results["tenant"]} <= {
            "timed out", "not scraped in time: every scraper was busy"}
        [later] = source.read([PodRef("o-0", "b", "127.0.0.1", fast.port)])  # the cancelled scrapes never ran
        assert later.ok
    source.close()


# --------------------------------------------------------------------------- spec.autoscaling.prometheusURL
def prometheus_failure(server: HostileServer) -> str:
    [sample] = PrometheusSource(server.base, timeout=1.0).read([PodRef("p", "ns", "ip")])
    assert not sample.ok and SECRET not in sample.error
    return sample.error.removeprefix(f"Prometheus {server.base}: ")


@pytest.mark.parametrize("reply, category", [
    (redirect_to("/secret"), "redirect refused"),
    (Reply(404, SECRET.encode()), "HTTP 404"),
    (Reply(503, SECRET.encode()), "HTTP 503"),
    (secret_page(), "not JSON"),
    (Reply(200, json.dumps({"data": SECRET}).encode()), "not a Prometheus answer"),
    (Reply(200, b"[" * 100_000 + b"]" * 100_000), "JSON nested deeper than 32 levels"),
    (Reply(200, b" " * (9 * 2**20)), "response larger than 8388608 bytes"),
    (Reply(200, b'{"data": {"result": []}}', trickle=0.1), "timed out"),
])
def test_a_hostile_prometheus_url_answers_only_a_category(reply, category):
    with HostileServer({"/api/v1/query": reply, "/secret": secret_page()}) as prom:
        assert prometheus_failure(prom) == category
        assert all(not r.startswith("/secret") for r in prom.requests)


def test_a_non_finite_value_from_prometheus_fails_that_pod():
    series = [{"metric": {"pod": pod, "q": "waiting"}, "value": [1.0, value]}
              for pod, value in (("p", "NaN"), ("q", "+Inf"), ("r", "3"))]
    shapes = [{"metric": SECRET}, {"metric": {"pod": ["p"], "q": "waiting"}, "value": [1, "1"]}, SECRET]
    answer = Reply(200, json.dumps({"status": "success", "data": {"result": series + shapes}}).encode())
    with HostileServer({"/api/v1/query": answer}) as prom:
        p, q, r = PrometheusSource(prom.base).read([PodRef(n, "ns", "ip") for n in "pqr"])
    assert p.error == q.error == f"Prometheus {prom.base}: non-finite value"
    assert (r.ok, r.waiting) == (True, 3.0)


# --------------------------------------------------------------------------- what reaches the status
class _Pods:
    """The reconciler's reader with the server's StatefulSet and one ready pod at `port`."""

    def __init__(self, port: int):
        self.port = port

    def children(self, namespace, name, uid, kinds=None):
        return {("StatefulSet", name): {"apiVersion": "apps/v1", "kind": "StatefulSet", "spec": {"replicas": 1},
                                        "metadata": {"name": name, "namespace": namespace,
                                                     "ownerReferences": [{"uid": uid, "controller": True}]}}}

    def pods(self, namespace, name):
        return [{"metadata": {"name": f"{name}-0", "namespace": namespace, "creationTimestamp": "2026-01-01T00:00:00Z"},
                 "spec": {"containers": [{"name": "vllm", "ports": [{"name": "http", "containerPort": self.port}]}]},
                 "status": {"phase": "Running", "podIP": "127.0.0.1",
                            "conditions": [{"type": "Ready", "status": "True"}]}}]


class _RecordingKube(FakeKube):
    def __init__(self, body):
        super().__init__(body)
        self.events: list[dict] = []

    def request(self, method, path, body=None, **kwargs):
        self.events.append(body)


@pytest.mark.parametrize("routes", [
    {"/metrics": redirect_to("/secret"), "/secret": secret_page()},  # the current code followed it
    {"/metrics": secret_page()},
    {"/metrics": Reply(500, SECRET.encode())},
])
def test_nothing_a_pod_answers_reaches_the_status_or_an_event(routes):
    body = yaml.safe_load((ROOT / "examples" / "llama-3b-autoscaled.yaml").read_text())
    body["metadata"] = {"name": "s", "namespace": "ns", "uid": "u1", "generation": 1, "resourceVersion": "5"}
    with HostileServer(routes) as pod:
        kube = _RecordingKube(body)
        scaler = actuator.Autoscaler(kube, actuator.Sources(), "ns", "s", clock=lambda: 1000.0,
                                     reader=_Pods(pod.port))
        result = scaler.tick(json.loads(json.dumps(body)))
    assert result.decision is not None and result.decision.hold
    written = json.dumps([kube.body["status"], kube.events])
    assert "holding" in written and kube.events, "the hold was reported"
    assert "SECRET" not in written and "root:x" not in written


def test_a_pod_ip_of_ipv6_is_bracketed():
    source = PodsSource(timeout=0.5)
    [sample] = source.read([PodRef("p", "ns", "::1", 1)])
    source.close()
    assert sample.error.startswith("GET http://[::1]:1/metrics: "), sample.error  # refused, or no IPv6 here


# --------------------------------------------------------------------------- spec.model.configURL
def config_plan(url: str, *, name: str = "acme/x", timeout: float = 1.0, configs=None, **model):
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["spec"]["model"] = {"name": name, "configURL": url, **model}
    return pipeline.plan_server("x", "ns", api.VLLMServerSpec.model_validate(doc["spec"]), configs=configs,
                                fetch=functools.partial(model_facts.fetch_config, timeout=timeout))


def config_problem(url: str, **kwargs) -> str:
    plan = config_plan(url, **kwargs)
    [problem] = plan.problems
    assert problem.field == "spec.model.configURL" and SECRET not in problem.message
    return problem.message.removeprefix(f"could not fetch config.json from {url}: ").removeprefix(
        f"config.json at {url}: ")


GOOD_CONFIG = Reply(200, json.dumps(LLAMA_31_8B).encode())


@pytest.mark.parametrize("reply, category", [
    (redirect_to("/secret"), "redirect refused"),
    (Reply(404, SECRET.encode()), "HTTP 404"),  # the current code quoted the reason phrase
    (secret_page(), "not JSON"),
    (Reply(200, json.dumps([SECRET]).encode()), "not a JSON object"),
    (Reply(200, b" " * (model_facts.MAX_CONFIG_BYTES + 1)), "response larger than 1048576 bytes"),
    (Reply(200, b'{"a":' * 100_000 + b"1" + b"}" * 100_000), "JSON nested deeper than 32 levels"),
    (Reply(200, GOOD_CONFIG.body, trickle=0.1), "timed out"),
])
def test_a_hostile_config_url_is_a_problem_naming_the_field(reply, category):
    with HostileServer({"/config.json": reply, "/secret": secret_page()}) as hub:
        t0 = time.monotonic()
        assert config_problem(f"{hub.base}/config.json") == category
        assert time.monotonic() - t0 < 3.0, "one deadline for the whole fetch"
        assert hub.requests == ["/config.json"]


def test_a_config_of_empty_objects_is_refused_at_the_cap():
    # 16 MiB of {"a":[{},{},...]} took the operator to 454 MiB; the cap is 1 MiB (bench/adversarial.py).
    body = b'{"a":[' + b"{}," * (6 * 2**20) + b"{}]}"
    with HostileServer({"/config.json": Reply(200, body)}) as hub:
        assert config_problem(f"{hub.base}/config.json") == "response larger than 1048576 bytes"


def test_the_operator_reads_no_local_file_for_a_tenant(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_31_8B))
    for location in ("/etc/passwd", "/nonexistent", f"file://{tmp_path}/config.json", str(tmp_path)):
        assert config_problem(location) == "not an http(s) URL", "the same answer whether or not it exists"
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["spec"]["model"] = {"name": str(tmp_path)}  # a directory of the operator's: just an unknown model
    plan = pipeline.plan_server("x", "ns", api.VLLMServerSpec.model_validate(doc["spec"]))
    assert [p.field for p in plan.problems] == ["spec.model.architecture"]


@pytest.mark.parametrize("changes, field", [
    ({"num_hidden_layers": 10**30}, "numLayers"),
    ({"num_hidden_layers": 1e308}, "numLayers"),
    ({"hidden_size": 2_000_000, "head_dim": 128}, "hiddenSize"),
    ({"vocab_size": int("9" * 4000)}, "vocabSize"),
])
def test_numbers_out_of_range_are_a_problem_naming_the_field(changes, field):
    with HostileServer({"/config.json": Reply(200, json.dumps({**LLAMA_31_8B, **changes}).encode())}) as hub:
        message = config_problem(f"{hub.base}/config.json")
    assert message.startswith(f"out of range: {field} (input should be less than or equal to")


_JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=10**20, max_value=10**400)
    | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8)
_CONFIG_KEYS = ["num_hidden_layers", "num_attention_heads", "hidden_size", "num_key_value_heads", "head_dim",
                "intermediate_size", "vocab_size", "max_position_embeddings", "num_local_experts",
                "moe_intermediate_size", "torch_dtype", "tie_word_embeddings", "text_config"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(_CONFIG_KEYS), _JSON_VALUE, max_size=6), st.booleans())
def test_any_config_json_is_a_plan_or_problems_never_an_exception(changes, catalog_model):
    config = {**LLAMA_31_8B, **changes}
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    name = "meta-llama/Llama-3.1-8B-Instruct" if catalog_model else "acme/x"
    doc["spec"]["model"] = {"name": name, "configURL": "https://hub.test/config.json"}
    plan = pipeline.plan_server("x", "ns", api.VLLMServerSpec.model_validate(doc["spec"]),
                                fetch=lambda url: json.loads(json.dumps(config)))
    for problem in plan.problems:
        assert problem.field.startswith("spec."), problem


def test_a_hub_outage_keeps_the_last_good_facts_with_a_note():
    clock = [1_000_000.0]
    configs = model_facts.ConfigCache(ttl=600, retry=60, clock=lambda: clock[0])
    with HostileServer({"/config.json": GOOD_CONFIG}) as hub:
        url = f"{hub.base}/config.json"
        first = config_plan(url, configs=configs)
        clock[0] += 300
        assert config_plan(url, configs=configs).args == first.args and len(hub.requests) == 1, "within the TTL"
    assert first.fits and not any("warning: could not fetch" in n for n in first.notes)
    clock[0] += 301  # the TTL is over and the hub is gone
    stale = config_plan(url, configs=configs)
    assert stale.fits and stale.args == first.args
    assert f"warning: could not fetch config.json from {url}: connection refused; planned with the facts it gave " \
           "at 1970-01-12T13:46:40Z" in stale.notes
    assert config_plan(url, configs=configs).notes == stale.notes, "the same note: no status churn"
    other = config_plan(url, configs=configs, revision="v2")  # another revision was never fetched
    assert [p.field for p in other.problems] == ["spec.model.configURL"]


def test_a_failing_url_is_retried_after_the_retry_interval_not_every_reconcile():
    clock = [0.0]
    configs = model_facts.ConfigCache(ttl=600, retry=60, clock=lambda: clock[0])
    with HostileServer({"/config.json": Reply(200, GOOD_CONFIG.body, trickle=0.1)}) as slow:
        url = f"{slow.base}/config.json"
        assert config_problem(url, configs=configs) == "timed out"
        t0 = time.monotonic()
        for _ in range(5):
            clock[0] += 10
            assert config_problem(url, configs=configs) == "timed out"
        assert time.monotonic() - t0 < 0.5 and len(slow.requests) == 1, "answered from the cache"
        clock[0] += 10
        assert config_problem(url, configs=configs) == "timed out"
        assert len(slow.requests) == 2


def test_the_config_cache_keeps_the_most_recently_used():
    configs = model_facts.ConfigCache(max_entries=2)
    arch = api.ModelArchitecture(numLayers=2)
    for url in ("a", "b", "a", "c"):
        configs.facts(url, None, lambda: arch)
    calls = []
    configs.facts("a", None, lambda: calls.append("a") or arch)
    configs.facts("b", None, lambda: calls.append("b") or arch)
    assert calls == ["b"], "b was the least recently used of three"


# --------------------------------------------------------------------------- quantities
@pytest.mark.parametrize("path", [("gpu", "memory"), ("gpu", "reservedMemory"), ("shmSize",), ("cache", "size"),
                                  ("resources", "requests", "memory"), ("resources", "limits", "cpu")])
@pytest.mark.parametrize("value", ["1e400", "1e-400", "1e1.5", "1e9999999", "9" * 400])
def test_a_quantity_out_of_range_is_a_problem_naming_the_field(path, value):
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    node = doc["spec"]
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    spec, errors = documents.parse_spec(doc["spec"])  # the operator's way; the current code raised OverflowError,
    assert spec is None                              # decimal.Overflow or decimal.InvalidOperation in the planner
    assert [e.split(":", 1)[0] for e in errors] == ["spec." + ".".join(path)]
    assert "out of range" in errors[0]
    [document] = documents.load_documents(yaml.safe_dump(doc))  # the CLI's
    assert [e.split(":", 1)[0] for e in document.errors] == ["spec." + ".".join(path)]


# --------------------------------------------------------------------------- values that become vLLM arguments
FLAG_LIKE = [("name", "spec.model.name"), ("servedName", "spec.model.servedName"), ("revision", "spec.model.revision")]


@pytest.mark.parametrize("key, field", FLAG_LIKE)
@pytest.mark.parametrize("value", ["--api-key=stolen", "-h", "--enable-auto-tool-choice"])
def test_a_value_that_becomes_an_argument_may_not_start_with_a_dash(key, field, value):
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["spec"]["model"][key] = value  # the current code passed "--api-key=stolen" to vLLM as a flag
    spec, errors = documents.parse_spec(doc["spec"])
    assert spec is None and errors == [f"{field}: must not start with '-': vLLM would read it as a flag "
                                       f"(got {value!r})"]
    [document] = documents.load_documents(yaml.safe_dump(doc))
    assert document.errors == errors


@pytest.mark.parametrize("key, field", FLAG_LIKE)
def test_the_planner_refuses_a_dash_in_a_spec_built_without_validation(key, field):
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    spec = api.VLLMServerSpec.model_validate(doc["spec"])
    attribute = {"name": "name", "servedName": "served_name", "revision": "revision"}[key]
    spec.model = spec.model.model_copy(update={attribute: "--api-key=stolen"})  # no validation
    plan = pipeline.plan_server("x", "ns", spec)
    assert f"{field}: '--api-key=stolen' starts with '-': vLLM would read it as a flag" in [
        str(p).split(", not as")[0] for p in plan.problems]
    assert not plan.fits, "nothing is applied"


def test_the_crd_refuses_a_leading_dash_too():
    from vllm_operator import crd
    model = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["model"]
    for key, _ in FLAG_LIKE:
        assert model["properties"][key]["pattern"] == "^[^-]"
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["spec"]["model"].update(name="org/a-b--c", servedName="x-", revision="v1.0-rc")
    assert documents.parse_spec(doc["spec"])[1] == []
