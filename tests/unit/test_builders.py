"""Builder tests: spec + plan -> the Kubernetes objects the operator applies.

Every example in examples/ is planned and built; the objects are checked field by field,
and the whole `vllm-operator render examples/<x>.yaml` output is compared with a golden
file in tests/golden/<x>.yaml.

The golden files are regenerated only on purpose, after a change you meant to make to
the planner or the builders (review the diff before committing it):

    UPDATE_GOLDEN=1 python -m pytest tests/unit/test_builders.py
"""

from __future__ import annotations

import difflib
import io
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_operator import api, builders, catalog, cli, documents, pipeline, planner
from vllm_operator.planner import Plan

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
GOLDEN = Path(__file__).resolve().parents[1] / "golden"
OWNER = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "x", "uid": "0b7e-uid-1234"}}


def plan_example(path: Path) -> Plan:
    [doc] = documents.load_documents(path.read_text())
    assert not doc.errors, doc.errors
    s = doc.server
    return pipeline.plan_server(s.metadata.name, s.metadata.namespace, s.spec)


def plan_spec(name: str = "srv", **spec: Any) -> Plan:
    spec.setdefault("model", {"name": "meta-llama/Llama-3.2-3B-Instruct"})
    spec.setdefault("gpu", {"count": 1, "product": "NVIDIA-L4"})
    spec.setdefault("workloadProfile", {"maxContextTokens": 8192})
    plan = pipeline.plan_server(name, "ns1", api.VLLMServerSpec.model_validate(spec))
    assert plan.fits, plan.problems
    return plan


