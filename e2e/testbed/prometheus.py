"""A real Prometheus for tests and benchmarks: Debian's ``prometheus`` package, run with a config we write.

Targets come from a file (``file_sd_configs``) the caller rewrites as pods come and go, each
with the ``namespace`` and ``pod`` labels a PodMonitor would give them::

    ensure_prometheus()
    with PrometheusServer(workdir, scrape_interval="1s") as prom:
        prom.set_targets([("127.0.0.11:8000", {"namespace": "ns", "pod": "srv-0"})])
        prom.url                       # http://127.0.0.1:PORT

CLI (used by tools/run-tests.sh): ``python -m e2e.testbed.prometheus ensure``.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterable, Optional

from e2e.testbed.controlplane import cache_dir
from e2e.testbed.procs import free_port, set_pdeathsig

PACKAGE = "prometheus"


def _dies_with_parent() -> None:
    set_pdeathsig(signal.SIGTERM)


def binary() -> Optional[str]:
    return shutil.which("prometheus") or (
        "/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None)


def apt_lock_path() -> Path:
    """The lock this project's Debian installers take in turn (tools/run-tests.sh's apt_install takes it too):
    suites started side by side share one dpkg. apt-get waits out a held dpkg lock when told to
    (DPkg::Lock::Timeout), but `apt-get update` fails at once on a held lists lock."""
    return cache_dir() / "apt.lock"


def ensure_prometheus(timeout: float = 600) -> str:
    """The prometheus binary, installing Debian's package (about 8 s) when it is missing."""
    found = binary()
    if found:
        return found

    def apt(*args: str) -> subprocess.CompletedProcess:
        cmd = ["apt-get", "-o", f"DPkg::Lock::Timeout={int(timeout)}", *args]
        if os.geteuid() != 0 and shutil.which("sudo"):
            cmd = ["sudo", "-n", *cmd]
        return subprocess.run(cmd, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
                              capture_output=True, text=True, timeout=timeout)

    lock = apt_lock_path()
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # released when `held` closes
        found = binary()  # another suite may have installed it while this one waited
        if found:
            return found
        install = ("install", "-y", "-q", "--no-install-recommends", PACKAGE)
        p = apt(*install)
        if p.returncode != 0:  # a stale package index: refresh once and retry
            apt("update", "-q")
            p = apt(*install)
    found = binary()
    if not found:
        raise RuntimeError(f"could not install {PACKAGE}: {p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    # The package starts a system service we do not use; leave it alone (it listens on :9090).
    return found


class PrometheusServer:
    """One Prometheus process on 127.0.0.1, its TSDB in `workdir` (kept across restarts)."""

    def __init__(self, workdir: str | os.PathLike, *, scrape_interval: str = "1s", port: Optional[int] = None,
                 job: str = "vllm"):
        self.workdir = Path(workdir).resolve()  # Prometheus runs in it: paths must not be relative
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.scrape_interval = scrape_interval
        self.port = port or free_port()
        self.job = job
        self.targets_file = self.workdir / "targets.json"
        self.config_file = self.workdir / "prometheus.yml"
        self.log_path = self.workdir / "prometheus.log"
        self.proc: Optional[subprocess.Popen] = None
        self._targets: list[tuple[str, dict[str, str]]] = []
        if not self.targets_file.exists():
            self._write_targets()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _write_config(self) -> None:
        # JSON is YAML: no quoting surprises.
        cfg = {
            "global": {"scrape_interval": self.scrape_interval, "scrape_timeout": self.scrape_interval,
                       "evaluation_interval": self.scrape_interval},
            "scrape_configs": [{
                "job_name": self.job,
                "file_sd_configs": [{"files": [str(self.targets_file)], "refresh_interval": "1s"}],
            }],
        }
        self.config_file.write_text(json.dumps(cfg, indent=1))

    def _write_targets(self) -> None:
        groups = [{"targets": [addr], "labels": labels} for addr, labels in self._targets]
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups, indent=1))
        tmp.replace(self.targets_file)  # atomic: Prometheus never reads half a file

    def set_targets(self, targets: Iterable[tuple[str, dict[str, str]]]) -> None:
        """Replace the scrape targets: (host:port, labels) pairs."""
        self._targets = [(addr, dict(labels)) for addr, labels in targets]
        self._write_targets()

    def start(self, timeout: float = 60) -> "PrometheusServer":
        if self.proc is not None and self.proc.poll() is None:
            return self
        exe = ensure_prometheus()
        self._write_config()
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                [exe, f"--config.file={self.config_file}", f"--storage.tsdb.path={self.workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=2h",
                 "--log.level=warn"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
                start_new_session=True, preexec_fn=_dies_with_parent)
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.ready():
                return self
            time.sleep(0.2)
        raise TimeoutError(f"prometheus not ready after {timeout}s:\n{self.log_tail()}")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def query(self, promql: str) -> list[dict]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())["data"]["result"]

    def stop(self, timeout: float = 15) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def __enter__(self) -> "PrometheusServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str]) -> int:
    if argv[:1] == ["ensure"]:
        print(ensure_prometheus())
        return 0
    print("usage: python -m e2e.testbed.prometheus ensure", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
