"""spec.adapters on the running replicas: load what is missing and unload what the spec dropped, on every ready pod,
through vLLM's runtime adapter endpoints (VLLM_ALLOW_RUNTIME_LORA_UPDATING, set in the pods' own environment only
with adapters).

The reconciler asks `AdapterSync.observe` at every reconcile with the ready pods and the adapters wanted; it answers
at once with what it knows of each pod (adapters.PodAdapters) and, for a pod whose knowledge is missing, stale, from
another incarnation (a new uid, a restarted container) or from another spec, starts one sync in a bounded pool (a
fixed number of threads, one sync per pod at a time): GET /v1/models, POST /v1/load_lora_adapter for each wanted
adapter not listed (a failed one again only after `retry_seconds`), POST /v1/unload_lora_adapter for each listed
adapter the spec no longer has. Every call goes to the pod's IP (pods on the node's network are skipped by
vllm_metrics.ready_pods), through sources/fetch.py (a deadline, a byte cap, no redirect); a failure is kept as a
category ("load: HTTP 400"), never the answer's bytes. When a sync changes what is known, `notify` asks for a
reconcile of the server, which writes status.adapters, servedModels and AdaptersReady, and sets the pods'
readiness gate (adapters.GATE, `set_gates`): a pod joins the Service once every adapter was tried on its vLLM.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from .. import adapters
from ..kube.client import ApiError
from ..sources import fetch
from ..sources.vllm_metrics import PodRef

log = logging.getLogger(__name__)

#: Threads that talk to pods (all servers together): a load may wait on a Hub download, so more syncs queue.
POOL_THREADS = 4
#: Seconds one GET /v1/models may take, and its byte cap (a list of 1 + 32 models is a few KB).
LIST_SECONDS, LIST_BYTES = 5.0, 1 << 20
#: Seconds one load may take (vLLM downloads a Hub adapter inside the call), and the answer's cap.
LOAD_SECONDS, CALL_BYTES = 120.0, 64 * 1024
#: How often a pod's list is read again although nothing changed (a vLLM restarted in place lost its adapters).
REFRESH_SECONDS = 15.0
#: A failed load is tried again after this long (the spec unchanged).
RETRY_SECONDS = 60.0

Wanted = tuple[tuple[str, str], ...]
"""(adapter name, what vLLM loads it from: a Hub repo id or a path), in the spec's order."""


@dataclass
class _Pod:
    """What is known of one pod's adapters."""

    incarnation: tuple[str, str, int]
    """(uid, IP, restarts): another value is another vLLM, which holds none of the old one's adapters."""
    server: str = ""
    wanted: Wanted = ()
    known: adapters.PodAdapters = field(default_factory=lambda: adapters.PodAdapters(""))
    synced_at: float = float("-inf")
    failed_at: dict[str, float] = field(default_factory=dict)
    busy: bool = False


