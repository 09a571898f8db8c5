"""Servers across nodes (spec.nodes > 1): the plan's layout (tensor parallelism inside a node, pipeline stages
across nodes, or tensor parallelism across them when pinned), the memory of a stage, the refusals with their
reasons, and the LeaderWorkerSet and the objects around it (docs/multi-node.md)."""

from __future__ import annotations

import io
import math
from typing import Any

import pytest
import yaml

from vllm_operator import api, builders, cli, pipeline, validation
from vllm_operator.server_status import pod_templates, workload_progress
from vllm_operator.planner import Plan
from vllm_operator.planner.stages import stage_sizes

GiB = 2**30
L405 = "meta-llama/Llama-3.1-405B-Instruct"
L70 = "meta-llama/Llama-3.1-70B-Instruct"


def plan_of(model: str, count: int, product: str, nodes: int = 1, **spec: Any) -> Plan:
    body = {"model": {"name": model}, "gpu": {"count": count, "product": product}, "nodes": nodes,
            "workloadProfile": {"maxContextTokens": 8192}, **spec}
    return pipeline.plan_server("srv", "ns1", api.VLLMServerSpec.model_validate(body))


def arg(plan: Plan, flag: str) -> str:
    return plan.args[plan.args.index(flag) + 1]


def problems(plan: Plan) -> str:
    return "; ".join(map(str, plan.problems))


# --------------------------------------------------------------------------- the layout
def test_vllms_layer_split():
    assert stage_sizes(126, 2) == [63, 63]
    assert stage_sizes(80, 3) == [27, 27, 26]  # the remainder before the last stage, which holds the LM head
    assert stage_sizes(5, 4) == [1, 1, 2, 1]


def test_405b_in_bf16_on_two_nodes_of_8_h100():
    one = plan_of(L405, 8, "H100", workloadProfile={"maxContextTokens": 32768})
    assert not one.fits and "nodes: 2" in problems(one), "one node refuses it and says how many nodes would do"
    two = plan_of(L405, 8, "H100", nodes=2, workloadProfile={"maxContextTokens": 32768})
    assert two.fits, two.problems
    assert (two.tensor_parallel_size, two.pipeline_parallel_size, two.stage_layers) == (8, 2, 63)
    assert arg(two, "--tensor-parallel-size") == "8" and arg(two, "--pipeline-parallel-size") == "2"
    assert arg(two, "--nnodes") == "2" and arg(two, "--node-rank") == "$(LWS_WORKER_INDEX)"
    assert arg(two, "--master-addr") == "$(LWS_LEADER_ADDRESS)" and arg(two, "--master-port") == "29500"
    # Each GPU holds half the layers' weights plus one vocabulary matrix, and the KV of its stage's 63 layers.
    assert one.memory is not None and two.memory is not None
    assert 0.49 < two.memory.weights / one.memory.weights < 0.51
    assert two.kv_bytes_per_token == 63 * 2 * 1 * 128 * 2  # 8 KV heads / TP 8, head_dim 128, bf16
    assert two.max_model_len == 32768 and two.kv_cache_tokens > 32768
    assert two.estimates()["nodes"] == 2 and two.estimates()["pipelineParallelSize"] == 2
    # A pod loads its stage's share: host memory and the startup probe follow it, not the whole model.
    assert two.stage_weight_bytes < 0.51 * two.weight_bytes_total
    assert two.host_memory_bytes == math.ceil((two.stage_weight_bytes / 2 + 4 * GiB) / GiB) * GiB


def test_70b_in_bf16_on_two_nodes_of_2_l40s():
    one = plan_of(L70, 2, "L40S")
    assert not one.fits and "nodes: 2" in problems(one)
    two = plan_of(L70, 2, "L40S", nodes=2)
    assert two.fits, two.problems
    assert (two.tensor_parallel_size, two.pipeline_parallel_size, two.stage_layers) == (2, 2, 40)
    assert two.max_model_len == 8192


def test_the_capacity_line_speaks_of_the_group():
    args = cli.build_parser().parse_args(["plan", "examples/llama-70b-two-nodes.yaml"])
    out, err = io.StringIO(), io.StringIO()
    assert args.func(args, out, err) == 0, err.getvalue()
    text = out.getvalue()
    assert "on 2 nodes of 2 x NVIDIA-L40S" in text
    assert "group: 2 nodes x 2 GPU(s) = 4 GPUs (tensor parallel 2 x pipeline 2)" in text
    assert "capacity per group:" in text
    assert "the model's 80 layers split 40 + 40" in text


