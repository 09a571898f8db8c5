"""Operator HA with kopf peering: one active replica, the others paused until it stops.

kopf's peering is not a lock: every replica writes keep-alives into one peering object
(`ClusterKopfPeering`, or a `KopfPeering` per watched namespace), and a replica pauses
while it sees a live peer with a *higher* priority. Peers with the *same* priority all
pause (kopf cannot tell which should win), so each replica needs its own priority.
By default the oldest replica wins: the priority falls with the start time, plus a random
tie-break, so a new replica (a rolling update, a rescheduled pod) never takes over from a
healthy one. A replica that dies without a goodbye (SIGKILL, a lost node) holds the others
off until its keep-alive expires: `lifetime` seconds bound the takeover time.

See docs/ha.md for the CRDs (crds/kopf-peering.yaml) and the RBAC this needs.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Optional, Sequence

from .kube.client import ApiError, Kube

log = logging.getLogger("vllm_operator.peering")

GROUP_VERSION = "kopf.dev/v1"
CLUSTER_PLURAL = "clusterkopfpeerings"
NAMESPACED_PLURAL = "kopfpeerings"
#: Seconds a peer's keep-alive holds: kopf refreshes it every lifetime - 5..10 s (at least 1 s).
DEFAULT_LIFETIME = 15
_EPOCH_CEILING = 4_000_000_000  # seconds; far beyond any start time


def default_priority(now: Optional[float] = None, rng: Optional[random.Random] = None) -> int:
    """Older replicas rank higher; the random part separates replicas started in the same second."""
    started = int(time.time() if now is None else now)
    return (_EPOCH_CEILING - started) * 1_000_000 + (rng or random).randrange(1_000_000)


def ensure_peering(kube: Kube, name: str, namespaces: Sequence[str] = ()) -> list[str]:
    """Create the peering object(s) kopf needs when missing; returns the paths created.

    Without its peering object kopf cannot see its peers, and every replica would be active.
    """
    created = []
    paths = [f"/apis/{GROUP_VERSION}/namespaces/{ns}/{NAMESPACED_PLURAL}" for ns in namespaces] or [
        f"/apis/{GROUP_VERSION}/{CLUSTER_PLURAL}"]
    kind = "KopfPeering" if namespaces else "ClusterKopfPeering"
    for path in paths:
        try:
            kube.request("POST", path, body={"apiVersion": GROUP_VERSION, "kind": kind, "metadata": {"name": name}})
            created.append(f"{path}/{name}")
        except ApiError as e:
            if e.status == 409:
                continue
            if e.status == 404:
                raise RuntimeError(f"{kind} is not installed: apply crds/kopf-peering.yaml before running with "
                                   "--peering (docs/ha.md)") from e
            raise
    for path in created:
        log.info("created the peering object %s", path)
    return created