class AdapterSync:
    """The adapters of every server's ready pods, kept in line with the spec in a bounded pool (see the module)."""

    def __init__(self, notify: Optional[Callable[[str, str], None]] = None, threads: int = POOL_THREADS,
                 clock: Callable[[], float] = time.monotonic, refresh_seconds: float = REFRESH_SECONDS,
                 retry_seconds: float = RETRY_SECONDS):
        self.notify = notify
        self.clock, self.refresh_seconds, self.retry_seconds = clock, refresh_seconds, retry_seconds
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="adapters")
        self._pods: dict[tuple[str, str], _Pod] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def observe(self, namespace: str, server: str, refs: Sequence[PodRef], incarnations: dict[str, tuple[str, int]],
                wanted: Wanted) -> list[adapters.PodAdapters]:
        """What each ready pod of `server` is known to list (refs in order); starts a sync where one is due.
        `incarnations`: pod name -> (uid, restarts of its containers)."""
        now, out = self.clock(), []
        with self._lock:
            ready = {r.name for r in refs}
            for key in [k for k, p in self._pods.items() if k[0] == namespace and p.server == server
                        and k[1] not in ready]:
                del self._pods[key]  # gone or no longer ready: forgotten (it syncs afresh when ready again)
            for ref in refs:
                uid, restarts = incarnations.get(ref.name, ("", 0))
                incarnation = (uid, ref.ip, restarts)
                pod = self._pods.get((ref.namespace, ref.name))
                if pod is None or pod.incarnation != incarnation:
                    pod = self._pods[(ref.namespace, ref.name)] = _Pod(incarnation, server,
                                                                       known=adapters.PodAdapters(ref.name))
                due = pod.wanted != wanted or pod.known.listed is None or now - pod.synced_at >= self.refresh_seconds
                if due and not pod.busy:
                    pod.busy = True
                    self._pool.submit(self._sync, server, ref, pod, wanted)
                out.append(pod.known)
        return out

    def _sync(self, server: str, ref: PodRef, pod: _Pod, wanted: Wanted) -> None:
        try:
            known = self._sync_pod(ref, pod, wanted)
        except Exception:  # noqa: BLE001 - a bug must not end the pool's thread; the next observe tries again
            log.exception("adapter sync of %s/%s failed", ref.namespace, ref.name)
            known = adapters.PodAdapters(ref.name, errors={name: "sync failed" for name, _ in wanted})
        with self._lock:
            changed = known != pod.known or pod.wanted != wanted
            pod.known, pod.wanted, pod.synced_at, pod.busy = known, wanted, self.clock(), False
        if changed and self.notify is not None:
            self.notify(ref.namespace, server)

    def _sync_pod(self, ref: PodRef, pod: _Pod, wanted: Wanted) -> adapters.PodAdapters:
        """One pod: list, load the missing, unload the unwanted, list again when anything was called."""
        base = f"http://{ref.ip}:{ref.port}"
        try:
            listed = list_adapters(base)
        except fetch.FetchError as err:
            return adapters.PodAdapters(ref.name, errors={name: f"list: {err}" for name, _ in wanted})
        errors = {k: v for k, v in pod.known.errors.items() if k in dict(wanted)} if pod.wanted == wanted else {}
        called = False
        now = self.clock()
        for name, source in wanted:
            if name in listed:
                errors.pop(name, None)
                continue
            if name in errors and now - pod.failed_at.get(name, float("-inf")) < self.retry_seconds:
                continue  # failed lately: tried again after retry_seconds
            called = True
            try:
                fetch.post_json(f"{base}/v1/load_lora_adapter", {"lora_name": name, "lora_path": source},
                                seconds=LOAD_SECONDS, max_bytes=CALL_BYTES)
                errors.pop(name, None)
            except fetch.FetchError as err:
                errors[name], pod.failed_at[name] = f"load: {err}", self.clock()
        for name in sorted(listed - {n for n, _ in wanted}):
            called = True
            try:
                fetch.post_json(f"{base}/v1/unload_lora_adapter", {"lora_name": name}, seconds=LIST_SECONDS,
                                max_bytes=CALL_BYTES)
            except fetch.FetchError as err:
                log.warning("unloading adapter %s from %s/%s failed: %s", name, ref.namespace, ref.name, err)
        if called:
            try:
                listed = list_adapters(base)
            except fetch.FetchError as err:
                return adapters.PodAdapters(ref.name, errors={name: f"list: {err}" for name, _ in wanted})
        return adapters.PodAdapters(ref.name, listed=frozenset(listed), errors=errors)


def list_adapters(base: str) -> set[str]:
    """The adapters a vLLM lists in /v1/models: the entries with a parent (the base model has none)."""
    answer = fetch.load_json(fetch.get(f"{base}/v1/models", seconds=LIST_SECONDS, max_bytes=LIST_BYTES,
                                       accept="application/json"))
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list):
        raise fetch.FetchError("not a model list")
    return {m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str) and m.get("parent")
            and len(m["id"]) <= 256}


def incarnations(pods: Sequence[dict[str, Any]]) -> dict[str, tuple[str, int]]:
    """Pod name -> (uid, restarts of its containers): a restarted vLLM holds none of its adapters."""
    out = {}
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        restarts = sum(int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or [])
        out[meta.get("name", "")] = (meta.get("uid", ""), restarts)
    return out


def set_gates(kube: Any, pods: Sequence[dict[str, Any]], known: Sequence[adapters.PodAdapters],
              names: Sequence[str]) -> int:
    """Set the adapters' readiness gate (adapters.gate_wanted) on the pods where it changes: True on a pod whose
    vLLM was tried with every adapter of `names`, False on one whose vLLM restarted since it was set. One
    conditional strategic-merge patch of pods/status per change (a pod changed meanwhile answers 409: the next
    reconcile sees it). Returns the patches made."""
    by_pod = {k.pod: k for k in known}
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    made = 0
    for pod in pods:
        meta = pod.get("metadata") or {}
        wanted = adapters.gate_wanted(pod, by_pod.get(meta.get("name", "")), names)
        if wanted is None:
            continue
        path = f"/api/v1/namespaces/{meta.get('namespace')}/pods/{meta.get('name')}/status"
        try:
            kube.request("PATCH", path, body=adapters.gate_patch(pod, *wanted, now=now),
                         content_type="application/strategic-merge-patch+json")
            made += 1
        except ApiError as e:  # a conflict, the pod gone, or no right: the next reconcile tries again
            log.info("setting %s=%s on pod %s/%s failed: HTTP %s", adapters.GATE, wanted[0], meta.get("namespace"),
                     meta.get("name"), e.status)
    return made
