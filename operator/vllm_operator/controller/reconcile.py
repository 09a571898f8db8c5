"""Reconcile one VLLMServer: plan, apply the children with server-side apply, prune, report status.

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
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .. import api, builders, catalog, pipeline, podsecurity
from . import apierrors, events, failures, kvcapacity, replan
from ..autoscaler import ownership
from ..informers.reader import DirectReader, Reader, controlled_by
from ..conditions import condition, set_condition
from .kube import ApiError, Kube
from ..urlpolicy import URLPolicy

log = logging.getLogger("vllm_operator.controller.reconcile")

HASH_ANNOTATION = f"{api.GROUP}/desired-hash"
#: Status fields this reconciler owns (server-side apply on /status under its field manager);
#: the autoscaler owns status.autoscaling and its own conditions under another manager.
OWN_FIELDS = ("observedGeneration", "conditions", "replicas", "readyReplicas", "selector", "endpoint", "plan",
              "kvCapacity")
OWN_CONDITIONS = ("SpecValid", "Ready", "Progressing", "Degraded", "ExternalScaler", "Stalled", "Reconciling",
                  "PlanOutdated")
KEDA_API_VERSION = "keda.sh/v1alpha1"
#: How long the answer to "does this cluster serve KEDA's ScaledObject?" is trusted.
DISCOVERY_TTL_SECONDS = 30.0
#: How long a namespace's labels (its Pod Security level) are trusted: a no-op resync reads none.
NAMESPACE_TTL_SECONDS = 300.0
COMPONENT = "vllm-operator"
#: The Degraded reason when a child's name is taken by an object this server does not control (never adopted).
NAME_CONFLICT = "NameConflict"
#: Degraded reasons that mean "nothing new was applied": each gets a Warning Event when it appears or its message
#: changes.
BLOCKED_REASONS = (NAME_CONFLICT, apierrors.API_REJECTED)


def utcnow() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------- pure helpers
def desired_hash(obj: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:20]


def with_hash(obj: dict[str, Any]) -> dict[str, Any]:
    """The object plus an annotation naming the hash of what we sent, so removals are noticed too."""
    digest = desired_hash(obj)
    out = json.loads(json.dumps(obj))
    out["metadata"].setdefault("annotations", {})[HASH_ANNOTATION] = digest
    return out


def is_subset(want: Any, have: Any) -> bool:
    """Every field in `want` is in `have` with the same value (server defaults may add more)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and is_subset(v, have[k]) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(map(is_subset, want, have))
    return want == have or (isinstance(want, (int, float)) and isinstance(have, str) and str(want) == have)


def up_to_date(want: dict[str, Any], live: Optional[dict[str, Any]]) -> bool:
    if live is None:
        return False
    digest = want["metadata"]["annotations"][HASH_ANNOTATION]
    if live.get("metadata", {}).get("annotations", {}).get(HASH_ANNOTATION) != digest:
        return False
    return is_subset(want, live)


def kstatus_reconciling(conditions: list[dict], generation: Optional[int], now: str) -> list[dict]:
    """Reconciling=True while a rollout replaces pods that already serve (Ready=True and Progressing=True, the
    rollout's reason and message), absent otherwise. kstatus (Flux, kpt, cli-utils) knows no Progressing and reads
    Ready=True as Current: without it a rollout would pass Flux's health check before any pod runs the new spec.
    Ready=False already reads as InProgress with Ready's message (what keeps the replicas from serving), and
    Stalled=True (Failed) wins: kstatus takes whichever of the two comes first, so never both."""
    def true(type_: str) -> Optional[dict]:
        c = condition({"conditions": conditions}, type_)
        return c if c is not None and c.get("status") == "True" else None

    progressing = true("Progressing")
    if progressing is None or true("Ready") is None or true("Stalled") is not None:
        return [c for c in conditions if c.get("type") != "Reconciling"]
    return set_condition(conditions, "Reconciling", "True", progressing["reason"], progressing["message"],
                         generation, now)


def own_status(status: dict[str, Any]) -> dict[str, Any]:
    """The part of a live status this reconciler owns, to compare with what it would write."""
    out = {k: status[k] for k in OWN_FIELDS if k in status}
    if "conditions" in out:
        out["conditions"] = [c for c in out["conditions"] if c.get("type") in OWN_CONDITIONS]
    return out


