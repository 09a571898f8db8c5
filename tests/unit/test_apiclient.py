"""The operator's API client (operator_main.api_client): the proxy it was built with is not looked up in the
environment again before every request, and the token refresh still runs."""

from __future__ import annotations

import kubernetes.client.configuration as k8s_configuration
import kubernetes.config.kube_config as k8s_kube_config
import yaml
from kubernetes import client as k8s

from vllm_operator import operator_main


def kubeconfig(tmp_path, token: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }))
    return str(path)


def test_the_proxy_is_chosen_once_and_the_token_still_refreshed(tmp_path, monkeypatch):
    monkeypatch.setattr(k8s_kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", kubeconfig(tmp_path, "first"))
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.setattr(k8s_configuration.Configuration, "_default", None)
    client = operator_main.api_client()
    assert client.configuration.proxy == "http://proxy.invalid:3128"  # what the connection pool was built with
    lookups = []
    real = k8s_configuration.getproxies
    monkeypatch.setattr(k8s_configuration, "getproxies", lambda: lookups.append(1) or real())
    # What every request does first (ApiClient.update_params_for_auth): the loader's hook refreshes the token
    # and sets the host again.
    settings = client.configuration.auth_settings()
    assert settings["BearerToken"]["value"] == "Bearer first"
    assert lookups == []
    assert client.configuration.proxy == "http://proxy.invalid:3128"

    # Without the pin, the same call reads the environment (what operator_main.pin_proxy saves per request).
    unpinned = k8s.ApiClient()
    unpinned.configuration.auth_settings()
    assert lookups
