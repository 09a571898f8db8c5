"""A real, local Kubernetes control plane for tests: etcd + kube-apiserver +
kube-controller-manager, built from their Go modules by ``tools/kube-build.sh`` (the
versions pinned in ``tools/testbed/*/go.mod``).

There is no scheduler and no kubelet: pods stay Pending unless a test plays the
kubelet (see ``e2e.testbed.fakekubelet``).

Usage::

    from e2e.testbed.controlplane import ControlPlane

    with ControlPlane() as cp:            # or ControlPlane.from_env()
        api = cp.api_client()             # kubernetes.client.ApiClient
        cp.kubectl("get", "ns")

CLI::

    python -m e2e.testbed.controlplane build          # just build the binaries
    python -m e2e.testbed.controlplane up [--dir D]   # run until Ctrl-C / SIGTERM

Set ``VLLM_OPERATOR_TEST_KUBECONFIG`` to run against an existing cluster
instead (``ControlPlane.from_env()`` then starts nothing).
"""

from __future__ import annotations

import argparse
import base64
import atexit
import ctypes
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml

from e2e.testbed.procs import free_ports

ENV_KUBECONFIG = "VLLM_OPERATOR_TEST_KUBECONFIG"
HERE = Path(__file__).resolve().parent
TOOLS = HERE.parents[1] / "tools"
BUILD_SCRIPT = TOOLS / "kube-build.sh"


#: Which pinned control plane the test bed runs: a folder of tools/testbed/ whose go.mod pins k8s.io/kubernetes.
#: "kube" (the default) is the newest claimed minor, "kube-1.30" the oldest (the README's minimum); the suite runs
#: its API-server tier on both (tools/run-tests.sh).
ENV_KUBE_MODULE = "VLLM_OPERATOR_KUBE_MODULE"
KUBE_MODULES = ("kube", "kube-1.30")
KUBE_MODULE = os.environ.get(ENV_KUBE_MODULE) or "kube"
if KUBE_MODULE not in KUBE_MODULES:
    raise RuntimeError(f"${ENV_KUBE_MODULE}={KUBE_MODULE!r}: not one of {', '.join(KUBE_MODULES)}")


def pinned_kube_version(module: str = KUBE_MODULE) -> str:
    """The Kubernetes release tools/testbed/<module>/go.mod pins (k8s.io/kubernetes vX.Y.Z)."""
    for line in (TOOLS / "testbed" / module / "go.mod").read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["require"]:
            parts = parts[1:]
        if len(parts) >= 2 and parts[0] == "k8s.io/kubernetes":
            return parts[1].lstrip("v")
    raise RuntimeError(f"tools/testbed/{module}/go.mod does not require k8s.io/kubernetes")


KUBE_VERSION = pinned_kube_version()

# Controllers that need node IPAM, volumes or a kubelet are off (the fake kubelet renews no node lease, so the
# node lifecycle controller would taint its nodes unreachable and evict their pods). Cloud controllers are no
# longer part of kube-controller-manager.
KCM_CONTROLLERS = (
    "*,-node-ipam-controller,-node-lifecycle-controller,-persistentvolume-attach-detach-controller,"
    "-persistentvolume-binder-controller"
)

_PR_SET_PDEATHSIG = 1
try:
    _libc = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - not Linux
    _libc = None


def cache_dir() -> Path:
    return Path(os.environ.get("VLLM_OPERATOR_CACHE", Path.home() / ".cache" / "vllm-operator"))


def bin_dir() -> Path:
    return cache_dir() / f"kube-{KUBE_VERSION}" / "bin"


#: kubectl of the test bed's own release (built with it), so `kubectl apply` speaks the same API version.
KUBECTL = str(bin_dir() / "kubectl")


class ControlPlaneError(RuntimeError):
    pass


class KubectlError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"{super().__str__()}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"


