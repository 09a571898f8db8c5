"""The running operator: thin kopf handlers that all call one idempotent reconcile.

Create/update/resume of a VLLMServer, a periodic timer, and events of its children
(a StatefulSet whose pods became ready, a Service deleted by hand) all end in
`Reconciler.reconcile(namespace, name)`, which reads the current state and converges.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
import time
from collections import defaultdict
from typing import Any, Optional

import kopf
import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from . import api, builders, telemetry
from .controller import apierrors, events, replan
from .informers import cache
from . import kopfext
from .kopfext import peering
from .autoscaler import actuator
from .controller.kube import PLURALS, ApiError, Kube, path_for
from .controller.reconcile import Reconciler
from .urlpolicy import URLPolicy

log = logging.getLogger("vllm_operator")

FINALIZER = f"{api.GROUP}/finalizer"
ANNOTATION_PREFIX = api.GROUP
CHILD_LABELS = {"app.kubernetes.io/managed-by": builders.MANAGED_BY}


class State:
    """What the handlers share: the reconciler, and one lock per server so reconciles never overlap."""

    def __init__(self) -> None:
        self.reconciler: Optional[Reconciler] = None
        self._locks: dict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
        self._guard = threading.Lock()

    def lock(self, namespace: str, name: str) -> threading.Lock:
        with self._guard:
            return self._locks[(namespace, name)]


STATE = State()
#: Seconds a replica's peering keep-alive holds (--peering-lifetime): bounds the HA takeover time.
PEERING_LIFETIME = peering.DEFAULT_LIFETIME
HEALTH = telemetry.Health()


def api_client() -> k8s.ApiClient:
    try:
        k8s_config.load_incluster_config()
    except k8s_config.ConfigException:
        k8s_config.load_kube_config()
    return k8s.ApiClient()


class UnsupportedKubernetes(RuntimeError):
    """The API server is older than api.MIN_KUBERNETES_VERSION."""


def server_version(kube: Kube, patience: float = 300.0) -> tuple[int, int]:
    """The API server's (major, minor), waiting out one that is not answering yet (it may be restarting)."""
    deadline, delay = time.monotonic() + patience, 1.0
    while True:
        try:
            return api.parse_kube_version(kube.request("GET", "/version"))
        except (urllib3.exceptions.HTTPError, OSError, ApiError) as e:
            if isinstance(e, ApiError) and e.status < 500 or time.monotonic() > deadline:
                raise
            log.warning("reading the API server's version failed (%s); retrying in %.0f s", e, delay)
            time.sleep(delay)
            delay = min(delay * 2, 15.0)


def check_server_version(kube: Kube) -> tuple[int, int]:
    """Refuse to run on a Kubernetes older than the declared minimum: its API server would reject the CRD's CEL
    rules or the objects the operator applies in ways that read as our bugs."""
    version = server_version(kube)
    if version < api.MIN_KUBERNETES_VERSION:
        want = ".".join(map(str, api.MIN_KUBERNETES_VERSION))
        raise UnsupportedKubernetes(
            f"the API server runs Kubernetes {version[0]}.{version[1]}; vllm-operator needs {want} or newer "
            f"(policy/v1, autoscaling/v2, CRD validation rules and ValidatingAdmissionPolicy): upgrade the cluster "
            "or use an older vllm-operator")
    return version


def url_policy(args: argparse.Namespace) -> URLPolicy:
    """What a spec's configURL and prometheusURL may name: the operator's own endpoints, the public Hub, and
    the prefixes its flags add."""
    return URLPolicy.from_settings(getattr(args, "allowed_config_url", None) or (),
                                   getattr(args, "allowed_prometheus_url", None) or (),
                                   hf_endpoint=getattr(args, "hf_endpoint", None),
                                   prometheus_url=getattr(args, "prometheus_url", None))


def make_reconciler(args: argparse.Namespace, client: Optional[k8s.ApiClient] = None) -> Reconciler:
    kube = Kube(client or api_client())
    check_server_version(kube)
    return Reconciler(kube, hf_endpoint=getattr(args, "hf_endpoint", None),
                      prometheus_url=getattr(args, "prometheus_url", None), events_of=events.FailureEvents(kube).of,
                      urls=url_policy(args),
                      replan_budget=replan.Budget(getattr(args, "replan_outdated_per_minute", 0.0) or 0.0))


