"""Check a chat template (spec.engine.chatTemplate) the way vLLM will use it, before any pod starts.

vLLM renders chat templates with Jinja2 in an ImmutableSandboxedEnvironment (trim_blocks, lstrip_blocks, the
loopcontrols extension, `raise_exception` and `strftime_now` as globals), with `messages`,
`add_generation_prompt`, `bos_token`, `eos_token` and `tools` among the variables. A template that does not parse,
that raises, or that renders nothing for an ordinary conversation would only show as a 400 on every chat request
once the server runs; here it is a problem naming the field.

A template is a tenant's program, so it never runs in the operator's process: one child Python per new
template (its digest cached), under RLIMIT_AS and RLIMIT_CPU and a wall-clock timeout, answering one line of
JSON. Inside, the sandbox's own limits (`range` at most 100,000 items) plus ours: output capped, call arguments
and namespace values bounded, `lipsum` gone. Whatever gets past them meets the rlimits: a template that doubles
a string 40 times ends as "uses more than its memory limit", not as the operator's OOM kill.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import subprocess
import sys
import threading
from collections import OrderedDict
from typing import Optional

MAX_TEMPLATE_CHARS = 65536
#: The child's limits: address space (the interpreter and jinja2 take ~60 MiB of it), CPU seconds, wall clock.
MEMORY_BYTES = 512 * 2**20
CPU_SECONDS = 3
WALL_SECONDS = 10.0
#: Rendered output and any one value the template builds, in characters.
MAX_OUTPUT_CHARS = 256 * 1024

SAMPLE_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi! How can I help you today?"},
    {"role": "user", "content": "What is the capital of France?"},
]

# The child: reads the template on stdin, prints {"ok": true, "chars": N} or {"ok": false, "error": "..."}.
_CHILD = r'''
import json, sys
from datetime import datetime
import jinja2, jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

LIMIT = int(sys.argv[1])
MESSAGES = json.loads(sys.argv[2])


class TooBig(Exception):
    pass


def _size(v):
    return len(v) if isinstance(v, (str, list, tuple, dict)) else 0


class BoundedNamespace(Namespace):
    def __setitem__(self, name, value):
        if _size(value) > LIMIT:
            raise TooBig("a namespace value longer than %d" % LIMIT)
        super().__setitem__(name, value)


class Env(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(["*", "**"])

    def call_binop(self, context, operator, left, right):
        if operator == "**" and isinstance(right, int) and abs(right) > 64:
            raise TooBig("an exponent above 64")
        if operator == "*" and (_size(left) * (right if isinstance(right, int) else 1) > LIMIT
                                or _size(right) * (left if isinstance(left, int) else 1) > LIMIT):
            raise TooBig("a repetition longer than %d" % LIMIT)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context, __obj, *args, **kwargs):
        for v in list(args) + list(kwargs.values()):
            if _size(v) > LIMIT or (isinstance(v, int) and not isinstance(v, bool) and abs(v) > LIMIT):
                raise TooBig("a call with an argument beyond %d" % LIMIT)
        return super().call(__context, __obj, *args, **kwargs)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


env = Env(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
env.globals.pop("lipsum", None)
env.globals.update(namespace=BoundedNamespace, raise_exception=raise_exception,
                   strftime_now=lambda fmt: datetime.now().strftime(fmt))
source = sys.stdin.read()
try:
    template = env.from_string(source)
except jinja2.TemplateSyntaxError as e:
    print(json.dumps({"ok": False, "error": "does not parse: line %s: %s" % (e.lineno, e.message)}))
    sys.exit(0)
out = 0
try:
    for chunk in template.generate(messages=MESSAGES, add_generation_prompt=True, bos_token="<s>",
                                   eos_token="</s>", tools=None, documents=None):
        out += len(chunk)
        if out > LIMIT:
            raise TooBig("renders more than %d characters" % LIMIT)
except TooBig as e:
    print(json.dumps({"ok": False, "error": "is too big to render: " + str(e)}))
    sys.exit(0)
except RecursionError:
    print(json.dumps({"ok": False, "error": "recurses without end"}))
    sys.exit(0)
except MemoryError:
    print(json.dumps({"ok": False, "limit": True}))
    sys.exit(0)
except Exception as e:  # noqa: BLE001 - the template's own error, as vLLM would meet it
    print(json.dumps({"ok": False, "error": "fails to render a sample conversation: %s: %s"
                      % (type(e).__name__, str(e)[:300])}))
    sys.exit(0)
print(json.dumps({"ok": True, "chars": out}))
'''


def _limits() -> None:  # pragma: no cover - runs in the child before exec
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))


def _run(template: str) -> Optional[str]:
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", _CHILD, str(MAX_OUTPUT_CHARS), json.dumps(SAMPLE_MESSAGES)],
            input=template, capture_output=True, text=True, timeout=WALL_SECONDS, preexec_fn=_limits,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    except subprocess.TimeoutExpired:
        return f"takes longer than {WALL_SECONDS:g} s to render a sample conversation"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        if done.returncode in (-9, -24) or "MemoryError" in done.stderr:  # SIGKILL/SIGXCPU, or out of memory
            return _over_limits()
        return f"could not be checked (the checker exited with {done.returncode})"
    answer = json.loads(lines[-1])
    if answer.get("limit"):
        return _over_limits()
    if answer["ok"] and answer["chars"] == 0:
        return "renders nothing for a sample conversation"
    return None if answer["ok"] else str(answer["error"])


def _over_limits() -> str:
    return (f"uses more than its limits ({MEMORY_BYTES // 2**20} MiB, {CPU_SECONDS} s of CPU) to render a sample "
            "conversation")


class _Cache:
    def __init__(self, size: int = 256):
        self.size, self._lock = size, threading.Lock()
        self._items: OrderedDict[str, Optional[str]] = OrderedDict()

    def get(self, template: str) -> Optional[str]:
        key = hashlib.sha256(template.encode()).hexdigest()
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        found = _run(template)
        with self._lock:
            self._items[key] = found
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return found


_CACHE = _Cache()


def problem(template: str) -> Optional[str]:
    """Why vLLM could not use this chat template, or None. One child process per template not seen before."""
    return _CACHE.get(template)
