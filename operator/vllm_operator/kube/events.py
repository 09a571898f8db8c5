"""Kubernetes Events about a VLLMServer, posted by the reconciler and by the autoscaler."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from .. import api, bounds
from .client import ApiError, Kube

log = logging.getLogger("vllm_operator.kube.events")


#: The Events this process posted, by (namespace, name), and their count: the next one of the same reason about the
#: same object is a PATCH of that count, not a new Event. Bounded; an Event it forgot (or a restart) is found by
#: its name (a 409) and counted on.
_POSTED: "OrderedDict[tuple[str, str], int]" = OrderedDict()
_POSTED_LOCK = threading.Lock()
POSTED_KEPT = 4096


def event_name(meta: dict[str, Any], type_: str, reason: str, component: str) -> str:
    """One name per (object, type, reason, component): Events aggregate the way the kubelet's do."""
    key = "|".join((meta.get("uid") or meta["name"], type_, reason, component))
    return f"{meta['name']}.{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def post_event(kube: Kube, body: dict[str, Any], type_: str, reason: str, message: str, *, component: str,
               stamp: str) -> None:
    """Record one Event about the VLLMServer `body`: the first of its reason a new Event, the next ones its count
    and last message and time (one Event per reason per server, whatever a tenant changes). Best effort: a failure
    is logged, never raised (no reconcile or autoscaler tick fails for an event)."""
    meta = body["metadata"]
    ns, name = meta["namespace"], event_name(meta, type_, reason, component)
    text = bounds.clean(message, bounds.EVENT_MESSAGE_CHARS)
    try:
        with _POSTED_LOCK:
            count = _POSTED.get((ns, name))
        if count is None or not _count_on(kube, ns, name, count + 1, text, stamp):
            count = _create(kube, body, name, type_, reason, text, component, stamp)
        else:
            count += 1
        with _POSTED_LOCK:
            _POSTED[(ns, name)] = count
            _POSTED.move_to_end((ns, name))
            while len(_POSTED) > POSTED_KEPT:
                _POSTED.popitem(last=False)
    except ApiError as e:
        log.warning("could not record event %s: %s", reason, bounds.clean(str(e), bounds.EVENT_MESSAGE_CHARS))


def _count_on(kube: Kube, ns: str, name: str, count: int, message: str, stamp: str) -> bool:
    """PATCH an Event's count, message and last time; False when it is gone (Events expire after an hour)."""
    try:
        kube.request("PATCH", f"/api/v1/namespaces/{ns}/events/{name}", content_type="application/merge-patch+json",
                     body={"count": count, "message": message, "lastTimestamp": stamp})
    except ApiError as e:
        if e.status == 404:
            return False
        raise
    return True


def _create(kube: Kube, body: dict[str, Any], name: str, type_: str, reason: str, message: str, component: str,
            stamp: str) -> int:
    """POST the Event; one of that name already there (posted before a restart) is counted on. Its count."""
    meta = body["metadata"]
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": meta["namespace"]},
        "involvedObject": {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": meta["name"],
                           "namespace": meta["namespace"], "uid": meta["uid"]},
        "type": type_,
        "reason": reason,
        "message": message,
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    try:
        kube.request("POST", f"/api/v1/namespaces/{meta['namespace']}/events", body=event)
        return 1
    except ApiError as e:
        if e.status != 409:
            raise
    live = kube.request("GET", f"/api/v1/namespaces/{meta['namespace']}/events/{name}")
    count = int(live.get("count") or 1) + 1
    _count_on(kube, meta["namespace"], name, count, message, stamp)
    return count


#: How long the events of one object are trusted: a server that stays short of replicas (a model loading for
#: minutes) costs one round of LISTs per object per this many seconds, whatever its reconciles.
EVENTS_TTL_SECONDS = 15.0
#: The Normal events failures.classify reads beside every Warning one: a probe's kill, a pod created after a
#: FailedCreate, a node on its way (cluster autoscaler, Karpenter).
NORMAL_REASONS = ("Killing", "SuccessfulCreate", "TriggeredScaleUp", "NotTriggerScaleUp", "Nominated")
#: Events per page of a LIST, pages and objects per read: what one read may cost whatever a namespace holds.
PAGE = 100
PAGES_PER_OBJECT = 3
OBJECTS_PER_READ = 16


@dataclass
class FailureEvents:
    """The events about a server's workload and pods that name a failure (FailedCreate, failed probes, a
    probe's kill, back-offs, a node being added), for failures.classify. Only those objects' Events are read: one
    LIST per object (a field selector on involvedObject.kind and .name), paginated (PAGE a page, at most
    PAGES_PER_OBJECT pages), the first OBJECTS_PER_READ objects, each kept for `ttl` seconds; of what is read,
    the Warning events and the Normal ones of NORMAL_REASONS are kept. Another server's or tenant's Events in the
    namespace cost nothing."""

    kube: Kube
    ttl: float = EVENTS_TTL_SECONDS
    _seen: dict[tuple[str, str, str], tuple[list[dict[str, Any]], float]] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def of(self, namespace: str, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
        now, found = time.monotonic(), []
        for o in objects[:OBJECTS_PER_READ]:
            key = (namespace, o.get("kind") or "Pod", o["metadata"]["name"])
            with self._lock:
                hit = self._seen.get(key)
            if hit is None or now - hit[1] > self.ttl:
                hit = (self._read(*key), now)
                with self._lock:
                    self._seen[key] = hit
                    if len(self._seen) > 64 * OBJECTS_PER_READ:  # forget what is stale
                        for k in [k for k, (_, t) in self._seen.items() if now - t > self.ttl]:
                            del self._seen[k]
            found += hit[0]
        return found

    def _read(self, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
        query = [("fieldSelector", f"involvedObject.kind={kind},involvedObject.name={name}"), ("limit", str(PAGE))]
        kept: list[dict[str, Any]] = []
        token = None
        for _ in range(PAGES_PER_OBJECT):
            page = self.kube.request("GET", f"/api/v1/namespaces/{namespace}/events",
                                     query=query + ([("continue", token)] if token else []))
            kept += [e for e in page.get("items") or []
                     if e.get("type") == "Warning" or e.get("reason") in NORMAL_REASONS]
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
        return kept
