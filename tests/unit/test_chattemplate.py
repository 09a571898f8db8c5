"""spec.engine.chatTemplate is checked in the sandbox vLLM renders templates in, in a child process under limits,
before anything is applied: a template that does not parse, raises, renders nothing, escapes the sandbox or
tries to exhaust the operator is a problem naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vllm_operator import api, chattemplate, pipeline

ROOT = Path(__file__).resolve().parents[2]
#: The tiny test model's own template (tools/make_tiny_model.py), and one in the style of Llama 3's.
TINY = ("{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}"
        "{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
LLAMA3_STYLE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim"
    " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")


def plan(template: str, **engine: Any):
    spec = api.VLLMServerSpec.model_validate({
        "model": {"name": "meta-llama/Llama-3.2-3B-Instruct"}, "gpu": {"count": 1, "product": "NVIDIA-L4"},
        "workloadProfile": {"maxContextTokens": 8192}, "engine": {"chatTemplate": template, **engine}})
    return pipeline.plan_server("srv", "ns", spec)


@pytest.mark.parametrize("template", [TINY, LLAMA3_STYLE, "{% for m in messages %}{{ m.content }}{% break %}{% endfor %}",
                                      "{{ strftime_now('%Y') }}{{ messages[-1]['content'] }}"])
def test_real_templates_are_passed_to_vllm(template):
    p = plan(template)
    assert p.fits, p.problems
    i = p.args.index("--chat-template")
    assert p.args[i + 1] == template


@pytest.mark.parametrize("template, words", [
    ("{% for m in messages %}{{ m.content }}", "does not parse: line 1: Unexpected end of template"),
    ("{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}",
     "fails to render a sample conversation: TemplateError: Conversation roles must alternate"),
    ("{% if false %}x{% endif %}", "renders nothing for a sample conversation"),
    ("{{ messages[0]['content'].nonexistent() }}", "fails to render a sample conversation: UndefinedError"),
    # the sandbox vLLM uses: no way out to Python's internals
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "fails to render a sample conversation: SecurityError"),
    # ... and ours on top, for what the sandbox lets through
    ("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}x",
     "is too big to render: a string longer than"),
    ("{{ 'x' * 100000000 }}", "is too big to render: a repetition longer than"),
    ("{{ '%s'.ljust(1000000000) }}", "is too big to render: a call with an argument beyond"),
    ("{% for i in range(100000) %}{{ messages }}{% endfor %}", "is too big to render: renders more than"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recurses without end"),
])
def test_broken_or_hostile_templates_are_refused_naming_the_field(template, words):
    p = plan(template)
    [problem] = [q for q in p.problems if q.field == "spec.engine.chatTemplate"]
    assert words in problem.message, problem.message
    assert not p.fits


def test_what_gets_past_the_sandbox_meets_the_childs_limits():
    # Nested loops with no output and no call: 10^10 iterations, stopped by RLIMIT_CPU (or the wall clock).
    spin = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x"
    assert "limits" in chattemplate.problem(spin) or "takes longer" in chattemplate.problem(spin)



@pytest.mark.parametrize("template", [
    # Concatenation (`~`): the code generator writes a bounded join (issue 18: one such template held 346 MiB).
    "{% set s = range(99999)|join(',') %}{{ (s" + " ~ s" * 1000 + ")|length }}",
    "{% set a = 'x' * 200000 %}{% set b = a ~ a %}{{ b|length }}",
    "{% set a = 'x' * 200000 %}{{ (a + a)|length }}",
    "{{ '%s' % ('x' * 200000 ~ 'x' * 100000) }}",
    # Buffered blocks: {% set %}...{% endset %}, macros, filter blocks.
    "{% set b %}{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}{% endset %}{{ b|length }}",
    "{% macro m(n) %}{% for i in range(n) %}{{ 'x' * 100000 }}{% endfor %}{% endmacro %}{{ m(100)|length }}",
    "{% filter upper %}{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}{% endfilter %}",
    # Filters and methods that multiply what they are given.
    "{{ (range(100000)|map('string')|list)|join('y' * 200000) }}",
    "{{ ('y' * 200000).join(range(100000)|map('string')) }}",
    "{{ ('a' * 1000).replace('a', 'b' * 100000)|length }}",
    "{{ ('a' * 1000)|replace('a', 'b' * 100000)|length }}",
])
def test_every_way_of_building_a_string_is_bounded_where_it_is_built(template):
    assert chattemplate.problem(template).startswith("is too big to render: "), chattemplate.problem(template)


def test_the_childs_memory_is_a_setting_and_a_share_of_the_cgroups_headroom():
    limits = chattemplate.Limits(memory_bytes=96 * 2**20, concurrency=2)
    assert chattemplate.memory_bound(limits, headroom=None) == 96 * 2**20
    assert chattemplate.memory_bound(limits, headroom=256 * 2**20) == 64 * 2**20
    assert chattemplate.memory_bound(limits, headroom=0) == chattemplate.MIN_MEMORY_BYTES
    # The default is far below the chart's 256 MiB container limit less the operator's own ~90 MiB.
    assert chattemplate.Limits().memory_bytes <= 64 * 2**20
    # Values each under the caps, many of them kept: the limit stops them, not the operator's OOM killer.
    small = chattemplate.Limits(memory_bytes=chattemplate.MIN_MEMORY_BYTES)
    hog = "".join(f"{{% set a{i} = range(99999)|list %}}" for i in range(40)) + "x"
    assert "uses more than its limits" in chattemplate.problem(hog + "{# small #}", small)


def test_a_template_is_checked_once(monkeypatch):
    runs: list[str] = []
    real = chattemplate._run
    monkeypatch.setattr(chattemplate, "_run", lambda t, limits: runs.append(t) or real(t, limits))
    template = TINY + "{# checked once #}"
    assert [chattemplate.problem(template) for _ in range(3)] == [None, None, None]
    assert runs == [template]


def test_the_flag_itself_is_refused_in_extra_args():
    p = plan(TINY, extraArgs=["--chat-template", "/etc/x.jinja"])
    assert [q.field for q in p.problems] == ["spec.engine.extraArgs[0]"]
    assert "spec.engine.chatTemplate" in p.problems[0].message


# --------------------------------------------------------------------------- the operator's checker
class FakeRun:
    """Checks that take `seconds` each and record how many ran at once (the real child is tested above)."""

    def __init__(self, seconds: float = 0.05):
        import threading
        self.seconds, self.now, self.most, self.calls = seconds, 0, 0, 0
        self._lock = threading.Lock()

    def __call__(self, template: str, limits: chattemplate.Limits) -> chattemplate.Verdict:
        import time
        with self._lock:
            self.now += 1
            self.calls += 1
            self.most = max(self.most, self.now)
        time.sleep(self.seconds)
        with self._lock:
            self.now -= 1
        return chattemplate.Verdict("bad" if "bad" in template else None)


def test_the_checker_never_blocks_a_reconcile_and_runs_one_check_at_a_time():
    import threading
    run, nudged = FakeRun(), []
    done = threading.Event()

    def nudge(server, delay):
        nudged.append((server, delay))
        if len(nudged) >= 24:
            done.set()
    checker = chattemplate.Checker(chattemplate.Limits(concurrency=1), nudge=nudge, run=run)
    for i in range(24):  # 24 servers, each a new template: every call returns at once
        with pytest.raises(chattemplate.Queued):
            checker.verdict(f"t{i}", ("attacker", f"s{i}"))
    assert done.wait(30)
    assert run.most == 1 and run.calls == 24
    assert {s for s, _ in nudged} == {("attacker", f"s{i}") for i in range(24)}
    assert checker.verdict("t3", ("attacker", "s3")) is None  # decided now, from the cache
    assert checker.verdict("t3", ("victim", "other")) is None  # the same template elsewhere: not checked again
    assert run.calls == 24


def test_a_server_pays_for_its_own_new_templates():
    now = [0.0]
    checker = chattemplate.Checker(chattemplate.Limits(per_minute=2.0, burst=3), run=FakeRun(0.0),
                                   clock=lambda: now[0])
    waits = []
    checker.nudge = lambda server, delay: waits.append(delay)
    for i in range(3):
        with pytest.raises(chattemplate.Queued):
            checker.verdict(f"new {i}", ("ns", "churn"))
    why = checker.verdict("new 3", ("ns", "churn"))
    assert why is not None and "not checked" in why and "checked in 30 s" in why
    assert waits[-1] == pytest.approx(30.0)
    with pytest.raises(chattemplate.Queued):  # another server is not charged for it
        checker.verdict("new 4", ("ns", "quiet"))
    now[0] = 31.0
    with pytest.raises(chattemplate.Queued):  # the bucket refilled
        checker.verdict("new 3", ("ns", "churn"))


def test_a_verdict_in_status_is_trusted_for_its_digest_only():
    run = FakeRun(0.0)
    checker = chattemplate.Checker(run=run)
    key = chattemplate.digest("tpl")
    assert checker.verdict("tpl", ("ns", "s"), (key, "stored problem")) == "stored problem"
    assert run.calls == 0  # an operator restart checks nothing again
    with pytest.raises(chattemplate.Queued):  # a digest of another template (or checker version) is no verdict
        checker.verdict("other", ("ns", "s"), (key, None))
    assert chattemplate.digest("tpl") != "sha256:" + __import__("hashlib").sha256(b"tpl").hexdigest()
