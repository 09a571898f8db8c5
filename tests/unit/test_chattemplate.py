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
     "is too big to render: a namespace value longer than"),
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
    # Concatenation is no operator the sandbox intercepts: 1,000 copies of a 590 KB string pass the memory limit.
    grow = "{% set s = range(99999)|join(',') %}{{ (s" + " ~ s" * 1000 + ")|length }}"
    assert "uses more than its limits" in chattemplate.problem(grow)


def test_a_template_is_checked_once(monkeypatch):
    runs: list[str] = []
    real = chattemplate._run
    monkeypatch.setattr(chattemplate, "_run", lambda t: runs.append(t) or real(t))
    template = TINY + "{# checked once #}"
    assert [chattemplate.problem(template) for _ in range(3)] == [None, None, None]
    assert runs == [template]


def test_the_flag_itself_is_refused_in_extra_args():
    p = plan(TINY, extraArgs=["--chat-template", "/etc/x.jinja"])
    assert [q.field for q in p.problems] == ["spec.engine.extraArgs[0]"]
    assert "spec.engine.chatTemplate" in p.problems[0].message
