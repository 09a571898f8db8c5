"""The README's main-job command, run end to end with --once."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.apiserver


def test_demo_brings_up_the_operator_and_an_example():
    p = subprocess.run([sys.executable, "-m", "tools.demo", "--once"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout
    assert "vllmserver.vllm-operator.io/llama-8b created" in out
    assert "statefulset.apps/llama-8b" in out and "service/llama-8b " in out and "pod/llama-8b-0" in out
    assert "vllm serve meta-llama/Llama-3.1-8B-Instruct" in out and "--max-model-len 16384" in out
    assert "Ready=True" in out and "SpecValid=True" in out