def wait_for(probe, timeout: float = 60.0, what: str = "condition", interval: float = 0.2):
    """Poll ``probe()`` until it returns a truthy value (returned) or raise
    TimeoutError after ``timeout`` seconds. Exceptions from probe count as
    "not yet" and the last one is reported."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            r = probe()
            if r:
                return r
            last = r
        except Exception as e:  # noqa: BLE001
            last = e
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")
        time.sleep(interval)


def ensure_binaries() -> Path:
    """Build kube-apiserver/kube-controller-manager if needed (fast when cached)."""
    t0 = time.monotonic()
    if KUBE_MODULE == "kube":
        subprocess.run(["bash", str(BUILD_SCRIPT)], check=True)
    else:
        subprocess.run(["bash", str(TOOLS / "kube-build-module.sh"), KUBE_MODULE], check=True)
    d = bin_dir()
    for name in ("kube-apiserver", "kube-controller-manager", "etcd"):
        if not os.access(d / name, os.X_OK):
            raise ControlPlaneError(f"{d / name} missing after {BUILD_SCRIPT}")
    dt = time.monotonic() - t0
    if dt > 5:
        print(f"[controlplane] kube binaries built in {dt:.0f}s", file=sys.stderr)
    return d


def _child_setup(parent_pid: int):
    """preexec_fn: die with SIGKILL when the parent (thread) dies."""

    def fn() -> None:
        if _libc is not None:
            _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # parent already gone before prctl
            os._exit(1)

    return fn


_ETCD_DIR_PREFIX = "vllm-operator-etcd-"


def _remove_stale_etcd_dirs(base: Path) -> None:
    """Remove etcd data dirs left on tmpfs by processes that were killed."""
    for d in base.glob(f"{_ETCD_DIR_PREFIX}*-*"):
        try:
            pid = int(d.name[len(_ETCD_DIR_PREFIX):].split("-", 1)[0])
        except ValueError:
            continue
        if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)


def _tail(path: Path, n: int = 40) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "<no log>"
    return "\n".join(lines[-n:])


def _read_kubeconfig(path: str | os.PathLike) -> tuple[str, Optional[str]]:
    with open(path) as f:
        cfg = yaml.safe_load(f)
    ctx_name = cfg.get("current-context")
    ctx = next((c["context"] for c in cfg.get("contexts", []) if c["name"] == ctx_name), None)
    if ctx is None:
        ctx = cfg["contexts"][0]["context"]
    cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
    user = next((u["user"] for u in cfg.get("users", []) if u["name"] == ctx.get("user")), {}) or {}
    return cluster["server"], user.get("token")


class _KubeMixin:
    """What both a local and an existing cluster offer."""

    kubeconfig: Optional[str]
    server: Optional[str]
    token: Optional[str]

    def api_client(self):
        """A fresh kubernetes.client.ApiClient for this cluster."""
        from kubernetes import config

        if not self.kubeconfig:
            raise ControlPlaneError("control plane not started")
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def kubectl(
        self,
        *args: str,
        check: bool = True,
        input: Optional[str] = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess:
        if not self.kubeconfig:
            raise ControlPlaneError("control plane not started")
        cmd = [KUBECTL, f"--kubeconfig={self.kubeconfig}", *args]
        p = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise KubectlError(p.returncode, cmd, p.stdout, p.stderr)
        return p

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class ExistingCluster(_KubeMixin):
    """Same interface as ControlPlane for a cluster we did not start."""

    def __init__(self, kubeconfig: str | os.PathLike):
        self.kubeconfig = str(Path(kubeconfig).expanduser().resolve())
        self.server = None
        self.token = None
        self.pids: dict[str, int] = {}

    def start(self) -> "ExistingCluster":
        self.server, self.token = _read_kubeconfig(self.kubeconfig)
        return self

    def stop(self) -> None:
        pass


class ControlPlane(_KubeMixin):
    """etcd + kube-apiserver + kube-controller-manager on free loopback ports.

    Children run in their own sessions, log to files in ``workdir``, get
    SIGKILL if this Python process (more exactly: the thread that called
    ``start()``) dies, and are stopped by ``stop()`` / atexit.

    The kubeconfig verifies TLS against the apiserver's self-signed CA
    (``verify_tls=False`` writes ``insecure-skip-tls-verify`` instead) and
    authenticates with a random admin token (group ``system:masters``).
    """

    def __init__(
        self,
        workdir: Optional[str | os.PathLike] = None,
        *,
        start_timeout: float = 90.0,
        stop_timeout: float = 10.0,
        build: bool = True,
        verify_tls: bool = True,
    ):
        self._own_workdir = workdir is None
        self._workdir_arg = workdir
        self.workdir: Optional[Path] = None
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.build = build
        self.verify_tls = verify_tls
        self.kubeconfig: Optional[str] = None
        self.server: Optional[str] = None
        self.token: Optional[str] = None
        self.etcd_url: Optional[str] = None
        self.start_seconds: Optional[float] = None
        self._procs: dict[str, subprocess.Popen] = {}
        self._etcd_dir: Optional[Path] = None
        self._logs: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._atexit = False
        self._apiserver_cmd: list[str] = []

    # ------------------------------------------------------------------ API
    @classmethod
    def from_env(cls, workdir: Optional[str | os.PathLike] = None, **kw: Any):
        """An ExistingCluster if $VLLM_OPERATOR_TEST_KUBECONFIG is set, else a
        (not yet started) local ControlPlane."""
        kc = os.environ.get(ENV_KUBECONFIG)
        if kc:
            return ExistingCluster(kc)
        return cls(workdir, **kw)

    @property
    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self._procs.items()}

    @property
    def running(self) -> bool:
        return bool(self._procs) and all(p.poll() is None for p in self._procs.values())

    def stop_apiserver(self) -> None:
        """Stop only the kube-apiserver (SIGTERM, then SIGKILL); etcd and the controller-manager keep running.

        For fault tests: clients see connection refused until ``start_apiserver()``.
        """
        with self._lock:
            p = self._procs.get("kube-apiserver")
            if p is None:
                raise ControlPlaneError("control plane not started")
            self._signal(p, signal.SIGTERM)
            try:
                p.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                self._signal(p, signal.SIGKILL)
                p.wait(timeout=self.stop_timeout)

    def start_apiserver(self, timeout: Optional[float] = None) -> None:
        """Start the kube-apiserver again after ``stop_apiserver()``: same port, certificates and etcd data."""
        with self._lock:
            p = self._procs.get("kube-apiserver")
            if p is None:
                raise ControlPlaneError("control plane not started")
            if p.poll() is None:
                return
            deadline = time.monotonic() + (timeout or self.start_timeout)
            for attempt in range(3):
                self._spawn("kube-apiserver", self._apiserver_cmd)
                try:
                    self._wait("kube-apiserver /readyz after a restart", lambda: self._get("/readyz")[0] == 200,
                               deadline)
                    return
                except ControlPlaneError:
                    # It can exit at once (the old socket not yet free, etcd busy): try again, keeping the log.
                    if attempt == 2 or time.monotonic() > deadline or self._procs["kube-apiserver"].poll() is None:
                        raise
                    time.sleep(1.0)

    def start(self) -> "ControlPlane":
        if self._procs:
            return self
        t0 = time.monotonic()
        bins = ensure_binaries() if self.build else bin_dir()
        if not self._atexit:
            atexit.register(self.stop)
            self._atexit = True
        last: Optional[Exception] = None
        for attempt in range(3):
            self._prepare_workdir()
            try:
                self._start(bins)
                self.start_seconds = time.monotonic() - t0
                return self
            except _PortRace as e:  # someone took a port between pick and bind
                last = e
                self.stop()
                continue
            except BaseException:
                self.stop(_keep_workdir=True)
                raise
        raise ControlPlaneError(f"could not start control plane: {last}")

    def stop(self, _keep_workdir: bool = False) -> None:
        """Terminate children (SIGTERM, then SIGKILL after stop_timeout). Idempotent."""
        with self._lock:
            procs = list(self._procs.items())
            # Controller-manager first, etcd last.
            for name, p in reversed(procs):
                self._signal(p, signal.SIGTERM)
                deadline = time.monotonic() + self.stop_timeout
                while p.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                if p.poll() is None:
                    self._signal(p, signal.SIGKILL)
                    try:
                        p.wait(timeout=self.stop_timeout)
                    except subprocess.TimeoutExpired:  # pragma: no cover
                        pass
                # Anything left in its process group (none expected).
                self._signal(p, signal.SIGKILL)
            self._procs.clear()
            if self._etcd_dir is not None:
                shutil.rmtree(self._etcd_dir, ignore_errors=True)
                self._etcd_dir = None
            for f in self._logs.values():
                f.close()
            self._logs.clear()
            if (
                self._own_workdir
                and not _keep_workdir
                and self.workdir is not None
                and not os.environ.get("VLLM_OPERATOR_KEEP_CONTROLPLANE_DIR")
            ):
                shutil.rmtree(self.workdir, ignore_errors=True)
                self.workdir = None
                self.kubeconfig = None

    # ------------------------------------------------------------ internals
    @staticmethod
    def _signal(p: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(p.pid, sig)  # own session: pgid == pid
        except (ProcessLookupError, PermissionError):
            pass

    def _prepare_workdir(self) -> None:
        if self.workdir is None:
            if self._own_workdir:
                self.workdir = Path(tempfile.mkdtemp(prefix="vllm-operator-cp-"))
            else:
                self.workdir = Path(self._workdir_arg).resolve()
        wd = self.workdir
        wd.mkdir(parents=True, exist_ok=True)
        # Fresh state on every start: stale etcd data would carry the old token
        # controller's secrets signed with a different key.
        for sub in ("etcd", "certs"):
            shutil.rmtree(wd / sub, ignore_errors=True)

    def _etcd_data_dir(self) -> Path:
        """Keep etcd's data on tmpfs when we can (with --unsafe-no-fsync, writes never wait for a disk);
        the data lives only as long as the control plane."""
        if self._etcd_dir is None:
            shm = Path("/dev/shm")
            if shm.is_dir() and os.access(shm, os.W_OK):
                base = shm
                _remove_stale_etcd_dirs(shm)
            else:
                base = self.workdir
            self._etcd_dir = Path(
                tempfile.mkdtemp(prefix=f"{_ETCD_DIR_PREFIX}{os.getpid()}-", dir=base)
            )
        return self._etcd_dir

    def _spawn(self, name: str, cmd: Sequence[str]) -> subprocess.Popen:
        assert self.workdir is not None
        if name in self._logs:  # a restart: the old process's log file
            self._logs.pop(name).close()
        log = open(self.workdir / f"{name}.log", "ab")
        self._logs[name] = log
        p = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            start_new_session=True,
            preexec_fn=_child_setup(os.getpid()),
        )
        self._procs[name] = p
        return p

    def _check_alive(self) -> None:
        assert self.workdir is not None
        for name, p in self._procs.items():
            if p.poll() is not None:
                tail = _tail(self.workdir / f"{name}.log")
                msg = f"{name} exited with {p.returncode}; log tail:\n{tail}"
                if "address already in use" in tail:
                    raise _PortRace(msg)
                raise ControlPlaneError(msg)

    def _wait(self, what: str, probe, deadline: float) -> Any:
        last = None
        while True:
            self._check_alive()
            try:
                r = probe()
                if r:
                    return r
            except Exception as e:  # noqa: BLE001 - keep polling
                last = e
            if time.monotonic() > deadline:
                logs = "\n".join(
                    f"--- {n}.log\n{_tail(self.workdir / f'{n}.log', 15)}" for n in self._procs
                )
                raise ControlPlaneError(f"timed out waiting for {what} (last error: {last!r})\n{logs}")
            time.sleep(0.1)

    def _get(self, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        req = urllib.request.Request(self.server + path, headers={"Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def _start(self, bins: Path) -> None:
        wd = self.workdir
        assert wd is not None
        deadline = time.monotonic() + self.start_timeout
        etcd_port, etcd_peer, api_port = free_ports(3)
        self.token = secrets.token_hex(16)
        self.server = f"https://127.0.0.1:{api_port}"
        self.etcd_url = f"http://127.0.0.1:{etcd_port}"

        (wd / "tokens.csv").write_text(f"{self.token},admin,admin,system:masters\n")
        os.chmod(wd / "tokens.csv", 0o600)
        sa_key = wd / "sa.key"
        if not sa_key.exists():
            subprocess.run(
                ["openssl", "genrsa", "-out", str(sa_key), "2048"],
                check=True,
                capture_output=True,
            )

        peer = f"http://127.0.0.1:{etcd_peer}"
        self._spawn(
            "etcd",
            [
                str(bins / "etcd"),
                "--name=default",
                f"--data-dir={self._etcd_data_dir()}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--log-level=warn",
                "--log-outputs=stderr",
                "--unsafe-no-fsync",
            ],
        )

        def etcd_healthy() -> bool:
            with urllib.request.urlopen(self.etcd_url + "/health", timeout=2) as r:
                return json.loads(r.read()).get("health") == "true"

        self._wait("etcd /health", etcd_healthy, deadline)

        self._apiserver_cmd = [
            str(bins / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            f"--secure-port={api_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--cert-dir={wd / 'certs'}",
            f"--token-auth-file={wd / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={sa_key}",
            f"--service-account-signing-key-file={sa_key}",
            # /16: room for a ClusterIP Service per server in the scale benchmark (bench/scale.py).
            "--service-cluster-ip-range=10.0.0.0/16",
            "--allow-privileged=true",
            # One apiserver, no real nodes: don't wait for endpoint reconciliation.
            "--endpoint-reconciler-type=none",
        ]
        self._spawn("kube-apiserver", self._apiserver_cmd)
        self._wait("kube-apiserver /readyz", lambda: self._get("/readyz")[0] == 200, deadline)

        self.kubeconfig = str(wd / "kubeconfig")
        self._write_kubeconfig()

        self._spawn(
            "kube-controller-manager",
            [
                str(bins / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                f"--service-account-private-key-file={sa_key}",
                f"--root-ca-file={wd / 'certs' / 'apiserver.crt'}",
                "--use-service-account-credentials=true",
                "--secure-port=0",
                f"--controllers={KCM_CONTROLLERS}",
            ],
        )

        def default_sa_exists() -> bool:
            return self._get("/api/v1/namespaces/default/serviceaccounts/default")[0] == 200

        # The default ServiceAccount proves that the serviceaccount controller (and so the manager) works.
        self._wait("default ServiceAccount in namespace default", default_sa_exists, deadline)

    def _write_kubeconfig(self) -> None:
        cluster: dict[str, Any] = {"server": self.server}
        ca = self.workdir / "certs" / "apiserver.crt"  # self-signed by the apiserver: cert + its CA
        if self.verify_tls and ca.exists():
            cluster["certificate-authority-data"] = base64.b64encode(ca.read_bytes()).decode()
        else:
            cluster["insecure-skip-tls-verify"] = True
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": cluster}],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
            "current-context": "local",
        }
        path = Path(self.kubeconfig)
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        os.chmod(path, 0o600)


class _PortRace(ControlPlaneError):
    pass


# ---------------------------------------------------------------------- CLI
def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m e2e.testbed.controlplane", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build", help="build kube-apiserver and kube-controller-manager (cached)")
    up = sub.add_parser("up", help="start a control plane and wait for Ctrl-C / SIGTERM")
    up.add_argument("--dir", help="work directory (kept); default: a temporary one (removed)")
    args = ap.parse_args(argv)

    if args.cmd == "build":
        print(ensure_binaries())
        return 0

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    cp = ControlPlane(args.dir)
    try:
        cp.start()
        print(f"control plane up in {cp.start_seconds:.1f}s; workdir {cp.workdir}", file=sys.stderr)
        print(f"kubeconfig: {cp.kubeconfig}")
        print(f"export KUBECONFIG={cp.kubeconfig}", flush=True)
        while not stop.is_set():
            if not cp.running:
                print("a control-plane process exited; see logs in the workdir", file=sys.stderr)
                return 1
            stop.wait(1.0)
    finally:
        cp.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
