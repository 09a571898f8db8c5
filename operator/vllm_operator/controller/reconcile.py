"""Reconcile one VLLMServer: plan, apply the children with server-side apply, prune, report status. This module
is the entry and its steps; applying and pruning the children is apply.py's (mixed into the Reconciler), what the
status says and which Events it emits is server_status.py's (pure).

Level-based and idempotent: every call reads the current object and its children and
converges them on what the spec wants, whatever happened before (operator restarts,
hand edits, deleted children). Writes happen only when something differs: a child is
applied only when its desired fields are not already live, and status only when it
changed. The current state is read through a reader (informers/reader.py): in the operator the
watch-fed copies (cache.py), so a no-op resync sends no request at all (bench/scale.py counts
them); elsewhere the API server itself. A copy that cannot be read raises (reader.ReadFailed):
the reconcile is retried, never read as "the server is gone".
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from .. import api, bounds, builders, chattemplate, documents, pipeline, planner, podsecurity, server_status
from . import adapters, failures, kvcapacity, replan
from .pod_admission import PodAdmission
from .apply import BLOCKED_REASONS, NAME_CONFLICT, WORKLOAD_KINDS, Applier, Refusal, name_conflict_message
from .drift import with_hash
from ..kube import events
from ..sources import model_facts, vllm_metrics
from ..autoscaler import ownership
from ..informers.reader import DirectReader, Reader
from ..conditions import Conditions, extra_args_unchecked
from ..kube.client import ApiError, Kube
from ..urlpolicy import URLPolicy

log = logging.getLogger("vllm_operator.controller.reconcile")

KEDA_API_VERSION = "keda.sh/v1alpha1"
LWS_NOT_INSTALLED = "LeaderWorkerSetNotInstalled"
#: How long the answer to "does this cluster serve KEDA's ScaledObject?" is trusted.
DISCOVERY_TTL_SECONDS = 30.0
#: How long a namespace's labels (its Pod Security level) are trusted: a no-op resync reads none.
NAMESPACE_TTL_SECONDS = 300.0
COMPONENT = "vllm-operator"


#: The Routing condition's reason where the cluster lacks the Inference Extension's or Gateway API's CRDs.
ROUTING_NOT_INSTALLED = "RoutingAPINotInstalled"
#: The kinds spec.routing emits (builders.build_routing), watched and pruned like the other children.
ROUTING_KINDS = [("v1", "ServiceAccount"), ("rbac.authorization.k8s.io/v1", "Role"),
                 ("rbac.authorization.k8s.io/v1", "RoleBinding"), ("apps/v1", "Deployment"),
                 (builders.POOL_API_VERSION, "InferencePool"), (builders.ROUTE_API_VERSION, "HTTPRoute")]


def routing_names(pool: str) -> set[tuple[str, str]]:
    """(kind, name) of a pool's picker objects."""
    name = builders.picker_name(pool)
    return {(k, name) for k in ("ServiceAccount", "Role", "RoleBinding", "Deployment", "Service")}


def routing_not_installed_message(missing: list[str]) -> str:
    what = []
    if builders.POOL_API_VERSION in missing:
        what.append(f"{builders.POOL_API_VERSION} InferencePools: install the Gateway API Inference Extension's "
                    "CRDs (release v1.2.0: its manifests.yaml, docs/routing.md)")
    if builders.ROUTE_API_VERSION in missing:
        what.append(f"{builders.ROUTE_API_VERSION} HTTPRoutes: install the Gateway API's CRDs (or your gateway's, "
                    "which bundle them)")
    return ("this cluster does not serve " + "; nor ".join(what)
            + ". Nothing of spec.routing that needs them is applied; the server is reached on its Service meanwhile")


