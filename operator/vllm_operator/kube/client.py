"""A thin typed-free layer over the Kubernetes REST API: server-side apply, get, list, delete, events.

Plain dicts in and out (the builders' output is sent as is), through the official
client's ApiClient for auth and TLS. The base of the runtime: the reconciler, the autoscaler's
actuator, the informers and peering use it; the pure core and the sources never do
(docs/architecture.md).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Optional

from kubernetes import client as k8s

from .. import telemetry

FIELD_MANAGER = "vllm-operator"

#: (apiVersion, kind) -> plural, for the kinds the operator manages or reads.
PLURALS = {
    ("v1", "Service"): "services",
    ("v1", "Pod"): "pods",
    ("v1", "Event"): "events",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
    ("v1", "Namespace"): "namespaces",
    ("apps/v1", "StatefulSet"): "statefulsets",
    ("apps/v1", "DaemonSet"): "daemonsets",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "horizontalpodautoscalers",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobjects",
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkersets",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitors",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("apps/v1", "Deployment"): "deployments",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepools",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproutes",
    ("vllm-operator.io/v1alpha1", "VLLMServer"): "vllmservers",
}


class ApiError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, body: str, method: str, path: str):
        self.status = status
        self.body = body
        try:
            parsed = json.loads(body)
            self.message = parsed.get("message", body)
            self.reason = parsed.get("reason", "")
        except ValueError:
            self.message, self.reason = body, ""
        super().__init__(f"{method} {path}: {status} {self.message}")


def path_for(api_version: str, kind: str, namespace: Optional[str], name: Optional[str] = None,
             subresource: Optional[str] = None) -> str:
    plural = PLURALS[(api_version, kind)]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if namespace:
        base += f"/namespaces/{namespace}"
    base += f"/{plural}"
    if name:
        base += f"/{name}"
    if subresource:
        base += f"/{subresource}"
    return base


# A \uD8xx\uDCxx pair not preceded by an escaped backslash (an even run of backslashes is literal text).
_SURROGATE_PAIR = re.compile(r"(?<!\\)((?:\\\\)*)\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})")


def yaml_json(obj: Any) -> str:
    """JSON that the API server's YAML parser reads back unchanged, for application/apply-patch+yaml.

    Plain json.dumps writes a character beyond U+FFFF (an emoji in a served model name) as a
    UTF-16 surrogate pair, \\ud83e\\udd99, which is JSON but not YAML: the API server refuses the
    whole patch ("found invalid Unicode character escape code"). YAML's own 8-digit escape
    says the same character; everything else stays ASCII-escaped JSON.
    """
    def astral(m: re.Match) -> str:
        high, low = int(m.group(2), 16), int(m.group(3), 16)
        return m.group(1) + "\\U%08x" % (0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))

    return _SURROGATE_PAIR.sub(astral, json.dumps(obj))


@dataclass
class Kube:
    """Raw REST calls through one ApiClient."""

    api: k8s.ApiClient
    field_manager: str = FIELD_MANAGER
    timeout: float = 30.0

    def request(self, method: str, path: str, *, query: Optional[list[tuple[str, str]]] = None,
                body: Any = None, content_type: str = "application/json") -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        if "yaml" in content_type and body is not None and not isinstance(body, (str, bytes)):
            body = yaml_json(body)  # the API server parses it as YAML
        m, url, hdrs, ser_body, _ = self.api.param_serialize(
            method=method, resource_path=path, query_params=query or [], header_params=headers,
            body=body, auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(m, url, header_params=hdrs, body=ser_body, _request_timeout=self.timeout)
        data = resp.read()
        text = data.decode() if isinstance(data, bytes) else (data or "")
        if not 200 <= resp.status < 300:
            raise ApiError(resp.status, text, method, path)
        labels = telemetry.api_write_labels(method, path, content_type)
        if labels is not None:
            telemetry.record_api_write(*labels)
        return json.loads(text) if text else None

    # ---- objects
    def apply(self, obj: dict[str, Any], *, subresource: Optional[str] = None,
              field_manager: Optional[str] = None) -> dict[str, Any]:
        """Server-side apply under our field manager; force takes fields back from hand edits."""
        meta = obj["metadata"]
        path = path_for(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"], subresource)
        query = [("fieldManager", field_manager or self.field_manager), ("force", "true")]
        return self.request("PATCH", path, query=query, body=obj, content_type="application/apply-patch+yaml")

    def get(self, api_version: str, kind: str, namespace: Optional[str], name: str) -> Optional[dict[str, Any]]:
        try:
            return self.request("GET", path_for(api_version, kind, namespace, name))
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def list(self, api_version: str, kind: str, namespace: Optional[str], *,
             label_selector: Optional[str] = None) -> list[dict[str, Any]]:
        query = [("labelSelector", label_selector)] if label_selector else []
        return self.request("GET", path_for(api_version, kind, namespace), query=query).get("items", [])

    def delete(self, api_version: str, kind: str, namespace: Optional[str], name: str, *,
               uid: Optional[str] = None, propagation: str = "Background") -> bool:
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", path_for(api_version, kind, namespace, name), body=body)
            return True
        except ApiError as e:
            if e.status in (404, 409):
                return False
            raise

    def merge_patch(self, api_version: str, kind: str, namespace: Optional[str], name: str, patch: dict,
                    *, subresource: Optional[str] = None) -> dict[str, Any]:
        return self.request("PATCH", path_for(api_version, kind, namespace, name, subresource), body=patch,
                            content_type="application/merge-patch+json")

    def serves(self, group_version: str) -> bool:
        """Whether the API server serves an API group version (discovery)."""
        path = f"/apis/{group_version}" if "/" in group_version else f"/api/{group_version}"
        try:
            self.request("GET", path)
            return True
        except ApiError as e:
            if e.status == 404:
                return False
            raise
