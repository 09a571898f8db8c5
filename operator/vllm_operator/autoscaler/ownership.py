"""Who owns a StatefulSet's replicas and the autoscaler's part of the status (server-side apply).

The reconciler sends ``spec.replicas`` only while autoscaling is off; the autoscaler then
owns the field under its own field manager. Handing the field over must never drop it
(server-side apply removes a field its last owner stops sending, and the StatefulSet would
fall back to 1 replica): `adopt_replicas` makes the autoscaler a co-owner first.
"""

from __future__ import annotations

from typing import Any, Optional

from .. import api
from ..kube.client import Kube, path_for

#: The field manager of everything the autoscaler writes (replicas, status.autoscaling, its conditions).
FIELD_MANAGER = "vllm-operator-autoscaler"
#: Conditions the autoscaler owns in VLLMServer status.
CONDITIONS = ("AutoscalingActive", "AutoscalingLimited")


def runs_operator_loop(spec: Any, **_: Any) -> bool:
    """Whether a spec (a dict, as the API server has it) asks the operator's own loop to scale it
    (also the kopf daemon's filter)."""
    a = (spec or {}).get("autoscaling") or {}
    return (bool(a.get("enabled")) and a.get("mode", "Operator") == "Operator"
            and (spec or {}).get("workload", "StatefulSet") == "StatefulSet")


def replicas_owners(obj: dict[str, Any]) -> set[str]:
    """Field managers that own ``spec.replicas`` of a live object (from metadata.managedFields)."""
    owners = set()
    for entry in obj.get("metadata", {}).get("managedFields") or []:
        fields = entry.get("fieldsV1") or {}
        if "f:replicas" in (fields.get("f:spec") or {}):
            owners.add(entry.get("manager", ""))
    return owners


def adopt_replicas(kube: Kube, sts: dict[str, Any], min_replicas: int, max_replicas: Optional[int],
                   reconciler_manager: str) -> Optional[int]:
    """Make sure someone besides the reconciler owns the StatefulSet's (or a group's LeaderWorkerSet's) replicas
    before the
    reconciler stops sending them: apply the live count (clamped to [min, max]) under the
    autoscaler's field manager. Returns the count applied, or None when nothing was needed
    (the autoscaler, an HPA or a person already owns the field)."""
    if replicas_owners(sts) - {reconciler_manager}:
        return None
    live = (sts.get("spec") or {}).get("replicas", 1)
    replicas = max(min_replicas, min(live, max(min_replicas, max_replicas or min_replicas)))
    meta = sts["metadata"]
    kube.apply({"apiVersion": sts.get("apiVersion", "apps/v1"), "kind": sts.get("kind", "StatefulSet"),
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                "spec": {"replicas": replicas}}, field_manager=FIELD_MANAGER)
    return replicas


def has_status(status: dict[str, Any]) -> bool:
    """Whether a VLLMServer status still shows the autoscaler's fields."""
    return "autoscaling" in status or any(c.get("type") in CONDITIONS for c in status.get("conditions") or [])


def clear_status(kube: Kube, body: dict[str, Any]) -> None:
    """Remove status.autoscaling and the autoscaler's conditions from a VLLMServer.

    A JSON patch with a `test` before each removal, so it removes exactly what was read (a
    concurrent change fails it, 422, and the next pass retries). An empty server-side apply
    would be the natural way, but the API server can leave ``autoscaling: null`` behind,
    which the schema then refuses.
    """
    status = body.get("status") or {}
    ops: list[dict[str, Any]] = []
    for i, c in reversed(list(enumerate(status.get("conditions") or []))):
        if c.get("type") in CONDITIONS:
            ops += [{"op": "test", "path": f"/status/conditions/{i}/type", "value": c["type"]},
                    {"op": "remove", "path": f"/status/conditions/{i}"}]
    if "autoscaling" in status:
        ops.append({"op": "remove", "path": "/status/autoscaling"})
    if not ops:
        return
    meta = body["metadata"]
    kube.request("PATCH", path_for(api.API_VERSION, api.KIND, meta["namespace"], meta["name"], "status"),
                 query=[("fieldManager", FIELD_MANAGER)], body=ops, content_type="application/json-patch+json")
