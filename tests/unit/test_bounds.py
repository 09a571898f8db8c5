"""What the operator writes about a tenant's server is printable and bounded (bounds.py, issue 18): a template's
`raise_exception` with newlines and ANSI escapes, a name in a refusal, a 514 KB plan."""

from __future__ import annotations

import json
import re

from e2e.testbed.memory_world import World
from vllm_operator import bounds
from vllm_operator.conditions import Conditions

CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")


def test_clean_removes_escapes_and_control_characters_and_says_what_it_cut():
    assert bounds.clean("a\nb\r\tc\x1b[2J\x1b[31mred\x1b[0m\x1b]0;title\x07 \u202eevil\u200b", 100) == \
        "a b  cred  evil "
    cut = bounds.clean("x" * 10_000, 100)
    assert len(cut) == 100 and cut.endswith("... (10000 characters)")
    assert bounds.clean("plain text, ünïcode ✓", 100) == "plain text, ünïcode ✓"


def test_conditions_keep_only_clean_bounded_messages():
    c = Conditions([], 1, "now")
    c.set("SpecValid", "False", "InvalidSpec", "line one\nline two\x1b[1A\x1b[2Kforged: Ready=True" + "y" * 50_000)
    message = c.get("SpecValid").message
    assert not CONTROL.search(message) and len(message) <= bounds.CONDITION_MESSAGE_CHARS


def test_a_templates_exception_reaches_status_and_events_printable():
    world = World({"engine": {"chatTemplate": "{{ raise_exception('roles\\n\\x1b[2J\\x1b[31mmust alternate\\r') }}"}})
    status = world.reconcile()["status"]
    spec_valid = next(c for c in status["conditions"] if c["type"] == "SpecValid")
    assert spec_valid["status"] == "False" and "roles" in spec_valid["message"] and "must alternate" in \
        spec_valid["message"]
    for c in status["conditions"]:
        assert not CONTROL.search(c["message"]), c
    assert not CONTROL.search(status["chatTemplate"]["problem"])
    assert world.kube.events and all(not CONTROL.search(e["message"]) for e in world.kube.events)


def test_a_status_is_bounded_like_the_children():
    status = {"observedGeneration": 1, "conditions": [
        {"type": t, "status": "False", "reason": "X", "message": "m" * 8000} for t in ("A", "B", "C", "D", "E")],
        "plan": {"args": ["--served-model-name", "n" * 16000] * 32, "notes": ["why " * 4000] * 30,
                 "estimates": {"kvCacheTokens": 1}}}
    assert len(json.dumps(status)) > 514_000
    bounded = bounds.bounded_status(status)
    assert len(json.dumps(bounded, separators=(",", ":"))) <= bounds.STATUS_BYTES
    assert bounded["plan"]["estimates"] == {"kvCacheTokens": 1} and bounded["observedGeneration"] == 1
    assert bounded["plan"]["args"][1].endswith("(16000 characters)")
    small = {"observedGeneration": 1, "plan": {"args": ["--x"]}}
    assert bounds.bounded_status(small) is small  # what fits is written as it is
