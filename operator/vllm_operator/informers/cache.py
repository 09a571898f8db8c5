"""What a reconcile reads, from memory: watch-fed copies of the servers, their children and pods.

Without it every reconcile GETs its server and LISTs four child kinds and the pods; at 1,000
servers those LISTs scan whole namespaces and dominate the API server's work (bench/scale.py).
The operator already watches these kinds, so kopf indices (registered in kopfindex.py) keep
a slim copy of each object -- no managedFields but the owners of spec.replicas, no kopf
bookkeeping -- keyed by server, and
kopf runs no handler before every index holds its initial listing.

Each copy is kept as compact JSON and decoded when a reconcile reads it: a tenth of the
memory of the same object as Python dicts, for a fraction of a millisecond per read.

A watch lags the operator's own writes by a moment. So that the next reconcile does not
write again what it wrote a moment ago, the answers of its own writes are kept too (the
write-through overlay) and win over the index until the watch delivers the same or a newer
resourceVersion, the object's deletion is seen, or OVERLAY_SECONDS pass.

Reads happen in the handler threads while kopf updates the indices on its event loop:
lookups are plain dict reads and copies taken in one step, never iterations of live dicts.
A read that finds no index yet (kopf has not handed them over) or cannot take its copy
raises (reader.NotSynced, reader.ReadFailed) instead of answering "nothing": an empty
answer would read as a server or child gone (reader.py).

kopf never tells an index that an object vanished while its watch was down: when a watch
resumes with a re-listing (after "410 Gone", as when a kube-apiserver restarts), objects
deleted in the gap simply stay. Such a stale entry would hide a deleted child from every
later reconcile, so drift would never be repaired. A re-listing shows itself by delivering
objects at a resourceVersion already indexed; the kind is then audited (`audit`): one LIST,
and every indexed object that the LIST lacks and that is older than it is marked gone and
no longer read. Every kind is also audited every AUDIT_INTERVAL_SECONDS, in case a
re-listing went unnoticed.
"""

from __future__ import annotations

import json
import threading
import time
from collections import abc
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Optional, Sequence

from .. import api, builders
from .reader import Children, Kind, NotSynced, ReadFailed, controlled_by

#: kopf index ids (handler ids in kopfindex.py): the kwargs of every handler carry them.
SERVERS_INDEX = "vllm_servers"
CHILDREN_INDEX = "vllm_children"
PODS_INDEX = "vllm_pods"
#: How long an own write's answer may stand in for a watch event that has not arrived yet.
OVERLAY_SECONDS = 30.0
#: A re-listing delivers its objects in a burst: audit the kind once it has been quiet this long.
AUDIT_QUIET_SECONDS = 3.0
#: The backstop: every kind is audited this often even with no sign of a re-listing.
AUDIT_INTERVAL_SECONDS = 600.0

#: kopf's own bookkeeping annotations: the last-handled spec (as big as the spec) is never read here.
_DROP_ANNOTATIONS = (f"{api.GROUP}/last-handled-configuration", "kubectl.kubernetes.io/last-applied-configuration")