def degraded_condition(trouble: Optional[failures.Failure]) -> tuple[str, str, str]:
    """Degraded's (status, reason, message): True with the failure's own reason (failures.py); a failure that
    is only waiting (a node being added) is not one."""
    if trouble is None or trouble.waiting:
        return "False", "AsExpected", "no pod is failing"
    return "True", trouble.reason, trouble.message


def name_conflict_message(taken: list[dict[str, Any]], server: str) -> str:
    names = ", ".join(f"{o['kind']} {o['metadata']['name']}" for o in taken)
    return (f"{names} already exist{'s' if len(taken) == 1 else ''} in this namespace and "
            f"{'is' if len(taken) == 1 else 'are'} not controlled by this VLLMServer; the operator never takes over "
            f"an object it did not create, so nothing was applied: rename the VLLMServer (or remove the other "
            f"object{'s' if len(taken) > 1 else ''} if it is not in use); {server!r} names the client Service, "
            "the workload and the PodDisruptionBudget")


@dataclass
class Refusal:
    """The API server refused to apply this object (apierrors.REJECTED): sent again only after `not_before`,
    unless what would be sent changes."""

    digest: str
    message: str
    attempts: int
    not_before: float


def workload_progress(workload: Optional[dict[str, Any]]) -> dict[str, Any]:
    """Desired/ready/updated counts of the StatefulSet or DaemonSet and whether it has settled."""
    if workload is None:
        return {"desired": 0, "ready": 0, "updated": 0, "settled": False}
    st = workload.get("status") or {}
    gen_ok = st.get("observedGeneration", 0) >= workload["metadata"].get("generation", 0)
    if workload["kind"] == "StatefulSet":
        desired = workload["spec"].get("replicas", 1)
        ready = st.get("readyReplicas", 0)
        updated = st.get("updatedReplicas", 0)
        revision_ok = st.get("currentRevision") == st.get("updateRevision") or updated >= desired
        settled = gen_ok and ready >= desired and updated >= desired and revision_ok and st.get("replicas", 0) == desired
    else:
        desired = st.get("desiredNumberScheduled", 0)
        ready = st.get("numberReady", 0)
        updated = st.get("updatedNumberScheduled", 0)
        settled = gen_ok and ready >= desired and updated >= desired
    return {"desired": desired, "ready": ready, "updated": updated, "settled": settled}


# --------------------------------------------------------------------------- reconciler
@dataclass
class Result:
    """What one reconcile did (for logs, metrics and tests)."""

    valid: bool = True
    applied: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    status_written: bool = False
    events: list[tuple[str, str]] = field(default_factory=list)
    ready: bool = False
    """The Ready condition this reconcile wrote is True (for the operator's vllm_operator_server_ready)."""
    replicas: int = 0
    ready_replicas: int = 0
    outdated: Optional[str] = None
    """What a re-plan would change, when the workload was kept on its running plan (replan.py)."""


