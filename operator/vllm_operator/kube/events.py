"""Kubernetes Events about a VLLMServer, posted by the reconciler and by the autoscaler."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from .. import api
from .client import ApiError, Kube

log = logging.getLogger("vllm_operator.kube.events")


def post_event(kube: Kube, body: dict[str, Any], type_: str, reason: str, message: str, *, component: str,
               stamp: str) -> None:
    """POST one Event about the VLLMServer `body`. Best effort: a failure is logged, never raised
    (no reconcile or autoscaler tick fails for an event)."""
    meta = body["metadata"]
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": meta["name"],
                           "namespace": meta["namespace"], "uid": meta["uid"]},
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    try:
        kube.request("POST", f"/api/v1/namespaces/{meta['namespace']}/events", body=event)
    except ApiError as e:
        log.warning("could not record event %s: %s", reason, e)


#: How long one namespace's events are trusted: a server that stays short of replicas (a model loading for
#: minutes) costs one round of LISTs per namespace per this many seconds, whatever its reconciles.
EVENTS_TTL_SECONDS = 15.0
#: The Normal events failures.classify reads beside every Warning one: a probe's kill, a pod created after a
#: FailedCreate, a node on its way (cluster autoscaler, Karpenter). A field selector cannot say "Warning or
#: one of these", so each is one LIST: a constant number per namespace, whatever its pods.
NORMAL_REASONS = ("Killing", "SuccessfulCreate", "TriggeredScaleUp", "NotTriggerScaleUp", "Nominated")


@dataclass
class FailureEvents:
    """The events about a server's workload and pods that name a failure (FailedCreate, failed probes, a
    probe's kill, back-offs, a node being added), for failures.classify: per namespace, one LIST of its Warning
    events and one per reason of NORMAL_REASONS, filtered here by the objects' kinds and names."""

    kube: Kube
    ttl: float = EVENTS_TTL_SECONDS
    _seen: dict[str, tuple[list[dict[str, Any]], float]] = field(default_factory=dict, repr=False)

    def of(self, namespace: str, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
        now = time.monotonic()
        hit = self._seen.get(namespace)
        if hit is None or now - hit[1] > self.ttl:
            items: list[dict[str, Any]] = []
            for selector in ("type=Warning", *(f"type=Normal,reason={r}" for r in NORMAL_REASONS)):
                items += self.kube.request("GET", f"/api/v1/namespaces/{namespace}/events",
                                           query=[("fieldSelector", selector)]).get("items") or []
            hit = self._seen[namespace] = (items, now)
        keys = {(o.get("kind") or "Pod", o["metadata"]["name"]) for o in objects}
        return [e for e in hit[0] if ((e.get("involvedObject") or {}).get("kind"),
                                      (e.get("involvedObject") or {}).get("name")) in keys]
