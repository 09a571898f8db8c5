"""The LeaderWorkerSet controller (sigs.k8s.io/lws, built by tools/lws-build.sh) against the test bed's API server.

`LWSController.start()` installs the LeaderWorkerSet CRD of the same module, makes a CA and a serving certificate
for 127.0.0.1 (openssl), starts the real controller manager with its webhook server on a free loopback port (the
harness's certificates: its internal certificate management would need a Service and a Secret in lws-system),
and registers its admission webhooks (the ones of the module's config/webhook/manifests.yaml) by URL on that
port. The pod webhooks only see pods that carry the LWS name label, so the other tests' pods never depend on it.
`stop()` removes the webhooks, stops the manager and uninstalls the CRD, leaving the API server as it was.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

from .controlplane import _child_setup, cache_dir, wait_for
from .convergence import wait_established
from .procs import free_ports

VERSION = "0.8.0"
CRD_NAME = "leaderworkersets.leaderworkerset.x-k8s.io"
WEBHOOK_NAME = "vllm-operator-testbed-lws"
POD_SELECTOR = {"matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]}


def lws_dir() -> Path:
    return cache_dir() / f"lws-{VERSION}"


def binary() -> Path:
    path = lws_dir() / "bin" / "lws-manager"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run tools/lws-build.sh (tools/run-tests.sh does)")
    return path


def crd_file() -> Path:
    return lws_dir() / "crd" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml"


def make_certificates(directory: Path) -> bytes:
    """A CA and a serving certificate for 127.0.0.1 in `directory` (tls.crt, tls.key: controller-runtime's
    names); returns the CA's PEM for the webhooks' caBundle."""
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=lws-testbed-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=127.0.0.1")
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out",
        "tls.crt", "-days", "2", "-extfile", "san.cnf")
    return (directory / "ca.crt").read_bytes()


def webhook_configurations(port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """The module's webhooks (config/webhook/manifests.yaml), reached by URL on loopback."""
    import base64

    bundle = base64.b64encode(ca_pem).decode()

    def hook(name: str, path: str, group: str, resource: str, operations: list[str],
             pods: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
            "timeoutSeconds": 10,
            "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle},
            "rules": [{"apiGroups": [group], "apiVersions": ["v1"], "operations": operations,
                       "resources": [resource]}],
        }
        if pods:
            out["objectSelector"] = POD_SELECTOR
        return out

    lws = ("leaderworkerset.x-k8s.io", "leaderworkersets")
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": WEBHOOK_NAME}, "webhooks": [
             hook("mleaderworkerset.kb.io", "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset", *lws,
                  ["CREATE", "UPDATE"], False),
             hook("mpod.kb.io", "/mutate--v1-pod", "", "pods", ["CREATE"], True)]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": WEBHOOK_NAME}, "webhooks": [
             hook("vleaderworkerset.kb.io", "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset", *lws,
                  ["CREATE", "UPDATE"], False),
             hook("vpod.kb.io", "/validate--v1-pod", "", "pods", ["CREATE", "UPDATE"], True)]},
    ]


class LWSController:
    """The real LeaderWorkerSet controller manager for one control plane (see the module's docstring)."""

    def __init__(self, control_plane: Any, workdir: Optional[Path] = None):
        self.cp = control_plane
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="lws-"))
        self.proc: Optional[subprocess.Popen] = None
        self.log = self.workdir / "lws-manager.log"

    def start(self, timeout: float = 180.0) -> "LWSController":
        certs = self.workdir / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        ca = make_certificates(certs)
        webhook, health = free_ports(2)
        config = self.workdir / "config.yaml"
        config.write_text(json.dumps({
            "apiVersion": "config.lws.x-k8s.io/v1alpha1", "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": webhook, "host": "127.0.0.1", "certDir": str(certs)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        }))
        self.cp.kubectl("apply", "--server-side", "-f", str(crd_file()), timeout=120)
        wait_established(self.cp, CRD_NAME, timeout=120)
        env = {**os.environ, "KUBECONFIG": str(self.cp.kubeconfig)}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([str(binary()), f"--config={config}", "--zap-log-level=info"],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         cwd=self.workdir, start_new_session=True,
                                         preexec_fn=_child_setup(os.getpid()))
        wait_for(lambda: self._healthy(health), timeout, "the LWS controller manager's readiness", interval=0.5)
        self.cp.kubectl("apply", "--server-side", "-f", "-",
                        # one List: kubectl 1.30 parses JSON documents split by "---" as one stream and fails
                        input=json.dumps({"apiVersion": "v1", "kind": "List",
                                          "items": list(webhook_configurations(webhook, ca))}))
        return self

    def _healthy(self, port: int) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"lws-manager exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            self.cp.kubectl("delete", kind, WEBHOOK_NAME, "--ignore-not-found", check=False)
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self.proc = None
        self.cp.kubectl("delete", "crd", CRD_NAME, "--ignore-not-found", "--wait=true", check=False, timeout=120)
