"""Run an Argo CD health check (Lua 5.1) against a resource, in two runtimes.

"lua5.1": Argo CD runs health scripts in gopher-lua (Lua 5.1) with the resource as the global
`obj` and takes the table the script returns. Here the resource (JSON-like dict) becomes a Lua
table literal, and Debian's `lua5.1` runs the script (tools/run-tests.sh installs it).

"argocd": Argo CD's own runtime, `argocd-health` (tools/testbed/argocd, built by tools/argocd-build.sh
from the github.com/argoproj/argo-cd/v3 release its go.mod pins): gopher-lua with Argo CD's sandbox
(no string, io or full os library unless useOpenLibs), its one-second deadline, its conversion of
the object and of the result, called as the application controller calls it.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Optional

import yaml

HERE = Path(__file__).resolve().parent
TOOLS = HERE.parents[1] / "tools"
HEALTH_SCRIPT = HERE.parents[1] / "operator" / "vllm_operator" / "argocd_health.lua"
ARGOCD_SRC = TOOLS / "testbed" / "argocd"
ARGOCD_BUILD = TOOLS / "argocd-build.sh"
#: The runtimes run_health_check can use.
RUNTIMES = ("lua5.1", "argocd")


def lua_interpreter() -> str:
    lua = shutil.which("lua5.1")
    if lua is None:
        raise RuntimeError("lua5.1 is not installed (apt-get install lua5.1; tools/run-tests.sh does it)")
    return lua


def to_lua(value: Any) -> str:
    """A Lua 5.1 expression for a JSON value (null becomes nil: Argo CD's converter drops it too)."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{value} has no JSON form")
        return repr(value)
    if isinstance(value, str):
        # JSON's escapes (\" \\ \n \t \r \b \f) are Lua's too; ensure_ascii=False keeps UTF-8 bytes as they are.
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "{" + ", ".join(to_lua(v) for v in value) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"[{to_lua(str(k))}] = {to_lua(v)}" for k, v in value.items() if v is not None) + "}"
    raise TypeError(f"cannot convert {type(value).__name__} to Lua")


def run_health_check(obj: dict[str, Any], script: Path = HEALTH_SCRIPT, timeout: float = 30,
                     runtime: str = "lua5.1") -> dict[str, str]:
    """The table the health script returns for `obj`: {"status": ..., "message": ...}, in `runtime`."""
    if runtime == "argocd":
        return run_argocd_health_check(obj, script=script, timeout=timeout)
    if runtime != "lua5.1":
        raise ValueError(f"unknown runtime {runtime!r}: one of {RUNTIMES}")
    program = (
        f"obj = {to_lua(obj)}\n"
        f"local check = assert(loadfile({to_lua(str(script))}))\n"
        "local hs = check()\n"
        "assert(type(hs) == 'table', 'the health check returned ' .. type(hs))\n"
        "io.write(tostring(hs.status), '\\0', tostring(hs.message))\n"
    )
    p = subprocess.run([lua_interpreter(), "-"], input=program.encode(), capture_output=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"lua5.1 failed ({p.returncode}): {p.stderr.decode(errors='replace')}")
    status, message = p.stdout.decode().split("\0", 1)
    return {"status": status, "message": message}


# --------------------------------------------------------------------------- Argo CD's own runtime
def pinned_argocd_version() -> str:
    """The Argo CD release tools/testbed/argocd/go.mod pins (github.com/argoproj/argo-cd/v3 vX.Y.Z), without the v."""
    for line in (ARGOCD_SRC / "go.mod").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "github.com/argoproj/argo-cd/v3":
            return parts[1].lstrip("v")
    raise RuntimeError("tools/testbed/argocd/go.mod does not require github.com/argoproj/argo-cd/v3")


def _cache_dir() -> Path:
    return Path(os.environ.get("VLLM_OPERATOR_CACHE", Path.home() / ".cache" / "vllm-operator"))


@functools.cache
def argocd_binary() -> Path:
    """argocd-health, built by tools/argocd-build.sh if needed (0.01 s when it is; tools/run-tests.sh builds it first)."""
    p = subprocess.run(["bash", str(ARGOCD_BUILD)], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{ARGOCD_BUILD} failed ({p.returncode}):\n{p.stderr[-4000:]}")
    binary = _cache_dir() / f"argocd-{pinned_argocd_version()}" / "bin" / "argocd-health"
    if not os.access(binary, os.X_OK):
        raise RuntimeError(f"{binary} missing after {ARGOCD_BUILD}")
    return binary


def argocd_versions() -> dict[str, str]:
    """What argocd-health was linked with: {"argo-cd", "gitops-engine", "gopher-lua", "go"} -> version."""
    p = subprocess.run([str(argocd_binary()), "-version"], capture_output=True, text=True, timeout=30, check=True)
    return json.loads(p.stdout)


def run_argocd_health_check(obj: dict[str, Any], script: Path = HEALTH_SCRIPT, timeout: float = 30, *,
                            use_open_libs: bool = False,
                            argocd_cm: Optional[dict[str, Any]] = None) -> dict[str, str]:
    """Argo CD's health for `obj` (which needs apiVersion and kind, as every object Argo CD reads has).

    The script is the override of the object's group/kind, with the standard libraries closed as argocd-cm's
    resource.customizations.useOpenLibs.<group>_<kind> defaults to (or open, `use_open_libs`). With
    `argocd_cm` (a ConfigMap's dict) Argo CD's settings manager reads the overrides from it instead.
    When the script fails, Argo CD shows the health as Unknown with the error: this raises RuntimeError
    with that error.
    """
    with tempfile.TemporaryDirectory(prefix="argocd-health-") as tmp:
        if argocd_cm is not None:
            cm_path = Path(tmp) / "argocd-cm.yaml"
            cm_path.write_text(yaml.safe_dump(argocd_cm))
            args = ["-argocd-cm", str(cm_path)]
        else:
            args = ["-script", str(script)] + (["-use-open-libs"] if use_open_libs else [])
        p = subprocess.run([str(argocd_binary()), *args], input=json.dumps(obj).encode(), capture_output=True,
                           timeout=timeout)
    out, err = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    if p.returncode == 0:
        hs = json.loads(out)
        return {"status": hs["status"], "message": hs["message"]}
    shown = ""
    if p.returncode == 1 and out.strip():
        hs = json.loads(out)
        shown = f" (Argo CD shows {hs['status']}: {hs['message']})"
        err = hs["error"]
    raise RuntimeError(f"Argo CD {pinned_argocd_version()} failed ({p.returncode}): {err.strip()}{shown}")
