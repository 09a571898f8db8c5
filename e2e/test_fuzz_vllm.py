"""Fuzzed VLLMServer specs that render (tests/unit/test_fuzz.py's generators): their vLLM args pass vLLM's own parser
(the vLLM CPU venv).
"""

from __future__ import annotations


import pytest

from tests.unit.test_fuzz import plausible, extreme, LONG, sample_rendered


@pytest.mark.vllm
def test_a_sample_of_rendered_args_is_accepted_by_vllms_parser(stress_report):
    from e2e.testbed.vllm_env import check_args

    size = 100 if LONG else 30
    samples = sample_rendered(plausible(), size) + sample_rendered(extreme(), size // 2)
    results = check_args([plan.args for _, _, plan in samples])
    bad = [(plan.args, r.get("error")) for (_, _, plan), r in zip(samples, results) if not r["ok"]]
    stress_report("fuzz", "arg lists checked by vLLM's parser", len(samples))
    assert not bad, bad[:5]
