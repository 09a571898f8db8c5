"""What one reconcile reports about a VLLMServer: its conditions, the progress of its workload, the status it
writes and the Events to emit, from plain data (the live status, the workload and pods as read, the plan). Pure:
no API client; the reconciler (controller/reconcile.py) reads the cluster, calls these and writes the result.

An Event to emit is a (type, reason, message) tuple; the functions that decide one return it, never post it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Optional, Protocol

from . import adapters as lora, api, bounds, builders, planner
from .conditions import EXTRA_ARGS_UNCHECKED, Conditions, condition

Event = tuple[str, str, str]

#: Status fields the reconciler owns (server-side apply on /status under its field manager);
#: the autoscaler owns status.autoscaling and its own conditions under another manager.
OWN_FIELDS = ("observedGeneration", "conditions", "replicas", "readyReplicas", "selector", "endpoint", "plan",
              "kvCapacity", "adapters", "servedModels", "chatTemplate")
OWN_CONDITIONS = ("SpecValid", "Ready", "Progressing", "Degraded", "ExternalScaler", "Stalled", "Reconciling",
                  "PlanOutdated", EXTRA_ARGS_UNCHECKED, "AdaptersReady", "Routing")
#: Status fields an invalid spec leaves as they are: what the last valid spec deployed still serves.
KEPT_WHILE_INVALID = ("selector", "endpoint", "plan", "kvCapacity", "adapters", "servedModels")


class Trouble(Protocol):
    """Why pods do not serve (controller/failures.py's Failure): a reason, a message, and whether it may resolve
    by itself (a node being added)."""

    @property
    def reason(self) -> str: ...

    @property
    def message(self) -> str: ...

    @property
    def waiting(self) -> bool: ...


# --------------------------------------------------------------------------- the workload
def idles_to_zero(spec: api.VLLMServerSpec) -> bool:
    """An autoscaled StatefulSet that may go to zero when idle (and comes back on a request)."""
    a = spec.autoscaling
    return a.enabled and a.min_replicas == 0 and spec.workload == "StatefulSet"


def workload_progress(workload: Optional[dict[str, Any]]) -> dict[str, Any]:
    """Desired/ready/updated counts of the StatefulSet, DaemonSet or LeaderWorkerSet (groups) and whether it has
    settled."""
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
    elif workload["kind"] == builders.LWS_KIND:  # counted in groups: a group is ready when all its pods are
        desired = workload["spec"].get("replicas", 1)
        ready = st.get("readyReplicas", 0)
        updated = st.get("updatedReplicas", 0)
        settled = gen_ok and ready >= desired and updated >= desired and st.get("replicas", 0) == desired
    else:
        desired = st.get("desiredNumberScheduled", 0)
        ready = st.get("numberReady", 0)
        updated = st.get("updatedNumberScheduled", 0)
        settled = gen_ok and ready >= desired and updated >= desired
    return {"desired": desired, "ready": ready, "updated": updated, "settled": settled}


def pod_templates(workload: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod templates of a workload: a LeaderWorkerSet's leader and worker, another kind's one."""
    if workload["kind"] == builders.LWS_KIND:
        group = workload["spec"]["leaderWorkerTemplate"]
        return [t for t in (group.get("leaderTemplate"), group.get("workerTemplate")) if t]
    return [workload["spec"]["template"]]


# --------------------------------------------------------------------------- conditions
def kstatus_reconciling(conditions: Conditions) -> None:
    """Reconciling=True while a rollout replaces pods that already serve (Ready=True and Progressing=True, the
    rollout's reason and message), absent otherwise. kstatus (Flux, kpt, cli-utils) knows no Progressing and reads
    Ready=True as Current: without it a rollout would pass Flux's health check before any pod runs the new spec.
    Ready=False already reads as InProgress with Ready's message (what keeps the replicas from serving), and
    Stalled=True (Failed) wins: kstatus takes whichever of the two comes first, so never both."""
    progressing = conditions.true("Progressing")
    if progressing is None or conditions.true("Ready") is None or conditions.true("Stalled") is not None:
        conditions.remove("Reconciling")
    else:
        conditions.set("Reconciling", "True", progressing.reason, progressing.message)


def degraded_condition(trouble: Optional[Trouble]) -> tuple[str, str, str]:
    """Degraded's (status, reason, message): True with the failure's own reason (failures.py); a failure that
    is only waiting (a node being added) is not one."""
    if trouble is None or trouble.waiting:
        return "False", "AsExpected", "no pod is failing"
    return "True", trouble.reason, trouble.message


def ready_conditions(conditions: Conditions, progress: dict[str, Any], workload: Optional[dict[str, Any]], *,
                     spec: Optional[api.VLLMServerSpec] = None, reason: str = "InvalidSpec", stalled: bool = False,
                     trouble: Optional[Trouble] = None, blocked: Optional[tuple[str, str]] = None) -> None:
    """Ready (are the replicas serving, and if not, why) and Progressing (is the workload rolling out). `reason`:
    why the spec cannot be deployed, while `stalled`; `blocked`: (reason, message) when nothing was applied."""
    desired, ready = progress["desired"], progress["ready"]
    if workload is None and blocked is not None:  # nothing applied: a name conflict or a refused apply
        conditions.set("Ready", "False", *blocked)
        conditions.set("Progressing", "False", *blocked)
        return
    if workload is None:
        conditions.set("Ready", "False", "NoWorkload", "no workload has been created")
        conditions.set("Progressing", "False" if stalled else "True", reason if stalled else "Creating",
                       "waiting for a valid spec" if stalled else "creating the workload")
        return
    conditions.set("Ready", *_ready(progress, workload, spec, trouble))
    if progress["settled"]:
        prog = ("False", "Stable", f"{workload['kind']} is up to date")
    else:
        prog = ("True", "RollingOut", f"{workload['kind']}: {progress['updated']}/{desired} updated, "
                f"{ready}/{desired} ready")
    conditions.set("Progressing", *prog)


def _ready(progress: dict[str, Any], workload: dict[str, Any], spec: Optional[api.VLLMServerSpec],
           trouble: Optional[Trouble]) -> tuple[str, str, str]:
    """Ready's (status, reason, message) for a workload that exists."""
    desired, ready = progress["desired"], progress["ready"]
    unit = "groups" if workload["kind"] == builders.LWS_KIND else "replicas"  # a group is a replica of nodes
    if desired == 0 and workload["kind"] == "DaemonSet":
        # A DaemonSet's count is the nodes it matches: zero is not a choice but a cluster that has
        # no such node (a GPU product label that no node carries, a taint not tolerated).
        if progress["settled"]:
            return ("False", "NoMatchingNodes",
                    "the DaemonSet runs on no node: no schedulable node matches its node selector "
                    + (builders.node_requirements_text(workload["spec"]["template"]["spec"]) or "(none)")
                    + " and tolerates its taints (check spec.gpu.product, spec.nodeSelector, spec.tolerations)")
        return "False", "NoReplicasReady", "waiting for the DaemonSet controller to count the nodes"
    if desired == 0 and spec is not None and idles_to_zero(spec):
        return ("True", "ScaledToZero", f"idle: scaled to zero after {spec.autoscaling.scale_to_zero.idle_seconds}s "
                "without a request; the next request wakes a replica (docs/scale-to-zero.md)")
    if desired == 0:
        return "True", "ScaledToZero", "no replicas requested"
    if ready >= desired:
        return "True", "AllReplicasReady", f"{ready}/{desired} {unit} ready"
    if ready > 0:
        return "False", "PartiallyReady", f"{ready}/{desired} {unit} ready"
    if trouble is not None:  # named: what keeps every replica from serving
        return "False", trouble.reason, f"0/{desired} {unit} ready: {trouble.message}"
    return "False", "NoReplicasReady", f"0/{desired} {unit} ready (models load for minutes)"


def health_conditions(conditions: Conditions, progress: dict[str, Any], workload: Optional[dict[str, Any]],
                      spec: api.VLLMServerSpec, trouble: Optional[Trouble],
                      blocked: Optional[tuple[str, str]]) -> None:
    """Degraded (and Stalled with it), then Ready and Progressing, for a valid spec."""
    degraded = ("True", *blocked) if blocked else degraded_condition(trouble)
    conditions.set("Degraded", *degraded)
    if degraded[0] == "True":
        # kstatus (Flux, kpt, cli-utils) knows no Degraded: Stalled=True makes it report the failure
        # (a crash loop, an image it cannot pull, a name taken) instead of InProgress until its timeout.
        # Updated in place, never dropped and re-added: its lastTransitionTime stays, a resync writes nothing.
        conditions.set("Stalled", "True", degraded[1], degraded[2])
    else:
        conditions.remove("Stalled")
    ready_conditions(conditions, progress, workload, spec=spec, trouble=trouble, blocked=blocked)


def plan_outdated(conditions: Conditions, message: Optional[str]) -> list[Event]:
    """PlanOutdated=True with what a re-plan would change (controller/replan.py's message), while the workload
    keeps its plan; absent when `message` is None. An Event when it appears or its message changes."""
    if message is None:
        conditions.remove("PlanOutdated")
        return []
    message = bounds.message(message)
    old = conditions.get("PlanOutdated")
    conditions.set("PlanOutdated", "True", "PlanChanged", message)
    return [("Normal", "PlanOutdated", message)] if old is None or old.message != message else []


# --------------------------------------------------------------------------- statuses
def invalid_spec(conditions: Conditions, live: dict[str, Any], errors: list[str], reason: str,
                 workload: Optional[dict[str, Any]], spec: Optional[api.VLLMServerSpec] = None
                 ) -> tuple[api.VLLMServerStatus, list[Event]]:
    """An invalid spec: nothing new is applied, the children of the last valid spec keep serving (`workload`, as
    read), and the status says why (SpecValid, Degraded and Stalled False/True with the reason). `live`: the live
    status, whose fields of the last valid spec are kept; `spec`: the spec when it parsed (a plan refused it)."""
    message = bounds.message("; ".join(errors))
    old_valid = condition(live, "SpecValid")
    conditions.set("SpecValid", "False", reason, message)
    events: list[Event] = []
    if not old_valid or old_valid.get("status") != "False" or old_valid.get("message") != message:
        events.append(("Warning", reason, message))
    progress = workload_progress(workload)
    serving = ("the last valid version keeps running" if workload is not None
               else "nothing has been deployed")  # a new object never had a valid version
    conditions.set("Degraded", "True", reason, f"the spec cannot be deployed; {serving}: {message}")
    ready_conditions(conditions, progress, workload, spec=spec, reason=reason, stalled=True)
    # Ready's reason is the cause (the Reason column of kubectl get): its status still counts the replicas of
    # the last valid version, if any.
    ready = conditions.get("Ready")
    if workload is None:
        conditions.set("Ready", "False", reason, "the spec cannot be deployed: " + message)
    elif ready is not None:
        conditions.set("Ready", ready.status, reason, f"{ready.message}; the last valid version "
                       f"keeps running, this spec cannot be deployed: {message}")
    # kstatus (Flux) reads Stalled=True as "failed, will not progress by itself" instead of
    # waiting out its timeout on Ready=False; present while the spec is invalid or Degraded is True.
    conditions.set("Stalled", "True", reason, message)
    kept = api.VLLMServerStatus.from_live({k: live[k] for k in KEPT_WHILE_INVALID if k in live})
    return api.VLLMServerStatus(observed_generation=conditions.generation, replicas=progress["desired"],
                                ready_replicas=progress["ready"], selector=kept.selector,
                                endpoint=kept.endpoint, plan=kept.plan, kv_capacity=kept.kv_capacity,
                                adapters=kept.adapters, served_models=kept.served_models), events


def deployed(name: str, namespace: str, conditions: Conditions, progress: dict[str, Any], plan: planner.Plan, *,
             live: dict[str, Any], outdated: bool = False, serves: bool = True,
             kv_capacity: Optional[api.KVCapacityStatus] = None,
             adapters: Optional[list[api.AdapterStatus]] = None,
             served_models: Optional[list[str]] = None) -> api.VLLMServerStatus:
    """The status of a valid spec: the workload's counts, where it serves (`serves`: something of ours does, else
    no endpoint is advertised: the name may be someone else's), and the plan: the running pods' own while the
    workload is kept on it (`outdated`, controller/replan.py)."""
    plan_status = api.PlanStatus.model_validate(plan.status())
    if outdated and "plan" in live:
        plan_status = api.PlanStatus.from_live(live["plan"])  # the plan the running pods were deployed with
    return api.VLLMServerStatus(
        observed_generation=conditions.generation, replicas=progress["desired"], ready_replicas=progress["ready"],
        selector=builders.selector_string(name) if serves else None,
        endpoint=f"http://{name}.{namespace}.svc:{builders.PORT}/v1" if serves else None,
        plan=plan_status, kv_capacity=kv_capacity, adapters=adapters, served_models=served_models)


def adapter_status(conditions: Conditions, spec: api.VLLMServerSpec, known: list[lora.PodAdapters],
                   live: dict[str, Any], in_service: Optional[Collection[str]] = None
                   ) -> tuple[list[api.AdapterStatus], list[str], list[Event]]:
    """status.adapters and servedModels from what the pods whose vLLM answers list (`known`: controller/adapters.py's
    observation), the AdaptersReady condition, and a Warning Event for each new failure. `in_service`: the pods
    in the Service (Ready: a pod still held back by the adapters' readiness gate is not), the only ones servedModels
    counts; None: every pod of `known`."""
    names = [a.name for a in spec.adapters]
    rows = lora.adapter_rows(names, known)
    previous = {r.get("name"): r.get("lastError") for r in live.get("adapters") or [] if isinstance(r, dict)}
    sources = {a.name: a.source for a in spec.adapters}
    events: list[Event] = []
    for row in rows:
        if row.get("lastError") and row["lastError"] != previous.get(row["name"]):
            events.append(("Warning", "AdapterLoadFailed", f"adapter {row['name']} ({sources[row['name']]}) did "
                           f"not load on {row['lastError']}; the model and the other adapters keep serving"))
    conditions.set("AdaptersReady", *lora.condition(rows))
    return ([api.AdapterStatus.model_validate(r) for r in rows],
            lora.served_models(spec.model.served_name or spec.model.name, names,
                               [k for k in known if in_service is None or k.pod in in_service]), events)


# --------------------------------------------------------------------------- the report
@dataclass
class Report:
    """The status to write (the wire form, bounded), whether it differs from the live one, and the Events of
    the transitions it makes."""

    status: dict[str, Any]
    changed: bool
    ready: bool
    events: list[Event]


def own_status(status: dict[str, Any]) -> dict[str, Any]:
    """The part of a live status the reconciler owns, to compare with what it would write."""
    out = {k: status[k] for k in OWN_FIELDS if k in status}
    if "conditions" in out:
        out["conditions"] = [c for c in out["conditions"] if c.get("type") in OWN_CONDITIONS]
    return out


def report(status: api.VLLMServerStatus, conditions: Conditions, live: dict[str, Any], *,
           chat_template: Optional[api.ChatTemplateStatus] = None, failure_reasons: Collection[str] = (),
           blocked_reasons: Collection[str] = ()) -> Report:
    """The conditions the reconciler owns into the status (Reconciling from the others), bounded, compared with
    the `live` status; the Events of Ready and Degraded transitions (transition_events)."""
    kstatus_reconciling(conditions)
    status.conditions = conditions.only(OWN_CONDITIONS)
    status.chat_template = chat_template
    new = bounds.bounded_status(status.wire())
    ready = condition(new, "Ready")
    return Report(new, new != own_status(live), ready is not None and ready["status"] == "True",
                  transition_events(live, new["conditions"], failure_reasons, blocked_reasons))


def transition_events(old_status: dict[str, Any], conditions: list[dict[str, Any]],
                      failure_reasons: Collection[str], blocked_reasons: Collection[str]) -> list[Event]:
    """An Event when Ready changes, and one when pods start failing or fail for another reason (the Event's
    reason is the failure's, one of `failure_reasons`: OOMKilled, FailedCreate, ...); one when nothing could be
    applied (`blocked_reasons`: a name taken, a refused apply) appears or its message changes."""
    old = {c["type"]: c for c in old_status.get("conditions") or []}
    was = {t: c.get("status") for t, c in old.items()}
    events: list[Event] = []
    for c in conditions:
        if c["type"] == "Ready" and was.get("Ready") != c["status"] and not (
                was.get("Ready") is None and c["status"] == "False"):
            events.append(("Normal" if c["status"] == "True" else "Warning",
                           "Ready" if c["status"] == "True" else "NotReady", c["message"]))
        if c["type"] == "Degraded" and c["status"] == "True" and c["reason"] in failure_reasons and (
                was.get("Degraded") != "True" or old["Degraded"].get("reason") != c["reason"]):
            events.append(("Warning", c["reason"], c["message"]))
        if c["type"] == "Degraded" and c["status"] == "True" and c["reason"] in blocked_reasons and (
                was.get("Degraded") != "True" or old["Degraded"].get("reason") != c["reason"]
                or old["Degraded"].get("message") != c["message"]):
            events.append(("Warning", c["reason"], c["message"]))
    return events
