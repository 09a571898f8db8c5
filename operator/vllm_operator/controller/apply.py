"""Apply a server's children and prune the ones it no longer wants: server-side apply under one field manager, only
what is not live yet; never adopt a name this server does not control (one GET for a child not seen as ours);
a StatefulSet whose immutable volumeClaimTemplates changed re-created keeping its pods; an apply the API server
refuses held back and retried slowly (apierrors.rejected_backoff) unless what would be sent changes.

`Applier` is the Reconciler's part that writes children (controller/reconcile.py mixes it in): it uses the
Reconciler's API client, reader, re-plan budget and clock, and keeps the refusals it holds back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from .. import api, bounds, builders
from . import replan
from .drift import HASH_ANNOTATION, is_subset, up_to_date
from ..autoscaler import ownership
from ..informers.reader import Reader, controlled_by
from ..kube import apierrors
from ..kube.client import ApiError, Kube

if TYPE_CHECKING:
    from .reconcile import Pass, Result

log = logging.getLogger("vllm_operator.controller.reconcile")

#: The kinds that run the pods: a server's one workload.
WORKLOAD_KINDS = ("StatefulSet", "DaemonSet", builders.LWS_KIND)
#: The Degraded reason when a child's name is taken by an object this server does not control (never adopted).
NAME_CONFLICT = "NameConflict"
#: Degraded reasons that mean "nothing new was applied": each gets a Warning Event when it appears or its message
#: changes.
BLOCKED_REASONS = (NAME_CONFLICT, apierrors.API_REJECTED)


def immutable_claims_refused(error: ApiError) -> bool:
    """Whether the API server refused a StatefulSet update for its volumeClaimTemplates (immutable). Kubernetes
    1.37 says "spec.volumeClaimTemplates: Invalid value: ...: field is immutable"; releases before declarative
    validation said "spec: Forbidden: updates to statefulset spec for fields other than ... are forbidden"."""
    if error.status != 422:
        return False
    message = error.message
    return ("volumeClaimTemplates" in message and "immutable" in message) or "updates to statefulset spec" in message


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


class Applier:
    """Applies and prunes a server's children; mixed into the Reconciler, whose fields below it uses."""

    kube: Kube
    reader: Reader
    #: Automatic re-plans of servers an operator upgrade left on an older plan (replan.py).
    replan_budget: replan.Budget
    monotonic: Callable[[], float]
    #: (namespace, server) -> the apply the API server last refused, held back until its slow retry is due.
    _refused: dict[tuple[str, str], Refusal]

    def event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        raise NotImplementedError  # the Reconciler's

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

    def _apply_children(self, run: Pass, live: dict[tuple[str, str], dict[str, Any]]
                        ) -> tuple[Optional[dict[str, Any]], Optional[tuple[str, str]]]:
        """Apply what is not live yet, in order; the workload as applied (or live), and (reason, message) when the
        API server refused a child (the later ones are not sent). Seen children are removed from `live`: what
        stays there is no longer wanted."""
        body, spec, result = run.body, run.spec, run.result
        assert spec is not None
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        workload = None
        for obj in run.desired:
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
                autoscaled = obj["kind"] in ("StatefulSet", builders.LWS_KIND) and not builders.owns_replicas(spec)
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
                    log.warning("%s/%s: %s", key[0], key[1], bounds.clean(message, bounds.EVENT_MESSAGE_CHARS))
                    return workload or self._live_workload(live, current), (apierrors.API_REJECTED, message)
                if autoscaled and current is None:
                    self._adopt_replicas(applied, spec)
                result.applied.append(f"{obj['kind']}/{obj['metadata']['name']}")
            if obj["kind"] in WORKLOAD_KINDS:
                workload = applied
        return workload, None

    @staticmethod
    def _live_workload(live: dict[tuple[str, str], dict[str, Any]],
                       current: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
        """The workload still running when an apply stopped short: the one being applied, or another kind's."""
        if current is not None and current["kind"] in WORKLOAD_KINDS:
            return current
        return next((o for o in live.values() if o["kind"] in WORKLOAD_KINDS), None)

    def _prune(self, namespace: str, unwanted: dict[tuple[str, str], dict[str, Any]], result: Result) -> None:
        """Delete children this server controls but no longer wants (`unwanted` holds only objects with its
        controller reference; the delete is conditional on their uid)."""
        for (kind, child), obj in unwanted.items():
            if self.kube.delete(obj["apiVersion"], kind, namespace, child, uid=obj["metadata"]["uid"]):
                result.pruned.append(f"{kind}/{child}")
            self.reader.forget(obj)
        if result.pruned:
            result.events.append(("Normal", "Pruned", "removed " + ", ".join(result.pruned)))

    def _adopt_replicas(self, sts: dict[str, Any], spec: api.VLLMServerSpec) -> None:
        a = spec.autoscaling
        ownership.adopt_replicas(self.kube, sts, a.min_replicas, a.max_replicas, self.kube.field_manager)

    def _replace_immutable(self, obj: dict[str, Any], error: ApiError, uid: str) -> bool:
        """A StatefulSet whose immutable fields (volumeClaimTemplates: spec.cache) must change: delete it
        with its pods orphaned, so the next reconcile creates it anew and it adopts them (the pods then roll
        to the new template). Only an object this operator manages; True when it was deleted."""
        if obj["kind"] != "StatefulSet" or not immutable_claims_refused(error):
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
