"""A tenant may point the operator only at the URLs the operator's own settings allow, and only at pods' IPs.

The operator reaches services a tenant cannot (internal Services, a cloud's metadata endpoint): a configURL or
prometheusURL outside the allowed prefixes is a problem naming the field and the setting, and is never fetched;
a pod on the node's network is never scraped (its IP is the node's).
"""

from __future__ import annotations

from typing import Any

import pytest

from vllm_operator import api, cli, operator_main, pipeline
from vllm_operator.sources import vllm_metrics
from vllm_operator.autoscaler import actuator
from vllm_operator.urlpolicy import PUBLIC_HUB, URLPolicy, allows


@pytest.mark.parametrize("prefix, url, allowed", [
    ("https://hub.example", "https://hub.example/org/m/resolve/main/config.json", True),
    ("https://hub.example/", "https://hub.example", True),
    ("https://hub.example/org", "https://hub.example/org/m/config.json", True),
    ("https://hub.example/org", "https://hub.example/org", True),
    ("https://hub.example/org", "https://hub.example/organisation/m/config.json", False),  # at a '/' only
    ("https://hub.example", "https://hub.example.evil.io/config.json", False),             # a string prefix
    ("https://hub.example", "https://hub.example@10.0.0.1/config.json", False),           # credentials
    ("https://hub.example", "http://hub.example/config.json", False),                      # the scheme
    ("https://hub.example", "https://hub.example:8443/config.json", False),                # the port
    ("https://hub.example", "https://hub.example:443/config.json", True),                  # the default port
    ("https://hub.example", "https://HUB.Example./config.json", True),                     # a host is a host
    ("http://prometheus.monitoring:9090", "http://prometheus.monitoring:9090/", True),
    ("*", "http://10.0.0.1/anything", True),
    ("*", "file:///etc/passwd", False),
    ("*", "gopher://10.0.0.1/", False),
    ("https://hub.example", "https://hub.example:99999/", False),                         # not a port
])
def test_a_prefix_is_compared_as_a_url(prefix, url, allowed):
    assert allows(prefix, url) is allowed


def settings(*argv: str) -> URLPolicy:
    return operator_main.url_policy(cli.build_parser().parse_args(["run", *argv]))


def test_the_operators_own_endpoints_and_the_public_hub_are_allowed_by_default():
    policy = settings("--hf-endpoint", "https://mirror.corp", "--prometheus-url", "http://prom.monitoring:9090")
    assert policy.config == (PUBLIC_HUB, "https://mirror.corp")
    assert policy.prometheus == ("http://prom.monitoring:9090",)
    assert settings().prometheus == ()  # no default Prometheus: a spec may name none
    more = settings("--allowed-config-url", "https://files.corp/models", "--allowed-prometheus-url", "*")
    assert more.config == (PUBLIC_HUB, "https://files.corp/models") and more.prometheus == ("*",)


def spec(**fields: Any) -> api.VLLMServerSpec:
    doc: dict[str, Any] = {"model": {"name": "meta-llama/Llama-3.2-3B-Instruct"},
                           "gpu": {"count": 1, "product": "NVIDIA-L4"}, **fields}
    return api.VLLMServerSpec.model_validate(doc)


def test_a_config_url_outside_the_settings_is_a_problem_and_is_never_fetched():
    fetched: list[str] = []

    def fetch(url: str, **_: Any) -> dict:
        fetched.append(url)
        raise ValueError("spec.model.configURL: HTTP 404")  # recorded; the answer does not matter here

    internal = spec(model={"name": "my-model", "configURL": "http://10.0.0.1:8080/admin"})
    plan = pipeline.plan_server("s", "ns", internal, fetch=fetch, urls=URLPolicy.from_settings())
    [problem] = [p for p in plan.problems if p.field == "spec.model.configURL"]
    assert "only under the URLs its settings allow (https://huggingface.co/)" in problem.message
    assert "--allowed-config-url" in problem.message and "10.0.0.1" not in problem.message
    assert fetched == []

    # The same URL under a prefix the platform team allowed is fetched; without settings (the CLI) too.
    for policy in (URLPolicy.from_settings(["http://10.0.0.1:8080/"]), None):
        plan = pipeline.plan_server("s", "ns", internal, fetch=fetch, urls=policy)
        assert fetched.pop() == "http://10.0.0.1:8080/admin"


def test_a_prometheus_url_outside_the_settings_is_a_problem_for_the_reconciler_and_the_autoscaler():
    auto = {"enabled": True, "maxReplicas": 3, "source": "Prometheus",
            "prometheusURL": "http://169.254.169.254/latest/meta-data"}
    policy = URLPolicy.from_settings(prometheus_url="http://prom.monitoring:9090")
    plan = pipeline.plan_server("s", "ns", spec(autoscaling=auto), urls=policy)
    [problem] = [p for p in plan.problems if p.field == "spec.autoscaling.prometheusURL"]
    assert "(http://prom.monitoring:9090)" in problem.message and "--allowed-prometheus-url" in problem.message
    [why] = actuator.autoscaling_problems("s", spec(autoscaling=auto), "http://prom.monitoring:9090", policy)
    assert why == str(problem)
    # The operator's own default, named in the spec or not, is allowed.
    fine = dict(auto, prometheusURL="http://prom.monitoring:9090/")
    assert actuator.autoscaling_problems("s", spec(autoscaling=fine), "http://prom.monitoring:9090", policy) == []
    assert not [p for p in pipeline.plan_server("s", "ns", spec(autoscaling=auto)).problems
                if p.field == "spec.autoscaling.prometheusURL"], "the offline CLI has no settings"


def pod(name: str, ip: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns"},
            "spec": {"containers": [{"name": "vllm", "ports": [{"name": "http", "containerPort": 8000}]}], **spec},
            "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}}


def test_a_pod_on_the_nodes_network_is_never_scraped():
    pods = [pod("a-0", "10.1.0.5"), pod("a-1", "192.168.0.7", hostNetwork=True), pod("a-2", "")]
    assert [p.name for p in vllm_metrics.ready_pods(pods)] == ["a-0"]
    groups = actuator.classify_pods(pods, now=0.0)
    assert [p.name for p in groups.ready] == ["a-0"]
    assert groups.ready_unscraped == ["a-1 (host network: the operator scrapes pod IPs only)", "a-2 (no IP yet)"]
