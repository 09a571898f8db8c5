"""Reconcile one VLLMServer: plan, apply the children with server-side apply, prune, report status.

Level-based and idempotent: every call reads the current object and its children and
converges them on what the spec wants, whatever happened before (operator restarts,
hand edits, deleted children). Writes happen only when something differs: a child is
applied only when its desired fields are not already live, and status only when it
changed. In the operator the current state comes from watch-fed copies (cache.py), so a
no-op resync sends no request at all (bench/scale.py counts them).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import api, builders, catalog, events, pipeline
from .autoscaler import ownership
from .cache import WatchedObjects
from .kube import ApiError, Kube

log = logging.getLogger("vllm_operator.reconcile")

HASH_ANNOTATION = f"{api.GROUP}/desired-hash"
#: Status fields this reconciler owns (server-side apply on /status under its field manager);
#: the autoscaler owns status.autoscaling and its own conditions under another manager.
OWN_FIELDS = ("observedGeneration", "conditions", "replicas", "readyReplicas", "selector", "endpoint", "plan")
OWN_CONDITIONS = ("SpecValid", "Ready", "Progressing", "Degraded", "ExternalScaler", "Stalled")
KEDA_API_VERSION = "keda.sh/v1alpha1"
#: How long the answer to "does this cluster serve KEDA's ScaledObject?" is trusted.
DISCOVERY_TTL_SECONDS = 30.0
COMPONENT = "vllm-operator"


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


def set_condition(conditions: list[dict], type_: str, status: str, reason: str, message: str,
                  generation: Optional[int], now: str) -> list[dict]:
    """Conditions keyed by type; lastTransitionTime moves only when status changes."""
    old = next((c for c in conditions if c.get("type") == type_), None)
    since = old.get("lastTransitionTime") if old and old.get("status") == status else now
    new = {"type": type_, "status": status, "reason": reason, "message": message[:32768],
           "lastTransitionTime": since or now, "observedGeneration": generation}
    if old is None:
        return [*conditions, new]
    return [new if c is old else c for c in conditions]  # keep the order: no spurious status writes


def own_status(status: dict[str, Any]) -> dict[str, Any]:
    """The part of a live status this reconciler owns, to compare with what it would write."""
    out = {k: status[k] for k in OWN_FIELDS if k in status}
    if "conditions" in out:
        out["conditions"] = [c for c in out["conditions"] if c.get("type") in OWN_CONDITIONS]
    return out


def condition(status: dict[str, Any], type_: str) -> Optional[dict[str, Any]]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), None)


BAD_WAITING = {"CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError",
               "CreateContainerError", "InvalidImageName"}


def pod_trouble(pods: list[dict[str, Any]]) -> Optional[str]:
    """A message about the first pod that is crash-looping or cannot start, if any."""
    for pod in pods:
        for cs in pod.get("status", {}).get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in BAD_WAITING:
                last = (cs.get("lastState") or {}).get("terminated") or {}
                detail = f", last exit code {last['exitCode']}" if "exitCode" in last else ""
                msg = (last.get("message") or waiting.get("message") or "").strip().splitlines()
                tail = f": {msg[-1][:300]}" if msg else ""
                return (f"pod {pod['metadata']['name']}: {cs.get('name')} is {waiting['reason']} "
                        f"(restarts {cs.get('restartCount', 0)}{detail}){tail}")
    return None


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


@dataclass
class Reconciler:
    kube: Kube
    hf_endpoint: Optional[str] = None
    prometheus_url: Optional[str] = None
    pdb_api_version: str = "policy/v1"
    hpa_api_version: str = "autoscaling/v2"
    clock: Callable[[], str] = utcnow
    fetch_config: Callable[..., dict] = field(default=None)  # type: ignore[assignment]
    #: config.json facts fetched for servers, kept between reconciles (catalog.ConfigCache).
    configs: catalog.ConfigCache = field(default_factory=catalog.ConfigCache)
    #: Watch-fed copies of servers, children and pods (cache.py); None: GET and LIST every time.
    objects: Optional[WatchedObjects] = None
    _keda: Optional[tuple[bool, float]] = field(default=None, repr=False)

    def managed_kinds(self) -> list[tuple[str, str]]:
        return [("v1", "Service"), ("apps/v1", "StatefulSet"), ("apps/v1", "DaemonSet"),
                (self.pdb_api_version, "PodDisruptionBudget"), (self.hpa_api_version, "HorizontalPodAutoscaler"),
                (KEDA_API_VERSION, "ScaledObject")]

    def serves_keda(self) -> bool:
        """Whether the cluster serves KEDA's ScaledObject (discovery, cached briefly: KEDA may be installed later)."""
        now = time.monotonic()
        if self._keda is None or now - self._keda[1] > DISCOVERY_TTL_SECONDS:
            self._keda = (self.kube.serves(KEDA_API_VERSION), now)
        return self._keda[0]

    # ---- entry point
    def _cached(self) -> Optional[WatchedObjects]:
        return self.objects if self.objects is not None and self.objects.ready else None

    def reconcile(self, namespace: str, name: str) -> Optional[Result]:
        cached = self._cached()
        body = cached.server(namespace, name) if cached else self.kube.get(api.API_VERSION, api.KIND, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
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
        if spec is not None:
            kwargs = {"fetch": self.fetch_config} if self.fetch_config else {}
            plan = pipeline.plan_server(name, namespace, spec, hf_endpoint=self.hf_endpoint,
                                        default_prometheus_url=self.prometheus_url,
                                        allow_unsafe_args=api.allows_unsafe_args(meta), configs=self.configs,
                                        **kwargs)
            errors = [str(p) for p in plan.problems]

        old_valid = condition(status, "SpecValid")
        if errors:
            result.valid = False
            message = "; ".join(errors)
            conditions = set_condition(conditions, "SpecValid", "False", "InvalidSpec", message, generation, now)
            if not old_valid or old_valid.get("status") != "False" or old_valid.get("message") != message:
                result.events.append(("Warning", "InvalidSpec", message))
            # Nothing new is applied: the children of the last valid spec keep serving.
            live = self._live_children(namespace, name, meta["uid"])
            workload = next((o for o in live.values() if o["kind"] in ("StatefulSet", "DaemonSet")), None)
            progress = workload_progress(workload)
            conditions = set_condition(conditions, "Degraded", "True", "InvalidSpec",
                                       "the spec cannot be deployed; the last valid version keeps running: " + message,
                                       generation, now)
            conditions = self._ready_conditions(conditions, progress, workload, generation, now, stalled=True)
            # kstatus (Flux) reads Stalled=True as "failed, will not progress by itself" instead of
            # waiting out its timeout on Ready=False; present only while the spec is invalid.
            conditions = set_condition(conditions, "Stalled", "True", "InvalidSpec", message, generation, now)
            kept = {k: status[k] for k in ("selector", "endpoint", "plan") if k in status}
            new_status = {**kept, "observedGeneration": generation, "conditions": conditions,
                          "replicas": progress["desired"], "readyReplicas": progress["ready"]}
        else:
            assert spec is not None and plan is not None
            conditions = [c for c in conditions if c.get("type") != "Stalled"]
            conditions = set_condition(conditions, "SpecValid", "True", "Planned",
                                       f"flags derived: {plan.max_model_len} tokens of context, "
                                       f"{plan.kv_cache_tokens} KV cache tokens per replica", generation, now)
            desired = [with_hash(o) for o in builders.build_all(plan, body, pdb_api_version=self.pdb_api_version,
                                                                hpa_api_version=self.hpa_api_version)]
            conditions, desired = self._external_scaler(name, spec, desired, conditions, generation, now, result)
            live = self._live_children(namespace, name, meta["uid"])
            workload = None
            for obj in desired:
                current = live.pop((obj["kind"], obj["metadata"]["name"]), None)
                if up_to_date(obj, current):
                    applied = current
                else:
                    # The autoscaler owns the replicas of an autoscaled StatefulSet: make it a co-owner
                    # before this apply stops sending them, or the server would drop them (back to 1).
                    autoscaled = obj["kind"] == "StatefulSet" and not builders.owns_replicas(spec)
                    if autoscaled and current is not None:
                        self._adopt_replicas(current, spec)
                    try:
                        applied = self._remember(self.kube.apply(obj))
                    except ApiError as e:
                        if self._replace_immutable(obj, e):
                            result.events.append(("Normal", "Recreating", f"{obj['kind']} {obj['metadata']['name']}: "
                                                  "its volumeClaimTemplates changed (spec.cache), which Kubernetes "
                                                  "cannot update in place; deleted it keeping its pods, to "
                                                  "re-create it"))
                            for type_, reason, message in result.events:
                                self.event(body, type_, reason, message)
                        raise
                    if autoscaled and current is None:
                        self._adopt_replicas(applied, spec)
                    result.applied.append(f"{obj['kind']}/{obj['metadata']['name']}")
                if obj["kind"] in ("StatefulSet", "DaemonSet"):
                    workload = applied
            for (kind, child), obj in live.items():  # owned by us, no longer wanted
                if self.kube.delete(obj["apiVersion"], kind, namespace, child, uid=obj["metadata"]["uid"]):
                    result.pruned.append(f"{kind}/{child}")
                if self.objects is not None:
                    self.objects.forget(obj)
            if result.pruned:
                result.events.append(("Normal", "Pruned", "removed " + ", ".join(result.pruned)))
            if result.applied:
                result.events.append(("Normal", "Applied", f"applied {', '.join(result.applied)}; vllm serve "
                                      + " ".join(plan.args)))
            progress = workload_progress(workload)
            cached = self._cached()
            pods = cached.pods(namespace, name) if cached else self.kube.list(
                "v1", "Pod", namespace, label_selector=builders.selector_string(name))
            trouble = pod_trouble(pods)
            if trouble:
                conditions = set_condition(conditions, "Degraded", "True", "PodFailing", trouble, generation, now)
            else:
                conditions = set_condition(conditions, "Degraded", "False", "AsExpected", "no pod is failing",
                                           generation, now)
            conditions = self._ready_conditions(conditions, progress, workload, generation, now)
            new_status = {
                "observedGeneration": generation,
                "conditions": conditions,
                "replicas": progress["desired"],
                "readyReplicas": progress["ready"],
                "selector": builders.selector_string(name),
                "endpoint": f"http://{name}.{namespace}.svc:{builders.PORT}/v1",
                "plan": {k: v for k, v in plan.status().items() if v is not None},
            }

        new_status["conditions"] = [c for c in new_status["conditions"] if c["type"] in OWN_CONDITIONS]
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
            cond = ("True", "HPAApplied", f"HorizontalPodAutoscaler {name} ({self.hpa_api_version}) "
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

    def _ready_conditions(self, conditions, progress, workload, generation, now, stalled=False):
        desired, ready = progress["desired"], progress["ready"]
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
                selector = (workload["spec"]["template"]["spec"].get("nodeSelector") or {})
                ready_c = ("False", "NoMatchingNodes",
                           "the DaemonSet runs on no node: no schedulable node matches its node selector "
                           + (", ".join(f"{k}={v}" for k, v in sorted(selector.items())) or "(none)")
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
        old = {c["type"]: c.get("status") for c in old_status.get("conditions") or []}
        for c in conditions:
            if c["type"] == "Ready" and old.get("Ready") != c["status"] and not (
                    old.get("Ready") is None and c["status"] == "False"):
                result.events.append(("Normal" if c["status"] == "True" else "Warning",
                                      "Ready" if c["status"] == "True" else "NotReady", c["message"]))
            if c["type"] == "Degraded" and c["status"] == "True" and c["reason"] == "PodFailing" and (
                    old.get("Degraded") != "True"):
                result.events.append(("Warning", "PodFailing", c["message"]))

    def _replace_immutable(self, obj: dict[str, Any], error: ApiError) -> bool:
        """A StatefulSet whose immutable fields (volumeClaimTemplates: spec.cache) must change: delete it
        with its pods orphaned, so the next reconcile creates it anew and it adopts them (the pods then roll
        to the new template). Only an object this operator manages; True when it was deleted."""
        if obj["kind"] != "StatefulSet" or error.status != 422 or "Forbidden" not in error.message:
            return False
        meta = obj["metadata"]
        live = self.kube.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        if live is None or (live["metadata"].get("labels") or {}).get(builders.SERVER_LABEL) != meta["name"]:
            return False
        log.info("re-creating %s/%s: %s", meta["namespace"], meta["name"], error.message)
        deleted = self.kube.delete(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"],
                                   uid=live["metadata"]["uid"], propagation="Orphan")
        if deleted and self.objects is not None:
            self.objects.forget(live)
        return deleted

    def _remember(self, answer: dict[str, Any]) -> dict[str, Any]:
        """Keep the answer to our own write until the watch delivers it (cache.py)."""
        if self.objects is not None:
            self.objects.remember(answer)
        return answer

    def _live_children(self, namespace: str, name: str, uid: str) -> dict[tuple[str, str], dict[str, Any]]:
        cached = self._cached()
        if cached:
            return cached.children(namespace, name, uid)
        selector = f"{builders.SERVER_LABEL}={name}"
        live: dict[tuple[str, str], dict[str, Any]] = {}
        for api_version, kind in self.managed_kinds():
            try:
                items = self.kube.list(api_version, kind, namespace, label_selector=selector)
            except ApiError as e:
                if e.status == 404:
                    continue
                raise
            for item in items:
                owners = item["metadata"].get("ownerReferences") or []
                if any(o.get("uid") == uid and o.get("controller") for o in owners):
                    item.setdefault("apiVersion", api_version)
                    item.setdefault("kind", kind)
                    live[(kind, item["metadata"]["name"])] = item
        return live

    def write_status(self, body: dict[str, Any], status: dict[str, Any]) -> None:
        """Server-side apply of the fields we own; fields we stop sending are removed by the server."""
        meta = body["metadata"]
        self._remember(self.kube.apply({"apiVersion": api.API_VERSION, "kind": api.KIND,
                                        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                                        "status": status}, subresource="status"))

    def event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        events.post_event(self.kube, body, type_, reason, message, component=COMPONENT, stamp=self.clock())