def utcnow() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------- pure helpers
def lws_missing_message(spec: api.VLLMServerSpec, max_nodes: Optional[int] = None) -> str:
    """`spec`: the plan's (spec.nodes the layout); `max_nodes`: the bound it was chosen under, if any."""
    field = f"spec.maxNodes {max_nodes} chose {spec.nodes} nodes (the fewest that fit): that" if max_nodes else \
        f"spec.nodes {spec.nodes}"
    other = "" if max_nodes else ", or set nodes: 1"
    return (f"{field} runs each replica as a group of {spec.nodes} pods on a LeaderWorkerSet, but "
            f"this cluster does not serve {builders.LWS_API_VERSION} LeaderWorkerSets: install LeaderWorkerSet "
            "(sigs.k8s.io/lws, v0.8.0 or later: kubectl apply --server-side -f https://github.com/kubernetes-sigs/"
            f"lws/releases/download/v0.8.0/manifests.yaml){other}. Nothing is applied until then")


# --------------------------------------------------------------------------- reconciler
@dataclass
class Result:
    """What one reconcile did (for logs, metrics and tests)."""

    valid: bool = True
    applied: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    status_written: bool = False
    events: list[tuple[str, str, str]] = field(default_factory=list)
    ready: bool = False
    """The Ready condition this reconcile wrote is True (for the operator's vllm_operator_server_ready)."""
    replicas: int = 0
    ready_replicas: int = 0
    outdated: Optional[str] = None
    """What a re-plan would change, when the workload was kept on its running plan (replan.py)."""
    pending: bool = False
    """The chat template waits for its check (chattemplate.Queued): nothing was decided, nothing written."""