def test_tensor_parallelism_across_nodes_only_when_pinned_and_with_a_warning():
    plan = plan_of(L405, 8, "H100", nodes=2, crossNodeParallelism="Tensor")
    assert plan.fits, plan.problems
    assert plan.tensor_parallel_size == 16 and "--pipeline-parallel-size" not in plan.args
    assert any(n.startswith("warning: crossNodeParallelism Tensor") and "InfiniBand" in n for n in plan.notes)
    odd = plan_of(L70, 3, "H100", nodes=2, crossNodeParallelism="Tensor")
    assert [p.field for p in odd.problems] == ["spec.nodes"]
    assert "tensor parallelism over 6 GPUs must divide the model's 64 attention heads" in problems(odd)


def test_refused_when_the_largest_allowed_layout_cannot_fit():
    plan = plan_of(L405, 2, "L40S", nodes=2)
    assert not plan.fits
    text = problems(plan)
    assert "does not fit (2 nodes: the largest stage's 63 layers on each GPU)" in text
    assert "nodes: " in text  # the fewest nodes of 2 x L40S that would hold it


def test_more_stages_than_layers_are_refused():
    plan = plan_of("meta-llama/Llama-3.2-1B-Instruct", 1, "L4", nodes=17)
    assert [p.field for p in plan.problems] == ["spec.nodes"]
    assert "17 pipeline stages need at least one of the model's 16 layers each" in problems(plan)


@pytest.mark.parametrize("spec, field", [
    ({"workload": "DaemonSet"}, "spec.nodes"),
    ({"gpu": {"count": 1, "migProfile": "3g.40gb"}}, "spec.nodes"),
    ({"cache": {"size": "100Gi"}}, "spec.cache.size"),
])
def test_what_a_group_cannot_be(spec, field):
    body = {"model": {"name": L70}, "nodes": 2, **spec}
    found = validation.node_problems(api.VLLMServerSpec.model_validate(body))
    assert [p.field for p in found] == [field]


@pytest.mark.parametrize("flag", ["--pipeline-parallel-size", "--nnodes", "--node-rank", "--master-addr",
                                  "--master-port", "--headless"])
def test_extra_args_cannot_set_the_groups_flags(flag):
    [found] = validation.check_extra_args([flag, "1"] if flag != "--headless" else [flag])
    assert f"{flag} is derived by the operator" in found.message


# --------------------------------------------------------------------------- the objects
def built(**spec: Any) -> tuple[Plan, dict[str, list[dict]]]:
    plan = plan_of(L70, 2, "L40S", nodes=2, **spec)
    assert plan.fits, plan.problems
    out: dict[str, list[dict]] = {}
    for obj in builders.build_all(plan):
        out.setdefault(obj["kind"], []).append(obj)
    return plan, out


