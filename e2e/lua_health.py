"""Run an Argo CD health check (Lua 5.1) against a resource, with a real Lua 5.1 interpreter.

Argo CD runs health scripts in gopher-lua (Lua 5.1) with the resource as the global `obj`
and takes the table the script returns. Here the resource (JSON-like dict) becomes a Lua
table literal, and Debian's `lua5.1` runs the script (e2e/run-tests.sh installs it).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

HEALTH_SCRIPT = Path(__file__).resolve().parents[1] / "operator" / "vllm_operator" / "argocd_health.lua"


def lua_interpreter() -> str:
    lua = shutil.which("lua5.1")
    if lua is None:
        raise RuntimeError("lua5.1 is not installed (apt-get install lua5.1; e2e/run-tests.sh does it)")
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


def run_health_check(obj: dict[str, Any], script: Path = HEALTH_SCRIPT, timeout: float = 30) -> dict[str, str]:
    """The table the health script returns for `obj`: {"status": ..., "message": ...}."""
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
