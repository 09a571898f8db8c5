"""Every object one VLLMServer wants, in apply order (`build_all`), and the ones too large to store
(`oversized`)."""

from __future__ import annotations

import json
from typing import Any, Optional

from ..planner import Plan
from .routing import build_routing
from .scalers import build_hpa, build_scaled_object
from .services import build_headless_service, build_pdb, build_service, build_shared_cache_claim, wants_pdb
from .workloads import build_daemonset, build_leaderworkerset, build_statefulset, is_group


#: The largest object the operator applies, as JSON. etcd stores at most 1.5 MiB per object and the API server
#: refuses a request above 2 MiB with a gRPC error (a 500 it would be retried on forever); a pod template copies
#: engine.env and extraArgs (and the extra containers and the patch), so a spec within the CRD's bounds can still
#: build a workload past them.
MAX_OBJECT_BYTES = 1_400_000


def oversized(objects: list[dict[str, Any]]) -> list[str]:
    """A problem for each object too large for the API server to store, naming what makes it large."""
    out = []
    for obj in objects:
        size = len(json.dumps(obj, separators=(",", ":")))
        if size > MAX_OBJECT_BYTES:
            out.append(f"spec: the {obj['kind']} {obj['metadata']['name']} would be {size:,} bytes, more than the "
                       f"{MAX_OBJECT_BYTES:,} the operator applies (etcd keeps at most 1.5 MiB per object): "
                       "shorten spec.engine.env, spec.engine.extraArgs, spec.engine.chatTemplate, the extra "
                       "containers or spec.podTemplatePatch")
    return out


def build_all(plan: Plan, owner: Optional[dict] = None,
              template: Optional[dict[str, Any]] = None) -> list[dict[str, Any]]:
    """Every object one VLLMServer wants, in apply order. The plan must fit. `template`: the workload's pod template,
    already built and checked (postbuild.build_and_check); pod_template(plan) otherwise."""
    if not plan.fits:
        raise ValueError("cannot build objects for a plan with problems: " + "; ".join(map(str, plan.problems)))
    spec = plan.spec
    objects: list[dict[str, Any]] = [build_service(plan, owner)]
    if spec.cache is not None and spec.cache.shared:
        objects.append(build_shared_cache_claim(plan, owner))  # before the pods that mount it
    if is_group(spec):
        objects.append(build_leaderworkerset(plan, owner, template))  # LWS makes the group's headless Service itself
    elif spec.workload == "StatefulSet":
        objects.append(build_headless_service(plan, owner))
        objects.append(build_statefulset(plan, owner, template))
    else:
        objects.append(build_daemonset(plan, owner, template))
    if wants_pdb(spec):
        objects.append(build_pdb(plan, owner))
    if spec.autoscaling.enabled and spec.workload == "StatefulSet":
        if spec.autoscaling.mode == "HPA":
            objects.append(build_hpa(plan, owner))
        elif spec.autoscaling.mode == "KEDA":
            objects.append(build_scaled_object(plan, owner))
    objects += build_routing(plan, owner)
    return objects
