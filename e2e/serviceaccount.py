"""Act as a ServiceAccount against a test control plane: a kubeconfig holding its token, and
`kubectl auth can-i` answers for it.

Kubernetes 1.20's token controller writes a token Secret for every ServiceAccount; the
test reads it as admin (the operator itself never reads Secrets) and hands the token to
whatever should run with exactly that account's rights.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Optional

import yaml

from e2e.controlplane import _read_kubeconfig, wait_for


def service_account_token(cp, namespace: str, name: str, timeout: float = 60) -> str:
    def token() -> Optional[str]:
        sa = json.loads(cp.kubectl("get", "serviceaccount", name, "-n", namespace, "-o", "json").stdout)
        for ref in sa.get("secrets") or []:
            secret = json.loads(cp.kubectl("get", "secret", ref["name"], "-n", namespace, "-o", "json").stdout)
            data = (secret.get("data") or {}).get("token")
            if secret.get("type") == "kubernetes.io/service-account-token" and data:
                return base64.b64decode(data).decode()
        return None

    return wait_for(token, timeout, f"a token Secret for ServiceAccount {namespace}/{name}")


def service_account_kubeconfig(cp, namespace: str, name: str, path: str | os.PathLike) -> Path:
    """A kubeconfig for the same cluster as `cp`'s, whose user is the ServiceAccount's token."""
    with open(cp.kubeconfig) as f:
        admin = yaml.safe_load(f)
    server, _ = _read_kubeconfig(cp.kubeconfig)
    cluster = dict(admin["clusters"][0]["cluster"], server=server)
    user = f"system:serviceaccount:{namespace}:{name}"
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": user, "user": {"token": service_account_token(cp, namespace, name)}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": user, "namespace": namespace}}],
        "current-context": "sa",
    }
    path = Path(path)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    os.chmod(path, 0o600)
    return path


def can_i(cp, verb: str, resource: str, *, as_namespace: str, as_name: str, namespace: Optional[str] = None) -> bool:
    """`kubectl auth can-i` for the ServiceAccount (a SubjectAccessReview, by impersonation as admin)."""
    args = ["auth", "can-i", verb, resource, f"--as=system:serviceaccount:{as_namespace}:{as_name}"]
    args += ["-n", namespace] if namespace else ["--all-namespaces"]
    p = cp.kubectl(*args, check=False)
    answer = p.stdout.strip()
    if answer not in ("yes", "no"):
        raise RuntimeError(f"kubectl {' '.join(args)}: {p.stdout}{p.stderr}")
    return answer == "yes"