@dataclass
class Pass:
    """One reconcile of one server: what it read and what it has decided so far, handed from step to step."""

    body: dict[str, Any]
    status: dict[str, Any]
    """The live status (a copy), compared with the new one at the end."""
    conditions: Conditions
    """The new status's conditions, at the server's generation and the reconcile's time."""
    result: Result
    spec: Optional[api.VLLMServerSpec] = None
    plan: Optional[planner.Plan] = None
    desired: list[dict[str, Any]] = field(default_factory=list)
    """The children the plan wants, hashed (with_hash)."""
    errors: list[str] = field(default_factory=list)
    """Why the spec cannot be deployed; the SpecValid reason is `reason`."""
    reason: str = "InvalidSpec"
    template: Optional[api.ChatTemplateStatus] = None
    """The chat template's verdict, kept in status.chatTemplate (chattemplate.py)."""

    @property
    def name(self) -> str:
        return self.body["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.body["metadata"]["namespace"]

    @property
    def uid(self) -> str:
        return self.body["metadata"]["uid"]

    @property
    def generation(self) -> Optional[int]:
        return self.conditions.generation

    @property
    def now(self) -> str:
        return self.conditions.now


@dataclass
class Reconciler(Applier):
    kube: Kube
    #: The Hub models outside the catalog are looked up on (hub.py); None: none.
    hf_endpoint: Optional[str] = None
    #: The operator's own Hub token, read at each reconcile (hub.token_reader); False: none.
    hf_token: Callable[[], Union[str, bool]] = lambda: False
    #: The orgs and repo prefixes the operator's Hub token is sent for (hub.token_for); others are looked up
    #: anonymously. Empty: the token is sent for none.
    hf_token_repos: tuple[str, ...] = ()
    prometheus_url: Optional[str] = None
    clock: Callable[[], str] = utcnow
    fetch_config: Optional[Callable[..., dict]] = None
    #: config.json facts fetched for servers, kept between reconciles (model_facts.ConfigCache).
    configs: model_facts.ConfigCache = field(default_factory=model_facts.ConfigCache)
    #: The URLs a spec may point the operator at (urlpolicy.py); None: any (tests that build a Reconciler).
    urls: Optional[URLPolicy] = None
    #: What reconciles read the server, its children and pods through (informers/reader.py): the operator's
    #: watch-fed copies; by default the API server itself (a DirectReader over `kube`).
    reader: Reader = field(default=None)  # type: ignore[assignment]
    #: The Events about some objects of a namespace (namespace, [workload, *pods]) -> Events, for the failures
    #: only Events tell (FailedCreate, a startup probe's kill); asked only while a replica is not ready. None:
    #: pod status only (the operator's RBAC does not read Events yet).
    events_of: Optional[Callable[[str, list[dict[str, Any]]], list[dict[str, Any]]]] = None
    #: Automatic re-plans of servers an operator upgrade left on an older plan (replan.py; default: only asked).
    replan_budget: replan.Budget = field(default_factory=replan.Budget)
    #: The KV cache capacity vLLM allocated on the ready pods (kvcapacity.py), for status.kvCapacity; None: not
    #: reported.
    kv_capacity: Optional[vllm_metrics.Observations] = None
    #: The operator's chat template checks (bounded, rated, on their own threads); None: checked in the calling
    #: thread (chattemplate.problem: the CLI, tests).
    templates: Optional[chattemplate.Checker] = None
    #: Loads and unloads spec.adapters on the ready pods (controller/adapters.py), for status.adapters; None: the
    #: adapters are planned but not loaded (tests that build a Reconciler).
    adapter_sync: Optional[adapters.AdapterSync] = None
    #: The API server's Pod Security admission asked by a dry run of the first pod (pod_admission.py); None: the
    #: offline reading of the namespace's label only (tests with an in-memory API).
    pod_admission: Optional[PodAdmission] = None
    _keda: Optional[tuple[bool, float]] = field(default=None, repr=False)
    _lws: Optional[tuple[bool, float]] = field(default=None, repr=False)
    #: group version -> (served, when asked): the Inference Extension's and Gateway API's (routing.py's kinds).
    _served: dict[str, tuple[bool, float]] = field(default_factory=dict, repr=False)
    _namespaces: dict[str, tuple[Optional[dict[str, str]], float]] = field(default_factory=dict, repr=False)
    #: (namespace, server) -> the apply the API server last refused, held back until its slow retry is due.
    _refused: dict[tuple[str, str], Refusal] = field(default_factory=dict, repr=False)
    monotonic: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        if self.reader is None:
            self.reader = DirectReader(self.kube, self.managed_kinds())

    def managed_kinds(self) -> list[tuple[str, str]]:
        return [("v1", "Service"), ("v1", "PersistentVolumeClaim"), ("apps/v1", "StatefulSet"),
                ("apps/v1", "DaemonSet"), ("policy/v1", "PodDisruptionBudget"),
                ("autoscaling/v2", "HorizontalPodAutoscaler"), (KEDA_API_VERSION, "ScaledObject"),
                (builders.LWS_API_VERSION, builders.LWS_KIND), *ROUTING_KINDS]

    def serves_api(self, group_version: str) -> bool:
        """Whether the cluster serves an optional API (discovery, cached briefly: it may be installed later)."""
        now = time.monotonic()
        hit = self._served.get(group_version)
        if hit is None or now - hit[1] > DISCOVERY_TTL_SECONDS:
            hit = self._served[group_version] = (self.kube.serves(group_version), now)
        return hit[0]

    def serves_keda(self) -> bool:
        """Whether the cluster serves KEDA's ScaledObject (discovery, cached briefly: KEDA may be installed later)."""
        now = time.monotonic()
        if self._keda is None or now - self._keda[1] > DISCOVERY_TTL_SECONDS:
            self._keda = (self.kube.serves(KEDA_API_VERSION), now)
        return self._keda[0]

    def serves_lws(self) -> bool:
        """Whether the cluster serves the LeaderWorkerSet API (discovery, cached briefly: it may be installed
        later)."""
        now = time.monotonic()
        if self._lws is None or now - self._lws[1] > DISCOVERY_TTL_SECONDS:
            self._lws = (self.kube.serves(builders.LWS_API_VERSION), now)
        return self._lws[0]

    # ---- entry point
    def reconcile(self, namespace: str, name: str) -> Optional[Result]:
        body = self.reader.server(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            self._refused.pop((namespace, name), None)
            return None  # gone: garbage collection removes the children
        return self.reconcile_body(body)

    def reconcile_body(self, body: dict[str, Any]) -> Result:
        """Read the live status, plan, then either keep the last valid children (an invalid spec) or deploy the
        planned ones; report the status (written when it changed) and post the Events."""
        run = self._read(body)
        try:
            self._plan(run)
        except chattemplate.Queued:  # reconciled again when the check ends (Checker.nudge)
            run.result.pending = True
            return run.result
        status = self._keep_last_valid(run) if run.errors else self._deploy(run)
        self._report(run, status)
        for type_, reason, message in run.result.events:
            self.event(body, type_, reason, message)
        return run.result

    # ---- the steps of one reconcile
    def _read(self, body: dict[str, Any]) -> Pass:
        """The server's live status (a copy: the body may be the watch cache's) and the time, taken once."""
        meta = body["metadata"]
        status = json.loads(json.dumps(body.get("status") or {}))
        return Pass(body=body, status=status, result=Result(),
                    conditions=Conditions(status.get("conditions") or [], meta.get("generation"), self.clock()))

    def _plan(self, run: Pass) -> None:
        """Spec -> plan -> the desired children, built and checked once (pipeline.build_server), hashed; or the
        errors that keep them from being applied: the plan's, then what the cluster lacks or refuses."""
        spec, run.errors = documents.parse_spec(run.body.get("spec") or {})
        if spec is None:
            return
        kwargs: dict[str, Any] = {"fetch": self.fetch_config} if self.fetch_config is not None else {}
        run.spec = spec
        built = pipeline.build_server(run.name, run.namespace, spec, owner=run.body,
                                      prepare=lambda children: self._prepare(run.body, children),
                                      hf_endpoint=self.hf_endpoint,
                                      hf_token=self.hf_token() if self.hf_endpoint else False,
                                      hf_token_repos=self.hf_token_repos,
                                      default_prometheus_url=self.prometheus_url,
                                      allow_unsafe_args=api.allows_unsafe_args(run.body["metadata"]),
                                      configs=self.configs, urls=self.urls,
                                      chat_template=self._template_check(run, spec.engine.chat_template), **kwargs)
        run.plan = built.plan
        run.errors = [str(p) for p in run.plan.problems]
        if run.errors:
            run.reason = run.plan.problems[0].reason
            return
        if builders.is_group(run.plan.spec) and not self.serves_lws():  # the plan's: maxNodes chooses the count
            run.errors, run.reason = [lws_missing_message(run.plan.spec, run.plan.max_nodes)], LWS_NOT_INSTALLED
            return
        run.desired = built.children
        forbidden = self._pod_security(run.namespace, run.desired)
        if forbidden:
            run.errors, run.reason = [forbidden], "PodSecurityForbidden"
        if built.oversized:
            run.errors = built.oversized

    @staticmethod
    def _prepare(body: dict[str, Any], children: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The children as they are applied: a requested re-plan recorded on the workload (replan.py), then each
        hashed (drift.with_hash)."""
        replan.mark_requested(body, children)
        return [with_hash(o) for o in children]

    def _template_check(self, run: Pass, template: Optional[str]) -> Callable[[str], Optional[str]]:
        """How this reconcile checks the chat template; its verdict, once known, goes into `run.template` (and
        status.chatTemplate), and the one in the live status is trusted for the same digest."""
        if not template:
            return chattemplate.problem
        key = chattemplate.digest(template)
        live = run.status.get("chatTemplate")
        stored = api.ChatTemplateStatus.from_live(live) if isinstance(live, dict) and live.get("digest") else None
        checker = self.templates

        def check(text: str) -> Optional[str]:
            if checker is None:
                why = chattemplate.problem(text)
                found = chattemplate.known(key)[0]
            else:
                why = checker.verdict(text, (run.namespace, run.name),
                                      (stored.digest, stored.problem) if stored is not None else None)
                found = checker.known(key)[0]
            if found:
                run.template = api.ChatTemplateStatus(digest=key, problem=bounds.clean(why, 1024) if why else None)
            return why
        return check

    def _keep_last_valid(self, run: Pass) -> api.VLLMServerStatus:
        """An invalid spec: nothing new is applied, the children of the last valid spec keep serving, and the
        status says why (server_status.invalid_spec)."""
        run.result.valid = False
        live = self._live_children(run.namespace, run.name, run.uid)
        workload = next((o for o in live.values() if o["kind"] in WORKLOAD_KINDS), None)
        status, events = server_status.invalid_spec(run.conditions, run.status, run.errors, run.reason, workload,
                                                     run.spec)
        run.result.events += events
        return status

    def _deploy(self, run: Pass) -> api.VLLMServerStatus:
        """A valid spec: apply what is not live yet, prune what is no longer wanted, and read how the workload and
        its pods are doing."""
        assert run.spec is not None and run.plan is not None
        run.conditions.set("SpecValid", "True", "Planned", f"flags derived: {run.plan.max_model_len} tokens of "
                           f"context, {run.plan.kv_cache_tokens} KV cache tokens per replica")
        loose = extra_args_unchecked(run.conditions, run.plan.flags.warning() if run.plan.flags else None)
        run.result.events += [loose] if loose else []
        self._external_scaler(run)
        self._routing(run)
        live = self._live_children(run.namespace, run.name, run.uid)
        taken = self._names_taken(run.desired, live, run.uid)
        if taken:  # never adopted: apply nothing (and prune nothing); what was deployed keeps running
            blocked: Optional[tuple[str, str]] = (NAME_CONFLICT, name_conflict_message(taken, run.name))
            workload = next((o for o in live.values() if o["kind"] in WORKLOAD_KINDS), None)
        else:
            workload, blocked = self._apply_children(run, live)
        if blocked is None:
            self._refused.pop((run.namespace, run.name), None)
            self._prune(run.namespace, live, run.result)
        if run.result.applied:
            run.result.events.append(("Normal", "Applied", f"applied {', '.join(run.result.applied)}; vllm serve "
                                      + " ".join(run.plan.args)))
        progress = server_status.workload_progress(workload)
        pods = self.reader.pods(run.namespace, run.name)
        trouble = self._pod_failure(run, workload, progress, pods)
        server_status.health_conditions(run.conditions, progress, workload, run.spec, trouble, blocked)
        outdated = run.result.outdated
        run.result.events += server_status.plan_outdated(run.conditions,
                                                         None if outdated is None else replan.message(outdated))
        rows, served = self._adapters(run, pods)
        return server_status.deployed(run.name, run.namespace, run.conditions, progress, run.plan, live=run.status,
                                      outdated=outdated is not None,
                                      serves=not (blocked and workload is None),  # else no endpoint: it may be theirs
                                      kv_capacity=self._kv_capacity(run, pods), adapters=rows, served_models=served)

    def _report(self, run: Pass, status: api.VLLMServerStatus) -> None:
        """The conditions this reconciler owns into the status, which is written when it changed; the Events of
        Ready and Degraded transitions; the autoscaler's status cleared when autoscaling is off."""
        report = server_status.report(status, run.conditions, run.status, chat_template=run.template,
                                      failure_reasons=failures.REASONS, blocked_reasons=BLOCKED_REASONS)
        result, new_status = run.result, report.status
        result.ready = report.ready
        result.replicas, result.ready_replicas = new_status["replicas"], new_status["readyReplicas"]
        result.events += report.events
        if report.changed:
            if log.isEnabledFor(logging.DEBUG):
                old_own = server_status.own_status(run.status)
                log.debug("status of %s/%s changed: %s", run.namespace, run.name,
                          sorted(k for k in new_status if new_status.get(k) != old_own.get(k)))
            self.write_status(run.body, new_status)
            result.status_written = True
        if not ownership.runs_operator_loop(run.body.get("spec")) and ownership.has_status(run.status):
            ownership.clear_status(self.kube, run.body)  # autoscaling is off: its last decision no longer applies

    # ---- pieces
    def _kv_capacity(self, run: Pass, pods: list[dict[str, Any]]) -> Optional[api.KVCapacityStatus]:
        """status.kvCapacity (the plan's KV cache tokens beside what vLLM allocated on the ready pods) and a
        Warning event when the measurement falls materially below the plan."""
        if self.kv_capacity is None:
            return None
        assert run.plan is not None
        plan, previous, result = run.plan, run.status.get("kvCapacity"), run.result
        refs = vllm_metrics.ready_pods(pods)
        kv = kvcapacity.status(plan.kv_cache_tokens, self.kv_capacity.measure(refs), len(refs), previous)
        if kvcapacity.below_plan(kv) and not kvcapacity.below_plan(previous):
            assert kv is not None
            result.events.append(("Warning", kvcapacity.EVENT_REASON, kvcapacity.warning(kv)))
        if kv is None:
            return None
        return api.KVCapacityStatus.from_live(previous) if kv is previous else api.KVCapacityStatus.model_validate(kv)

    def _adapters(self, run: Pass, pods: list[dict[str, Any]]
                  ) -> tuple[Optional[list[api.AdapterStatus]], Optional[list[str]]]:
        """status.adapters and servedModels from what the pods whose vLLM answers list (the sync loads and unloads
        in the background: controller/adapters.py), their readiness gates, the AdaptersReady condition, and a
        Warning event for each new failure."""
        assert run.spec is not None
        spec = run.spec
        if not spec.adapters or self.adapter_sync is None:
            run.conditions.remove("AdaptersReady")
            return None, None
        wanted = tuple((a.name, a.source) for a in spec.adapters)
        names = [a.name for a in spec.adapters]
        # Every pod whose vLLM answers, Ready or still held back by the adapters' readiness gate (adapters.GATE).
        refs = vllm_metrics.ready_pods(pods, conditions=("Ready", "ContainersReady"))
        known = self.adapter_sync.observe(run.namespace, run.name, refs, adapters.incarnations(pods), wanted)
        adapters.set_gates(self.kube, pods, known, names)
        in_service = {r.name for r in vllm_metrics.ready_pods(pods)}
        rows, served, failed = server_status.adapter_status(run.conditions, spec, known, run.status,
                                                            in_service=in_service)
        run.result.events += failed
        return rows, served

    def _pod_security(self, namespace: str, desired: list[dict[str, Any]]) -> Optional[str]:
        """Why the namespace's Pod Security level would refuse the workload's pods, if it would: the offline reading
        of the namespace's label first, then the API server's own admission by a dry run (pod_admission.py)."""
        level = podsecurity.enforced_level(self.namespace_labels(namespace))
        for obj in desired:
            if obj["kind"] in WORKLOAD_KINDS:
                for template in server_status.pod_templates(obj):  # a LeaderWorkerSet's leader and worker
                    found = podsecurity.violations(template["spec"], level,
                                                   template["metadata"].get("annotations"))
                    if found:
                        return podsecurity.message(namespace, level or "", found)
                    if self.pod_admission is not None:
                        one = {**obj, "spec": {**obj["spec"], "template": template}}
                        why = self.pod_admission.refusal(self.kube, one)
                        if why is not None:
                            return why
        return None

    def namespace_labels(self, namespace: str) -> Optional[dict[str, str]]:
        """A namespace's labels, read at most every NAMESPACE_TTL_SECONDS (None when this operator may not read
        namespaces: its Roles-only mode; the StatefulSet controller's FailedCreate events then tell)."""
        now = time.monotonic()
        hit = self._namespaces.get(namespace)
        if hit is None or now - hit[1] > NAMESPACE_TTL_SECONDS:
            try:
                ns = self.kube.get("v1", "Namespace", None, namespace)
                labels = (ns or {}).get("metadata", {}).get("labels") or {}
            except ApiError as e:
                if e.status != 403:
                    raise
                labels = None
            hit = self._namespaces[namespace] = (labels, now)
        return hit[0]

    def _external_scaler(self, run: Pass) -> None:
        """The ExternalScaler condition for autoscaling.mode HPA/KEDA; a ScaledObject is left out of the desired
        children (and said so) when the cluster has no KEDA."""
        assert run.spec is not None
        a, name = run.spec.autoscaling, run.name
        mode = a.mode if a.enabled and run.spec.workload == "StatefulSet" else None
        if mode not in ("HPA", "KEDA"):
            run.conditions.remove("ExternalScaler")
            return
        old = run.conditions.get("ExternalScaler")
        target = builders.scaler_quantity(a.target_waiting_per_replica)
        if mode == "HPA":
            cond = ("True", "HPAApplied", f"HorizontalPodAutoscaler {name} (autoscaling/v2) "
                    f"scales the StatefulSet on the Pods metric {builders.QUEUE_METRIC}, {target} per replica; "
                    "it needs a custom metrics adapter (prometheus-adapter) serving that metric")
        elif self.serves_keda():
            cond = ("True", "ScaledObjectApplied", f"ScaledObject {name} ({KEDA_API_VERSION}) scales "
                    f"the StatefulSet on {builders.QUEUE_METRIC} from Prometheus, {target} per replica")
        else:
            run.desired = [o for o in run.desired if o["kind"] != "ScaledObject"]
            cond = ("False", "KEDANotInstalled", f"autoscaling.mode KEDA, but this cluster does not serve "
                    f"{KEDA_API_VERSION} ScaledObjects: install KEDA or use mode: Operator. No ScaledObject is "
                    "applied; the replicas stay where they are")
            if old is None or old.reason != "KEDANotInstalled":
                run.result.events.append(("Warning", "KEDANotInstalled", cond[2]))
        run.conditions.set("ExternalScaler", *cond)

    def _routing(self, run: Pass) -> None:
        """The Routing condition for spec.routing; the pool, its picker and the route are left out of the desired
        children (and said so) where the cluster does not serve their APIs, never applied into a crash loop."""
        assert run.spec is not None
        routing = run.spec.routing
        if not routing.inference_pool.enabled:
            run.conditions.remove("Routing")
            return
        pool = api.pool_name(run.name, routing)
        missing = [gv for gv, wanted in ((builders.POOL_API_VERSION, True),
                                         (builders.ROUTE_API_VERSION, routing.http_route.enabled))
                   if wanted and not self.serves_api(gv)]
        if missing:
            run.desired = [o for o in run.desired if o["apiVersion"] not in missing]
            if builders.POOL_API_VERSION in missing:  # a picker without its pool could only fail
                run.desired = [o for o in run.desired if (o["kind"], o["metadata"]["name"]) not in
                               routing_names(pool)]
            cond = ("False", ROUTING_NOT_INSTALLED, routing_not_installed_message(missing))
        elif not api.owns_pool(run.name, routing):
            owner = self.reader.server(run.namespace, pool)
            owner_spec = documents.parse_spec((owner or {}).get("spec") or {})[0]
            if owner_spec is None or not api.owns_pool(pool, owner_spec.routing):
                cond = ("False", "PoolOwnerMissing", f"the pods carry {builders.POOL_LABEL}={pool}, but no "
                        f"VLLMServer {pool} with routing.inferencePool.enabled owns that pool in this namespace: "
                        "create it (the pool and its picker are its children)")
            else:
                cond = ("True", "JoinedPool", f"the pods are members of InferencePool {pool} (VLLMServer {pool}'s)")
        else:
            cond = ("True", "PoolApplied", f"InferencePool {pool} selects the pods labelled "
                    f"{builders.POOL_LABEL}={pool} on port {builders.PORT}; endpoint picker "
                    f"{builders.picker_name(pool)} (Service port {builders.PICKER_GRPC_PORT})")
        old = run.conditions.get("Routing")
        if cond[0] == "False" and (old is None or old.reason != cond[1]):
            run.result.events.append(("Warning", cond[1], cond[2]))
        run.conditions.set("Routing", *cond)

    def _pod_failure(self, run: Pass, workload: Optional[dict[str, Any]], progress: dict[str, Any],
                 pods: list[dict[str, Any]]) -> Optional[failures.Failure]:
        """Why pods do not serve (failures.classify), with the Events of the workload and its pods while a
        replica is missing: a healthy server costs no request."""
        found: list[dict[str, Any]] = []
        if self.events_of is not None and workload is not None and progress["ready"] < progress["desired"]:
            try:
                found = self.events_of(run.namespace, [workload, *pods])
            except ApiError as e:
                log.warning("could not read the Events of %s/%s: %s", run.namespace, workload["metadata"]["name"], e)
        return failures.classify(pods, found, workload=workload, now=run.now)

    def _live_children(self, namespace: str, name: str, uid: str) -> dict[tuple[str, str], dict[str, Any]]:
        return self.reader.children(namespace, name, uid)

    def write_status(self, body: dict[str, Any], status: dict[str, Any]) -> None:
        """Server-side apply of the fields we own; fields we stop sending are removed by the server."""
        meta = body["metadata"]
        self._remember(self.kube.apply({"apiVersion": api.API_VERSION, "kind": api.KIND,
                                        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                                        "status": status}, subresource="status"))

    def event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        events.post_event(self.kube, body, type_, reason, message, component=COMPONENT, stamp=self.clock())