def slim(body: Mapping[str, Any]) -> dict[str, Any]:
    """The fields a reconcile reads of a server or child (a plain dict, safe to keep)."""
    meta = body.get("metadata") or {}
    out_meta = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "generation", "labels",
                                     "ownerReferences", "deletionTimestamp", "finalizers") if k in meta}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in _DROP_ANNOTATIONS}
    if annotations:
        out_meta["annotations"] = annotations
    # Of managedFields only who owns spec.replicas is read (autoscaler/ownership.py); the rest is the
    # biggest part of an object and stays out.
    replicas_owners = [{"manager": e.get("manager"), "fieldsV1": {"f:spec": {"f:replicas": {}}}}
                       for e in meta.get("managedFields") or []
                       if "f:replicas" in ((e.get("fieldsV1") or {}).get("f:spec") or {})]
    if replicas_owners:
        out_meta["managedFields"] = replicas_owners
    out = {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"), "metadata": _plain(out_meta)}
    for key in ("spec", "status"):
        if body.get(key) is not None:
            out[key] = _plain(body[key])
    return out


def slim_pod(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the reconciler (failures.classify: scheduling, container states, the image, the memory limit and
    the startup probe; the adapters' readiness gate) and the autoscaler (readiness, IP, start times, the
    container's args, ports and startup probe) read of a pod."""
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    statuses = [{k: cs[k] for k in ("name", "state", "lastState", "restartCount", "ready") if k in cs}
                for cs in status.get("containerStatuses") or []]
    containers = [{k: c[k] for k in ("name", "image", "args", "ports", "startupProbe") if k in c}
                  for c in (body.get("spec") or {}).get("containers") or []]
    for kept, c in zip(containers, (body.get("spec") or {}).get("containers") or []):
        memory = ((c.get("resources") or {}).get("limits") or {}).get("memory")
        if memory is not None:
            kept["resources"] = {"limits": {"memory": memory}}
    return _plain({
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp",
                                          "resourceVersion") if k in meta},
        "spec": {"containers": containers, **({"hostNetwork": True} if (body.get("spec") or {}).get("hostNetwork")
                                                 else {}),
                 # the adapters' readiness gate (adapters.GATE), which the reconciler sets
                 **({"readinessGates": body["spec"]["readinessGates"]} if (body.get("spec") or {}).get(
                     "readinessGates") else {})},
        "status": {**{k: status[k] for k in ("phase", "podIP", "conditions", "startTime") if k in status},
                   "containerStatuses": statuses},
    })


#: Leaves of a JSON document, told by their exact type first: typing.Mapping's isinstance check on every leaf was
#: most of this copy's CPU (yappi, bench/scale.py).
_SCALARS = frozenset((str, int, float, bool, type(None)))


def _plain(value: Any) -> Any:
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict or isinstance(value, abc.Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if kind is list or isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def resource_version(obj: Optional[Mapping[str, Any]]) -> int:
    """The resourceVersion as a number (etcd's revision); -1 when absent or not a number."""
    try:
        return int(((obj or {}).get("metadata") or {}).get("resourceVersion"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return -1


#: Attempts at copying a collection that kopf keeps changing before the read gives up (ReadFailed).
COPY_ATTEMPTS = 5


def _copy(items: Iterable) -> list:
    """A list of a collection kopf may change meanwhile, taken in one step."""
    for _ in range(COPY_ATTEMPTS):
        try:
            return list(items)
        except RuntimeError:  # changed size during the copy: copy again
            continue
    raise ReadFailed(f"the watch-fed copy changed during {COPY_ATTEMPTS} attempts at reading it")


def _keys(index: Optional[Mapping]) -> list:
    """A copy of an index's keys (kopf may add or remove keys meanwhile)."""
    return _copy(index.keys()) if index is not None else []


def _uid(obj: Mapping[str, Any]) -> Optional[str]:
    return (obj.get("metadata") or {}).get("uid")


class Listing(NamedTuple):
    """One LIST that audits an index: its items, its resourceVersion, what it covers (None: every kind or
    namespace)."""
    items: list[Mapping[str, Any]]
    version: int
    kind: Optional[str] = None
    namespace: Optional[str] = None


def _values(index: Mapping, key: Any) -> list:
    """A copy of one index entry's values, taken in one step (kopf may update it meanwhile); [] when the index
    holds nothing under `key`."""
    for _ in range(COPY_ATTEMPTS):
        try:
            store = index.get(key)
        except KeyError:  # removed between kopf's lookup and its read: nothing indexed under it
            return []
        except RuntimeError:  # resized meanwhile: look again
            continue
        return _copy(store) if store is not None else []
    raise ReadFailed(f"the watch-fed copy changed during {COPY_ATTEMPTS} attempts at reading {key!r}")


class WatchedObjects:
    """The reconciler's view of the cluster, from kopf indices plus the answers of its own writes (a
    reader.Reader)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.indices: Optional[Mapping[str, Mapping]] = None
        # (namespace, server) -> (kind, name) -> (when, object as our write's answer)
        self._overlay: dict[tuple[str, str], dict[tuple[str, str], tuple[float, dict[str, Any]]]] = {}
        self._lock = threading.Lock()
        self._writes = 0
        self.clock = clock
        # index id -> uid -> the resourceVersion last indexed (a re-listing delivers the same one again)
        self._seen: dict[str, dict[str, int]] = {}
        # index id -> when a re-delivery was last seen (an audit is due once it has been quiet)
        self._relisted: dict[str, float] = {}
        # index id -> uids still in the index although a LIST showed them deleted (never read again)
        self._gone: dict[str, frozenset[str]] = {}

    @property
    def ready(self) -> bool:
        return self.indices is not None

    def bind(self, kwargs: Mapping[str, Any]) -> None:
        """Take the indices from a kopf handler's kwargs (the same objects for every handler)."""
        if self.indices is None and CHILDREN_INDEX in kwargs:
            self.indices = {k: kwargs[k] for k in (SERVERS_INDEX, CHILDREN_INDEX, PODS_INDEX) if k in kwargs}

    # ---- own writes
    @staticmethod
    def _keys(obj: Mapping[str, Any]) -> Optional[tuple[tuple[str, str], tuple[str, str]]]:
        meta = obj.get("metadata") or {}
        kind, namespace, name = obj.get("kind") or "", meta.get("namespace") or "", meta.get("name") or ""
        server = name if kind == api.KIND else (meta.get("labels") or {}).get(builders.SERVER_LABEL)
        return ((namespace, server), (kind, name)) if server else None

    def remember(self, obj: Mapping[str, Any]) -> None:
        """An object as the API server answered our write (apply, status apply)."""
        keys = self._keys(obj)
        if keys is not None:
            now = self.clock()
            with self._lock:
                self._overlay.setdefault(keys[0], {})[keys[1]] = (now, slim(obj))
                self._writes += 1
                if self._writes % 256 == 0:  # entries never read again (a deleted server's) expire here
                    for owner in list(self._overlay):
                        entries = self._overlay[owner]
                        for key in [k for k, (at, _) in entries.items() if now - at > OVERLAY_SECONDS]:
                            del entries[key]
                        if not entries:
                            del self._overlay[owner]

    def forget(self, obj: Mapping[str, Any]) -> None:
        """The object was deleted (by us, or a watch said so)."""
        keys = self._keys(obj)
        if keys is not None:
            with self._lock:
                entries = self._overlay.get(keys[0], {})
                entries.pop(keys[1], None)
                if not entries:
                    self._overlay.pop(keys[0], None)

    def _written(self, owner: tuple[str, str]) -> dict[tuple[str, str], tuple[float, dict[str, Any]]]:
        with self._lock:
            return dict(self._overlay.get(owner, {}))

    def _merge(self, owner: tuple[str, str], key: tuple[str, str], watched: Optional[dict[str, Any]],
               entry: Optional[tuple[float, dict[str, Any]]]) -> Optional[dict[str, Any]]:
        """The newer of what the watch delivered and what our own write answered."""
        if entry is None:
            return watched
        at, written = entry
        if self.clock() - at > OVERLAY_SECONDS or (watched is not None and resource_version(watched) >= resource_version(written)):
            with self._lock:  # the watch caught up (or never will): drop our copy
                entries = self._overlay.get(owner, {})
                if entries.get(key) is entry:
                    del entries[key]
                    if not entries:
                        self._overlay.pop(owner, None)
            return watched
        if watched is not None and _uid(watched) != _uid(written):
            return watched  # re-created since our write
        return written

    def echoes_own_write(self, obj: Mapping[str, Any]) -> bool:
        """Whether a watch event delivers exactly the answer to one of our own writes (same uid and
        resourceVersion): the reconcile that wrote it has seen it already, so it brings nothing new."""
        keys = self._keys(obj)
        if keys is None:
            return False
        with self._lock:
            entry = self._overlay.get(keys[0], {}).get(keys[1])
        if entry is None:
            return False
        written = entry[1]
        return resource_version(written) == resource_version(obj) and _uid(written) == _uid(obj)

    def overlay_size(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._overlay.values())

    # ---- re-listings and audits
    def note_indexed(self, index_id: str, body: Mapping[str, Any]) -> None:
        """Called for every object kopf indexes: the same version delivered again means a re-listing."""
        uid, version = _uid(body), resource_version(body)
        if not uid:
            return
        seen = self._seen.setdefault(index_id, {})
        before = seen.get(uid)
        seen[uid] = version
        if before is not None and version <= before:
            self.relisted(index_id)

    def relisted(self, index_id: str) -> None:
        """Mark an index for an audit (a re-listing was seen, or the last audit failed)."""
        with self._lock:
            self._relisted[index_id] = self.clock()

    def audits_due(self) -> list[str]:
        """The indices re-listed and quiet for AUDIT_QUIET_SECONDS (each returned once per re-listing)."""
        now = self.clock()
        with self._lock:
            due = [i for i, at in self._relisted.items() if now - at >= AUDIT_QUIET_SECONDS]
            for index_id in due:
                del self._relisted[index_id]
        return due

    def audit(self, index_id: str, listings: list[Listing]) -> list[dict[str, Any]]:
        """Compare an index, in one pass, with the LISTs of what it holds: an indexed object that the
        LIST covering it lacks and that is older than that LIST was deleted unseen; it is marked gone
        (no read returns it again) and returned. Objects newer than their LIST, or covered by none (a
        kind the cluster does not serve), are not judged. The uids kopf discarded on their deletion
        events are forgotten here too."""
        index = self.indices.get(index_id) if self.indices else None
        covering = {(listing.kind, listing.namespace): (listing.version, {_uid(o) for o in listing.items})
                    for listing in listings}
        gone: list[dict] = []
        indexed: set[Optional[str]] = set()
        for key in _keys(index):
            assert index is not None  # _keys(None) is empty
            for obj in map(unpack, _values(index, key)):
                uid, kind = _uid(obj), obj.get("kind")
                indexed.add(uid)
                cover = next((covering[c] for c in ((kind, key[0]), (None, key[0]), (kind, None), (None, None))
                              if c in covering), None)
                if cover is not None and uid not in cover[1] and resource_version(obj) < cover[0]:
                    gone.append(obj)
        seen = self._seen.get(index_id, {})
        for uid in [u for u in _keys(seen) if u not in indexed]:
            seen.pop(uid, None)
        with self._lock:
            self._gone[index_id] = (self._gone.get(index_id, frozenset()) & indexed) | {u for u in map(_uid, gone) if u is not None}
        return gone

    def _index(self, index_id: str) -> Mapping:
        """One of kopf's indices; NotSynced until kopf handed them over (bind)."""
        index = self.indices.get(index_id) if self.indices is not None else None
        if index is None:
            raise NotSynced(f"the watch-fed copy of {index_id} is not synced yet")
        return index

    def _live(self, index_id: str, key: Any) -> list[dict[str, Any]]:
        """One index entry's objects, less those an audit found deleted."""
        gone = self._gone.get(index_id, frozenset())
        objects = map(unpack, _values(self._index(index_id), key))
        return [o for o in objects if _uid(o) not in gone] if gone else list(objects)

    # ---- reads
    def server(self, namespace: str, name: str) -> Optional[dict[str, Any]]:
        found = self._live(SERVERS_INDEX, (namespace, name))
        watched = max(found, key=resource_version) if found else None
        owner, key = (namespace, name), (api.KIND, name)
        return self._merge(owner, key, watched, self._written(owner).get(key))

    def children(self, namespace: str, name: str, uid: str, kinds: Optional[Sequence[Kind]] = None) -> Children:
        """The server's children (controller reference to `uid`), keyed by (kind, name); `kinds`: only these."""
        owner = (namespace, name)
        watched = {(o["kind"], o["metadata"]["name"]): o for o in self._live(CHILDREN_INDEX, owner)}
        written = self._written(owner)
        wanted = None if kinds is None else {kind for _, kind in kinds}
        out = {}
        for key in watched.keys() | (written.keys() - {(api.KIND, name)}):
            if wanted is not None and key[0] not in wanted:
                continue
            merged = self._merge(owner, key, watched.get(key), written.get(key))
            if merged is None:
                continue
            if controlled_by(merged, uid):
                out[key] = merged
        return out

    def pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return self._live(PODS_INDEX, (namespace, name))


# --------------------------------------------------------------------------- kopf index functions
def pack(obj: dict[str, Any]) -> bytes:
    """Compact JSON: a kept StatefulSet is ~3 KB this way, ~20 KB as Python dicts (bench/scale.py's RSS)."""
    return json.dumps(obj, separators=(",", ":")).encode()


def unpack(packed: bytes) -> dict[str, Any]:
    return json.loads(packed)


def index_server(body: Mapping[str, Any]) -> dict[tuple[str, str], bytes]:
    meta = body["metadata"]
    return {(meta["namespace"], meta["name"]): pack(slim(body))}


def drop_managed_fields(body: Mapping[str, Any]) -> None:
    """Remove metadata.managedFields from a watched body in place (kopf's Body is a view of the raw dict).

    kopf holds the last event's body of every VLLMServer for its timer and daemons; at 300 servers
    those bodies were about 220 dicts each, most of them managedFields (bench/scale.py's RSS). The
    server's copy in the index (slim) is taken before this."""
    meta = body.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)


def index_child(body: Mapping[str, Any]) -> Optional[dict[tuple[str, str], bytes]]:
    meta = body["metadata"]
    server = (meta.get("labels") or {}).get(builders.SERVER_LABEL)
    if not server or not meta.get("namespace"):
        return None
    return {(meta["namespace"], server): pack(slim(body))}


def index_pod(body: Mapping[str, Any]) -> Optional[dict[tuple[str, str], bytes]]:
    meta = body["metadata"]
    instance = (meta.get("labels") or {}).get("app.kubernetes.io/instance")
    if not instance:
        return None
    return {(meta["namespace"], instance): pack(slim_pod(body))}
