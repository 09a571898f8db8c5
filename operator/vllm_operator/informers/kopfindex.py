"""What feeds the watch-fed copies (cache.py): kopf indices of the servers, their children and pods, and the
audits that find what a re-listing deleted unseen.

kopf runs no handler before every index holds its initial listing; each handler then hands the indices over
(`WatchedObjects.bind`, from the kwargs kopf passes it), and the copies answer reads from then on.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional, Sequence

import kopf

from .. import api, builders
from ..kube.client import PLURALS, ApiError, Kube, path_for
from . import cache
from .reader import Kind

log = logging.getLogger("vllm_operator.informers")

#: What the operator watches of the children and pods: only what it manages.
CHILD_LABELS = {"app.kubernetes.io/managed-by": builders.MANAGED_BY}


class Indexer:
    """The kopf index functions of one WatchedObjects: each notes what it indexed (re-listings show
    themselves by a version delivered again) and returns the slim, packed copy."""

    def __init__(self, objects: cache.WatchedObjects, on_pod: Optional[Callable[[Any], None]] = None):
        self.objects = objects
        #: Told of every pod event (on kopf's event loop: it must not block); the adapters' readiness gate.
        self.on_pod = on_pod

    async def server(self, body: Any, **_: Any) -> Any:
        self.objects.note_indexed(cache.SERVERS_INDEX, body)
        entry = cache.index_server(body)
        # kopf keeps this body (the last event's, for timers and daemons) as long as the server exists; its
        # managedFields, a nested dict per field per manager, are most of it and nothing here reads them.
        cache.drop_managed_fields(body)
        return entry

    async def child(self, body: Any, **_: Any) -> Any:
        self.objects.note_indexed(cache.CHILDREN_INDEX, body)
        return cache.index_child(body)

    async def pod(self, body: Any, **_: Any) -> Any:
        self.objects.note_indexed(cache.PODS_INDEX, body)
        if self.on_pod is not None:
            self.on_pod(body)
        return cache.index_pod(body)


def register(registry: kopf.OperatorRegistry, objects: cache.WatchedObjects, kinds: Sequence[Kind],
             on_pod: Optional[Callable[[Any], None]] = None) -> None:
    """kopf indices of the servers, every kind the reconciler manages (`kinds`), and their pods: reconciles
    read these instead of GET/LIST (bench/scale.py), and kopf runs no handler before they hold a full listing.
    `on_pod`: told of every pod event (Indexer.on_pod)."""
    indexer = Indexer(objects, on_pod)
    kopf.index(api.GROUP, api.VERSION, api.PLURAL, id=cache.SERVERS_INDEX, registry=registry)(indexer.server)
    for api_version, kind in kinds:
        group, _, version = api_version.rpartition("/")
        kopf.index(group, version, PLURALS[(api_version, kind)], id=cache.CHILDREN_INDEX, labels=CHILD_LABELS,
                   registry=registry)(indexer.child)
    kopf.index("", "v1", "pods", id=cache.PODS_INDEX, labels=CHILD_LABELS, registry=registry)(indexer.pod)


# --------------------------------------------------------------------------- audits
def audit_lists(kinds: Sequence[Kind], index_id: str,
                namespaces: Sequence[Optional[str]]) -> list[tuple[str, str, Optional[str], Optional[str]]]:
    """(apiVersion, kind, namespace, label selector) of the LISTs that audit one index: what kopf watches."""
    selector = ",".join(f"{k}={v}" for k, v in CHILD_LABELS.items())
    if index_id == cache.SERVERS_INDEX:
        listed: list[tuple[str, str, Optional[str]]] = [(f"{api.GROUP}/{api.VERSION}", api.KIND, None)]
    elif index_id == cache.CHILDREN_INDEX:
        listed = [(api_version, kind, selector) for api_version, kind in kinds]
    else:
        listed = [("v1", "Pod", selector)]
    return [(api_version, kind, namespace, sel) for api_version, kind, sel in listed
            for namespace in (namespaces or [None])]


def audit_index(kube: Kube, objects: cache.WatchedObjects, kinds: Sequence[Kind], index_id: str,
                namespaces: list[str]) -> list[dict]:
    """One LIST per watched kind (and namespace): what the index still holds but the cluster no longer
    has is marked gone (cache.py); the next resync of its server repairs what that hid."""
    listings = []
    for api_version, kind, namespace, selector in audit_lists(kinds, index_id, namespaces):
        try:
            listing = kube.request("GET", path_for(api_version, kind, namespace),
                                   query=[("labelSelector", selector)] if selector else [])
        except ApiError as e:
            if e.status == 404:  # a kind this cluster does not serve (KEDA's, when KEDA is not installed)
                continue
            raise
        listings.append(cache.Listing(listing.get("items") or [], cache.resource_version(listing),
                                      None if index_id == cache.PODS_INDEX else kind, namespace))
    gone = objects.audit(index_id, listings)
    for obj in gone:
        meta = obj["metadata"]
        log.warning("%s %s/%s was deleted while the watch was down (kopf re-listed without telling): "
                    "no longer read from the cache", obj.get("kind") or "Pod", meta.get("namespace"),
                    meta.get("name"))
    log.info("cache audit of %s: %d objects listed, %d deleted unseen", index_id,
             sum(len(listing.items) for listing in listings), len(gone))
    return gone


def _audit_forever(kube: Kube, objects: cache.WatchedObjects, kinds: Sequence[Kind], namespaces: list[str],
                   stop: threading.Event) -> None:
    """Audit an index when kopf re-listed its kinds, and every index every AUDIT_INTERVAL_SECONDS."""
    last_full = time.monotonic()
    while not stop.wait(1.0):
        if not objects.ready:
            continue
        due = set(objects.audits_due())
        if time.monotonic() - last_full >= cache.AUDIT_INTERVAL_SECONDS:
            due |= {cache.SERVERS_INDEX, cache.CHILDREN_INDEX, cache.PODS_INDEX}
            last_full = time.monotonic()
        for index_id in sorted(due):
            try:
                audit_index(kube, objects, kinds, index_id, namespaces)
            except Exception as e:  # the API server may be away again: try once more later
                log.warning("cache audit of %s failed (%s); retrying", index_id, e)
                objects.relisted(index_id)


def start_audits(kube: Kube, objects: cache.WatchedObjects, kinds: Sequence[Kind],
                 namespaces: list[str]) -> threading.Event:
    """The audit thread (a daemon); set the returned event to stop it."""
    stop = threading.Event()
    threading.Thread(target=_audit_forever, args=(kube, objects, list(kinds), namespaces, stop), name="cache-audit",
                     daemon=True).start()
    return stop
