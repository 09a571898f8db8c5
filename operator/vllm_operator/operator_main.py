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
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from . import api, builders, metrics
from .autoscaler import actuator
from .kube import ApiError, Kube
from .reconcile import Reconciler

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
HEALTH = metrics.Health()


def api_client() -> k8s.ApiClient:
    try:
        k8s_config.load_incluster_config()
    except k8s_config.ConfigException:
        k8s_config.load_kube_config()
    return k8s.ApiClient()


def make_reconciler(args: argparse.Namespace, client: Optional[k8s.ApiClient] = None) -> Reconciler:
    kube = Kube(client or api_client())
    pdb = "policy/v1" if kube.serves("policy/v1") else "policy/v1beta1"  # policy/v1 arrived in Kubernetes 1.21
    # autoscaling/v2 arrived in 1.23; v2beta2 (same fields for what we emit) serves older clusters.
    hpa = "autoscaling/v2" if kube.serves("autoscaling/v2") else "autoscaling/v2beta2"
    return Reconciler(kube, hf_endpoint=getattr(args, "hf_endpoint", None),
                      prometheus_url=getattr(args, "prometheus_url", None), pdb_api_version=pdb,
                      hpa_api_version=hpa)


def reconcile_result(result: Any) -> str:
    """The metrics label of one reconcile's outcome."""
    if result is None:
        return "gone"
    if not result.valid:
        return "invalid"
    return "applied" if result.applied or result.pruned or result.status_written else "unchanged"


def reconcile(namespace: str, name: str, logger: Any) -> None:
    reconciler = STATE.reconciler
    assert reconciler is not None, "operator not started"
    with STATE.lock(namespace, name):
        started = time.monotonic()
        try:
            result = reconciler.reconcile(namespace, name)
        except ApiError as e:
            metrics.record_reconcile_error(str(e.status))
            metrics.record_reconcile("error", time.monotonic() - started)
            if e.status in (409, 429) or e.status >= 500:
                raise kopf.TemporaryError(str(e), delay=2) from e
            raise kopf.TemporaryError(str(e), delay=10) from e
        except Exception as e:
            metrics.record_reconcile_error(type(e).__name__)
            metrics.record_reconcile("error", time.monotonic() - started)
            raise
        metrics.record_reconcile(reconcile_result(result), time.monotonic() - started)
    if result is not None and (result.applied or result.pruned or not result.valid):
        logger.info("reconciled %s/%s: applied=%s pruned=%s valid=%s", namespace, name, result.applied,
                    result.pruned, result.valid)


# --------------------------------------------------------------------------- handlers
@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration")
    settings.posting.level = logging.WARNING  # our own events say what happened; kopf's only on trouble
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.execution.max_workers = 8


@kopf.on.startup()
async def watch_event_loop(**_: Any) -> None:
    HEALTH.loop = asyncio.get_running_loop()  # /healthz checks that this loop still answers


@kopf.on.resume(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.create(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.update(api.GROUP, api.VERSION, api.PLURAL)
def on_change(namespace: str, name: str, logger: Any, **_: Any) -> None:
    reconcile(namespace, name, logger)


def on_timer(namespace: str, name: str, logger: Any, **_: Any) -> None:
    reconcile(namespace, name, logger)


def _on_child(body: Any, event: Any, logger: Any) -> None:
    meta = body.get("metadata", {})
    server = (meta.get("labels") or {}).get(builders.SERVER_LABEL)
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("kind") == api.KIND]
    if not server or not owners:
        return
    reconcile(meta["namespace"], server, logger)


for _group, _version, _plural in (("apps", "v1", "statefulsets"), ("apps", "v1", "daemonsets"),
                                  ("", "v1", "services")):
    kopf.on.event(_group, _version, _plural, labels=CHILD_LABELS)(
        lambda body, event, logger, **_: _on_child(body, event, logger))


# --------------------------------------------------------------------------- entry point
def run(args: argparse.Namespace) -> int:
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.JSON if args.log_format == "json"
                   else kopf.LogFormat.FULL)
    # The periodic resync repairs drift that no watch event announces; its interval is a flag.
    kopf.timer(api.GROUP, api.VERSION, api.PLURAL, interval=args.resync_seconds, initial_delay=args.resync_seconds,
               sharp=False)(on_timer)
    STATE.reconciler = make_reconciler(args)
    # One queue-based autoscaler loop per VLLMServer with autoscaling.mode Operator (autoscaler/actuator.py).
    actuator.register(STATE.reconciler.kube, default_prometheus_url=getattr(args, "prometheus_url", None))
    namespaces = list(args.namespace)
    settings = kopf.OperatorSettings()
    settings.scanning.disabled = getattr(args, "disable_scanning", False)
    # /metrics, /healthz and /readyz on one port (metrics.py); kopf's own liveness endpoint stays off.
    server = metrics.serve(args.health_port, HEALTH) if args.health_port else None
    try:
        kopf.run(
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=args.peering is None,
            peering_name=args.peering,
            ready_flag=HEALTH.ready,
            settings=settings,
        )
    finally:
        if server is not None:
            server.shutdown()
    return 0
