"""Check a chat template (spec.engine.chatTemplate) the way vLLM will use it, before any pod starts.

vLLM renders chat templates with Jinja2 in an ImmutableSandboxedEnvironment (trim_blocks, lstrip_blocks, the
loopcontrols extension, `raise_exception` and `strftime_now` as globals), with `messages`,
`add_generation_prompt`, `bos_token`, `eos_token` and `tools` among the variables. A template that does not parse,
that raises, or that renders nothing for an ordinary conversation would only show as a 400 on every chat request
once the server runs; here it is a problem naming the field.

A template is a tenant's program, so it never runs in the operator's process, and what it may cost is bounded by
the operator's settings, not by the tenant:

* one child Python per template not seen before, under RLIMIT_AS (`Limits.memory_bytes`, and never more than a
  share of what the operator's cgroup has left: `memory_bound`), RLIMIT_CPU and a wall-clock timeout;
* inside it the sandbox's own limits (`range` at most 100,000 items) plus ours: every string, list or output the
  template builds is capped at MAX_OUTPUT_CHARS where it is built (see the child below);
* in the operator (`Checker`): at most `Limits.concurrency` children at a time on the checker's own threads, never
  on kopf's (a reconcile that meets a template not checked yet returns at once, `Queued`, and is run again when the
  check ends); a rate of new templates per server (a token bucket: the cost is charged to the tenant that makes
  it, as a SpecValid=False message naming when the next check may run); verdicts cached by digest, in memory and
  in the server's status (`status.chatTemplate`, written by the operator only, through the status subresource),
  so a restart checks nothing again.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from . import bounds

MAX_TEMPLATE_CHARS = 65536
#: The child's default limits: address space (the interpreter and jinja2 take ~30 MiB of it), CPU seconds, wall
#: clock. The chart's container has 256 MiB and the operator itself uses ~90 MiB of it.
MEMORY_BYTES = 64 * 2**20
#: The least address space a child is started with, whatever the cgroup says (below it, Python does not start).
MIN_MEMORY_BYTES = 40 * 2**20
CPU_SECONDS = 3
WALL_SECONDS = 10.0
#: Rendered output and any one value the template builds, in characters.
MAX_OUTPUT_CHARS = 256 * 1024
#: Part of a verdict's digest: a checker that checks differently does not trust the digests of the last one.
CHECKER_VERSION = "2"

SAMPLE_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi! How can I help you today?"},
    {"role": "user", "content": "What is the capital of France?"},
]

# The child: reads the template on stdin, prints {"ok": true, "chars": N} or {"ok": false, "error": "..."}.
# Every value the template builds is bounded where it is built: `*`, `+`, `%` and `**` (intercepted binary
# operators), `~` (the code generator writes a bounded concatenation), every buffered block (`{% set %}...
# {% endset %}`, macros, `{% filter %}`, call blocks: environment.concat), every filter and every call (their
# arguments before, their results after; join's and replace's size before they run), namespace values, and the
# output. What is built between two checks meets RLIMIT_AS.
_CHILD = r"""
import functools, json, sys
from datetime import datetime
import jinja2, jinja2.ext
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

LIMIT = int(sys.argv[1])
MESSAGES = json.loads(sys.argv[2])


class TooBig(Exception):
    pass


def _weight(v, budget=LIMIT):
    # Characters and items in v, counted until they pass budget (a list of one string 1,000 times weighs 1,000
    # of that string: str() of it would be that long).
    if isinstance(v, str):
        return len(v)
    if isinstance(v, dict):
        v = list(v.items())
    if isinstance(v, (list, tuple)):
        total = len(v)
        for item in v:
            if total > budget:
                break
            total += _weight(item, budget - total)
        return total
    return 0


def _check(v, what):
    if _weight(v) > LIMIT:
        raise TooBig("%s longer than %d" % (what, LIMIT))
    return v


def _check_args(args, kwargs):
    for v in list(args) + list(kwargs.values()):
        if _weight(v) > LIMIT or (isinstance(v, int) and not isinstance(v, bool) and abs(v) > LIMIT):
            raise TooBig("a call with an argument beyond %d" % LIMIT)


def concat(values):
    parts, n = [], 0
    for v in values:
        if not isinstance(v, str):
            v = str(_check(v, "a value"))
        n += len(v)
        if n > LIMIT:
            raise TooBig("a string longer than %d" % LIMIT)
        parts.append(v)
    return "".join(parts)


