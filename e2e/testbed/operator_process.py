"""Run `vllm-operator run` as a child process against a kubeconfig (tests, demo, benchmarks).

The process dies with its parent (PR_SET_PDEATHSIG) and can be stopped politely or
killed with SIGKILL, as a crash would.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from e2e.testbed.procs import set_pdeathsig

def _die_with_parent() -> None:
    os.setsid()
    set_pdeathsig(signal.SIGKILL)


#: What an operator logs whenever it acts on an object (kopf's per-handler line and our reconcile line):
#: a replica that stands by under peering logs none of it.
ACTING = re.compile(r"(Handler|Timer|Daemon) '[^']+' (succeeded|failed)|reconciled |autoscal", re.I)

class OperatorProcess:
    def __init__(self, kubeconfig: str | os.PathLike, log_path: str | os.PathLike,
                 extra_args: Sequence[str] = (), resync_seconds: float = 3.0, env: Optional[dict] = None):
        self.kubeconfig = str(kubeconfig)
        self.env = dict(env or {})
        self.log_path = Path(log_path)
        self.args = ["--resync-seconds", str(resync_seconds), "--health-port", "0", *extra_args]
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "OperatorProcess":
        env = {**os.environ, "KUBECONFIG": self.kubeconfig, "PYTHONUNBUFFERED": "1", **self.env}
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "vllm_operator.cli", "run", *self.args],
                                     stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent)
        log.close()
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill would end it."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.1)
        self.kill()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def __enter__(self) -> "OperatorProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
