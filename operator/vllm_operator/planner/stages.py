"""The plan's pipeline stages, for a server across nodes (spec.nodes > 1): how vLLM splits the layers, the
largest stage's weights and architecture, step 2b (`plan_stages`: --pipeline-parallel-size and the multi-node
flags), and the fewest nodes whose stages would fit."""

from __future__ import annotations

import math
from typing import Optional, cast

from .. import api
from ..catalog import Architecture
from .memory import rotary_cache_bytes
from .plan_types import COORDINATION_PORT, LEADER_ADDRESS_ENV, WORKER_INDEX_ENV, FlagDecision, Plan, Sizing


def stage_sizes(layers: int, stages: int) -> list[int]:
    """How vLLM splits `layers` over `stages` pipeline stages (distributed/utils.py get_pp_indices): evenly, the
    remainder one layer each to the stages before the last (which holds the LM head)."""
    sizes = [layers // stages] * stages
    for i in range(2, layers % stages + 2):
        sizes[-i] += 1
    return sizes


def stage_architecture(arch: Architecture, layers: int) -> Architecture:
    """The model as one pipeline stage of `layers` layers holds it: the KV cache and its layout per GPU follow the
    stage's layers (sliding-window layers in the same proportion)."""
    sliding = arch.sliding_window_layers
    if sliding is not None:
        sliding = min(layers, math.ceil(sliding * layers / arch.num_layers))
    return cast(Architecture, cast(api.ModelArchitecture, arch).model_copy(
        update={"num_layers": layers, "sliding_window_layers": sliding}))


def stage_weight_bytes(total: int, arch: Architecture, stages: int, layers: int, elem: int) -> int:
    """The weights of the largest pipeline stage (of `layers` layers): its share of the layers' weights, plus one
    vocabulary x hidden matrix (the embedding on the first stage, the LM head on the last; a tied head is loaded
    again on the last stage). All of them with one stage."""
    if stages == 1:
        return total
    matrix = arch.vocab_size * arch.hidden_size * elem
    embeddings = matrix * (1 if arch.tie_word_embeddings else 2)
    body = max(0, total - embeddings)
    return math.ceil(body * layers / arch.num_layers) + matrix


def plan_stages(p: Plan, s: Sizing) -> bool:
    """2b. A server across nodes: the pipeline stages (one per node, the layer split checked against the model's
    layer count; each GPU then holds its stage's share of the weights and the KV cache of its stage's layers) and
    vLLM's multi-node flags, which the kubelet completes from the LeaderWorkerSet's variables. False when the
    model has fewer layers than stages."""
    if p.nodes == 1:
        return True
    arch, pp, nodes = s.arch, p.pipeline_parallel_size, p.nodes
    if pp > arch.num_layers:
        p.problem("spec.nodes", f"{pp} pipeline stages need at least one of the model's {arch.num_layers} layers "
                  f"each: use at most {arch.num_layers} nodes")
        return False
    sizes = stage_sizes(arch.num_layers, pp)
    p.stage_layers = max(sizes)
    s.arch = stage_architecture(arch, p.stage_layers)
    if pp > 1:
        split = " + ".join(str(n) for n in sizes)
        p.decisions.append(FlagDecision("--pipeline-parallel-size", str(pp), f"nodes: one pipeline stage per node, "
                                        f"the model's {arch.num_layers} layers split {split}; each GPU holds its "
                                        f"stage's share of the weights and the KV cache of its {p.stage_layers} "
                                        "layers"))
    else:
        p.notes.append(f"warning: crossNodeParallelism Tensor shards every layer over all {p.tensor_parallel_size} "
                       f"GPUs of {nodes} nodes: each step all-reduces across the nodes, which needs a fast "
                       "interconnect (InfiniBand or RoCE with GPUDirect RDMA); over plain Ethernet it is slower than "
                       "pipeline stages")
    p.decisions += [
        FlagDecision("--nnodes", str(nodes), f"nodes: the group's {nodes} pods, one per node, "
                     f"{p.spec.gpu.count} GPU(s) each"),
        FlagDecision("--node-rank", f"$({WORKER_INDEX_ENV})", "the pod's index in its LeaderWorkerSet group (0: "
                     "the leader, which serves the API; the workers run vLLM --headless)"),
        FlagDecision("--master-addr", f"$({LEADER_ADDRESS_ENV})", "the group's leader, by the name the "
                     "LeaderWorkerSet gives it"),
        FlagDecision("--master-port", str(COORDINATION_PORT), "where the leader coordinates the group's nodes"),
    ]
    return True


def nodes_that_fit(p: Plan, s: Sizing, rest: int) -> Optional[int]:
    """The fewest nodes of gpu.count GPUs whose pipeline stages leave room for a KV cache (`rest`: the activations
    and overheads per GPU), up to 16; None when none do (or the model has too few layers)."""
    full = p.model.complete if p.model is not None else s.arch
    for n in range(max(2, p.nodes + 1), 17):
        if n > full.num_layers:
            return None
        stage = max(stage_sizes(full.num_layers, n))
        weights = math.ceil(stage_weight_bytes(p.weight_bytes_total, full, n, stage, s.elem) / p.spec.gpu.count)
        if weights + rotary_cache_bytes(full, s.elem) + rest < s.budget:
            return n
    return None
