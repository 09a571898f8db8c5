"""Act as a ServiceAccount against a test control plane: a kubeconfig holding its token, and
`kubectl auth can-i` answers for it.

The token is a bound one from the TokenRequest API (`kubectl create token`), as kubelets
give pods since Kubernetes 1.24 (no token Secrets are made any more); the test asks for it
as admin and hands it to whatever should run with exactly that account's rights.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import yaml

from e2e.testbed.controlplane import _read_kubeconfig, wait_for


def service_account_token(cp, namespace: str, name: str, timeout: float = 60, *, seconds: int = 86400) -> str:
    """A bound token of the ServiceAccount (waiting for the account itself, which a chart may have just made)."""
    def token() -> Optional[str]:
        p = cp.kubectl("create", "token", name, "-n", namespace, f"--duration={seconds}s", check=False)
        return p.stdout.strip() if p.returncode == 0 else None

    return wait_for(token, timeout, f"a token for ServiceAccount {namespace}/{name}")


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
