"""spec.routing: the Gateway API Inference Extension's routing (an InferencePool of the server's pods, its endpoint
picker, an optional HTTPRoute to a Gateway of the same namespace). Opt-in; docs/routing.md says how it is wired."""

from __future__ import annotations

from typing import Annotated, Optional

from pydantic import ConfigDict, Field

from .kube_types import DNS_LABEL_PATTERN
from .names import _Model, _rules, cel

#: The endpoint picker image of the extension's release the operator's picker config and flags are written for.
DEFAULT_PICKER_IMAGE = "registry.k8s.io/gateway-api-inference-extension/epp:v1.2.0"
#: The longest pool name: the picker's Deployment, Service, ServiceAccount, Role and ConfigMap are <pool>-epp.
MAX_POOL_NAME = 59

Hostname = Annotated[str, Field(min_length=1, max_length=253,
                                pattern=r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")]


class ScorerWeights(_Model):
    """How much each of the picker's scorers counts when it chooses a pod (0 leaves the scorer out)."""

    queue_depth: int = Field(2, ge=0, le=100, alias="queueDepth")
    """Fewest requests waiting in vLLM's queue (vllm:num_requests_waiting): the queue-scorer."""
    kv_cache_utilization: int = Field(2, ge=0, le=100, alias="kvCacheUtilization")
    """Most free KV cache (vllm:kv_cache_usage_perc; vllm:gpu_cache_usage_perc before vLLM 0.10): the
    kv-cache-utilization-scorer."""
    prefix_cache: int = Field(3, ge=0, le=100, alias="prefixCache")
    """The pod that most likely holds the prompt's prefix in its KV cache (the picker's own prefix index): the
    prefix-cache-scorer."""
    lora_affinity: int = Field(1, ge=0, le=100, alias="loraAffinity")
    """A pod with the request's LoRA adapter already loaded, else one with room for it (vllm:lora_requests_info):
    the lora-affinity-scorer."""


class PickerSpec(_Model):
    """The endpoint picker (the extension's EPP) the operator runs for the pool: one Deployment in the namespace."""

    image: str = Field(DEFAULT_PICKER_IMAGE, min_length=1, max_length=1024)
    """The endpoint picker's image; its flags and config are the extension's v1.2.0 ones."""
    scorers: ScorerWeights = Field(default_factory=ScorerWeights)
    """The scorers' weights."""
    refresh_metrics_milliseconds: int = Field(50, ge=10, le=60000, alias="refreshMetricsMilliseconds")
    """How often the picker scrapes each pod's /metrics (--refresh-metrics-interval)."""


class InferencePoolSpec(_Model):
    """An InferencePool (inference.networking.k8s.io/v1) of this server's pods, with its endpoint picker."""

    enabled: bool = False
    """Emit the pool and run its picker (or join poolName's)."""
    pool_name: Optional[str] = Field(None, min_length=1, max_length=MAX_POOL_NAME, pattern=DNS_LABEL_PATTERN,
                                     alias="poolName")
    """The pool to be part of; the server's own name when omitted. A pool named after another VLLMServer of the
    namespace is that server's: this server's pods join it (the pool selects them by label) and this server
    emits no pool or picker of its own. The pool's servers must serve the same model (its adapters may differ)."""
    picker: PickerSpec = Field(default_factory=PickerSpec)
    """The endpoint picker; read from the pool's own server only."""


class HTTPRouteSpec(_Model):
    """An HTTPRoute (gateway.networking.k8s.io/v1) from a Gateway of the same namespace to the pool."""

    model_config = ConfigDict(json_schema_extra=_rules(
        cel("!self.enabled || has(self.gatewayName)", "required when the route is enabled", ".gatewayName"),
    ))

    enabled: bool = False
    """Emit the route (needs inferencePool.enabled)."""
    gateway_name: Optional[str] = Field(None, min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN,
                                        alias="gatewayName")
    """The Gateway the route attaches to, in the server's own namespace (a route cannot name another's)."""
    section_name: Optional[str] = Field(None, min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN,
                                        alias="sectionName")
    """The Gateway's listener to attach to; all of them when omitted."""
    hostnames: list[Hostname] = Field(default_factory=list, max_length=16)
    """Hostnames the route answers for; the listener's when empty."""
    path: str = Field("/", min_length=1, max_length=1024, pattern=r"^/[A-Za-z0-9/._~%!$&'()*+,;=:@-]*$")
    """The path prefix the route matches."""
    match_model_name: bool = Field(True, alias="matchModelName")
    """Match only requests for this server's model (the X-Gateway-Model-Name header, which the extension's
    body-based router sets from the request's "model" field), so several servers share one hostname and path,
    each model routed to its own pool. false: every request on the path goes to the pool."""


class RoutingSpec(_Model):
    """Route through the Gateway API Inference Extension instead of the ClusterIP Service's round robin."""

    model_config = ConfigDict(json_schema_extra=_rules(
        cel("!has(self.httpRoute) || !self.httpRoute.enabled || "
            "(has(self.inferencePool) && self.inferencePool.enabled)",
            "an HTTPRoute routes to the InferencePool: set inferencePool.enabled", ".httpRoute.enabled"),
    ))

    inference_pool: InferencePoolSpec = Field(default_factory=InferencePoolSpec, alias="inferencePool")
    """The InferencePool and its endpoint picker."""
    http_route: HTTPRouteSpec = Field(default_factory=HTTPRouteSpec, alias="httpRoute")
    """The HTTPRoute from a Gateway to the pool."""


def pool_name(server: str, routing: RoutingSpec) -> str:
    """The pool a server's pods are part of."""
    return routing.inference_pool.pool_name or server


def owns_pool(server: str, routing: RoutingSpec) -> bool:
    """Whether this server emits the pool and its picker (one owner per pool: the server the pool is named after)."""
    return routing.inference_pool.enabled and pool_name(server, routing) == server


__all__ = ["DEFAULT_PICKER_IMAGE", "HTTPRouteSpec", "InferencePoolSpec", "MAX_POOL_NAME", "PickerSpec",
           "RoutingSpec", "ScorerWeights", "owns_pool", "pool_name"]