def reconcile_result(result: Any) -> str:
    """The metrics label of one reconcile's outcome."""
    if result is None:
        return "gone"
    if not result.valid:
        return "invalid"
    return "applied" if result.applied or result.pruned or result.status_written else "unchanged"


def reconcile(namespace: str, name: str, logger: Any, retry: int = 0) -> None:
    """One reconcile under the server's lock. An apply the API server refuses is not an error here: the
    reconciler reports it as Degraded/ApiRejected and holds it back (apierrors.py); what is raised is retried by
    kopf after apierrors.retry_delay (`retry`: kopf's count of retries so far)."""
    reconciler = STATE.reconciler
    assert reconciler is not None, "operator not started"
    with STATE.lock(namespace, name):
        started = time.monotonic()
        try:
            result = reconciler.reconcile(namespace, name)
        except ApiError as e:
            telemetry.record_reconcile_error(str(e.status))
            telemetry.record_reconcile("error", time.monotonic() - started)
            raise kopf.TemporaryError(str(e), delay=apierrors.retry_delay(e.status, retry)) from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            # The API server is unreachable (restarting, network): retry soon, not after kopf's default minute.
            telemetry.record_reconcile_error(type(e).__name__)
            telemetry.record_reconcile("error", time.monotonic() - started)
            raise kopf.TemporaryError(f"the API server is unreachable: {e}", delay=3) from e
        except Exception as e:
            telemetry.record_reconcile_error(type(e).__name__)
            telemetry.record_reconcile("error", time.monotonic() - started)
            raise
        telemetry.record_reconcile(reconcile_result(result), time.monotonic() - started)
        if result is None:
            telemetry.forget_server(namespace, name)
        else:
            telemetry.record_server(namespace, name, result.ready, result.replicas, result.ready_replicas)
    if result is not None and (result.applied or result.pruned or not result.valid):
        logger.info("reconciled %s/%s: applied=%s pruned=%s valid=%s", namespace, name, result.applied,
                    result.pruned, result.valid)


# --------------------------------------------------------------------------- handlers
@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER  # kopf's storages: kopfext.install() in run()
    settings.posting.level = logging.WARNING  # our own events say what happened; kopf's only on trouble
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.execution.max_workers = 8
    settings.peering.lifetime = PEERING_LIFETIME


@kopf.on.startup()
async def watch_event_loop(**_: Any) -> None:
    HEALTH.loop = asyncio.get_running_loop()  # /healthz checks that this loop still answers


