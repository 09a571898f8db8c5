"""What the reconciler and the autoscaler read of the cluster, behind one interface (`Reader`).

Two implementations: the watch-fed copies the running operator keeps (cache.WatchedObjects, fed by
kopf indices: kopfindex.py), and `DirectReader`, which asks the API server each time (GET and
LIST), for code that runs without watches (tests, tools, a Reconciler built by hand).

An answer is always an answer: "no such server" is None, "no children" is {}, "no pods" is [].
A copy that could not be read (not synced yet, or changed under the read too often) raises
`ReadFailed` instead, so a reconcile retries rather than reading a server or its children as gone.
The direct reader's failures are the API's own (kube.ApiError, urllib3's errors), handled as today.

Read-your-writes: `remember` keeps the answer of our own write and the reads return it until the
watch delivers the same or a newer version; `forget` drops it when we deleted the object. The
direct reader reads the API server itself, so both do nothing there.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Protocol, Sequence

from .. import api, builders
from ..kube.client import ApiError

#: (apiVersion, kind): a kind of child, as the reconciler names them (Reconciler.managed_kinds).
Kind = tuple[str, str]
#: (kind, name) -> the object: a server's children.
Children = dict[tuple[str, str], dict[str, Any]]


class ReadFailed(RuntimeError):
    """The copy could not be read: retry the reconcile (or the tick) later; never read as "gone"."""


class NotSynced(ReadFailed):
    """The watch-fed copy holds no full listing yet (kopf has not handed over its indices)."""


class Reader(Protocol):
    """The servers, their children and pods, as the reconciler and the autoscaler read them."""

    def server(self, namespace: str, name: str) -> Optional[dict[str, Any]]:
        """The VLLMServer; None when it does not exist."""

    def children(self, namespace: str, name: str, uid: str, kinds: Optional[Sequence[Kind]] = None) -> Children:
        """The server's children (a controller reference to `uid`) by (kind, name); `kinds`: only these."""

    def pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The pods of the server's workload."""

    def remember(self, obj: Mapping[str, Any]) -> None:
        """An object as the API server answered our own write (apply, status apply)."""

    def forget(self, obj: Mapping[str, Any]) -> None:
        """An object we deleted (or a watch saw deleted)."""


def controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether the object's controller ownerReference names the VLLMServer with this uid."""
    return any(o.get("uid") == uid and o.get("controller")
               for o in (obj.get("metadata") or {}).get("ownerReferences") or [])


class DirectReader:
    """Reads the API server on every call: a GET for the server, a LIST per child kind, a LIST of pods."""

    def __init__(self, kube: Any, kinds: Sequence[Kind] = ()):
        self.kube = kube
        #: The kinds `children` lists when asked for all (the reconciler's managed kinds).
        self.kinds = list(kinds)

    def server(self, namespace: str, name: str) -> Optional[dict[str, Any]]:
        return self.kube.get(api.API_VERSION, api.KIND, namespace, name)

    def children(self, namespace: str, name: str, uid: str, kinds: Optional[Sequence[Kind]] = None) -> Children:
        selector = f"{builders.SERVER_LABEL}={name}"
        live: Children = {}
        for api_version, kind in self.kinds if kinds is None else kinds:
            try:
                items = self.kube.list(api_version, kind, namespace, label_selector=selector)
            except ApiError as e:
                if e.status == 404:  # a kind this cluster does not serve (KEDA's, when KEDA is not installed)
                    continue
                raise
            for item in items:
                if controlled_by(item, uid):
                    item.setdefault("apiVersion", api_version)
                    item.setdefault("kind", kind)
                    live[(kind, item["metadata"]["name"])] = item
        return live

    def pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return self.kube.list("v1", "Pod", namespace, label_selector=builders.selector_string(name))

    def remember(self, obj: Mapping[str, Any]) -> None:
        """Nothing to keep: the next read asks the API server."""

    def forget(self, obj: Mapping[str, Any]) -> None:
        """Nothing kept."""
