"""Build and check: the step after the plan that the CLI (`plan`, `render`) and the reconciler share. Pure.

The pod template is built once (builders.base_pod_template), spec.podTemplatePatch applied to it once and the
result checked against the escape hatches' rules (escape_hatches.final_template); the workload takes that same
template (builders.build_all's `template`), and every child is then checked for size as it will be sent
(builders.oversized). A template the rules refuse is never built into children: a patch may leave it in no shape
a workload builder can take (no map for spec, a LeaderWorkerSet's leader without its container).

What needs the cluster stays with the reconciler: whether it serves LeaderWorkerSets, and the namespace's Pod
Security level (its label, then the API server's dry run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import builders, escape_hatches
from .planner import Plan


@dataclass
class Built:
    """A plan, its children built from one pod template, and what the checks after the build found: the template's
    problems are in `plan.problems` (then there are no children), the objects too large to store in `oversized`."""

    plan: Plan
    children: list[dict[str, Any]] = field(default_factory=list)
    oversized: list[str] = field(default_factory=list)


def build_and_check(plan: Plan, owner: Optional[dict[str, Any]] = None,
                    prepare: Optional[Callable[[list[dict[str, Any]]], list[dict[str, Any]]]] = None) -> Built:
    """Build `plan`'s children (owned by `owner`) and check them; nothing is built for a plan with problems.
    `prepare`: what the caller does to the children before it sends them (the reconciler's annotations), so the
    size checked is the size sent."""
    if not plan.fits:
        return Built(plan)
    base = builders.base_pod_template(plan)  # the one build of the pod template
    template, problems = escape_hatches.final_template(plan, base)
    if problems or template is None:
        plan.problems.extend(problems)
        return Built(plan)
    children = builders.build_all(plan, owner, template)
    if prepare is not None:
        children = prepare(children)
    return Built(plan, children, builders.oversized(children))
