"""The running operator: thin kopf handlers that all call one idempotent reconcile.

Create/update/resume of a VLLMServer, a periodic timer, and events of its children
(a StatefulSet whose pods became ready, a Service deleted by hand) all end in
`Reconciler.reconcile(namespace, name)`, which reads the current state and converges.
No module-level state: `run()` builds one `Operator` (what the handlers share) and
`register_handlers` puts every handler on one kopf registry.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextvars
import functools
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import kopf
import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from . import adapters as lora, api, builders, chattemplate, kopfext, telemetry
from .sources import hub
from .controller import adapters as adapter_sync, replan
from .kube import apierrors, events
from .informers import cache, kopfindex
from .informers.reader import ReadFailed
from . import peering
from .autoscaler import actuator, ownership
from .kube.client import ApiError, Kube
from .controller.pod_admission import PodAdmission
from .controller.reconcile import Reconciler
from .urlpolicy import URLPolicy

log = logging.getLogger("vllm_operator")

FINALIZER = f"{api.GROUP}/finalizer"
ANNOTATION_PREFIX = api.GROUP
CHILD_LABELS = kopfindex.CHILD_LABELS
#: how often kopf looks again at a deleted server whose resync timer is still stopping (kopf: 60 s)
DELETE_POLL_SECONDS = 2.0


def api_client() -> k8s.ApiClient:
    try:
        k8s_config.load_incluster_config()
    except k8s_config.ConfigException:
        k8s_config.load_kube_config()
    return pin_proxy(k8s.ApiClient())


def pin_proxy(client: k8s.ApiClient) -> k8s.ApiClient:
    """Keep the proxy the client was built with from being looked up in the environment again on every request.

    The config loaders install a hook that refreshes the token before each request and sets the host again
    with it; the client's host setter then reads the proxy settings from the whole environment (in a pod:
    every Service's variables in its namespace). That was a fifth of the operator's CPU in bench/scale.py. The
    connection pool was made with the proxy chosen when the client was built and never changes, so the value
    is set once, explicitly: the token is still refreshed, the proxy used is the same."""
    configuration = client.configuration
    configuration.proxy = configuration.proxy  # the setter stops the per-request environment lookup
    return client


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


def hub_endpoint(args: argparse.Namespace) -> Optional[str]:
    """The Hub models outside the catalog are looked up on (hub.endpoint_setting), None offline."""
    return hub.endpoint_setting(getattr(args, "hf_endpoint", None), getattr(args, "offline", False))


def url_policy(args: argparse.Namespace) -> URLPolicy:
    """What a spec's configURL and prometheusURL may name: the operator's own endpoints, the public Hub, and
    the prefixes its flags add."""
    return URLPolicy.from_settings(getattr(args, "allowed_config_url", None) or (),
                                   getattr(args, "allowed_prometheus_url", None) or (),
                                   hf_endpoint=hub_endpoint(args),
                                   prometheus_url=getattr(args, "prometheus_url", None))


def template_limits(args: argparse.Namespace) -> chattemplate.Limits:
    """What checking chat templates may cost (--chat-template-*; chattemplate.Limits' defaults otherwise)."""
    defaults = chattemplate.Limits()
    return chattemplate.Limits(
        memory_bytes=int((getattr(args, "chat_template_memory_mib", None) or defaults.memory_bytes // 2**20) * 2**20),
        concurrency=getattr(args, "chat_template_checks", None) or defaults.concurrency,
        per_minute=getattr(args, "chat_template_checks_per_minute", None) or defaults.per_minute)


def counted_check(template: str, limits: chattemplate.Limits) -> chattemplate.Verdict:
    """One chat template checked in a child (chattemplate._run), counted in vllm_operator_chat_template_checks."""
    verdict = chattemplate._run(template, limits)
    telemetry.record_chat_template_check("error" if not verdict.definitive else "refused" if verdict.problem else "ok")
    return verdict


def make_reconciler(args: argparse.Namespace, client: Optional[k8s.ApiClient] = None) -> Reconciler:
    kube = Kube(client or api_client())
    check_server_version(kube)
    return Reconciler(kube, hf_endpoint=hub_endpoint(args),
                      templates=chattemplate.Checker(template_limits(args), run=counted_check),
                      hf_token=hub.token_reader(getattr(args, "hf_token_file", None)),
                      hf_token_repos=tuple(getattr(args, "hf_token_repo", None) or ()),
                      prometheus_url=getattr(args, "prometheus_url", None), events_of=events.FailureEvents(kube).of,
                      urls=url_policy(args), pod_admission=PodAdmission(),
                      replan_budget=replan.Budget(getattr(args, "replan_outdated_per_minute", 0.0) or 0.0))


def reconcile_result(result: Any) -> str:
    """The metrics label of one reconcile's outcome."""
    if result is None:
        return "gone"
    if result.pending:
        return "pending"
    if not result.valid:
        return "invalid"
    return "applied" if result.applied or result.pruned or result.status_written else "unchanged"


@dataclass
class Operator:
    """What the handlers share, built once in `run()`: the reconciler, the watch-fed copies it reads
    (informers/), the autoscaler's context, the health endpoints' state, one lock per server so reconciles
    never overlap, and the settings kopf is configured with. Its handlers are registered on a kopf registry by
    `register_handlers`, the one place that does so."""

    reconciler: Reconciler
    objects: cache.WatchedObjects = field(default_factory=cache.WatchedObjects)
    scaling: Optional[actuator.Context] = None
    health: telemetry.Health = field(default_factory=telemetry.Health)
    #: Seconds a replica's peering keep-alive holds (--peering-lifetime): bounds the HA takeover time.
    peering_lifetime: int = peering.DEFAULT_LIFETIME
    _locks: dict[tuple[str, str], threading.Lock] = field(default_factory=lambda: defaultdict(threading.Lock),
                                                          repr=False)
    _guard: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: The threads kopf runs sync handlers on (set by `configure`; None: the event loop's default executor).
    executor: Optional[concurrent.futures.Executor] = field(default=None, repr=False)

    def nudge(self, server: tuple[str, str], delay: float) -> None:
        """Reconcile this server again in `delay` seconds, on kopf's threads (a chat template's check ended, or
        its server's rate lets the next one run). Safe from any thread; before kopf's loop runs, the periodic
        resync does it."""
        loop = self.health.loop
        if loop is None or loop.is_closed():
            return
        call = functools.partial(self._nudged, *server)

        def later() -> None:
            loop.call_later(max(delay, 0.0), lambda: loop.run_in_executor(self.executor, call))
        try:
            loop.call_soon_threadsafe(later)
        except RuntimeError:  # the loop closed meanwhile: the operator is stopping
            pass

    def _nudged(self, namespace: str, name: str) -> None:
        try:
            self.reconcile(namespace, name, log)
        except Exception as e:  # noqa: BLE001 - kopf's next event or resync retries it; nothing waits for this
            log.warning("reconcile of %s/%s after a nudge failed: %s", namespace, name, e)

    def on_pod(self, body: Any) -> None:
        """A pod event (on kopf's event loop): a pod whose adapters' readiness gate waits on the operator (its vLLM
        now answers, or restarted under a True gate) gets its server reconciled at once, which starts the pod's
        adapter sync; the sync's end reconciles again and sets the gate. Other pod events cost nothing."""
        meta = body.get("metadata") or {}
        server = (meta.get("labels") or {}).get(builders.SERVER_LABEL)
        if server and lora.gate_due(body):
            self.nudge((meta.get("namespace", ""), server), 0)

    def lock(self, namespace: str, name: str) -> threading.Lock:
        with self._guard:
            return self._locks[(namespace, name)]

    def reconcile(self, namespace: str, name: str, logger: Any, retry: int = 0) -> None:
        """One reconcile under the server's lock. An apply the API server refuses is not an error here: the
        reconciler reports it as Degraded/ApiRejected and holds it back (apierrors.py); what is raised is retried
        by kopf after apierrors.retry_delay (`retry`: kopf's count of retries so far). A copy that could not be
        read (reader.ReadFailed) is retried soon: the server is not taken for gone."""
        with self.lock(namespace, name):
            started = time.monotonic()
            try:
                result = self.reconciler.reconcile(namespace, name)
            except ApiError as e:
                telemetry.record_reconcile_error(str(e.status))
                telemetry.record_reconcile("error", time.monotonic() - started)
                raise kopf.TemporaryError(str(e), delay=apierrors.retry_delay(e.status, retry)) from e
            except (urllib3.exceptions.HTTPError, OSError, ReadFailed) as e:
                # The API server is unreachable (restarting, network), or the watch-fed copy could not be read:
                # retry soon, not after kopf's default minute.
                telemetry.record_reconcile_error(type(e).__name__)
                telemetry.record_reconcile("error", time.monotonic() - started)
                what = "the watch-fed copy could not be read" if isinstance(e, ReadFailed) else \
                    "the API server is unreachable"
                raise kopf.TemporaryError(f"{what}: {e}", delay=3) from e
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

    # ---- handlers (registered by register_handlers)
    def configure(self, settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = FINALIZER  # kopf's storages: kopfext.install() in run()
        settings.posting.level = logging.WARNING  # our own events say what happened; kopf's only on trouble
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.execution.max_workers = 8
        # A server deleted while its resync timer's reconcile runs (or waits for one of the 8 threads) keeps its
        # finalizer until that timer has stopped, and kopf looks again only after cancellation_polling: 60 s by
        # default, which a loaded run met as a `kubectl delete --wait` of 60 s that timed out. A reconcile ends in
        # seconds, so kopf looks again every DELETE_POLL_SECONDS (one patch of the object each time it looks).
        settings.background.cancellation_polling = DELETE_POLL_SECONDS
        settings.peering.lifetime = self.peering_lifetime
        self.executor = settings.execution.executor  # kopf's threads, for on_child's reconciles

    async def watch_event_loop(self, **_: Any) -> None:
        self.health.loop = asyncio.get_running_loop()  # /healthz checks that this loop still answers

    def bind(self, kwargs: dict) -> None:
        """Hand kopf's indices (in every handler's kwargs) to the watch-fed copies, once."""
        if not self.objects.ready:
            self.objects.bind(kwargs)

    def on_change(self, *, namespace: Any, name: Any, logger: Any, **kwargs: Any) -> None:
        self.bind(kwargs)
        self.reconcile(namespace, name, logger, retry=kwargs.get("retry") or 0)

    def on_timer(self, *, namespace: Any, name: Any, logger: Any, **kwargs: Any) -> None:
        self.bind(kwargs)
        self.reconcile(namespace, name, logger, retry=kwargs.get("retry") or 0)

    async def on_child(self, body: Any, event: Any, logger: Any, **kwargs: Any) -> None:
        """A child's event, decided on kopf's event loop: one that brings nothing (not a server's child, or the
        echo of the operator's own apply) ends here; a change is reconciled on kopf's threads, as the sync
        handlers are. kopf queues every sync handler call for its threads, and each queued call holds its state
        until a thread is free: at 1,000 servers most of the calls in that queue were child events
        (bench/README.md, run E)."""
        self.bind(kwargs)
        meta = body.get("metadata", {})
        server = (meta.get("labels") or {}).get(builders.SERVER_LABEL)
        owners = [o for o in meta.get("ownerReferences") or [] if o.get("kind") == api.KIND]
        if not server or not owners:
            return
        if (event or {}).get("type") == "DELETED":
            self.objects.forget(body)  # deleted by hand: our own write's copy must not stand in for it
        elif self.objects.echoes_own_write(body):
            return  # our own apply coming back: the reconcile that sent it has used its answer already
        call = functools.partial(contextvars.copy_context().run, self.reconcile, meta["namespace"], server, logger)
        await asyncio.get_running_loop().run_in_executor(self.executor, call)

    async def autoscaler(self, **kwargs: Any) -> None:
        self.bind(kwargs)
        assert self.scaling is not None, "autoscaler not set up"
        await self.scaling.daemon(**kwargs)


def register_handlers(registry: kopf.OperatorRegistry, op: Operator, *, resync_seconds: float) -> None:
    """Every kopf handler of the operator, on one registry (handler ids as before: progress annotations and
    index kwargs keep their names)."""
    kopf.on.startup(id="configure", registry=registry)(op.configure)
    kopf.on.startup(id="watch_event_loop", registry=registry)(op.watch_event_loop)
    # Create/update/resume of a server, its periodic resync (repairs drift no watch event announces), and events
    # of its children all end in one reconcile.
    for on in (kopf.on.resume, kopf.on.create, kopf.on.update):
        on(api.GROUP, api.VERSION, api.PLURAL, id="on_change", registry=registry)(op.on_change)
    kopf.timer(api.GROUP, api.VERSION, api.PLURAL, interval=resync_seconds, initial_delay=resync_seconds,
               sharp=False, id="on_timer", registry=registry)(op.on_timer)
    for group, version, plural in (("apps", "v1", "statefulsets"), ("apps", "v1", "daemonsets"),
                                   ("", "v1", "services")):
        kopf.on.event(group, version, plural, labels=CHILD_LABELS, id=f"on_child/{plural}", registry=registry)(op.on_child)
    # The watch-fed copies the reconciler and the autoscaler read (informers/kopfindex.py).
    kopfindex.register(registry, op.objects, op.reconciler.managed_kinds(), on_pod=op.on_pod)
    # One queue-based autoscaler loop per VLLMServer with autoscaling.mode Operator (autoscaler/actuator.py).
    if op.scaling is not None:
        kopf.daemon(api.GROUP, api.VERSION, api.PLURAL, id="autoscaler", when=ownership.runs_operator_loop,
                    cancellation_timeout=30.0, registry=registry)(op.autoscaler)

def _reconciles_on(op: Operator) -> Callable[[str, str], None]:
    """What the adapter sync calls when a pod's adapters changed: one reconcile of that server on a thread of its
    own (one at a time, so a burst of syncs queues instead of multiplying threads), which writes the status."""
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="adapters-notify")

    def reconcile(namespace: str, name: str) -> None:
        try:
            op.reconcile(namespace, name, log)
        except Exception as e:  # noqa: BLE001 - the timer's resync reconciles again
            log.info("reconcile of %s/%s after an adapter change failed: %s", namespace, name, e)

    def notify(namespace: str, name: str) -> None:
        pool.submit(reconcile, namespace, name)

    return notify


# --------------------------------------------------------------------------- entry point
def run(args: argparse.Namespace) -> int:
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.JSON if args.log_format == "json"
                   else kopf.LogFormat.FULL)
    metrics = telemetry.start()  # the operator's metrics, registered now (telemetry.py); served below
    reconciler = make_reconciler(args)
    op = Operator(reconciler)
    if reconciler.templates is not None:
        reconciler.templates.nudge = op.nudge
    reconciler.reader = op.objects  # reconciles read the watch-fed copies (informers/cache.py)
    op.scaling = actuator.Context.create(reconciler.kube, op.objects,
                                         default_prometheus_url=getattr(args, "prometheus_url", None),
                                         urls=reconciler.urls)
    # status.kvCapacity: what vLLM allocated beside the plan, read through the autoscaler's bounded scrape pool.
    reconciler.kv_capacity = op.scaling.sources.kv_capacity
    # spec.adapters loaded and unloaded on the ready pods in a bounded pool; a change it sees reconciles the server.
    reconciler.adapter_sync = adapter_sync.AdapterSync(notify=_reconciles_on(op))
    namespaces = list(args.namespace)
    registry = kopf.OperatorRegistry()
    register_handlers(registry, op, resync_seconds=args.resync_seconds)
    audits = kopfindex.start_audits(reconciler.kube, op.objects, reconciler.managed_kinds(), namespaces)
    priority = None
    if args.peering is not None:  # HA: one active replica (peering.py, docs/ha.md)
        op.peering_lifetime = getattr(args, "peering_lifetime", None) or peering.DEFAULT_LIFETIME
        peering.ensure_peering(reconciler.kube, args.peering, namespaces)
        priority = getattr(args, "peering_priority", None)
        priority = peering.default_priority() if priority is None else priority
        log.info("peering %r with priority %d, keep-alive lifetime %d s", args.peering, priority,
                 op.peering_lifetime)
    settings = kopf.OperatorSettings()
    # Every adaptation of kopf, each behind a self-test (kopfext/): the linear start-up wait for the indices, kopf's
    # storages (one patch per server), its HTTP connections in a pool sized by the watches (servers, each managed
    # kind, pods, peering).
    watched = len(reconciler.managed_kinds()) + 3
    kopfext.install(settings, finalizer=FINALIZER, prefix=ANNOTATION_PREFIX,
                    connections=kopfext.session.connection_limit(watched, len(namespaces)), registry=registry)
    settings.scanning.disabled = getattr(args, "disable_scanning", False)
    # /metrics, /healthz and /readyz on one port (telemetry.py); kopf's own liveness endpoint stays off.
    access = telemetry.MetricsAccess(token_file=getattr(args, "metrics_token_file", None),
                                     public_server_series=getattr(args, "metrics_public_server_series", False))
    server = telemetry.serve(args.health_port, op.health, registry=metrics.registry,
                             access=access) if args.health_port else None
    try:
        kopf.run(
            registry=registry,
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=args.peering is None,
            peering_name=args.peering,
            priority=priority,
            ready_flag=op.health.ready,
            settings=settings,
        )
    finally:
        audits.set()
        if server is not None:
            server.shutdown()
    return 0