def _joined(items, sep):
    items = list(items)
    if sum(_weight(i) for i in items) + max(len(items) - 1, 0) * len(str(sep)) > LIMIT:
        raise TooBig("a join longer than %d" % LIMIT)
    return items


def _replaced(s, old, new):
    s, old, new = str(s), str(old), str(new)
    grows = max(len(new) - len(old), 0) * (s.count(old) if old else len(s) + 1)
    if len(s) + grows > LIMIT:
        raise TooBig("a replace longer than %d" % LIMIT)


class BoundedNamespace(Namespace):
    def __setitem__(self, name, value):
        super().__setitem__(name, _check(value, "a namespace value"))


class Buffer(list):
    # A block's output before it is joined ({% set %}...{% endset %}, macros, filter and call blocks).
    size = 0

    def _grow(self, values):
        for v in values:
            self.size += len(v) if isinstance(v, str) else _weight(v)
            if self.size > LIMIT:
                raise TooBig("a block longer than %d" % LIMIT)

    def append(self, v):
        self._grow((v,))
        super().append(v)

    def extend(self, values):
        values = list(values)
        self._grow(values)
        super().extend(values)


class Generator(CodeGenerator):
    def buffer(self, frame):
        frame.buffer = self.temporary_identifier()
        self.writeline("%s = environment.buffer()" % frame.buffer)

    def visit_Concat(self, node, frame):
        self.write("environment.concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class Env(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(["*", "**", "+", "%"])
    code_generator_class = Generator
    concat = staticmethod(concat)
    buffer = Buffer

    def call_binop(self, context, operator, left, right):
        if operator == "**" and isinstance(right, int) and abs(right) > 64:
            raise TooBig("an exponent above 64")
        if operator == "*" and (_weight(left) * (right if isinstance(right, int) else 1) > LIMIT
                                or _weight(right) * (left if isinstance(left, int) else 1) > LIMIT):
            raise TooBig("a repetition longer than %d" % LIMIT)
        if operator == "+" and _weight(left) + _weight(right) > LIMIT:
            raise TooBig("a sum longer than %d" % LIMIT)
        return _check(super().call_binop(context, operator, left, right), "a result")

    def call(__self, __context, __obj, *args, **kwargs):
        _check_args(args, kwargs)
        owner, name = getattr(__obj, "__self__", None), getattr(__obj, "__name__", "")
        if isinstance(owner, str) and name == "join" and args:
            args = (_joined(args[0], owner),) + args[1:]
        if isinstance(owner, str) and name == "replace" and len(args) >= 2:
            _replaced(owner, args[0], args[1])
        return _check(super().call(__context, __obj, *args, **kwargs), "a call's result")


def _bounded(name, f):
    @functools.wraps(f)
    def filter_(*args, **kwargs):
        _check_args(args, kwargs)
        at = 1 if getattr(f, "jinja_pass_arg", None) else 0  # after the context the filter asks for
        if name == "join":
            args = list(args)
            args[at] = _joined(args[at], args[at + 1] if len(args) > at + 1 else kwargs.get("d", ""))
        if name == "replace" and len(args) >= at + 3:
            _replaced(args[at], args[at + 1], args[at + 2])
        return _check(f(*args, **kwargs), "the result of the filter " + name)
    return filter_


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


env = Env(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
env.filters = {name: _bounded(name, f) for name, f in env.filters.items()}
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
"""


@dataclass(frozen=True)
class Limits:
    """What checking chat templates may cost the operator (its flags --chat-template-*)."""

    memory_bytes: int = MEMORY_BYTES
    """RLIMIT_AS of one child, before `memory_bound` takes the cgroup's headroom into account."""
    cpu_seconds: int = CPU_SECONDS
    wall_seconds: float = WALL_SECONDS
    concurrency: int = 1
    """Children at a time (1 or 2)."""
    per_minute: float = 2.0
    """New templates (not seen before) one server may have checked a minute, after a burst of `burst`."""
    burst: int = 3
    queue: int = 256
    """Servers whose check may wait at once; beyond, a server is asked again later."""


def _cgroup_headroom(root: Path = Path("/sys/fs/cgroup")) -> Optional[int]:
    """Bytes the operator's cgroup may still use (its limit less its usage): cgroup v2, then v1; None unlimited."""
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            limit = (root / limit_file).read_text().strip()
            usage = int((root / usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 2**60:
            return None
        return max(int(limit) - usage, 0)
    return None


def memory_bound(limits: Limits, headroom: Optional[int] = None) -> int:
    """RLIMIT_AS for one child: the setting, or half of what the cgroup has left shared by the children that may
    run at once when that is less (address space is an upper bound of what a child can touch)."""
    headroom = _cgroup_headroom() if headroom is None else headroom
    bound = limits.memory_bytes
    if headroom is not None:
        bound = min(bound, headroom // (2 * max(limits.concurrency, 1)))
    return max(bound, MIN_MEMORY_BYTES)


@dataclass(frozen=True)
class Verdict:
    """A check's answer: the problem (None: the template is fine), and whether it says something about the
    template (False: the check itself failed, e.g. the checker could not start; not cached)."""

    problem: Optional[str]
    definitive: bool = True


def _run(template: str, limits: Limits = Limits()) -> Verdict:
    memory = memory_bound(limits)

    def rlimits() -> None:  # pragma: no cover - runs in the child before exec
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds))

    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", _CHILD, str(MAX_OUTPUT_CHARS), json.dumps(SAMPLE_MESSAGES)],
            input=template, capture_output=True, text=True, timeout=limits.wall_seconds, preexec_fn=rlimits,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    except subprocess.TimeoutExpired:
        return Verdict(f"takes longer than {limits.wall_seconds:g} s to render a sample conversation")
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        if done.returncode in (-9, -24) or "MemoryError" in done.stderr:  # SIGKILL/SIGXCPU, or out of memory
            return Verdict(_over_limits(memory, limits))
        return Verdict(f"could not be checked (the checker exited with {done.returncode})", definitive=False)
    answer = json.loads(lines[-1])
    if answer.get("limit"):
        return Verdict(_over_limits(memory, limits))
    if answer["ok"] and answer["chars"] == 0:
        return Verdict("renders nothing for a sample conversation")
    return Verdict(None if answer["ok"] else bounds.clean(str(answer["error"]), 1024))  # a tenant's words


def _over_limits(memory: int, limits: Limits) -> str:
    return (f"uses more than its limits ({memory // 2**20} MiB, {limits.cpu_seconds} s of CPU) to render a sample "
            "conversation")


def digest(template: str) -> str:
    """The key a verdict is cached under (in memory and in status.chatTemplate.digest)."""
    return "sha256:" + hashlib.sha256(f"{CHECKER_VERSION}\n{template}".encode()).hexdigest()


class Queued(Exception):
    """The template is being checked (or waits its turn): nothing is decided yet, and the server is reconciled
    again when the check ends."""


@dataclass
class _Bucket:
    tokens: float
    at: float


ServerKey = tuple[str, str]


@dataclass
class Checker:
    """The operator's chat template checks: bounded children on its own threads, a rate per server, verdicts
    cached by digest. `nudge(server, delay)` asks for the server to be reconciled again after `delay` seconds
    (the operator's reconcile on kopf's threads); `run` is how one template is checked (a child process)."""

    limits: Limits = field(default_factory=Limits)
    nudge: Callable[[ServerKey, float], None] = lambda server, delay: None
    run: Callable[[str, Limits], Verdict] = _run
    clock: Callable[[], float] = time.monotonic
    cache_size: int = 1024
    _cache: "OrderedDict[str, Optional[str]]" = field(default_factory=OrderedDict, repr=False)
    _queue: "OrderedDict[ServerKey, tuple[str, str]]" = field(default_factory=OrderedDict, repr=False)
    _running: dict[ServerKey, str] = field(default_factory=dict, repr=False)
    _buckets: dict[ServerKey, _Bucket] = field(default_factory=dict, repr=False)
    _wake: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _threads: list[threading.Thread] = field(default_factory=list, repr=False)
    _transient: dict[str, tuple[Optional[str], float]] = field(default_factory=dict, repr=False)
    checks: int = 0
    """Children run so far (for tests and bench/adversarial.py)."""

    def known(self, key: str) -> tuple[bool, Optional[str]]:
        """(True, problem) when this digest was checked, (False, None) otherwise."""
        with self._wake:
            if key in self._cache:
                self._cache.move_to_end(key)
                return True, self._cache[key]
        return False, None

    def remember(self, key: str, problem: Optional[str]) -> None:
        with self._wake:
            self._cache[key] = problem
            self._cache.move_to_end(key)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def verdict(self, template: str, server: ServerKey, stored: Optional[tuple[str, Optional[str]]] = None
                ) -> Optional[str]:
        """Why vLLM could not use this template (None: it can). `stored`: the (digest, problem) the server's status
        holds (the operator wrote it after an earlier check). Raises Queued while the check is on its way; a
        server over its rate gets a problem saying when it may try again (and is reconciled again then)."""
        key = digest(template)
        if stored is not None and stored[0] == key:
            self.remember(key, stored[1])
        found, problem = self.known(key)
        if found:
            return problem
        with self._wake:
            said = self._transient.pop(key, None)
            if said is not None and said[1] > self.clock():
                self._transient[key] = said
                return said[0]
            if self._queue.get(server, ("",))[0] == key or self._running.get(server) == key:
                raise Queued()
            wait = self._take(server)
            if wait > 0:
                self.nudge(server, wait)
                return (f"not checked: this VLLMServer's chat template changed more than {self.limits.burst} times "
                        f"at once (at most {self.limits.per_minute:g} new templates a minute are checked); "
                        f"checked in {wait:.0f} s")
            if server not in self._queue and len(self._queue) >= self.limits.queue:
                self.nudge(server, 5.0)
                raise Queued()
            self._queue[server] = (key, template)
            self._start()
            self._wake.notify()
        raise Queued()

    def _take(self, server: ServerKey) -> float:
        """Take one check from the server's bucket: 0, or the seconds until one is there (nothing taken)."""
        now, rate = self.clock(), self.limits.per_minute / 60.0
        bucket = self._buckets.setdefault(server, _Bucket(float(self.limits.burst), now))
        bucket.tokens = min(float(self.limits.burst), bucket.tokens + (now - bucket.at) * rate)
        bucket.at = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            if len(self._buckets) > 4 * self.limits.queue:  # forget the servers that are back to a full bucket
                full = [k for k, b in self._buckets.items() if b.tokens >= self.limits.burst - 1 and k != server]
                for k in full:
                    del self._buckets[k]
            return 0.0
        return (1.0 - bucket.tokens) / rate if rate > 0 else 3600.0

    def _start(self) -> None:
        while len(self._threads) < max(1, min(self.limits.concurrency, 2)):
            t = threading.Thread(target=self._work, name=f"chat-template-check-{len(self._threads)}", daemon=True)
            self._threads.append(t)
            t.start()

    def _work(self) -> None:
        while True:
            with self._wake:
                while not self._queue:
                    self._wake.wait()
                server, (key, template) = self._queue.popitem(last=False)
                self._running[server] = key
            try:
                verdict = self.run(template, self.limits)
            except Exception as e:  # noqa: BLE001 - the checker's own failure: the template is not judged by it
                verdict = Verdict(f"could not be checked ({type(e).__name__})", definitive=False)
            with self._wake:
                self.checks += 1
                self._running.pop(server, None)
            if verdict.definitive:
                self.remember(key, verdict.problem)
            else:  # said for a minute, then checked again (under the server's rate)
                with self._wake:
                    now = self.clock()
                    self._transient = {k: v for k, v in self._transient.items() if v[1] > now}  # bounded: 1 a minute
                    self._transient[key] = (verdict.problem, now + 60.0)                        # per server at most
            self.nudge(server, 0.0)

    def drain(self, timeout: float = 30.0) -> None:
        """Wait until no check is queued or running (tests, the CLI)."""
        deadline = self.clock() + timeout
        while self.clock() < deadline:
            with self._wake:
                if not self._queue and not self._running:
                    return
            time.sleep(0.01)


_CACHE: "OrderedDict[str, Optional[str]]" = OrderedDict()
_CACHE_LOCK = threading.Lock()


def known(key: str) -> tuple[bool, Optional[str]]:
    """(True, problem) when `problem` checked the template of this digest, (False, None) otherwise."""
    with _CACHE_LOCK:
        return (True, _CACHE[key]) if key in _CACHE else (False, None)


def problem(template: str, limits: Limits = Limits()) -> Optional[str]:
    """Why vLLM could not use this chat template, or None, checked here and now (the CLI; a Reconciler without a
    Checker). One child process per template not seen before."""
    key = digest(template)
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    verdict = _run(template, limits)
    if verdict.definitive:
        with _CACHE_LOCK:
            _CACHE[key] = verdict.problem
            while len(_CACHE) > 256:
                _CACHE.popitem(last=False)
    return verdict.problem
