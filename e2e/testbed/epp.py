"""The Gateway API Inference Extension on the test bed: its CRDs, its endpoint picker (the EPP, cmd/epp of the
release tools/testbed/epp/go.mod pins) as a process, and the test bed's gateway in front of it.

No gateway data plane can be installed here (no Envoy build is available from the registries), so the gateway's
part is played by tools/testbed/epp/gateway: it speaks the picker's real ext_proc gRPC interface (the messages
Envoy's ext_proc filter sends, as the extension's own integration tests do) and forwards each HTTP request to the
endpoint the picker chose. tools/epp-build.sh builds both into the cache (tools/run-tests.sh runs it; the first
use here does too).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional, Sequence

from e2e.testbed.controlplane import cache_dir, wait_for
from e2e.testbed.convergence import wait_established
from e2e.testbed.procs import free_port, free_ports, set_pdeathsig

TOOLS = Path(__file__).resolve().parents[2] / "tools"
BUILD_SCRIPT = TOOLS / "epp-build.sh"
GO_MOD = TOOLS / "testbed" / "epp" / "go.mod"
MODULE = "sigs.k8s.io/gateway-api-inference-extension"
_built = threading.Lock()


def pinned_version() -> str:
    """The extension's release tools/testbed/epp/go.mod pins ("1.2.0")."""
    for line in GO_MOD.read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["require"]:
            parts = parts[1:]
        if len(parts) >= 2 and parts[0] == MODULE:
            return parts[1].lstrip("v")
    raise RuntimeError(f"{GO_MOD} does not require {MODULE}")


def ensure_built() -> Path:
    """The cache folder holding bin/epp, bin/gateway and crds/ (built once, serialised by the script's lock)."""
    out = cache_dir() / f"epp-{pinned_version()}"
    with _built:
        subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.DEVNULL, timeout=3600)
    return out


def _install_crd_folder(cp, folder: str) -> list[str]:
    """Every CRD file of the build's `folder` (named <group>_<plural>.yaml) applied and established; their names."""
    crds = sorted((ensure_built() / folder).glob("*.yaml"))
    cp.kubectl("apply", "--server-side", *[a for c in crds for a in ("-f", str(c))])
    names = [c.name.split("_", 1)[1].removesuffix(".yaml") + "." + c.name.split("_", 1)[0] for c in crds]
    for name in names:
        wait_established(cp, name, timeout=120)
    return names


def install_crds(cp) -> list[str]:
    """The extension's CRDs (InferencePool v1, InferenceObjective, ...) applied and established."""
    return _install_crd_folder(cp, "crds")


def install_gateway_crds(cp) -> list[str]:
    """The Gateway API's standard-channel CRDs (HTTPRoute, Gateway, ...) at the version the extension requires."""
    return _install_crd_folder(cp, "gateway-crds")