def test_a_group_is_a_leaderworkerset_with_a_leader_and_headless_workers():
    plan, kinds = built()
    assert "StatefulSet" not in kinds and "DaemonSet" not in kinds
    [lws] = kinds["LeaderWorkerSet"]
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1" and lws["spec"]["replicas"] == 1
    assert lws["spec"]["startupPolicy"] == "LeaderCreated"
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 2 and group["restartPolicy"] == "RecreateGroupOnPodRestart"
    [leader] = group["leaderTemplate"]["spec"]["containers"]
    [worker] = group["workerTemplate"]["spec"]["containers"]
    assert leader["args"] == plan.args and worker["args"] == plan.args + ["--headless"]
    assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(leader)
    assert not {"startupProbe", "readinessProbe", "livenessProbe", "ports"} & set(worker)
    assert {p["containerPort"] for p in leader["ports"]} == {8000, 29500}
    for container in (leader, worker):
        assert container["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert group["leaderTemplate"]["metadata"]["labels"][builders.ROLE_LABEL] == "leader"
    assert group["workerTemplate"]["metadata"]["labels"][builders.ROLE_LABEL] == "worker"
    assert [t["metadata"]["labels"][builders.ROLE_LABEL] for t in pod_templates(lws)] == ["leader", "worker"]
    dshm = next(v for v in group["workerTemplate"]["spec"]["volumes"] if v["name"] == "dshm")
    assert dshm["emptyDir"]["sizeLimit"] == "8Gi"  # sized for the node's 2 GPU workers
    # Both roles drain alike: the same grace period.
    assert (group["leaderTemplate"]["spec"]["terminationGracePeriodSeconds"]
            == group["workerTemplate"]["spec"]["terminationGracePeriodSeconds"])


def test_engine_env_reaches_every_pod_of_the_group():
    _, kinds = built(engine={"env": [{"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}]})
    group = kinds["LeaderWorkerSet"][0]["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        [container] = group[role]["spec"]["containers"]
        assert {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"} in container["env"], role


def test_the_client_service_selects_the_leaders_and_lws_makes_the_headless_one():
    _, kinds = built()
    [service] = kinds["Service"]
    assert service["spec"]["selector"][builders.ROLE_LABEL] == "leader"
    assert "PodDisruptionBudget" not in kinds
    _, kinds = built(replicas=2)
    [pdb] = kinds["PodDisruptionBudget"]
    assert pdb["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("mode, kind", [("HPA", "HorizontalPodAutoscaler"), ("KEDA", "ScaledObject")])
def test_external_scalers_scale_groups(mode, kind):
    a = {"enabled": True, "mode": mode, "maxReplicas": 3, "prometheusURL": "http://prometheus.monitoring:9090"}
    _, kinds = built(autoscaling=a)
    [lws] = kinds["LeaderWorkerSet"]
    assert "replicas" not in lws["spec"], "the scaler owns the group count"
    [scaler] = kinds[kind]
    assert scaler["spec"]["scaleTargetRef"] == {"apiVersion": "leaderworkerset.x-k8s.io/v1",
                                                "kind": "LeaderWorkerSet", "name": "srv"}


def test_progress_counts_groups():
    lws = {"kind": "LeaderWorkerSet", "metadata": {"generation": 2}, "spec": {"replicas": 2},
           "status": {"observedGeneration": 2, "replicas": 2, "readyReplicas": 1, "updatedReplicas": 2}}
    assert workload_progress(lws) == {"desired": 2, "ready": 1, "updated": 2, "settled": False}
    lws["status"]["readyReplicas"] = 2
    assert workload_progress(lws)["settled"]


# --------------------------------------------------------------------------- maxNodes: the planner chooses
L8 = "meta-llama/Llama-3.1-8B-Instruct"


def chosen(model: str, count: int, product: str, max_nodes: int, **spec: Any) -> Plan:
    return plan_of(model, count, product, maxNodes=max_nodes, **spec)


def test_max_nodes_chooses_two_nodes_of_8_h100_for_405b_and_says_why():
    plan = chosen(L405, 8, "H100", 4, workloadProfile={"maxContextTokens": 32768})
    assert plan.fits, plan.problems
    fixed = plan_of(L405, 8, "H100", nodes=2, workloadProfile={"maxContextTokens": 32768})
    assert (plan.nodes, plan.spec.nodes, plan.max_nodes) == (2, 2, 4)
    assert plan.args == fixed.args, "the chosen layout is planned exactly as nodes: 2 is"
    assert plan.layout.startswith("layout: 2 nodes x 8 GPU(s), one LeaderWorkerSet group per replica, chosen by "
                                  "maxNodes 4: the fewest that fit; 1 node(s): spec.gpu: the model does not fit")
    assert "what would fit" not in plan.layout
    assert plan.notes[0] == plan.layout and plan.status()["notes"][-len(plan.notes)] == plan.layout
    assert plan.estimates()["nodes"] == 2
    [lws] = [o for o in builders.build_all(plan) if o["kind"] == "LeaderWorkerSet"]
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2


def test_max_nodes_chooses_two_nodes_of_2_l40s_for_70b():
    plan = chosen(L70, 2, "L40S", 8)
    assert plan.fits and plan.nodes == 2 and arg(plan, "--pipeline-parallel-size") == "2"


def test_max_nodes_keeps_a_model_that_fits_one_node_on_one_node():
    plan = chosen(L8, 1, "L4", 4)
    assert plan.fits, plan.problems
    assert plan.nodes == 1 and "--nnodes" not in plan.args
    assert plan.layout == ("layout: 1 node x 1 GPU(s), a StatefulSet pod per replica, chosen by maxNodes 4: the "
                           "fewest that fit")
    assert plan.estimates()["nodes"] == 1, "status says the layout even when it is one node"
    assert {o["kind"] for o in builders.build_all(plan)} >= {"StatefulSet", "Service"}
    assert "LeaderWorkerSet" not in {o["kind"] for o in builders.build_all(plan)}


def test_max_nodes_is_refused_with_the_reason_when_its_largest_layout_cannot_fit():
    plan = chosen(L405, 8, "L40S", 2)  # 756 GiB of weights on 2 x 8 x 44.5 GiB: three nodes would do
    assert not plan.fits and plan.nodes == 2
    first = plan.problems[0]
    assert (first.field, first.reason) == ("spec.maxNodes", api.REASON_DOES_NOT_FIT)
    assert first.message.startswith("no layout of 1 to 2 node(s) of 8 GPU(s) fits: the largest maxNodes allows, "
                                    "2 node(s), is refused as below (spec.gpu: the model does not fit (2 nodes")
    gpu = next(p for p in plan.problems if p.field == "spec.gpu")
    assert "more nodes (maxNodes: 3:" in gpu.message, "the hint names the field the user sets"
    assert not plan.layout and plan.problem_kinds() == [api.REASON_DOES_NOT_FIT]


def test_max_nodes_stops_at_the_models_layers_and_skips_layouts_that_cannot_split_it():
    small = chosen("meta-llama/Llama-3.2-1B-Instruct", 1, "L4", 64)
    assert small.fits and small.nodes == 1
    # Tensor parallelism across nodes of 2 GPUs: 405B fits none of 1, 2 or 4 nodes (TP 2, 4, 8), and TP 6, 10, 12
    # and 14 split none of its 128 heads; those counts are passed over, never a refusal of the planner's own choice.
    odd = chosen(L405, 2, "H100", 8, crossNodeParallelism="Tensor")
    assert odd.fits and odd.nodes == 8 and odd.tensor_parallel_size == 16, odd.problems
    assert "7 node(s): spec.nodes: tensor parallelism over 14 GPUs must divide" in odd.layout


@pytest.mark.parametrize("spec, field, words", [
    ({"nodes": 2}, "spec.maxNodes", "exclude each other"),
    ({"workload": "DaemonSet"}, "spec.maxNodes", "LeaderWorkerSet of groups"),
    ({"gpu": {"count": 1, "migProfile": "3g.40gb"}}, "spec.maxNodes", "MIG slices"),
    ({"cache": {"size": "100Gi"}}, "spec.cache.size", "no claim per pod"),
])
def test_what_max_nodes_cannot_be_combined_with(spec, field, words):
    body = {"model": {"name": L70}, "maxNodes": 4, **spec}
    found = validation.node_problems(api.VLLMServerSpec.model_validate(body))
    assert [p.field for p in found][:1] == [field] and words in found[0].message
    plan = pipeline.plan_server("srv", "ns1", api.VLLMServerSpec.model_validate(body))
    assert field in {p.field for p in plan.problems} and not plan.layout, "refused, no layout chosen"


def test_plan_and_render_say_the_layout_chosen(tmp_path):
    doc = {"apiVersion": "vllm-operator.io/v1alpha1", "kind": "VLLMServer", "metadata": {"name": "big"},
           "spec": {"model": {"name": L70}, "gpu": {"count": 2, "product": "L40S"}, "maxNodes": 4,
                    "cache": {"claimName": "models"}, "workloadProfile": {"maxContextTokens": 8192}}}
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(doc))
    for command in ("plan", "render"):
        args = cli.build_parser().parse_args([command, "--offline", str(path)])
        out, err = io.StringIO(), io.StringIO()
        assert args.func(args, out, err) == 0, err.getvalue()
        said = out.getvalue() + err.getvalue()
        assert "layout: 2 nodes x 2 GPU(s), one LeaderWorkerSet group per replica, chosen by maxNodes 4" in said
    assert "kind: LeaderWorkerSet" in out.getvalue() and "size: 2" in out.getvalue()


def test_the_operators_autoscaler_finds_the_chosen_layouts_workload():
    from vllm_operator.autoscaler.actuator import planned_nodes

    spec = api.VLLMServerSpec.model_validate({"model": {"name": L70}, "maxNodes": 4})
    assert planned_nodes({"status": {"plan": {"estimates": {"nodes": 2}}}}, spec) == 2
    assert planned_nodes({}, spec) == 1, "no plan written yet: not a group"
    assert planned_nodes({}, spec.model_copy(update={"max_nodes": None, "nodes": 3})) == 3


def test_max_nodes_chooses_nothing_for_a_model_it_cannot_size():
    plan = chosen("acme/unknown-7b", 1, "L4", 4)
    assert plan.problem_kinds() == [api.REASON_MODEL_UNKNOWN] and not plan.layout
    assert not any(n.startswith("layout:") for n in plan.notes)


def test_without_leaderworkerset_the_message_names_the_chosen_layout():
    from vllm_operator.controller.reconcile import lws_missing_message

    plan = chosen(L70, 2, "L40S", 4)
    said = lws_missing_message(plan.spec, plan.max_nodes)
    assert said.startswith("spec.maxNodes 4 chose 2 nodes (the fewest that fit): that runs each replica as a group "
                           "of 2 pods on a LeaderWorkerSet") and "set nodes: 1" not in said
    assert "or set nodes: 1" in lws_missing_message(plan_of(L70, 2, "L40S", nodes=2).spec)
