"""Which URLs a VLLMServer may point the operator at. Pure.

`spec.model.configURL` and `spec.autoscaling.prometheusURL` are written by tenants and fetched by the operator,
which reaches services they cannot (the cluster's internal Services, a cloud's metadata endpoint). So the
operator fetches only under the prefixes its own settings allow (`--allowed-config-url`,
`--allowed-prometheus-url`; chart values `operator.allowedConfigURLs`, `operator.allowedPrometheusURLs`),
beside the endpoints it was configured with itself (`--hf-endpoint`, `--prometheus-url`). A prefix is compared
as a URL, not as a string: scheme, host and port equal, and the path under the prefix's path at a '/'
boundary, so `https://hub.example` allows neither `https://hub.example.evil.io` nor `http://hub.example`.
`*` allows any http(s) URL.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Iterable, Optional

#: The public Hugging Face Hub: a configURL under it is allowed by default (it serves public files only).
PUBLIC_HUB = "https://huggingface.co/"
ANY = "*"
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _parts(url: str) -> Optional[tuple[str, str, int, str]]:
    try:
        u = urllib.parse.urlsplit(url.strip())
        port = u.port
    except ValueError:
        return None
    scheme = u.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not u.hostname or "@" in u.netloc:
        return None
    return scheme, u.hostname.lower().rstrip("."), port or _DEFAULT_PORTS[scheme], u.path or "/"


def allows(prefix: str, url: str) -> bool:
    """`url` lies under `prefix` (same scheme, host and port; the path under the prefix's, at a '/')."""
    if prefix == ANY:
        return _parts(url) is not None
    want, got = _parts(prefix), _parts(url)
    if want is None or got is None or want[:3] != got[:3]:
        return False
    base = want[3] if want[3].endswith("/") else want[3] + "/"
    return got[3] == want[3] or got[3].startswith(base)


@dataclass(frozen=True)
class URLPolicy:
    """The operator's settings: URL prefixes a spec may name. The offline CLI has none (it fetches as its user)."""

    config: tuple[str, ...] = (PUBLIC_HUB,)
    prometheus: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, config: Iterable[str] = (), prometheus: Iterable[str] = (), *,
                      hf_endpoint: Optional[str] = None, prometheus_url: Optional[str] = None) -> "URLPolicy":
        """The allowed prefixes: the public Hub and the operator's own endpoints, plus what its settings add."""
        own = [hf_endpoint] if hf_endpoint and hf_endpoint.rstrip("/") + "/" != PUBLIC_HUB else []
        configs = [PUBLIC_HUB, *own, *config]
        proms = [*([prometheus_url] if prometheus_url else []), *prometheus]
        return cls(tuple(dict.fromkeys(configs)), tuple(dict.fromkeys(proms)))

    def config_problem(self, url: str) -> Optional[str]:
        return _problem(url, self.config, "--allowed-config-url", "operator.allowedConfigURLs")

    def prometheus_problem(self, url: str) -> Optional[str]:
        return _problem(url, self.prometheus, "--allowed-prometheus-url", "operator.allowedPrometheusURLs")


#: Why a URL that is not http(s) with a host is refused, whatever the settings allow.
NOT_HTTP = ("must be an http(s) URL with a host: the operator fetches it and reads no files of its own (to plan with "
            "a local config.json: vllm-operator plan --model-config PATH)")


def _problem(url: str, prefixes: tuple[str, ...], flag: str, value: str) -> Optional[str]:
    if any(allows(p, url) for p in prefixes):
        return None
    if _parts(url) is None:
        return NOT_HTTP
    allowed = ", ".join(prefixes) if prefixes else "none"
    return (f"the operator fetches only under the URLs its settings allow ({allowed}); ask the platform team to "
            f"add this one ({flag}, chart value {value})")