@dataclass
class Reconciler:
    kube: Kube
    hf_endpoint: Optional[str] = None
    prometheus_url: Optional[str] = None
    clock: Callable[[], str] = utcnow
    fetch_config: Callable[..., dict] = field(default=None)  # type: ignore[assignment]
    #: config.json facts fetched for servers, kept between reconciles (catalog.ConfigCache).
    configs: catalog.ConfigCache = field(default_factory=catalog.ConfigCache)
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
    kv_capacity: Optional[kvcapacity.Observations] = None
    _keda: Optional[tuple[bool, float]] = field(default=None, repr=False)
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
                ("autoscaling/v2", "HorizontalPodAutoscaler"), (KEDA_API_VERSION, "ScaledObject")]

    def serves_keda(self) -> bool:
        """Whether the cluster serves KEDA's ScaledObject (discovery, cached briefly: KEDA may be installed later)."""
        now = time.monotonic()
        if self._keda is None or now - self._keda[1] > DISCOVERY_TTL_SECONDS:
            self._keda = (self.kube.serves(KEDA_API_VERSION), now)
        return self._keda[0]

    # ---- entry point
    def reconcile(self, namespace: str, name: str) -> Optional[Result]:
        body = self.reader.server(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            self._refused.pop((namespace, name), None)
            return None  # gone: garbage collection removes the children
        return self.reconcile_body(body)

    def reconcile_body(self, body: dict[str, Any]) -> Result:
        meta = body["metadata"]
        name, namespace, generation = meta["name"], meta["namespace"], meta.get("generation")
        status = json.loads(json.dumps(body.get("status") or {}))
        result = Result()
        now = self.clock()
        conditions = list(status.get("conditions") or [])

        spec, errors = pipeline.parse_spec(body.get("spec") or {})
        plan = None
        reason = "InvalidSpec"
        desired: list[dict[str, Any]] = []
        if spec is not None:
            kwargs = {"fetch": self.fetch_config} if self.fetch_config else {}
            plan = pipeline.plan_server(name, namespace, spec, hf_endpoint=self.hf_endpoint,
                                        default_prometheus_url=self.prometheus_url,
                                        allow_unsafe_args=api.allows_unsafe_args(meta), configs=self.configs,
                                        urls=self.urls,
                                        **kwargs)
            errors = [str(p) for p in plan.problems]
        if not errors:
            assert plan is not None
            desired = builders.build_all(plan, body)
            replan.mark_requested(body, desired)
            desired = [with_hash(o) for o in desired]
            forbidden = self._pod_security(namespace, desired)
            if forbidden:
                errors, reason = [forbidden], "PodSecurityForbidden"
            too_large = builders.oversized(desired)
            if too_large:
                errors = too_large

        old_valid = condition(status, "SpecValid")
        if errors:
            result.valid = False
            message = "; ".join(errors)
            conditions = set_condition(conditions, "SpecValid", "False", reason, message, generation, now)
            if not old_valid or old_valid.get("status") != "False" or old_valid.get("message") != message:
                result.events.append(("Warning", reason, message))
            # Nothing new is applied: the children of the last valid spec keep serving.
            live = self._live_children(namespace, name, meta["uid"])
            workload = next((o for o in live.values() if o["kind"] in ("StatefulSet", "DaemonSet")), None)
            progress = workload_progress(workload)
            conditions = set_condition(conditions, "Degraded", "True", reason,
                                       "the spec cannot be deployed; the last valid version keeps running: " + message,
                                       generation, now)
            conditions = self._ready_conditions(conditions, progress, workload, generation, now, stalled=True)
            # kstatus (Flux) reads Stalled=True as "failed, will not progress by itself" instead of
            # waiting out its timeout on Ready=False; present while the spec is invalid or Degraded is True.
            conditions = set_condition(conditions, "Stalled", "True", reason, message, generation, now)
            kept = {k: status[k] for k in ("selector", "endpoint", "plan", "kvCapacity") if k in status}
            new_status = {**kept, "observedGeneration": generation, "conditions": conditions,
                          "replicas": progress["desired"], "readyReplicas": progress["ready"]}
        else:
            assert spec is not None and plan is not None
            conditions = set_condition(conditions, "SpecValid", "True", "Planned",
                                       f"flags derived: {plan.max_model_len} tokens of context, "
                                       f"{plan.kv_cache_tokens} KV cache tokens per replica", generation, now)
            conditions, desired = self._external_scaler(name, spec, desired, conditions, generation, now, result)
            live = self._live_children(namespace, name, meta["uid"])
            taken = self._names_taken(desired, live, meta["uid"])
            if taken:  # never adopted: apply nothing (and prune nothing); what was deployed keeps running
                blocked: Optional[tuple[str, str]] = (NAME_CONFLICT, name_conflict_message(taken, name))
                workload = next((o for o in live.values() if o["kind"] in ("StatefulSet", "DaemonSet")), None)
            else:
                workload, blocked = self._apply_children(body, spec, desired, live, result)
            if blocked is None:
                self._refused.pop((namespace, name), None)
                self._prune(namespace, live, result)
            if result.applied:
                result.events.append(("Normal", "Applied", f"applied {', '.join(result.applied)}; vllm serve "
                                      + " ".join(plan.args)))
            progress = workload_progress(workload)
            pods = self.reader.pods(namespace, name)
            trouble = self._trouble(namespace, workload, progress, pods, now)
            degraded = ("True", *blocked) if blocked else degraded_condition(trouble)
            conditions = set_condition(conditions, "Degraded", *degraded, generation, now)
            if degraded[0] == "True":
                # kstatus (Flux, kpt, cli-utils) knows no Degraded: Stalled=True makes it report the failure
                # (a crash loop, an image it cannot pull, a name taken) instead of InProgress until its timeout.
                # Updated in place, never dropped and re-added: its lastTransitionTime stays, a resync writes nothing.
                conditions = set_condition(conditions, "Stalled", "True", degraded[1], degraded[2], generation, now)
            else:
                conditions = [c for c in conditions if c.get("type") != "Stalled"]
            conditions = self._ready_conditions(conditions, progress, workload, generation, now, trouble=trouble,
                                                blocked=blocked)
            new_status = {
                "observedGeneration": generation,
                "conditions": conditions,
                "replicas": progress["desired"],
                "readyReplicas": progress["ready"],
                "selector": builders.selector_string(name),
                "endpoint": f"http://{name}.{namespace}.svc:{builders.PORT}/v1",
                "plan": {k: v for k, v in plan.status().items() if v is not None},
            }
            if blocked and workload is None:  # nothing of ours serves: no endpoint to advertise (it may be theirs)
                for key in ("selector", "endpoint"):
                    new_status.pop(key)
            conditions = self._plan_outdated(conditions, result.outdated, generation, now, result)
            new_status["conditions"] = conditions
            if result.outdated is not None and "plan" in status:
                new_status["plan"] = status["plan"]  # the plan the running pods were deployed with
            kv = self._kv_capacity(plan, pods, status.get("kvCapacity"), result)
            if kv is not None:
                new_status["kvCapacity"] = kv

        new_status["conditions"] = kstatus_reconciling(new_status["conditions"], generation, now)
        new_status["conditions"] = [c for c in new_status["conditions"] if c["type"] in OWN_CONDITIONS]
        ready_condition = condition(new_status, "Ready")
        result.ready = ready_condition is not None and ready_condition["status"] == "True"
        result.replicas, result.ready_replicas = new_status["replicas"], new_status["readyReplicas"]
        self._transition_events(status, new_status["conditions"], result)
        if new_status != own_status(status):
            if log.isEnabledFor(logging.DEBUG):
                old_own = own_status(status)
                log.debug("status of %s/%s changed: %s", namespace, name,
                          sorted(k for k in new_status if new_status.get(k) != old_own.get(k)))
            self.write_status(body, new_status)
            result.status_written = True
        if not ownership.runs_operator_loop(body.get("spec")) and ownership.has_status(status):
            ownership.clear_status(self.kube, body)  # autoscaling is off: its last decision no longer applies
        for type_, reason, message in result.events:
            self.event(body, type_, reason, message)
        return result
    # ---- pieces
    def _plan_outdated(self, conditions, outdated, generation, now, result):
        """PlanOutdated=True naming what a re-plan would change, while the workload keeps its plan (replan.py)."""
        if outdated is None:
            return [c for c in conditions if c.get("type") != "PlanOutdated"]
        message = replan.message(outdated)
        old = condition({"conditions": conditions}, "PlanOutdated")
        if old is None or old.get("message") != message:
            result.events.append(("Normal", "PlanOutdated", message))
        return set_condition(conditions, "PlanOutdated", "True", "PlanChanged", message, generation, now)
    def _kv_capacity(self, plan: Any, pods: list[dict[str, Any]], previous: Optional[dict[str, Any]],
                     result: Result) -> Optional[dict[str, Any]]:
        """status.kvCapacity (the plan's KV cache tokens beside what vLLM allocated on the ready pods) and a
        Warning event when the measurement falls materially below the plan."""
        if self.kv_capacity is None:
            return None
        refs = kvcapacity.ready_pods(pods)
        kv = kvcapacity.status(plan.kv_cache_tokens, self.kv_capacity.measure(refs), len(refs), previous)
        if kvcapacity.below_plan(kv) and not kvcapacity.below_plan(previous):
            assert kv is not None
            result.events.append(("Warning", kvcapacity.EVENT_REASON, kvcapacity.warning(kv)))
        return kv

    def _names_taken(self, desired: list[dict[str, Any]], live: dict[tuple[str, str], dict[str, Any]],
                     uid: str) -> list[dict[str, Any]]:
        """The wanted children whose name is taken by an object this server does not control. Only a child not
        seen as ours is looked up (one GET): a no-op resync sends no request."""
        taken = []
        for obj in desired:
            meta = obj["metadata"]
            if (obj["kind"], meta["name"]) in live:
                continue
            existing = self.kube.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
            if existing is not None and not controlled_by(existing, uid):
                existing.setdefault("kind", obj["kind"])
                taken.append(existing)
        return taken

    def _apply_children(self, body: dict[str, Any], spec: api.VLLMServerSpec, desired: list[dict[str, Any]],
                        live: dict[tuple[str, str], dict[str, Any]],
                        result: Result) -> tuple[Optional[dict[str, Any]], Optional[tuple[str, str]]]:
        """Apply what is not live yet, in order; the workload as applied (or live), and (reason, message) when the
        API server refused a child (the later ones are not sent). Seen children are removed from `live`: what
        stays there is no longer wanted."""
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        workload = None
        for obj in desired:
            current = live.pop((obj["kind"], obj["metadata"]["name"]), None)
            if up_to_date(obj, current):
                applied = current
            elif replan.held(body, obj, current, HASH_ANNOTATION) and not self.replan_budget.take():
                # Same spec, new plan (an operator upgrade): the pods keep running as they are (replan.py).
                assert current is not None
                applied, result.outdated = current, replan.difference(current, obj, is_subset)
            else:
                digest = f"{obj['kind']}/{obj['metadata']['name']}/{obj['metadata']['annotations'][HASH_ANNOTATION]}"
                held = self._refused.get(key)
                if held is not None and held.digest == digest and self.monotonic() < held.not_before:
                    return workload or self._live_workload(live, current), (apierrors.API_REJECTED, held.message)
                # The autoscaler owns the replicas of an autoscaled StatefulSet: make it a co-owner
                # before this apply stops sending them, or the server would drop them (back to 1).
                autoscaled = obj["kind"] == "StatefulSet" and not builders.owns_replicas(spec)
                if autoscaled and current is not None:
                    self._adopt_replicas(current, spec)
                try:
                    applied = self._remember(self.kube.apply(obj))
                except ApiError as e:
                    if self._replace_immutable(obj, e, meta["uid"]):
                        result.events.append(("Normal", "Recreating", f"{obj['kind']} {obj['metadata']['name']}: "
                                              "its volumeClaimTemplates changed (spec.cache), which Kubernetes "
                                              "cannot update in place; deleted it keeping its pods, to "
                                              "re-create it"))
                        for type_, reason, message in result.events:
                            self.event(body, type_, reason, message)
                        raise
                    if apierrors.classify(e.status) != apierrors.REJECTED:
                        raise  # 409, 429, 5xx: the caller retries (apierrors.retry_delay)
                    attempts = held.attempts + 1 if held is not None and held.digest == digest else 1
                    message = apierrors.rejected_message(obj["kind"], obj["metadata"]["name"], e.status, e.message)
                    self._refused[key] = Refusal(digest, message, attempts,
                                                 self.monotonic() + apierrors.rejected_backoff(attempts))
                    log.warning("%s/%s: %s", key[0], key[1], message)
                    return workload or self._live_workload(live, current), (apierrors.API_REJECTED, message)
                if autoscaled and current is None:
                    self._adopt_replicas(applied, spec)
                result.applied.append(f"{obj['kind']}/{obj['metadata']['name']}")
            if obj["kind"] in ("StatefulSet", "DaemonSet"):
                workload = applied
        return workload, None

    @staticmethod
    def _live_workload(live: dict[tuple[str, str], dict[str, Any]],
                       current: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
        """The workload still running when an apply stopped short: the one being applied, or another kind's."""
        if current is not None and current["kind"] in ("StatefulSet", "DaemonSet"):
            return current
        return next((o for o in live.values() if o["kind"] in ("StatefulSet", "DaemonSet")), None)

    def _prune(self, namespace: str, unwanted: dict[tuple[str, str], dict[str, Any]], result: Result) -> None:
        """Delete children this server controls but no longer wants (`unwanted` holds only objects with its
        controller reference; the delete is conditional on their uid)."""
        for (kind, child), obj in unwanted.items():
            if self.kube.delete(obj["apiVersion"], kind, namespace, child, uid=obj["metadata"]["uid"]):
                result.pruned.append(f"{kind}/{child}")
            self.reader.forget(obj)
        if result.pruned:
            result.events.append(("Normal", "Pruned", "removed " + ", ".join(result.pruned)))

    def _pod_security(self, namespace: str, desired: list[dict[str, Any]]) -> Optional[str]:
        """Why the namespace's Pod Security level would refuse the workload's pods, if it would."""
        level = podsecurity.enforced_level(self.namespace_labels(namespace))
        for obj in desired:
            if obj["kind"] in ("StatefulSet", "DaemonSet"):
                found = podsecurity.violations(obj["spec"]["template"]["spec"], level)
                if found:
                    return podsecurity.message(namespace, level, found)
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

    def _adopt_replicas(self, sts: dict[str, Any], spec: api.VLLMServerSpec) -> None:
        a = spec.autoscaling
        ownership.adopt_replicas(self.kube, sts, a.min_replicas, a.max_replicas, self.kube.field_manager)

    def _external_scaler(self, name, spec, desired, conditions, generation, now, result):
        """The ExternalScaler condition for autoscaling.mode HPA/KEDA; a ScaledObject is left out
        (and said so) when the cluster has no KEDA."""
        a = spec.autoscaling
        mode = a.mode if a.enabled and spec.workload == "StatefulSet" else None
        if mode not in ("HPA", "KEDA"):
            return [c for c in conditions if c.get("type") != "ExternalScaler"], desired
        old = condition({"conditions": conditions}, "ExternalScaler")
        target = builders.scaler_quantity(a.target_waiting_per_replica)
        if mode == "HPA":
            cond = ("True", "HPAApplied", f"HorizontalPodAutoscaler {name} (autoscaling/v2) "
                    f"scales the StatefulSet on the Pods metric {builders.QUEUE_METRIC}, {target} per replica; "
                    "it needs a custom metrics adapter (prometheus-adapter) serving that metric")
        elif self.serves_keda():
            cond = ("True", "ScaledObjectApplied", f"ScaledObject {name} ({KEDA_API_VERSION}) scales "
                    f"the StatefulSet on {builders.QUEUE_METRIC} from Prometheus, {target} per replica")
        else:
            desired = [o for o in desired if o["kind"] != "ScaledObject"]
            cond = ("False", "KEDANotInstalled", f"autoscaling.mode KEDA, but this cluster does not serve "
                    f"{KEDA_API_VERSION} ScaledObjects: install KEDA or use mode: Operator. No ScaledObject is "
                    "applied; the replicas stay where they are")
            if old is None or old.get("reason") != "KEDANotInstalled":
                result.events.append(("Warning", "KEDANotInstalled", cond[2]))
        return set_condition(conditions, "ExternalScaler", *cond, generation, now), desired

    def _trouble(self, namespace: str, workload: Optional[dict[str, Any]], progress: dict[str, Any],
                 pods: list[dict[str, Any]], now: str) -> Optional[failures.Failure]:
        """Why pods do not serve (failures.classify), with the Events of the workload and its pods while a
        replica is missing: a healthy server costs no request."""
        found: list[dict[str, Any]] = []
        if self.events_of is not None and workload is not None and progress["ready"] < progress["desired"]:
            try:
                found = self.events_of(namespace, [workload, *pods])
            except ApiError as e:
                log.warning("could not read the Events of %s/%s: %s", namespace, workload["metadata"]["name"], e)
        return failures.classify(pods, found, workload=workload, now=now)

    def _ready_conditions(self, conditions, progress, workload, generation, now, stalled=False, trouble=None,
                          blocked=None):
        desired, ready = progress["desired"], progress["ready"]
        if workload is None and blocked is not None:  # nothing applied: a name conflict or a refused apply
            conditions = set_condition(conditions, "Ready", "False", *blocked, generation, now)
            return set_condition(conditions, "Progressing", "False", *blocked, generation, now)
        if workload is None:
            conditions = set_condition(conditions, "Ready", "False", "NoWorkload", "no workload has been created",
                                       generation, now)
            return set_condition(conditions, "Progressing", "False" if stalled else "True",
                                 "InvalidSpec" if stalled else "Creating", "waiting for a valid spec" if stalled
                                 else "creating the workload", generation, now)
        if desired == 0 and workload["kind"] == "DaemonSet":
            # A DaemonSet's count is the nodes it matches: zero is not a choice but a cluster that has
            # no such node (a GPU product label that no node carries, a taint not tolerated).
            if progress["settled"]:
                ready_c = ("False", "NoMatchingNodes",
                           "the DaemonSet runs on no node: no schedulable node matches its node selector "
                           + (builders.node_requirements_text(workload["spec"]["template"]["spec"]) or "(none)")
                           + " and tolerates its taints (check spec.gpu.product, spec.nodeSelector, "
                           "spec.tolerations)")
            else:
                ready_c = ("False", "NoReplicasReady", "waiting for the DaemonSet controller to count the nodes")
        elif desired == 0:
            ready_c = ("True", "ScaledToZero", "no replicas requested")
        elif ready >= desired:
            ready_c = ("True", "AllReplicasReady", f"{ready}/{desired} replicas ready")
        elif ready > 0:
            ready_c = ("False", "PartiallyReady", f"{ready}/{desired} replicas ready")
        elif trouble is not None:  # named: what keeps every replica from serving
            ready_c = ("False", trouble.reason, f"0/{desired} replicas ready: {trouble.message}")
        else:
            ready_c = ("False", "NoReplicasReady", f"0/{desired} replicas ready (models load for minutes)")
        conditions = set_condition(conditions, "Ready", *ready_c, generation, now)
        if progress["settled"]:
            prog = ("False", "Stable", f"{workload['kind']} is up to date")
        else:
            prog = ("True", "RollingOut", f"{workload['kind']}: {progress['updated']}/{desired} updated, "
                    f"{ready}/{desired} ready")
        return set_condition(conditions, "Progressing", *prog, generation, now)

    def _transition_events(self, old_status: dict, conditions: list[dict], result: Result) -> None:
        """An Event when Ready changes, and one when pods start failing or fail for another reason (the
        Event's reason is the failure's: OOMKilled, FailedCreate, ...)."""
        old = {c["type"]: c for c in old_status.get("conditions") or []}
        was = {t: c.get("status") for t, c in old.items()}
        for c in conditions:
            if c["type"] == "Ready" and was.get("Ready") != c["status"] and not (
                    was.get("Ready") is None and c["status"] == "False"):
                result.events.append(("Normal" if c["status"] == "True" else "Warning",
                                      "Ready" if c["status"] == "True" else "NotReady", c["message"]))
            if c["type"] == "Degraded" and c["status"] == "True" and c["reason"] in failures.REASONS and (
                    was.get("Degraded") != "True" or old["Degraded"].get("reason") != c["reason"]):
                result.events.append(("Warning", c["reason"], c["message"]))
            if c["type"] == "Degraded" and c["status"] == "True" and c["reason"] in BLOCKED_REASONS and (
                    was.get("Degraded") != "True" or old["Degraded"].get("reason") != c["reason"]
                    or old["Degraded"].get("message") != c["message"]):
                result.events.append(("Warning", c["reason"], c["message"]))

    def _replace_immutable(self, obj: dict[str, Any], error: ApiError, uid: str) -> bool:
        """A StatefulSet whose immutable fields (volumeClaimTemplates: spec.cache) must change: delete it
        with its pods orphaned, so the next reconcile creates it anew and it adopts them (the pods then roll
        to the new template). Only an object this operator manages; True when it was deleted."""
        if obj["kind"] != "StatefulSet" or error.status != 422 or "Forbidden" not in error.message:
            return False
        meta = obj["metadata"]
        live = self.kube.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        if live is None or not controlled_by(live, uid):
            return False
        log.info("re-creating %s/%s: %s", meta["namespace"], meta["name"], error.message)
        deleted = self.kube.delete(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"],
                                   uid=live["metadata"]["uid"], propagation="Orphan")
        if deleted:
            self.reader.forget(live)
        return deleted

    def _remember(self, answer: dict[str, Any]) -> dict[str, Any]:
        """Keep the answer to our own write until the watch delivers it (read-your-writes: reader.py)."""
        self.reader.remember(answer)
        return answer

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