def by_kind(objects: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for obj in objects:
        out.setdefault(obj["kind"], []).append(obj)
    return out


def workload(objects: list[dict]) -> dict:
    [w] = [o for o in objects if o["kind"] in ("StatefulSet", "DaemonSet")]
    return w


def pod_spec(objects: list[dict]) -> dict:
    return workload(objects)["spec"]["template"]["spec"]


def container(objects: list[dict]) -> dict:
    [c] = pod_spec(objects)["containers"]
    return c


def render(path: Path, *extra: str) -> tuple[int, str, str]:
    args = cli.build_parser().parse_args(["render", str(path), *extra])
    out, err = io.StringIO(), io.StringIO()
    rc = args.func(args, out, err)
    return rc, out.getvalue(), err.getvalue()


def _workload_of(path: Path) -> str:
    return (yaml.safe_load(path.read_text())["spec"].get("workload") or "StatefulSet")


def _nodes_of(path: Path) -> int:
    return int(yaml.safe_load(path.read_text())["spec"].get("nodes") or 1)


#: Servers on one node each; those across nodes (a LeaderWorkerSet) are tests/unit/test_multinode.py's.
SINGLE_NODE_EXAMPLES = [p for p in EXAMPLES if _nodes_of(p) == 1]
STATEFULSET_EXAMPLES = [p for p in SINGLE_NODE_EXAMPLES if _workload_of(p) == "StatefulSet"]
DAEMONSET_EXAMPLES = [p for p in EXAMPLES if _workload_of(p) == "DaemonSet"]


def _built(path: Path) -> tuple[Plan, list[dict]]:
    plan = plan_example(path)
    assert plan.fits, plan.problems
    return plan, builders.build_all(plan)


@pytest.fixture(params=SINGLE_NODE_EXAMPLES, ids=[p.stem for p in SINGLE_NODE_EXAMPLES])
def example(request) -> tuple[Plan, list[dict]]:
    return _built(request.param)


@pytest.fixture(params=STATEFULSET_EXAMPLES, ids=[p.stem for p in STATEFULSET_EXAMPLES])
def sts_example(request) -> tuple[Plan, list[dict]]:
    return _built(request.param)


@pytest.fixture(params=DAEMONSET_EXAMPLES, ids=[p.stem for p in DAEMONSET_EXAMPLES])
def ds_example(request) -> tuple[Plan, list[dict]]:
    return _built(request.param)


def test_examples_exist():
    assert len(EXAMPLES) >= 5
    assert STATEFULSET_EXAMPLES and DAEMONSET_EXAMPLES


# --------------------------------------------------------------------------- workloads
def test_workload_kind_follows_spec(example):
    plan, objects = example
    kinds = by_kind(objects)
    if plan.spec.workload == "StatefulSet":
        assert "DaemonSet" not in kinds and len(kinds["StatefulSet"]) == 1
    else:
        assert "StatefulSet" not in kinds and len(kinds["DaemonSet"]) == 1


def test_statefulset(sts_example):
    plan, objects = sts_example
    [sts] = by_kind(objects)["StatefulSet"]
    spec = sts["spec"]
    headless = [s for s in by_kind(objects)["Service"] if s["spec"].get("clusterIP") == "None"]
    assert [s["metadata"]["name"] for s in headless] == [spec["serviceName"]]
    assert spec["podManagementPolicy"] == "Parallel"
    if plan.spec.autoscaling.enabled:
        assert "replicas" not in spec  # the autoscaler owns it; applying a number would fight it
    else:
        assert spec["replicas"] == plan.spec.replicas
    if plan.spec.cache is not None and plan.spec.cache.size:
        [claim] = spec["volumeClaimTemplates"]
        assert claim["metadata"]["name"] == "cache"
        assert claim["spec"]["resources"]["requests"]["storage"] == plan.spec.cache.size
        assert "cache" not in [v["name"] for v in spec["template"]["spec"]["volumes"]]
    else:
        assert "volumeClaimTemplates" not in spec
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()


def test_daemonset_has_no_replicas(ds_example):
    plan, objects = ds_example
    [ds] = by_kind(objects)["DaemonSet"]
    assert "replicas" not in ds["spec"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize(("replicas", "autoscaling"), [
    (3, {}),
    (0, {}),
    (3, {"enabled": True, "maxReplicas": 5}),
])
def test_statefulset_replicas(replicas, autoscaling):
    plan = plan_spec(replicas=replicas, autoscaling=autoscaling)
    sts = builders.build_statefulset(plan)
    if autoscaling.get("enabled"):
        assert "replicas" not in sts["spec"]
    else:
        assert sts["spec"]["replicas"] == replicas


@pytest.mark.parametrize(("cache", "claim_templates", "volume"), [
    (None, False, {"name": "cache", "emptyDir": {}}),
    ({"size": "100Gi", "storageClassName": "fast"}, True, None),
    ({"claimName": "models"}, False, {"name": "cache", "persistentVolumeClaim": {"claimName": "models"}}),
])
def test_cache_volume(cache, claim_templates, volume):
    plan = plan_spec(**({"cache": cache} if cache else {}))
    sts = builders.build_statefulset(plan)
    assert ("volumeClaimTemplates" in sts["spec"]) is claim_templates
    if claim_templates:
        assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "fast"
    volumes = [v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "cache"]
    assert volumes == ([volume] if volume else [])
    [c] = sts["spec"]["template"]["spec"]["containers"]
    assert {"name": "cache", "mountPath": builders.CACHE_MOUNT} in c["volumeMounts"]


@pytest.mark.parametrize(("cache", "policy"), [
    ({"size": "50Gi"}, {"whenDeleted": "Delete", "whenScaled": "Retain"}),  # the stated default
    ({"size": "50Gi", "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain"}},
     {"whenDeleted": "Retain", "whenScaled": "Retain"}),
    ({"size": "50Gi", "persistentVolumeClaimRetentionPolicy": {"whenScaled": "Delete"}},
     {"whenDeleted": "Delete", "whenScaled": "Delete"}),
    ({"size": "50Gi", "shared": True}, None),  # one claim, owned by the server: deleted with it
    ({"claimName": "models"}, None),  # an existing claim: never touched
])
def test_the_per_replica_cache_claims_retention_policy(cache, policy):
    """docs/storage.md: what happens to the cache claims when a server is deleted or scaled down."""
    sts = builders.build_statefulset(plan_spec(cache=cache))
    assert sts["spec"].get("persistentVolumeClaimRetentionPolicy") == policy
    assert sts["spec"]["template"]["spec"]["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"


# --------------------------------------------------------------------------- the pod
def test_pod_args_and_gpus(example):
    plan, objects = example
    c = container(objects)
    assert c["args"] == plan.args
    assert c["image"] == plan.spec.image
    assert c["resources"]["limits"]["nvidia.com/gpu"] == str(plan.spec.gpu.count)
    assert c["resources"]["requests"]["nvidia.com/gpu"] == str(plan.spec.gpu.count)
    assert [p["containerPort"] for p in c["ports"] if p["name"] == "http"] == [8000]


def test_pod_scheduling(example):
    plan, objects = example
    pod = pod_spec(objects)
    if plan.spec.gpu.product:
        assert pod["nodeSelector"]["nvidia.com/gpu.product"] == catalog.lookup_gpu(plan.spec.gpu.product).product
    else:
        assert "nvidia.com/gpu.product" not in pod.get("nodeSelector", {})
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


# --------------------------------------------------------------------------- which nodes, which GPU resource
def gpu_pod(**gpu: Any) -> dict:
    """The pod spec for Llama-3.2-3B on the GPU described by spec.gpu fields."""
    return builders.pod_template(plan_spec(gpu={"count": 1, **gpu}))["spec"]


def required_expressions(pod: dict) -> list[list[dict]]:
    terms = pod.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution",
                                                                  {}).get("nodeSelectorTerms", [])
    return [t.get("matchExpressions", []) for t in terms]


def gpu_resources(pod: dict) -> dict[str, dict[str, str]]:
    [c] = pod["containers"]
    return {side: {k: v for k, v in c["resources"][side].items() if k.startswith("nvidia.com/")}
            for side in ("requests", "limits")}


@pytest.mark.parametrize("written, label", [
    ("L4", "NVIDIA-L4"),
    ("l4", "NVIDIA-L4"),
    ("NVIDIA-L4", "NVIDIA-L4"),
    ("nvidia l4", "NVIDIA-L4"),
    ("nvidia-l4-shared", "NVIDIA-L4-SHARED"),  # GFD's label on a time-sliced or MPS-shared L4 node
    ("NVIDIA-A100-SXM4-80GB-SHARED", "NVIDIA-A100-SXM4-80GB-SHARED"),
    ("h100-sxm", "NVIDIA-H100-80GB-HBM3"),
    ("Tesla-T4", "Tesla-T4"),
])
def test_node_selector_carries_the_gfd_label(written, label):
    pod = gpu_pod(product=written)
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == label
    assert "affinity" not in pod
    assert gpu_resources(pod) == {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}


@pytest.mark.parametrize("family, labels", [
    ("A100-80GB", ["NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"]),
    ("H100", ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", "NVIDIA-H100-NVL"]),
    ("h100-shared", ["NVIDIA-H100-80GB-HBM3-SHARED", "NVIDIA-H100-PCIe-SHARED", "NVIDIA-H100-NVL-SHARED"]),
])
def test_a_family_is_node_affinity_in_every_member(family, labels):
    # A nodeSelector cannot say "or": the pod may land on any member, and was planned for the smallest.
    pod = gpu_pod(product=family)
    assert "nvidia.com/gpu.product" not in pod.get("nodeSelector", {})
    assert required_expressions(pod) == [[{"key": "nvidia.com/gpu.product", "operator": "In", "values": labels}]]


def test_family_affinity_is_added_to_every_term_of_the_specs_own_affinity():
    own = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}]},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    plan = plan_spec(gpu={"count": 1, "product": "A100-80GB"}, affinity=own)
    pod = builders.pod_template(plan)["spec"]
    gpu = {"key": "nvidia.com/gpu.product", "operator": "In",
           "values": ["NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"]}
    assert required_expressions(pod) == [[{"key": "zone", "operator": "In", "values": ["a"]}, gpu], [gpu]]
    assert pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == \
        own["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert pod["affinity"]["podAntiAffinity"] == own["podAntiAffinity"]
    assert plan.spec.affinity == own  # the spec is not changed in place


def test_the_specs_own_node_selector_wins():
    pod = builders.pod_template(plan_spec(gpu={"count": 1, "product": "H100"},
                                          nodeSelector={"nvidia.com/gpu.product": "NVIDIA-H100-NVL"}))["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-NVL"}
    assert "affinity" not in pod


def test_mig_slice_is_requested_instead_of_a_gpu():
    pod = gpu_pod(product="A100-80GB", migProfile="3g.40gb")
    assert gpu_resources(pod) == {"requests": {"nvidia.com/mig-3g.40gb": "1"},
                                  "limits": {"nvidia.com/mig-3g.40gb": "1"}}
    # The mixed strategy keeps the whole GPU's product label on the node.
    assert required_expressions(pod) == [[{"key": "nvidia.com/gpu.product", "operator": "In",
                                           "values": ["NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"]}]]


def test_mig_slice_without_product_selects_by_resource_only():
    pod = gpu_pod(migProfile="1g.10gb")
    assert gpu_resources(pod)["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
    assert "nodeSelector" not in pod and "affinity" not in pod


def test_mig_single_strategy_label_requests_nvidia_gpu():
    # GFD's single strategy renames the product (…-MIG-3g.40gb) and serves the slices as nvidia.com/gpu.
    pod = gpu_pod(product="NVIDIA-A100-SXM4-80GB-MIG-3g.40gb")
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"}
    assert gpu_resources(pod)["limits"] == {"nvidia.com/gpu": "1"}


@pytest.mark.parametrize("gpu, node_selector, expressions", [
    ({"product": "L4"}, {"cloud.google.com/gke-accelerator": "nvidia-l4"}, []),
    ({"product": "nvidia-l4"}, {"cloud.google.com/gke-accelerator": "nvidia-l4"}, []),
    ({"product": "A100-40GB"}, {"cloud.google.com/gke-accelerator": "nvidia-tesla-a100"}, []),
    ({"product": "nvidia-tesla-t4"}, {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}, []),
    ({"product": "H100"}, {}, [{"key": "cloud.google.com/gke-accelerator", "operator": "In",
                                "values": ["nvidia-h100-80gb", "nvidia-h100-mega-80gb"]}]),
    ({"product": "A100-80GB", "migProfile": "3g.40gb"},
     {"cloud.google.com/gke-accelerator": "nvidia-a100-80gb", "cloud.google.com/gke-gpu-partition-size": "3g.40gb"},
     []),
])
def test_gke_label_convention(gpu, node_selector, expressions):
    pod = gpu_pod(labelConvention="GKE", **gpu)
    assert pod.get("nodeSelector", {}) == node_selector
    assert required_expressions(pod) == ([expressions] if expressions else [])
    assert gpu_resources(pod)["limits"] == {"nvidia.com/gpu": "1"}  # GKE serves MIG slices as nvidia.com/gpu


@pytest.mark.parametrize("gpu, node_selector, resource", [
    ({"product": "L4"}, {"karpenter.k8s.aws/instance-gpu-name": "l4"}, "nvidia.com/gpu"),
    ({"product": "NVIDIA-A10G"}, {"karpenter.k8s.aws/instance-gpu-name": "a10g"}, "nvidia.com/gpu"),
    ({"product": "H100"}, {"karpenter.k8s.aws/instance-gpu-name": "h100"}, "nvidia.com/gpu"),
    # a100 is the p4d's 40 GB card and the p4de's 80 GB one: the per-GPU memory label picks the 80 GB
    ({"product": "A100-80GB"}, {"karpenter.k8s.aws/instance-gpu-name": "a100",
                                "karpenter.k8s.aws/instance-gpu-memory": "81920"}, "nvidia.com/gpu"),
    ({"product": "A100-80GB", "migProfile": "1g.10gb"}, {"karpenter.k8s.aws/instance-gpu-name": "a100",
                                                         "karpenter.k8s.aws/instance-gpu-memory": "81920"},
     "nvidia.com/mig-1g.10gb"),
])
def test_karpenter_label_convention(gpu, node_selector, resource):
    pod = gpu_pod(labelConvention="Karpenter", **gpu)
    assert pod["nodeSelector"] == node_selector
    assert gpu_resources(pod)["limits"] == {resource: "1"}


def test_karpenter_a100_family_plans_for_the_40gb_card():
    plan = plan_spec(gpu={"count": 1, "product": "A100", "labelConvention": "Karpenter"})
    assert builders.pod_template(plan)["spec"]["nodeSelector"] == {"karpenter.k8s.aws/instance-gpu-name": "a100"}
    assert plan.gpu_memory == catalog.lookup_gpu("NVIDIA-A100-SXM4-40GB").memory_bytes


@pytest.mark.parametrize("gpu, field, needle", [
    ({"product": "RTX-A6000", "labelConvention": "GKE"}, "spec.gpu.labelConvention", "NVIDIA-L4"),
    ({"product": "L4-SHARED", "labelConvention": "Karpenter"}, "spec.gpu.product", "-SHARED"),
    ({"product": "H100x"}, "spec.gpu.product", "did you mean H100"),
    ({"product": "L4-SHARED", "count": 2}, "spec.gpu.count", "shares of one GPU"),
    ({"product": "H100", "migProfile": "1g.10gb", "count": 2}, "spec.gpu.count", "MIG"),
    ({"product": "L4", "migProfile": "1g.10gb"}, "spec.gpu.migProfile", "no MIG profiles for NVIDIA-L4"),
])
def test_gpu_selections_that_cannot_schedule_are_refused(gpu, field, needle):
    spec = api.VLLMServerSpec.model_validate({"model": {"name": "meta-llama/Llama-3.2-3B-Instruct"}, "ipc": "Host",
                                              "gpu": {"count": 1, **gpu}})
    plan = pipeline.plan_server("srv", "ns1", spec)
    assert any(p.field == field and needle in p.message for p in plan.problems), plan.problems


def test_node_requirements_text():
    pod = gpu_pod(product="H100", labelConvention="GFD")
    assert builders.node_requirements_text(pod) == \
        "nvidia.com/gpu.product in (NVIDIA-H100-80GB-HBM3, NVIDIA-H100-PCIe, NVIDIA-H100-NVL)"
    assert builders.node_requirements_text(gpu_pod(product="L4")) == "nvidia.com/gpu.product=NVIDIA-L4"


def test_shared_memory(example):
    plan, objects = example
    pod, c = pod_spec(objects), container(objects)
    dshm = [v for v in pod["volumes"] if v["name"] == "dshm"]
    if plan.spec.ipc == "Host":
        assert pod["hostIPC"] is True
        assert not dshm
        assert "/dev/shm" not in [m["mountPath"] for m in c["volumeMounts"]]
    else:
        assert "hostIPC" not in pod
        [vol] = dshm
        assert vol["emptyDir"]["medium"] == "Memory"
        assert vol["emptyDir"]["sizeLimit"] == builders.quantity(plan.shm_bytes)
        assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]


@pytest.mark.parametrize("ipc", ["Host", "SharedMemory"])
def test_host_ipc_only_for_ipc_host(ipc):
    plan = plan_spec(ipc=ipc, gpu={"count": 2, "product": "NVIDIA-L4"})
    pod = builders.pod_template(plan)["spec"]
    assert pod.get("hostIPC", False) is (ipc == "Host")
    assert bool([v for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]) is (ipc != "Host")


def test_hf_token_from_secret_only(example):
    plan, objects = example
    env = container(objects)["env"]
    tokens = [e for e in env if e["name"] in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")]
    for e in tokens:
        assert "value" not in e
        assert e["valueFrom"]["secretKeyRef"]["name"]
    ref = plan.spec.hf_token_secret_ref
    if ref is None:
        assert not tokens
    else:
        assert tokens == [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]
    assert {"name": "HF_HOME", "value": builders.HF_HOME} in env


def test_probes_never_kill_a_loading_model(example):
    plan, objects = example
    c = container(objects)
    startup = c["startupProbe"]
    assert startup["failureThreshold"] * startup["periodSeconds"] >= plan.startup_seconds
    for name in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[name]["httpGet"] == {"path": "/health", "port": "http"}, name


def test_pod_hardening(example):
    plan, objects = example
    pod, c = pod_spec(objects), container(objects)
    assert pod["enableServiceLinks"] is False
    assert not any("hostPath" in v for v in pod["volumes"])
    for ctr in pod["containers"] + pod.get("initContainers", []):
        sc = ctr.get("securityContext", {})
        assert not sc.get("privileged", False)
        assert sc.get("allowPrivilegeEscalation") is False
    assert "hostNetwork" not in pod or plan.spec.workload == "DaemonSet"
    assert pod["terminationGracePeriodSeconds"] > plan.prestop_seconds + plan.drain_seconds
    assert c["resources"]["requests"]["memory"]


def test_a_crash_leaves_vllms_last_log_lines(example):
    """The reconciler quotes lastState.terminated.message (failures.py); the kubelet fills it from the log."""
    _, objects = example
    assert container(objects)["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_termination_lets_in_flight_requests_finish(example):
    """preStop sleep (leave the endpoints), then SIGTERM and vLLM's drain (--shutdown-timeout), then its
    teardown: the grace period covers all three, so the kubelet never SIGKILLs a drain."""
    plan, objects = example
    pod, c = pod_spec(objects), container(objects)
    [sleep] = [int(arg) for arg in c["lifecycle"]["preStop"]["exec"]["command"][1:]]
    drain = int(c["args"][c["args"].index("--shutdown-timeout") + 1])
    assert sleep == plan.prestop_seconds > 0 and drain == plan.drain_seconds >= 30
    assert pod["terminationGracePeriodSeconds"] == sleep + drain + planner.ASSUMPTIONS["shutdown_margin_seconds"][0]


@pytest.mark.parametrize(("engine", "profile", "drain", "grace"), [
    ({}, {}, 30, 50),  # an assumed p95 of 512 tokens at 20 tokens/s is 26 s: the 30 s floor
    ({}, {"p95OutputTokens": 2000}, 100, 120),
    ({}, {"p95OutputTokens": 7000}, 350, 370),
    ({}, {"p95OutputTokens": 20_000, "maxContextTokens": 32768}, 600, 620),  # the ceiling: a rollout never waits longer per pod
    ({"shutdownTimeoutSeconds": 0}, {"p95OutputTokens": 2000}, 0, 20),  # pinned: abort at once, as vLLM's default
    ({"shutdownTimeoutSeconds": 900}, {}, 900, 920),
])
def test_grace_period_follows_the_shutdown_timeout(engine, profile, drain, grace):
    plan = plan_spec(engine=engine, workloadProfile={"maxContextTokens": 8192, **profile})
    pod = builders.pod_template(plan)["spec"]
    assert plan.args[plan.args.index("--shutdown-timeout") + 1] == str(drain)
    assert pod["terminationGracePeriodSeconds"] == grace
    assert pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "10"]


# --------------------------------------------------------------------------- services, PDB
def test_client_service(example):
    plan, objects = example
    [svc] = [s for s in by_kind(objects)["Service"] if s["metadata"]["name"] == plan.name]
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    assert svc["spec"]["selector"] == builders.selector_labels(plan.name)
    assert svc["spec"].get("clusterIP") != "None"


@pytest.mark.parametrize(("workload", "policy"), [
    ("DaemonSet", "Local"),  # a client reaches the server on its own node
    ("StatefulSet", None),  # replicas anywhere: the cluster-wide default
])
def test_daemonset_service_keeps_traffic_on_the_node(workload, policy):
    plan = plan_spec(workload=workload)
    [svc] = [o for o in builders.build_all(plan) if o["kind"] == "Service" and o["metadata"]["name"] == plan.name]
    assert svc["spec"].get("internalTrafficPolicy") == policy


@pytest.mark.parametrize(("spec", "wanted"), [
    ({"replicas": 1}, False),
    ({"replicas": 2}, True),
    ({"replicas": 1, "autoscaling": {"enabled": True, "maxReplicas": 1}}, False),
    ({"replicas": 1, "autoscaling": {"enabled": True, "maxReplicas": 4}}, True),
    ({"replicas": 3, "workload": "DaemonSet"}, False),
])
def test_pdb(spec, wanted):
    plan = plan_spec(**spec)
    pdbs = [o for o in builders.build_all(plan) if o["kind"] == "PodDisruptionBudget"]
    if not wanted:
        assert pdbs == []
        return
    [pdb] = pdbs
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == builders.selector_labels(plan.name)


# --------------------------------------------------------------------------- metadata
def test_owner_references(example):
    plan, _ = example
    for obj in builders.build_all(plan, OWNER):
        [ref] = obj["metadata"]["ownerReferences"]
        assert ref == {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": "x", "uid": "0b7e-uid-1234",
                       "controller": True, "blockOwnerDeletion": True}
    for obj in builders.build_all(plan):
        assert "ownerReferences" not in obj["metadata"]


def test_labels(example):
    plan, objects = example
    for obj in objects:
        meta = obj["metadata"]
        assert meta["namespace"] == plan.namespace
        labels = meta["labels"]
        assert labels["app.kubernetes.io/name"] == "vllm"
        assert labels["app.kubernetes.io/instance"] == plan.name
        assert labels["app.kubernetes.io/managed-by"] == "vllm-operator"
        assert labels["app.kubernetes.io/component"]
    template_labels = workload(objects)["spec"]["template"]["metadata"]["labels"]
    assert template_labels.items() >= builders.selector_labels(plan.name).items()


def test_pod_labels_cannot_override_selector():
    plan = plan_spec(podLabels={"app.kubernetes.io/instance": "other", "team": "a"})
    labels = builders.pod_template(plan)["metadata"]["labels"]
    assert labels["app.kubernetes.io/instance"] == "srv" and labels["team"] == "a"


def test_build_all_refuses_a_plan_that_does_not_fit():
    plan = pipeline.plan_server("x", "default", api.VLLMServerSpec.model_validate(
        {"model": {"name": "meta-llama/Llama-3.1-70B-Instruct"}, "gpu": {"product": "NVIDIA-L4"}}))
    assert not plan.fits
    with pytest.raises(ValueError, match="does not fit"):
        builders.build_all(plan)


# --------------------------------------------------------------------------- golden files
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_render_matches_golden(path: Path):
    rc, out, err = render(path)
    assert rc == 0, err
    assert err == ""
    docs = list(yaml.safe_load_all(out))
    assert docs and all(isinstance(d, dict) and d.get("kind") for d in docs)
    golden = GOLDEN / f"{path.stem}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(out)
    assert golden.exists(), f"no golden file {golden}; create it with UPDATE_GOLDEN=1 python -m pytest {__file__}"
    expected = golden.read_text()
    if out != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), out.splitlines(True),
                                            f"golden/{golden.name}", "render output"))
        pytest.fail(f"render output differs from {golden.name} (if intended: UPDATE_GOLDEN=1 python -m pytest "
                    f"tests/unit/test_builders.py):\n{diff}")


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_render_is_what_the_builders_build(path: Path):
    """The CLI's render prints exactly the objects the operator would apply (no owner: it is offline)."""
    _, objects = _built(path)
    rc, out, _ = render(path)
    assert rc == 0
    assert list(yaml.safe_load_all(out)) == objects


