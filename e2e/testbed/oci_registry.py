"""A real OCI registry on loopback: Debian's ``docker-registry`` (the CNCF distribution registry), run with a
config we write, storage in a temporary directory, plain HTTP on 127.0.0.1.

The release workflow pushes the chart to ghcr.io; a test pushes it the same way to this one and pulls it
back by the README's reference, the registry's host swapped::

    with OciRegistry(workdir) as registry:
        registry.host                  # 127.0.0.1:PORT

tools/run-tests.sh installs the package (its service is not started: the tests start their own).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from e2e.testbed.procs import free_port, set_pdeathsig


def _dies_with_parent() -> None:
    set_pdeathsig(signal.SIGTERM)


def binary() -> str:
    found = shutil.which("docker-registry")
    if found is None:
        raise RuntimeError("docker-registry is not installed (apt-get install docker-registry; "
                           "tools/run-tests.sh does it)")
    return found


class OciRegistry:
    def __init__(self, workdir: Path, start_timeout: float = 30):
        self.workdir = Path(workdir)
        self.start_timeout = start_timeout
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "OciRegistry":
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "config.yml"
        config.write_text(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
                          f"    rootdirectory: {self.workdir / 'data'}\nhttp:\n  addr: {self.host}\n")
        log = open(self.workdir / "registry.log", "wb")
        try:
            self.proc = subprocess.Popen([binary(), "serve", str(config)], stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, preexec_fn=_dies_with_parent)
        finally:
            log.close()
        deadline = time.monotonic() + self.start_timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"docker-registry did not serve /v2/ on {self.host}:\n"
                                   + (self.workdir / "registry.log").read_text()[-2000:])
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "OciRegistry":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
