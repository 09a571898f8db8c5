"""autoscaling.mode HPA and KEDA: the HorizontalPodAutoscaler and ScaledObject builders, and what
the planner refuses (autoscaling on a DaemonSet, KEDA without a Prometheus)."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_operator import api, builders, pipeline

OWNER = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "srv", "uid": "uid-1"}}


def plan_for(autoscaling: dict[str, Any], default_prometheus_url=None, **spec: Any):
    spec.setdefault("model", {"name": "meta-llama/Llama-3.2-3B-Instruct"})
    spec.setdefault("gpu", {"count": 1, "product": "NVIDIA-L4"})
    spec.setdefault("workloadProfile", {"maxContextTokens": 8192})
    spec["autoscaling"] = autoscaling
    return pipeline.plan_server("srv", "team-a", api.VLLMServerSpec.model_validate(spec),
                                default_prometheus_url=default_prometheus_url)


def kinds(objects):
    return [o["kind"] for o in objects]


HPA = {"enabled": True, "mode": "HPA", "minReplicas": 2, "maxReplicas": 6, "targetWaitingPerReplica": 0.5,
       "scaleUpStabilizationSeconds": 10, "scaleDownStabilizationSeconds": 300}


def test_hpa_shape():
    plan = plan_for(HPA)
    assert plan.fits, plan.problems
    hpa = builders.build_hpa(plan, OWNER)
    assert hpa["apiVersion"] == "autoscaling/v2" and hpa["kind"] == "HorizontalPodAutoscaler"
    assert hpa["metadata"]["name"] == "srv" and hpa["metadata"]["namespace"] == "team-a"
    assert hpa["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert hpa["metadata"]["labels"]["app.kubernetes.io/component"] == "autoscaler"
    assert hpa["spec"] == {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "srv"},
        "minReplicas": 2,
        "maxReplicas": 6,
        "metrics": [{"type": "Pods", "pods": {"metric": {"name": "vllm:num_requests_waiting"},
                                              "target": {"type": "AverageValue", "averageValue": "500m"}}}],
        "behavior": {
            "scaleUp": {"stabilizationWindowSeconds": 10, "selectPolicy": "Max",
                        "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15},
                                     {"type": "Percent", "value": 100, "periodSeconds": 15}]},
            "scaleDown": {"stabilizationWindowSeconds": 300,
                          "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]},
        },
    }


def test_scaled_object_shape():
    auto = dict(HPA, mode="KEDA", targetWaitingPerReplica=4, intervalSeconds=5)
    plan = plan_for(auto, default_prometheus_url="http://prometheus.monitoring:9090")
    assert plan.fits, plan.problems
    so = builders.build_scaled_object(plan, OWNER)
    assert (so["apiVersion"], so["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "srv"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["pollingInterval"]) == (2, 6, 5)
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == builders.scaling_behavior(plan.spec)
    assert spec["triggers"] == [{"type": "prometheus", "metadata": {
        "serverAddress": "http://prometheus.monitoring:9090",
        "query": 'sum(vllm:num_requests_waiting{namespace="team-a",pod=~"srv-[0-9]+"})',
        "threshold": "4",
        "metricType": "AverageValue",
    }}]
    # the spec's own URL wins over the operator's default
    plan = plan_for(dict(auto, prometheusURL="http://p:9090"), default_prometheus_url="http://other:9090")
    assert builders.build_scaled_object(plan)["spec"]["triggers"][0]["metadata"]["serverAddress"] == "http://p:9090"


@pytest.mark.parametrize(("autoscaling", "extra"), [
    ({"enabled": False, "mode": "HPA", "maxReplicas": 3}, []),
    ({"enabled": True, "maxReplicas": 3}, []),
    ({"enabled": True, "mode": "HPA", "maxReplicas": 3}, ["HorizontalPodAutoscaler"]),
    ({"enabled": True, "mode": "KEDA", "maxReplicas": 3, "prometheusURL": "http://p:9090"}, ["ScaledObject"]),
])
def test_build_all_adds_the_scaler_the_mode_asks_for(autoscaling, extra):
    plan = plan_for(autoscaling)
    objects = builders.build_all(plan, OWNER)
    assert kinds(objects)[:3] == ["Service", "Service", "StatefulSet"]
    assert [k for k in kinds(objects) if k in ("HorizontalPodAutoscaler", "ScaledObject")] == extra
    if extra == ["HorizontalPodAutoscaler"]:
        assert objects[-1]["apiVersion"] == "autoscaling/v2"


def test_keda_needs_a_prometheus():
    plan = plan_for({"enabled": True, "mode": "KEDA", "maxReplicas": 3})
    assert [str(p) for p in plan.problems] == [
        "spec.autoscaling.prometheusURL: mode: KEDA needs prometheusURL (or the operator's --prometheus-url "
        "default): the ScaledObject's Prometheus trigger queries it"]
    assert plan_for({"enabled": True, "mode": "KEDA", "maxReplicas": 3}, default_prometheus_url="http://p").fits
    assert plan_for({"enabled": True, "mode": "HPA", "maxReplicas": 3}).fits, "an HPA needs no URL"


def test_autoscaling_on_a_daemonset_is_still_refused():
    plan = plan_for({"enabled": True, "mode": "HPA", "maxReplicas": 3}, workload="DaemonSet")
    assert any(p.field == "spec.autoscaling.enabled" and "needs workload: StatefulSet" in p.message
               for p in plan.problems)


@pytest.mark.parametrize(("value", "quantity"), [(2.0, "2"), (0.5, "500m"), (1.25, "1250m"), (10000.0, "10000")])
def test_scaler_quantity(value, quantity):
    assert builders.scaler_quantity(value) == quantity
    assert float(api.parse_quantity(quantity)) == value