def test_a_hub_model_downloads_in_an_init_container_and_a_path_or_engine_download_does_not():
    plan = plan_spec(model={"name": "meta-llama/Llama-3.2-3B-Instruct", "revision": "v2"},
                     hfTokenSecretRef={"name": "hf", "key": "token"},
                     engine={"env": [{"name": "HF_HUB_ENABLE_HF_TRANSFER", "value": "1"},
                                     {"name": "HTTPS_PROXY", "value": "http://proxy:3128"},
                                     {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]})
    pod = builders.pod_template(plan)["spec"]
    [init] = pod["initContainers"]
    main = pod["containers"][0]
    assert init["command"][3:] == ["meta-llama/Llama-3.2-3B-Instruct", "v2"] and init["image"] == main["image"]
    # the Hub's variables, the token and the proxy as vLLM has them; not the engine's own (engine.env may be large)
    assert [e["name"] for e in init["env"]] == ["HOME", "HF_HOME", "HF_TOKEN", "HF_HUB_ENABLE_HF_TRANSFER",
                                                "HTTPS_PROXY"]
    assert [e for e in main["env"] if e["name"] != "VLLM_LOGGING_LEVEL"] == init["env"]
    assert {m["name"] for m in init["volumeMounts"]} == {"cache", "home"}
    assert "nvidia.com/gpu" not in str(init["resources"]) and init["securityContext"] == main["securityContext"]
    assert [n for n in plan.notes if n.startswith("the weights download in the init container")]
    for spec in ({"model": {"name": "meta-llama/Llama-3.2-3B-Instruct", "download": "Engine"}},
                 {"model": {"name": "/models/llama-3b", "architecture": plan.model.architecture.model_dump(
                     by_alias=True, exclude_none=True)}}):
        other = plan_spec(**spec)
        assert "initContainers" not in builders.pod_template(other)["spec"], spec
        assert [n for n in other.notes if n.startswith("vLLM downloads or reads the weights itself")]


def test_a_shared_cache_is_one_read_write_many_claim_every_replica_mounts():
    plan = plan_spec(replicas=3, cache={"size": "200Gi", "shared": True, "storageClassName": "nfs"})
    objects = builders.build_all(plan, OWNER)
    kinds = [o["kind"] for o in objects]
    assert kinds.index("PersistentVolumeClaim") < kinds.index("StatefulSet"), "the claim before its pods"
    [claim] = [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    assert claim["metadata"]["name"] == "srv-cache" and claim["metadata"]["ownerReferences"][0]["controller"]
    assert claim["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "200Gi"}},
                             "storageClassName": "nfs"}
    [sts] = [o for o in objects if o["kind"] == "StatefulSet"]
    assert "volumeClaimTemplates" not in sts["spec"]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["cache"] == {"name": "cache", "persistentVolumeClaim": {"claimName": "srv-cache"}}
    # per replica (today's default) stays volumeClaimTemplates; a DaemonSet may share, not claim per pod
    per_replica = [o for o in builders.build_all(plan_spec(cache={"size": "200Gi"}), OWNER) if o["kind"] == "StatefulSet"]
    assert per_replica[0]["spec"]["volumeClaimTemplates"][0]["spec"]["accessModes"] == ["ReadWriteOnce"]
    ds = plan_spec(workload="DaemonSet", cache={"size": "200Gi", "shared": True})
    assert [o["kind"] for o in builders.build_all(ds, OWNER)].count("PersistentVolumeClaim") == 1
    bad = pipeline.plan_server("srv", "ns1", api.VLLMServerSpec.model_validate(
        {"model": {"name": "meta-llama/Llama-3.2-3B-Instruct"}, "gpu": {"count": 1, "product": "NVIDIA-L4"},
         "workload": "DaemonSet", "cache": {"size": "200Gi"}}))
    assert [p.field for p in bad.problems] == ["spec.cache.size"] and "cache.shared" in bad.problems[0].message


def test_an_object_the_api_server_could_not_store_is_a_problem_naming_what_makes_it_large():
    letters = "abcdefghijklmnopqrstuvwxyz" * 630
    fits = plan_spec(engine={"env": [{"name": f"L_{i}", "value": letters} for i in range(64)]})  # 1 MB: stored
    assert builders.oversized(builders.build_all(fits, OWNER)) == []
    big = plan_spec(engine={"env": [{"name": f"L_{i}", "value": letters} for i in range(90)]})
    [line] = builders.oversized(builders.build_all(big, OWNER))
    assert line.startswith("spec: the StatefulSet srv would be 1,4") and "spec.engine.env" in line


def test_escape_hatches_reach_the_pod():
    spread = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
              "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "srv"}}}
    plan = plan_spec(runtimeClassName="nvidia", topologySpreadConstraints=[spread], startupSeconds=3600)
    pod = builders.pod_template(plan)["spec"]
    assert pod["runtimeClassName"] == "nvidia" and pod["topologySpreadConstraints"] == [spread]
    probe = pod["containers"][0]["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] == 3600
    assert [n for n in plan.notes if n.startswith("startup probe budget 3600 s from spec.startupSeconds")]
    with pytest.raises(Exception):
        plan_spec(startupSeconds=10)  # below the CRD's minimum: no probe that kills a loading model at once


def test_the_exposing_docs_name_the_service_the_operator_builds():
    """docs/exposing.md: the client Service is the server's name, port 8000 named http, and VLLM_API_KEY from a
    Secret reaches the vLLM container (a plain-text key and --api-key are refused)."""
    import re

    text = (Path(__file__).resolve().parents[2] / "docs" / "exposing.md").read_text()
    docs = [d for block in re.findall(r"```yaml\n(.*?)```", text, re.S) for d in yaml.safe_load_all(block) if d]
    env = next(d["spec"]["engine"]["env"] for d in docs if "engine" in d.get("spec", {}))
    plan = plan_spec(name="llama-8b", engine={"env": env})
    [svc] = [o for o in builders.build_all(plan) if o["kind"] == "Service" and o["spec"].get("clusterIP") != "None"]
    assert svc["metadata"]["name"] == "llama-8b"
    assert svc["spec"]["ports"][0] | {"protocol": "TCP"} == {"name": "http", "port": 8000, "targetPort": "http",
                                                             "protocol": "TCP"}
    ingress = next(d for d in docs if d["kind"] == "Ingress")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "llama-8b", "port": {"name": "http"}}
    route = next(d for d in docs if d["kind"] == "HTTPRoute")
    assert route["spec"]["rules"][0]["backendRefs"] == [{"name": "llama-8b", "port": 8000}]
    vllm = next(c for c in builders.build_statefulset(plan)["spec"]["template"]["spec"]["containers"]
                if c["name"] == "vllm")
    assert {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "llama-8b-api-key", "key": "key"}}} \
        in vllm["env"]
    for refused in ({"engine": {"env": [{"name": "VLLM_API_KEY", "value": "sk-0123456789abcdef"}]}},
                    {"engine": {"extraArgs": ["--api-key", "sk-0123456789abcdef"]}}):
        spec = {"model": {"name": "meta-llama/Llama-3.2-3B-Instruct"}, "gpu": {"count": 1, "product": "NVIDIA-L4"},
                **refused}
        assert not pipeline.plan_server("srv", "ns1", api.VLLMServerSpec.model_validate(spec)).fits, refused
