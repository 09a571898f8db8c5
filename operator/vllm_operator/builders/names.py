"""The names every builder shares: ports, mount paths and labels, owner references, each object's metadata."""

from __future__ import annotations

import math
from typing import Any, Optional

from .. import api
from ..catalog import gpus
from ..planner import GiB, Plan


PORT = api.VLLM_PORT
PORT_NAME = "http"
CACHE_MOUNT = "/cache"
HF_HOME = f"{CACHE_MOUNT}/huggingface"
#: HOME of the non-root vLLM user: an emptyDir, since the image's /root is not writable by it (vLLM, torch.compile,
#: Triton and FlashInfer keep caches and settings under ~/.cache and ~/.config).
HOME = "/home/vllm"
PRESTOP_SECONDS = 10
GPU_RESOURCE = gpus.GPU_RESOURCE
GPU_PRODUCT_LABEL = gpus.GFD_PRODUCT_LABEL
MANAGED_BY = "vllm-operator"
SERVER_LABEL = f"{api.GROUP}/server"
#: A group's pods (spec.nodes > 1): "leader" (serves the API) or "worker" (vLLM --headless).
ROLE_LABEL = f"{api.GROUP}/role"
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
COORDINATION_PORT_NAME = "coordination"
#: The pod label an InferencePool selects its members by (the servers of one pool share it).
POOL_LABEL = f"{api.GROUP}/inference-pool"


# --------------------------------------------------------------------------- shared helpers
def selector_labels(name: str) -> dict[str, str]:
    """Labels that select one server's pods; never change them (selectors are immutable)."""
    return {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": name}


def labels(name: str, component: str = "server") -> dict[str, str]:
    return {
        **selector_labels(name),
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        SERVER_LABEL: name,
    }


def selector_string(name: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector_labels(name).items())


def owner_reference(owner: dict[str, Any]) -> dict[str, Any]:
    """Controller owner reference to the VLLMServer, so garbage collection removes children."""
    meta = owner["metadata"]
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(plan: Plan, name: str, owner: Optional[dict], component: str = "server") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": plan.namespace, "labels": labels(plan.name, component)}
    if owner is not None:
        meta["ownerReferences"] = [owner_reference(owner)]
    return meta


def quantity(n: int) -> str:
    """Bytes as a whole number of Gi (or Mi below 1 Gi), the way people write them."""
    if n % GiB == 0 or n >= 16 * GiB:
        return f"{math.ceil(n / GiB)}Gi"
    return f"{math.ceil(n / 2**20)}Mi"


def headless_service_name(name: str) -> str:
    return f"{name}-headless"


def shared_cache_claim_name(name: str) -> str:
    return f"{name}-cache"
