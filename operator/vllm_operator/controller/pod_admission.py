"""Pod Security as the API server judges it: a server-side dry run (dryRun=All) of a Pod made from the workload's
final template, in the server's namespace, before anything is applied.

podsecurity.py reads the Pod Security Standards offline (the CLI's `plan`, and the reconciler's first look); the
API server's own Pod Security admission is what the StatefulSet or DaemonSet controller's pod creations will meet,
with the namespace's labels and the cluster's AdmissionConfiguration defaults and exemptions. Asking it with a dry
run makes nothing (no Pod is stored, no quota used) and needs `create` on pods (the chart's ClusterRole grants it
for this; docs/security.md). A refusal that names Pod Security becomes the condition reason PodSecurityForbidden
with the API server's words (one line, bounded); any other refusal (a quota, another policy, a ServiceAccount
not yet created) is left to the controllers' FailedCreate, which the failure reporting already reads.

One dry run per (namespace, workload template) is remembered for CACHE_SECONDS, at most CACHE_ENTRIES of them,
so a steady server costs no request; a 403 (no RBAC for it: the Roles-only mode without pods create) turns the
dry run off for that namespace for the same time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..kube.client import ApiError, Kube, path_for
from . import failures

log = logging.getLogger(__name__)

CACHE_SECONDS = 300.0
CACHE_ENTRIES = 2048
#: The longest API server message quoted in the condition.
MAX_MESSAGE = 1024
#: Words of Pod Security admission's refusal (k8s.io/pod-security-admission: 'violates PodSecurity "baseline:..."').
POD_SECURITY_WORDS = "violates PodSecurity"


def dry_run_pod(workload: dict[str, Any]) -> dict[str, Any]:
    """The Pod the workload's controller would create first: its template, the claims of its volumeClaimTemplates
    as volumes (the StatefulSet controller adds them), a generated name."""
    template = json.loads(json.dumps(workload["spec"]["template"]))
    spec = template["spec"]
    for claim in workload["spec"].get("volumeClaimTemplates") or []:
        name = claim["metadata"]["name"]
        spec.setdefault("volumes", []).append(
            {"name": name, "persistentVolumeClaim": {"claimName": f"{name}-{workload['metadata']['name']}-0"}})
    meta = {k: v for k, v in (template.get("metadata") or {}).items() if k in ("labels", "annotations")}
    meta["generateName"] = f"{workload['metadata']['name'][:40]}-podsecurity-"
    meta["namespace"] = workload["metadata"]["namespace"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


@dataclass
class PodAdmission:
    """The dry runs of one operator, remembered by (namespace, template digest)."""

    monotonic: Callable[[], float] = time.monotonic
    _seen: "OrderedDict[tuple[str, str], tuple[Optional[str], float]]" = field(default_factory=OrderedDict)
    _denied: dict[str, float] = field(default_factory=dict)

    def refusal(self, kube: Kube, workload: dict[str, Any]) -> Optional[str]:
        """Why the namespace's Pod Security admission refuses the workload's pods (None: it admits them, or it
        could not be asked)."""
        namespace = workload["metadata"]["namespace"]
        now = self.monotonic()
        if self._denied.get(namespace, 0.0) > now:
            return None
        pod = dry_run_pod(workload)
        key = (namespace, hashlib.sha256(json.dumps(pod, sort_keys=True).encode()).hexdigest())
        hit = self._seen.get(key)
        if hit is not None and hit[1] > now:
            return hit[0]
        try:
            kube.request("POST", path_for("v1", "Pod", namespace), query=[("dryRun", "All")], body=pod)
            why = None
        except ApiError as e:
            why = self._why(namespace, e, now)
            if why is None and e.status not in (400, 403, 409, 422):
                # 429, 5xx (a webhook down): not asked this time, nothing remembered; the apply goes ahead and the
                # controller's FailedCreate tells if the pods are refused.
                log.info("namespace %s: the Pod Security dry run failed (HTTP %s); not checked this time",
                         namespace, e.status)
                return None
        self._seen[key] = (why, now + CACHE_SECONDS)
        self._seen.move_to_end(key)
        while len(self._seen) > CACHE_ENTRIES:
            self._seen.popitem(last=False)
        return why

    def _why(self, namespace: str, e: ApiError, now: float) -> Optional[str]:
        if e.status == 403 and POD_SECURITY_WORDS in e.message:
            return (f"namespace {namespace}: the API server's Pod Security admission refuses the pods (a dry run of "
                    f"the first one): {failures.clean(e.message, MAX_MESSAGE)}. Change the spec, or ask for a "
                    "namespace whose level allows it")
        if e.status == 403 and "cannot create resource" in e.message:
            log.info("namespace %s: no RBAC to dry-run pods; Pod Security is read offline only", namespace)
            self._denied[namespace] = now + CACHE_SECONDS
        return None
