"""What kstatus, the library Flux, kpt and the cli-utils applier judge resources with, makes of resources.

kstatus is sigs.k8s.io/cli-utils/pkg/kstatus/status at the release tools/testbed/kstatus/go.mod pins; its own
status.Compute runs in a small Go program (tools/testbed/kstatus/main.go) that tools/kstatus-build.sh builds
into the cache (tools/run-tests.sh does it; the first call here does it too when needed, ~0 s once built).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any, Iterable

from e2e.testbed.controlplane import cache_dir

HERE = Path(__file__).resolve().parent
TOOLS = HERE.parents[1] / "tools"
BUILD_SCRIPT = TOOLS / "kstatus-build.sh"
GO_MOD = TOOLS / "testbed" / "kstatus" / "go.mod"


def _pinned_version() -> str:
    """The sigs.k8s.io/cli-utils release tools/testbed/kstatus/go.mod pins ("0.37.2")."""
    for line in GO_MOD.read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["require"]:
            parts = parts[1:]
        if len(parts) >= 2 and parts[0] == "sigs.k8s.io/cli-utils":
            return parts[1].lstrip("v")
    raise RuntimeError(f"{GO_MOD} does not require sigs.k8s.io/cli-utils")


CLI_UTILS_VERSION = _pinned_version()
_built = threading.Lock()
_checked = False


def binary() -> Path:
    """The kstatus program, built by tools/kstatus-build.sh if it is not yet (once per process)."""
    global _checked
    path = cache_dir() / f"kstatus-{CLI_UTILS_VERSION}" / "bin" / "kstatus"
    with _built:
        if not _checked:
            subprocess.run(["bash", str(BUILD_SCRIPT)], check=True)
            _checked = True
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path} missing after {BUILD_SCRIPT}")
    return path


def kstatus(objs: Iterable[dict[str, Any]], timeout: float = 60) -> list[dict[str, str]]:
    """kstatus's Result for each resource, in order: [{"status": "Current"|"InProgress"|"Failed"|"Terminating"|
    "NotFound"|"Unknown", "message": ...}]. Each resource needs apiVersion and kind, as the API returns it.
    A resource kstatus cannot judge (status.Compute returns an error) raises RuntimeError."""
    docs = list(objs)
    p = subprocess.run([str(binary())], input=json.dumps(docs).encode(), capture_output=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"kstatus failed ({p.returncode}): {p.stderr.decode(errors='replace').strip()}")
    out = json.loads(p.stdout)
    if len(out) != len(docs):
        raise RuntimeError(f"kstatus judged {len(out)} resources, {len(docs)} given")
    return out


def version() -> str:
    """The cli-utils version the built program reports ("v0.37.2")."""
    return subprocess.run([str(binary()), "-version"], capture_output=True, check=True, timeout=60,
                          text=True).stdout.strip()