@kopf.on.resume(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.create(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.update(api.GROUP, api.VERSION, api.PLURAL)
def on_change(namespace: str, name: str, logger: Any, **kwargs: Any) -> None:
    _bind_indices(kwargs)
    reconcile(namespace, name, logger, retry=kwargs.get("retry") or 0)


def on_timer(namespace: str, name: str, logger: Any, **kwargs: Any) -> None:
    _bind_indices(kwargs)
    reconcile(namespace, name, logger, retry=kwargs.get("retry") or 0)


def _on_child(body: Any, event: Any, logger: Any, kwargs: Optional[dict] = None) -> None:
    _bind_indices(kwargs or {})
    meta = body.get("metadata", {})
    server = (meta.get("labels") or {}).get(builders.SERVER_LABEL)
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("kind") == api.KIND]
    if not server or not owners:
        return
    objects = STATE.reconciler.objects if STATE.reconciler else None
    if objects is not None and (event or {}).get("type") == "DELETED":
        objects.forget(body)  # deleted by hand: our own write's copy must not stand in for it
    elif objects is not None and objects.echoes_own_write(body):
        return  # our own apply coming back: the reconcile that sent it has used its answer already
    reconcile(meta["namespace"], server, logger)


for _group, _version, _plural in (("apps", "v1", "statefulsets"), ("apps", "v1", "daemonsets"),
                                  ("", "v1", "services")):
    kopf.on.event(_group, _version, _plural, labels=CHILD_LABELS)(
        lambda body, event, logger, **kw: _on_child(body, event, logger, kw))


# --------------------------------------------------------------------------- watch-fed caches (cache.py)
def _bind_indices(kwargs: dict) -> None:
    objects = STATE.reconciler.objects if STATE.reconciler else None
    if objects is not None and not objects.ready:
        objects.bind(kwargs)


def _note_indexed(index_id: str, body: Any) -> None:
    objects = STATE.reconciler.objects if STATE.reconciler else None
    if objects is not None:
        objects.note_indexed(index_id, body)


async def _index_server(body: Any, **_: Any) -> Any:
    _note_indexed(cache.SERVERS_INDEX, body)
    entry = cache.index_server(body)
    # kopf keeps this body (the last event's, for timers and daemons) as long as the server exists; its
    # managedFields, a nested dict per field per manager, are most of it and nothing here reads them.
    cache.drop_managed_fields(body)
    return entry


async def _index_child(body: Any, **_: Any) -> Any:
    _note_indexed(cache.CHILDREN_INDEX, body)
    return cache.index_child(body)


async def _index_pod(body: Any, **_: Any) -> Any:
    _note_indexed(cache.PODS_INDEX, body)
    return cache.index_pod(body)


def register_indices(reconciler: Reconciler) -> None:
    """kopf indices of the servers, every kind the reconciler manages, and their pods: reconciles read
    these instead of GET/LIST (bench/scale.py), and kopf runs no handler before they hold a full listing."""
    reconciler.objects = cache.WatchedObjects()
    kopf.index(api.GROUP, api.VERSION, api.PLURAL, id=cache.SERVERS_INDEX)(_index_server)
    for api_version, kind in reconciler.managed_kinds():
        group, _, version = api_version.rpartition("/")
        kopf.index(group, version, PLURALS[(api_version, kind)], id=cache.CHILDREN_INDEX,
                   labels=CHILD_LABELS)(_index_child)
    kopf.index("", "v1", "pods", id=cache.PODS_INDEX, labels=CHILD_LABELS)(_index_pod)


def _audit_lists(reconciler: Reconciler, index_id: str,
                 namespaces: list[str]) -> list[tuple[str, str, Optional[str], Optional[str]]]:
    """(apiVersion, kind, namespace, label selector) of the LISTs that audit one index: what kopf watches."""
    selector = ",".join(f"{k}={v}" for k, v in CHILD_LABELS.items())
    if index_id == cache.SERVERS_INDEX:
        kinds: list[tuple[str, str, Optional[str]]] = [(f"{api.GROUP}/{api.VERSION}", api.KIND, None)]
    elif index_id == cache.CHILDREN_INDEX:
        kinds = [(api_version, kind, selector) for api_version, kind in reconciler.managed_kinds()]
    else:
        kinds = [("v1", "Pod", selector)]
    return [(api_version, kind, namespace, sel) for api_version, kind, sel in kinds
            for namespace in (namespaces or [None])]


def audit_index(reconciler: Reconciler, index_id: str, namespaces: list[str]) -> list[dict]:
    """One LIST per watched kind (and namespace): what the index still holds but the cluster no longer
    has is marked gone (cache.py); the next resync of its server repairs what that hid."""
    listings = []
    for api_version, kind, namespace, selector in _audit_lists(reconciler, index_id, namespaces):
        try:
            listing = reconciler.kube.request("GET", path_for(api_version, kind, namespace),
                                              query=[("labelSelector", selector)] if selector else [])
        except ApiError as e:
            if e.status == 404:  # a kind this cluster does not serve (KEDA's, when KEDA is not installed)
                continue
            raise
        listings.append(cache.Listing(listing.get("items") or [], cache.resource_version(listing),
                                      None if index_id == cache.PODS_INDEX else kind, namespace))
    gone = reconciler.objects.audit(index_id, listings)
    for obj in gone:
        meta = obj["metadata"]
        log.warning("%s %s/%s was deleted while the watch was down (kopf re-listed without telling): "
                    "no longer read from the cache", obj.get("kind") or "Pod", meta.get("namespace"),
                    meta.get("name"))
    log.info("cache audit of %s: %d objects listed, %d deleted unseen", index_id,
             sum(len(listing.items) for listing in listings), len(gone))
    return gone


def _audit_forever(reconciler: Reconciler, namespaces: list[str], stop: threading.Event) -> None:
    """Audit an index when kopf re-listed its kinds, and every index every AUDIT_INTERVAL_SECONDS."""
    objects = reconciler.objects
    last_full = time.monotonic()
    while not stop.wait(1.0):
        if objects is None or not objects.ready:
            continue
        due = set(objects.audits_due())
        if time.monotonic() - last_full >= cache.AUDIT_INTERVAL_SECONDS:
            due |= {cache.SERVERS_INDEX, cache.CHILDREN_INDEX, cache.PODS_INDEX}
            last_full = time.monotonic()
        for index_id in sorted(due):
            try:
                audit_index(reconciler, index_id, namespaces)
            except Exception as e:  # the API server may be away again: try once more later
                log.warning("cache audit of %s failed (%s); retrying", index_id, e)
                objects.relisted(index_id)


def start_audits(reconciler: Reconciler, namespaces: list[str]) -> threading.Event:
    stop = threading.Event()
    threading.Thread(target=_audit_forever, args=(reconciler, namespaces, stop), name="cache-audit",
                     daemon=True).start()
    return stop


# --------------------------------------------------------------------------- entry point
def run(args: argparse.Namespace) -> int:
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.JSON if args.log_format == "json"
                   else kopf.LogFormat.FULL)
    # The periodic resync repairs drift that no watch event announces; its interval is a flag.
    kopf.timer(api.GROUP, api.VERSION, api.PLURAL, interval=args.resync_seconds, initial_delay=args.resync_seconds,
               sharp=False)(on_timer)
    STATE.reconciler = make_reconciler(args)
    register_indices(STATE.reconciler)
    # One queue-based autoscaler loop per VLLMServer with autoscaling.mode Operator (autoscaler/actuator.py).
    scaling = actuator.register(STATE.reconciler.kube, default_prometheus_url=getattr(args, "prometheus_url", None),
                                objects=STATE.reconciler.objects, urls=STATE.reconciler.urls)
    # status.kvCapacity: what vLLM allocated beside the plan, read through the autoscaler's bounded scrape pool.
    STATE.reconciler.kv_capacity = scaling.sources.kv_capacity
    namespaces = list(args.namespace)
    audits = start_audits(STATE.reconciler, namespaces)
    priority = None
    if args.peering is not None:  # HA: one active replica (peering.py, docs/ha.md)
        global PEERING_LIFETIME
        PEERING_LIFETIME = getattr(args, "peering_lifetime", None) or peering.DEFAULT_LIFETIME
        peering.ensure_peering(STATE.reconciler.kube, args.peering, namespaces)
        priority = getattr(args, "peering_priority", None)
        priority = peering.default_priority() if priority is None else priority
        log.info("peering %r with priority %d, keep-alive lifetime %d s", args.peering, priority, PEERING_LIFETIME)
    settings = kopf.OperatorSettings()
    # Every adaptation of kopf, each behind a self-test (kopfext/): the linear start-up wait for the indices, kopf's
    # storages (one patch per server), its HTTP connections in a pool sized by the watches (servers, each managed
    # kind, pods, peering).
    watched = len(STATE.reconciler.managed_kinds()) + 3
    kopfext.install(settings, finalizer=FINALIZER, prefix=ANNOTATION_PREFIX,
                    connections=kopfext.session.connection_limit(watched, len(namespaces)))
    settings.scanning.disabled = getattr(args, "disable_scanning", False)
    # /metrics, /healthz and /readyz on one port (telemetry.py); kopf's own liveness endpoint stays off.
    server = telemetry.serve(args.health_port, HEALTH) if args.health_port else None
    try:
        kopf.run(
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=args.peering is None,
            peering_name=args.peering,
            priority=priority,
            ready_flag=HEALTH.ready,
            settings=settings,
        )
    finally:
        audits.set()
        if server is not None:
            server.shutdown()
    return 0
