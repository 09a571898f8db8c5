"""`plan`, the planner's entry: the plan of spec.nodes, or with spec.maxNodes the fewest nodes whose layout fits
(steps.plan_layout plans each one)."""

from __future__ import annotations

from typing import Any, Optional

from .. import api
from ..api import VLLMServerSpec
from ..catalog import ResolvedModel
from ..catalog.gpus import GPUSelection, select_gpu
from ..validation import Problem, max_nodes_problems
from .plan_types import Plan
from .steps import plan_layout


def plan(
    name: str,
    namespace: str,
    spec: VLLMServerSpec,
    model: Optional[ResolvedModel],
    gpu: Optional[GPUSelection] = None,
    **options: Any,
) -> Plan:
    """Derive the vLLM args and estimates for one server. Pure; never raises on bad input.

    `gpu`: spec.gpu resolved by gpus.select_gpu (resolved here when not given). `options`: plan_layout's.
    With spec.maxNodes the node count is the planner's to choose (choose_nodes); otherwise spec.nodes is the
    layout."""
    if spec.max_nodes is None or max_nodes_problems(spec):  # the latter: check_spec reports them
        return plan_layout(name, namespace, spec, model, gpu, **options)
    return choose_nodes(name, namespace, spec, model, gpu, **options)


def _refuses_layout(problem: Problem) -> bool:
    """A problem of the layout: the model does not fit (DoesNotFit) or the node count cannot split it (spec.nodes:
    more stages than layers, tensor parallelism across nodes that does not divide the heads)."""
    return problem.reason == api.REASON_DOES_NOT_FIT or problem.field == "spec.nodes"


def layout_refused(p: Plan) -> bool:
    """The plan fails for its layout (_refuses_layout)."""
    return any(_refuses_layout(pr) for pr in p.problems)


def _first_refusal(p: Plan) -> str:
    """The first layout refusal of `p`, without its list of what would fit (the layout chosen is the answer)."""
    problem = next(pr for pr in p.problems if _refuses_layout(pr))
    return f"{problem.field}: {problem.message.split('; what would fit:')[0]}"


def choose_nodes(name: str, namespace: str, spec: VLLMServerSpec, model: Optional[ResolvedModel],
                 gpu: Optional[GPUSelection], **options: Any) -> Plan:
    """spec.maxNodes: the fewest nodes, 1 to maxNodes (and at most the model's layers), whose layout fits. The plan
    of that layout is returned with spec.nodes set to it (what the builders and the reconciler read), the bound in
    `max_nodes` and the choice and its reason as the first note. When none fits, the largest layout's plan, its
    refusal led by one on spec.maxNodes."""
    limit = spec.max_nodes or 1
    if model is not None:
        limit = min(limit, model.complete.num_layers)
    gpu = gpu if gpu is not None else select_gpu(spec.gpu)
    fewer: Optional[Plan] = None
    for n in range(1, limit + 1):
        trial = plan_layout(name, namespace, spec.model_copy(update={"nodes": n, "max_nodes": None}), model, gpu,
                            max_nodes=spec.max_nodes, **options)
        if model is None or trial.gpu_memory is None:
            return trial  # nothing to size a layout with (an unknown model or GPU): its problems say why
        if not layout_refused(trial):
            break
        fewer = trial
    else:
        trial.problems.insert(0, Problem(
            "spec.maxNodes", f"no layout of 1 to {limit} node(s) of {spec.gpu.count} GPU(s) fits: the largest "
            f"maxNodes allows, {limit} node(s), is refused as below ({_first_refusal(trial)})",
            api.REASON_DOES_NOT_FIT))
        return trial
    what = (f"{trial.nodes} nodes x {spec.gpu.count} GPU(s), one LeaderWorkerSet group per replica" if trial.nodes > 1
            else f"1 node x {spec.gpu.count} GPU(s), a StatefulSet pod per replica")
    why = ("the fewest that fit" if fewer is None else
           f"the fewest that fit; {fewer.nodes} node(s): {_first_refusal(fewer)}")
    trial.layout = f"layout: {what}, chosen by maxNodes {spec.max_nodes}: {why}"
    trial.notes.insert(0, trial.layout)
    return trial
