"""Kubernetes Events about a VLLMServer, posted by the reconciler and by the autoscaler."""

from __future__ import annotations

import logging
from typing import Any

from . import api
from .kube import ApiError, Kube

log = logging.getLogger("vllm_operator.events")


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
