"""spec.routing (the Gateway API Inference Extension) and scale to zero, pure: the objects built, the rules, the
policy's idle window and wake-up, the picker's metric parsed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_operator import api, builders, pipeline, validation
from vllm_operator.autoscaler import policy
from vllm_operator.sources import picker_metrics
from vllm_operator.sources.vllm_metrics import Sample

ROOT = Path(__file__).resolve().parents[2]
BASE = {"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}, "gpu": {"product": "L4"}}


def build(spec: dict[str, Any], name: str = "chat", namespace: str = "team-a") -> dict[tuple[str, str], dict]:
    plan = pipeline.plan_server(name, namespace, api.VLLMServerSpec.model_validate({**BASE, **spec}))
    assert plan.fits, plan.problems
    return {(o["kind"], o["metadata"]["name"]): o for o in builders.build_all(plan, None)}


def problems(spec: dict[str, Any]) -> list[str]:
    return [str(p) for p in validation.check_spec("chat", api.VLLMServerSpec.model_validate({**BASE, **spec}))]


POOL_ON = {"routing": {"inferencePool": {"enabled": True}}}


def test_routing_is_off_by_default_and_emits_nothing():
    objects = build({})
    assert not [k for k in objects if k[0] in ("InferencePool", "Deployment", "HTTPRoute", "Role")]
    sts = objects[("StatefulSet", "chat")]
    assert builders.POOL_LABEL not in sts["spec"]["template"]["metadata"]["labels"]


def test_the_pool_selects_the_servers_pods_on_port_8000_and_names_its_picker():
    objects = build(POOL_ON)
    pool = objects[("InferencePool", "chat")]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["selector"] == {"matchLabels": {builders.POOL_LABEL: "chat"}}
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"] == {"kind": "Service", "name": "chat-epp", "port": {"number": 9002},
                                                 "failureMode": "FailClose"}
    labels = objects[("StatefulSet", "chat")]["spec"]["template"]["metadata"]["labels"]
    assert labels[builders.POOL_LABEL] == "chat"
    service = objects[("Service", "chat-epp")]
    assert service["spec"]["selector"] == builders.picker_selector("chat")
    assert {p["port"] for p in service["spec"]["ports"]} == {9002, 9090}


def test_the_pickers_rbac_is_namespaced_and_read_only():
    objects = build(POOL_ON)
    role = objects[("Role", "chat-epp")]
    assert role["metadata"]["namespace"] == "team-a"
    assert {(r["apiGroups"][0], r["resources"][0]): r["verbs"] for r in role["rules"]} == {
        ("", "pods"): ["get", "list", "watch"],
        ("inference.networking.k8s.io", "inferencepools"): ["get", "list", "watch"],
        ("inference.networking.x-k8s.io", "inferenceobjectives"): ["get", "list", "watch"]}
    binding = objects[("RoleBinding", "chat-epp")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "chat-epp", "namespace": "team-a"}]
    assert binding["roleRef"]["kind"] == "Role"
    assert not [k for k in objects if k[0].startswith("Cluster")]


def picker_flags(objects: dict) -> dict[str, str]:
    args = objects[("Deployment", "chat-epp")]["spec"]["template"]["spec"]["containers"][0]["args"]
    return {a: b for a, b in zip(args, args[1:]) if a.startswith("--") and not b.startswith("--")}


def test_the_pickers_config_has_the_four_scorers_with_their_weights_and_drops_a_zero():
    objects = build(POOL_ON)
    assert not [k for k in objects if k[0] == "ConfigMap"], "inline: the operator needs no right on ConfigMaps"
    config = yaml.safe_load(picker_flags(objects)["--config-text"])
    assert config["kind"] == "EndpointPickerConfig"
    weights = {p["pluginRef"]: p["weight"] for p in config["schedulingProfiles"][0]["plugins"]}
    assert weights == {"queue-scorer": 2, "kv-cache-utilization-scorer": 2, "prefix-cache-scorer": 3,
                       "lora-affinity-scorer": 1}
    off = build({"routing": {"inferencePool": {"enabled": True, "picker": {"scorers": {"prefixCache": 0}}}}})
    config = yaml.safe_load(picker_flags(off)["--config-text"])
    assert "prefix-cache-scorer" not in [p["type"] for p in config["plugins"]]


def test_the_picker_reads_vllms_metric_names_of_the_images_release():
    flags = picker_flags(build(POOL_ON))
    assert flags["--pool-name"] == "chat" and flags["--pool-namespace"] == "team-a"
    assert flags["--total-queued-requests-metric"] == "vllm:num_requests_waiting"
    assert flags["--kv-cache-usage-percentage-metric"] == "vllm:kv_cache_usage_perc"
    assert builders.picker_metrics("0.9.2")["kv-cache-usage-percentage-metric"] == "vllm:gpu_cache_usage_perc"
    assert builders.picker_metrics("0.33.0")["kv-cache-usage-percentage-metric"] == "vllm:kv_cache_usage_perc"


def test_the_pickers_flow_control_layer_stays_off_and_its_lora_scorer_reads_vllms_adapter_metric():
    """docs/scale-to-zero.md: v1.2.0's flow-control queue is never reached by a request that finds no pod (and its
    TTL cannot be configured), so the operator leaves its gate off, by config and by the deprecated variable;
    docs/routing.md: the lora-affinity-scorer reads vllm:lora_requests_info."""
    objects = build(POOL_ON)
    flags = picker_flags(objects)
    config = yaml.safe_load(flags["--config-text"])
    assert "featureGates" not in config and "flowControl" not in flags["--config-text"]
    [container] = objects[("Deployment", "chat-epp")]["spec"]["template"]["spec"]["containers"]
    assert "ENABLE_EXPERIMENTAL_FLOW_CONTROL_LAYER" not in {e["name"] for e in container.get("env", [])}
    assert flags["--lora-info-metric"] == "vllm:lora_requests_info"
    assert builders.picker_metrics("0.9.2")["lora-info-metric"] == "vllm:lora_requests_info"


def test_a_server_joining_another_pool_labels_its_pods_and_emits_no_pool_or_picker():
    objects = build({"routing": {"inferencePool": {"enabled": True, "poolName": "shared"}}}, name="chat-b")
    assert objects[("StatefulSet", "chat-b")]["spec"]["template"]["metadata"]["labels"][builders.POOL_LABEL] == \
        "shared"
    assert not [k for k in objects if k[0] in ("InferencePool", "Deployment", "Role", "ServiceAccount")]
    assert api.owns_pool("shared", api.RoutingSpec.model_validate({"inferencePool": {"enabled": True,
                                                                                      "poolName": "shared"}}))


def test_servers_of_two_models_share_one_route_path_each_matching_its_model_name():
    route = {"enabled": True, "gatewayName": "inference-gateway", "hostnames": ["llm.example.com"]}
    a = build({"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct", "servedName": "qwen"},
               "routing": {"inferencePool": {"enabled": True}, "httpRoute": route}}, name="qwen")
    b = build({"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct", "servedName": "other"},
               "routing": {"inferencePool": {"enabled": True}, "httpRoute": route}}, name="other")
    ra, rb = a[("HTTPRoute", "qwen")]["spec"], b[("HTTPRoute", "other")]["spec"]
    assert ra["parentRefs"] == rb["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                                     "name": "inference-gateway"}]
    assert ra["hostnames"] == rb["hostnames"] == ["llm.example.com"]
    [ma], [mb] = ra["rules"][0]["matches"], rb["rules"][0]["matches"]
    assert ma["path"] == mb["path"] == {"type": "PathPrefix", "value": "/"}
    assert ma["headers"] == [{"type": "Exact", "name": "X-Gateway-Model-Name", "value": "qwen"}]
    assert mb["headers"] == [{"type": "Exact", "name": "X-Gateway-Model-Name", "value": "other"}]
    assert ra["rules"][0]["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                                              "name": "qwen"}]


def test_a_route_names_only_a_gateway_of_its_own_namespace():
    schema = api.HTTPRouteSpec.model_json_schema(by_alias=True)
    assert "gatewayNamespace" not in schema["properties"] and "namespace" not in schema["properties"]
    route = build({"routing": {"inferencePool": {"enabled": True},
                               "httpRoute": {"enabled": True, "gatewayName": "gw"}}})[("HTTPRoute", "chat")]
    assert "namespace" not in route["spec"]["parentRefs"][0]
    with pytest.raises(ValueError):
        api.HTTPRouteSpec.model_validate({"enabled": True, "gatewayName": "other-ns/gw"})


def test_route_and_scale_to_zero_rules():
    assert any("inferencePool.enabled" in p for p in problems(
        {"routing": {"httpRoute": {"enabled": True, "gatewayName": "gw"}}}))
    assert any("gatewayName" in p for p in problems({**POOL_ON, "routing": {
        "inferencePool": {"enabled": True}, "httpRoute": {"enabled": True}}}))
    zero = {"enabled": True, "minReplicas": 0, "maxReplicas": 2}
    assert any("needs routing.inferencePool.enabled" in p for p in problems({"autoscaling": zero}))
    assert not problems({"autoscaling": zero, **POOL_ON})
    assert any("cannot scale to zero" in p for p in problems({"autoscaling": {**zero, "mode": "HPA"}, **POOL_ON}))
    assert not problems({"autoscaling": {**zero, "mode": "KEDA", "prometheusURL": "http://prom:9090"}})


def test_a_pool_of_a_server_across_nodes_is_refused():
    assert any("not with spec.nodes > 1" in p for p in problems({**POOL_ON, "nodes": 2}))


def test_the_crd_carries_the_same_rules():
    crd = yaml.safe_load((ROOT / "crds" / "vllmservers.vllm-operator.io.yaml").read_text())
    text = json.dumps(crd)
    assert "minReplicas 0 with mode Operator needs routing.inferencePool.enabled" in text
    assert "a HorizontalPodAutoscaler cannot scale to zero" in text
    assert "an HTTPRoute routes to the InferencePool" in text
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec["autoscaling"]["properties"]["minReplicas"]["minimum"] == 0


def test_keda_scales_to_zero_on_activation_and_wakes_on_the_pickers_count():
    objects = build({"autoscaling": {"enabled": True, "mode": "KEDA", "minReplicas": 0, "maxReplicas": 2,
                                     "prometheusURL": "http://prom:9090", "scaleToZero": {"idleSeconds": 600}},
                     **POOL_ON})
    so = objects[("ScaledObject", "chat")]["spec"]
    assert so["minReplicaCount"] == 0 and so["cooldownPeriod"] == 600
    assert all(t["metadata"]["activationThreshold"] == "0" for t in so["triggers"])
    queries = [t["metadata"]["query"] for t in so["triggers"]]
    assert any("vllm:num_requests_running" in q for q in queries)
    assert any('inference_objective_request_error_total{namespace="team-a",service="chat-epp",'
               'error_code="ServiceUnavailable"}' in q for q in queries)


# --------------------------------------------------------------------------- scale to zero: the policy
ZERO = api.AutoscalingSpec.model_validate({"enabled": True, "minReplicas": 0, "maxReplicas": 3,
                                           "scaleToZero": {"idleSeconds": 60}})


def idle_sample(pod: str = "chat-0") -> Sample:
    return Sample(pod, waiting=0.0, running=0.0)


def test_an_idle_server_goes_to_zero_only_after_the_whole_window():
    early = policy.decide_with_zero([idle_sample()], 1, 1, 0, ZERO, [], 100.0, policy.Idle(59.0))
    assert early.desired == 1 and "idle for 59s of the 60s" in early.reason
    late = policy.decide_with_zero([idle_sample()], 1, 1, 0, ZERO, [], 100.0, policy.Idle(60.0))
    assert (late.desired, late.code) == (0, policy.SCALE_TO_ZERO)


@pytest.mark.parametrize("sample", [Sample("chat-0", waiting=1.0), Sample("chat-0", running=1.0),
                                    Sample.failed("chat-0", "timed out")])
def test_a_running_or_waiting_request_or_missing_data_keeps_a_replica(sample):
    d = policy.decide_with_zero([sample], 1, 1, 0, ZERO, [], 100.0, policy.Idle(1000.0))
    assert d.desired >= 1


def test_starting_replicas_are_never_scaled_to_zero():
    assert policy.decide_with_zero([], 1, 0, 1, ZERO, [], 100.0, policy.Idle(1000.0)).desired == 1


def test_at_zero_it_stays_until_a_request_finds_no_pod_then_wakes_one():
    stay = policy.decide_with_zero([], 0, 0, 0, ZERO, [], 100.0, policy.Idle(0.0))
    assert (stay.desired, stay.code) == (0, policy.SCALED_TO_ZERO)
    wake = policy.decide_with_zero([], 0, 0, 0, ZERO, [], 100.0, policy.Idle(0.0, woken=True))
    assert (wake.desired, wake.code) == (1, policy.SCALE_FROM_ZERO)


def test_min_replicas_one_is_the_old_policy():
    one = ZERO.model_copy(update={"min_replicas": 1})
    a = policy.decide_with_zero([idle_sample()], 1, 1, 0, one, [], 100.0, policy.Idle(1e6))
    b = policy.decide([idle_sample()], 1, 1, 0, one, [], 100.0)
    assert a == b


def test_the_pickers_unserved_count_is_summed_over_models():
    text = ("# TYPE inference_objective_request_error_total counter\n"
            'inference_objective_request_error_total{error_code="ServiceUnavailable",model_name="tiny",'
            'target_model_name="tiny"} 3\n'
            'inference_objective_request_error_total{error_code="BadRequest",model_name="tiny",'
            'target_model_name="tiny"} 7\n'
            'inference_objective_request_error_total{error_code="ServiceUnavailable",model_name="b",'
            'target_model_name="b"} 2\n')
    assert picker_metrics.unserved(text) == 5.0
    assert picker_metrics.unserved("") == 0.0
    assert picker_metrics.picker_url("ns", "chat") == "http://chat-epp.ns.svc:9090/metrics"


# --------------------------------------------------------------------------- the reconciler (in memory)
def _world(spec_changes: dict[str, Any], served: set[str]):
    from e2e.testbed.memory_world import World

    world = World(spec_changes)
    world.kube.serves = lambda gv: gv in served  # type: ignore[attr-defined]
    return world


def test_without_the_extensions_crds_the_condition_says_what_to_install_and_nothing_of_it_is_applied():
    from e2e.testbed.memory_world import NS
    from vllm_operator.conditions import condition

    world = _world({"routing": {"inferencePool": {"enabled": True}}}, served=set())
    status = world.reconcile()["status"]
    routing = condition(status, "Routing")
    assert (routing["status"], routing["reason"]) == ("False", "RoutingAPINotInstalled")
    assert "install the Gateway API Inference Extension's CRDs" in routing["message"]
    assert not [k for k in world.kube.objects if k[0] in ("InferencePool", "Deployment", "Role")]
    assert ("StatefulSet", NS, "srv") in world.kube.objects, "the server itself is deployed"
    assert condition(status, "Degraded")["status"] == "False"
    assert ("RoutingAPINotInstalled", routing["message"]) in world.warning_events()
    world.kube.serves = lambda gv: True  # the CRDs installed: applied at the next pass (after the cache's TTL)
    world.reconciler._served.clear()
    status = world.reconcile()["status"]
    assert condition(status, "Routing")["reason"] == "PoolApplied"
    assert ("InferencePool", NS, "srv") in world.kube.objects and ("Deployment", NS, "srv-epp") in world.kube.objects
    world.change_spec(routing={"inferencePool": {"enabled": False}})  # switched off: pruned
    status = world.reconcile()["status"]
    assert condition(status, "Routing") is None
    assert not [k for k in world.kube.objects if k[0] in ("InferencePool", "Deployment", "Role", "RoleBinding")]


def test_a_server_joining_a_pool_without_its_owner_says_so():
    from vllm_operator.conditions import condition

    world = _world({"routing": {"inferencePool": {"enabled": True, "poolName": "shared"}}},
                   served={"inference.networking.k8s.io/v1"})
    routing = condition(world.reconcile()["status"], "Routing")
    assert (routing["status"], routing["reason"]) == ("False", "PoolOwnerMissing")


def test_the_pickers_pods_are_never_counted_as_the_servers():
    """The operator's pod index keys pods by their instance label among those it manages: the picker's pods carry
    neither the server's instance nor managed-by, so the autoscaler never scrapes one as a replica."""
    from vllm_operator.informers.cache import index_pod

    template = build(POOL_ON)[("Deployment", "chat-epp")]["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert labels.get("app.kubernetes.io/instance") != "chat" and "app.kubernetes.io/managed-by" not in labels
    pod = {"metadata": {"name": "chat-epp-1", "namespace": "team-a", "labels": labels}}
    assert ("team-a", "chat") not in (index_pod(pod) or {})