class Process:
    """A started binary with its log; stopped (SIGTERM, then SIGKILL) by stop() or the context manager.
    A subclass that picks its ports itself starts through _start() (counting `starts`), so that a start whose port
    was taken can be made again on fresh ones."""

    #: how many times a process whose port was taken meanwhile is started, on fresh ports each time
    STARTS = 3
    starts = 0

    def __init__(self, cmd: Sequence[str], log_path: Path, env: Optional[dict[str, str]] = None):
        self.cmd = list(cmd)
        self.log_path = log_path
        self._log = open(log_path, "ab")
        #: where this start's output begins in the log (a restarted process appends to the same file)
        self.log_start = self._log.tell()
        # SIGKILLed with the test's process (a test killed by its timeout leaves nothing running); start it from
        # the thread that lives as long as it should (the fixtures' thread).
        self.popen = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                      env={**os.environ, **(env or {})}, start_new_session=True,
                                      preexec_fn=lambda: set_pdeathsig(signal.SIGKILL))

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def log_since_start(self) -> str:
        """What this start of the process wrote (not an earlier start's lines in the same log)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_start)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def _start(self) -> None:
        raise NotImplementedError

    def _start_again_if_port_taken(self, what: str) -> None:
        """For a process that exited: started again on fresh ports if this start found a port taken (STARTS in
        all); any other exit is an error, with its log."""
        if "address already in use" in self.log_since_start() and self.starts < self.STARTS:
            self._log.close()
            self._start()
            return
        raise RuntimeError(f"{what} exited with {self.popen.returncode}:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=5)
        self._log.close()

    def __enter__(self) -> "Process":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _replace_arg(args: list[str], flag: str, value: str) -> list[str]:
    out = list(args)
    i = out.index(flag)
    out[i + 1] = value
    return out


class Picker(Process):
    """The endpoint picker run with a Deployment's container args (as built by builders.build_picker_deployment,
    its config inline), its ports free ones of this machine (the test bed's processes share the host's network),
    its API access the kubeconfig given (the picker's ServiceAccount's, to prove its Role)."""

    def __init__(self, args: Sequence[str], kubeconfig: str | os.PathLike, workdir: Path, namespace: str):
        workdir.mkdir(parents=True, exist_ok=True)
        self.args, self._kubeconfig, self._namespace = list(args), kubeconfig, namespace
        self._log_path = workdir / "epp.log"
        self._start()

    def _start(self) -> None:
        """Start on three distinct ports free now. free_ports() lets them go before the picker binds them, and
        any process of this machine (the suite's own, or a second suite's) may take one meanwhile: wait_serving()
        starts again on fresh ports when that happened."""
        self.starts += 1
        self.grpc_port, self.health_port, self.metrics_port = free_ports(3)
        argv = self.args
        for flag, port in (("--grpc-port", self.grpc_port), ("--grpc-health-port", self.health_port),
                           ("--metrics-port", self.metrics_port)):
            argv = _replace_arg(argv, flag, str(port))
        binary = ensure_built() / "bin" / "epp"
        super().__init__([str(binary), "--kubeconfig", str(self._kubeconfig), *argv], self._log_path,
                         env={"NAMESPACE": self._namespace, "POD_NAME": "epp-test"})

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def metrics_text(self, timeout: float = 5) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=timeout) as r:
            return r.read().decode("utf-8", "replace")

    def listening(self) -> set[tuple[str, int]]:
        """The (server, port) pairs this start of the picker logged as bound: "ext-proc" and "health" once their
        net.Listen succeeded (internal/runnable/grpc.go logs "gRPC server listening" after it), "metrics" once
        controller-runtime serves its metrics endpoint. A port that merely accepts connections proves nothing:
        another process may hold it (a second suite's, or, before free_ports(), this picker's own health
        server on the port it was also given for ext-proc)."""
        out = set()
        for line in self.log_since_start().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if not isinstance(entry, dict):
                continue
            if entry.get("msg") == "gRPC server listening" and isinstance(entry.get("port"), int):
                out.add((str(entry.get("name")), entry["port"]))
            elif entry.get("msg") == "Serving metrics server":
                port = str(entry.get("bindAddress", "")).rpartition(":")[2]
                if port.isdigit():
                    out.add(("metrics", int(port)))
        return out

    def wait_serving(self, timeout: float = 120) -> None:
        """Until this picker logged its ext-proc and metrics ports bound and its metrics endpoint answers: the
        gateway's requests go to the ext-proc port, which the picker opens last, once its caches are read (seconds
        later on a busy machine). A picker that exits meanwhile because a port was taken is started again on
        fresh ones; any other exit is an error, with its log."""
        def up() -> bool:
            if not self.alive():
                self._start_again_if_port_taken("the endpoint picker")
                return False
            if not {("ext-proc", self.grpc_port), ("metrics", self.metrics_port)} <= self.listening():
                return False
            try:
                self.metrics_text(timeout=2)
            except (urllib.error.URLError, OSError):
                return False
            return True

        wait_for(up, timeout, "the endpoint picker's metrics endpoint and ext-proc port", interval=0.5)


class Gateway(Process):
    """The test bed's gateway (tools/testbed/epp/gateway) in front of a picker; `hold` seconds it holds a request
    the picker has no endpoint for (503), asking again every half second."""

    def __init__(self, picker: Picker, workdir: Path, hold: float = 0, tls: bool = True):
        self._picker, self._workdir, self._hold, self._tls = picker, workdir, hold, tls
        self._start()

    def _start(self) -> None:
        """On a port free now; wait_listening() starts again on a fresh one if it was taken meanwhile."""
        self.starts += 1
        self.port = free_port()
        binary = ensure_built() / "bin" / "gateway"
        # its deadline for one request (300 s by default) above the hold, or a long hold ends in its 502
        hold = self._hold
        cmd = [str(binary), "-listen", f"127.0.0.1:{self.port}", "-picker", f"127.0.0.1:{self._picker.grpc_port}",
               "-hold", f"{hold}s", "-timeout", f"{max(300, hold + 120)}s", f"-tls={'true' if self._tls else 'false'}"]
        super().__init__(cmd, self._workdir / f"gateway-{self.port}.log")
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_listening(self, timeout: float = 30) -> None:
        """Until this start of the gateway logged its port bound (it logs once net.Listen succeeded); one whose
        port was taken meanwhile is started again on a fresh one."""
        def up() -> bool:
            if not self.alive():
                self._start_again_if_port_taken("the test bed's gateway")
                return False
            return f"gateway: listening on 127.0.0.1:{self.port}," in self.log_since_start()

        wait_for(up, timeout, "the test bed's gateway", interval=0.1)

    def complete(self, model: str, prompt: str, max_tokens: int = 8, timeout: float = 300) -> dict[str, Any]:
        """POST /v1/completions through the gateway: status, the endpoint the picker chose, the held time, the
        wall time and the answer's JSON (or text)."""
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
        req = urllib.request.Request(self.url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        start = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, headers, text = r.status, r.headers, r.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            status, headers, text = e.code, e.headers, e.read().decode("utf-8", "replace")
        try:
            answer: Any = json.loads(text)
        except ValueError:
            answer = text
        return {"status": status, "endpoint": headers.get("x-gateway-destination-endpoint"),
                "held_ms": int(headers.get("x-gateway-held-ms") or 0), "seconds": time.monotonic() - start,
                "answer": answer}
