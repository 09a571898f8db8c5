"""What the operator writes about a tenant's server is bounded and printable: text that came from a tenant (a
template's `raise_exception` message, a flag's value, a name it chose, an API server's refusal quoting the spec)
reaches conditions, Events and logs through `clean`, and a status through `bounded_status`. Pure.

Why: a message with newlines or ANSI escapes rewrites what `kubectl describe` and a terminal show (a forged line,
a cleared screen); a valid 514 KB spec once made the operator's status exceed etcd's request limit, so it was
never written (issue 18)."""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

#: ANSI/VT escape sequences (CSI, OSC, and two-character ones), removed whole.
_ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])|\x9b[0-?]*[ -/]*[@-~]")
#: Longest condition message (metav1.Condition allows 32768; a person reads far less).
CONDITION_MESSAGE_CHARS = 8192
#: Longest Event message.
EVENT_MESSAGE_CHARS = 1024
#: The status a reconcile writes, as JSON: far below etcd's 1.5 MiB for an object with a 1 MB spec beside it.
STATUS_BYTES = 96 * 1024
#: status.plan's args and notes, each, when the status would be longer than STATUS_BYTES.
PLAN_ITEM_CHARS = 512


def clean(text: str, limit: int) -> str:
    """`text` with escape sequences removed, every other control or format character (newlines and tabs, bidi
    overrides, zero-width joiners) made a space, cut at `limit` characters with the length said."""
    text = _ESCAPES.sub("", text)
    text = "".join(" " if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") else c for c in text)
    if len(text) > limit:
        marker = f"... ({len(text)} characters)"
        text = text[: max(limit - len(marker), 0)] + marker
    return text


def message(text: str) -> str:
    """A condition's message (clean, at most CONDITION_MESSAGE_CHARS)."""
    return clean(text, CONDITION_MESSAGE_CHARS)


def _size(status: dict[str, Any]) -> int:
    return len(json.dumps(status, separators=(",", ":")))


def bounded_status(status: dict[str, Any], limit: int = STATUS_BYTES) -> dict[str, Any]:
    """The status (wire form) fitted into `limit` bytes of JSON: when it is longer, status.plan's args and notes are
    cut to PLAN_ITEM_CHARS each, then the notes and the args beyond the first ones dropped (counted in a note),
    then every condition message cut to 1024; what the status says stays true, only shorter."""
    if _size(status) <= limit:
        return status
    out = json.loads(json.dumps(status))
    plan = out.get("plan") or {}
    for key in ("args", "notes"):
        if key in plan:
            plan[key] = [clean(str(v), PLAN_ITEM_CHARS) for v in plan[key]]
    for key in ("notes", "args"):
        items, kept = list(plan.get(key) or []), len(plan.get(key) or [])
        while kept and _size(out) > limit:
            kept //= 2
            plan[key] = items[:kept]
        if kept < len(items):
            plan.setdefault("notes", []).append(f"{len(items) - kept} of status.plan.{key} left out: the status is "
                                                f"kept under {limit // 1024} KiB")
    for c in out.get("conditions") or []:
        if _size(out) > limit:
            c["message"] = clean(c.get("message", ""), 1024)
    return out
