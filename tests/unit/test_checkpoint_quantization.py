"""The checkpoint's quantization_config decides (issue 12 item 3): read from config.json, served by the local Hub
stand-in (e2e/testbed/hub_http.py) through the operator's own fetch, and compared with spec.model.quantization as vLLM 0.32
compares them at start."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from e2e.testbed.hub_http import HubServer
from vllm_operator import api, catalog, pipeline

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
AWQ = json.loads((CONFIGS / "Qwen2.5-7B-Instruct-AWQ.config.json").read_text())
PLAIN = json.loads((CONFIGS / "Qwen2.5-7B-Instruct.config.json").read_text())
AWQ_REPO, PLAIN_REPO = "acme/qwen-7b-awq", "acme/qwen-7b"  # not in the catalog: the Hub's config.json decides


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    repos = {}
    for repo, config in ((AWQ_REPO, AWQ), (PLAIN_REPO, PLAIN)):
        d = root / repo.replace("/", "__")
        d.mkdir()
        (d / "config.json").write_text(json.dumps(config))
        repos[repo] = d
    with HubServer(repos) as server:
        yield server


def plan(hub: HubServer, repo: str, quantization: str = "none"):
    spec = api.VLLMServerSpec.model_validate({"model": {"name": repo, "quantization": quantization},
                                              "gpu": {"count": 1, "product": "NVIDIA-L4"},
                                              "workloadProfile": {"maxContextTokens": 8192}})
    return pipeline.plan_server("srv", "ns", spec, hf_endpoint=hub.base)


def test_the_checkpoints_method_is_read_from_its_config():
    assert catalog.architecture_from_config(AWQ).quantization == "awq"
    assert catalog.architecture_from_config(PLAIN).quantization == "none"
    other = copy.deepcopy(AWQ)
    other["quantization_config"]["quant_method"] = "hqq-SECRET"
    assert catalog.architecture_from_config(other).quantization == "other"  # never echoed


def test_an_awq_checkpoint_with_quantization_none_is_sized_as_stored(hub):
    awq, plain = plan(hub, AWQ_REPO), plan(hub, PLAIN_REPO)
    assert awq.fits and plain.fits, (awq.problems, plain.problems)
    assert "--quantization" not in awq.args, "vLLM reads the method from the checkpoint"
    assert awq.weight_bytes_total < plain.weight_bytes_total * 0.4  # 4-bit weights, 16-bit embeddings
    assert [n for n in awq.notes if n.startswith("weights sized as the checkpoint stores them (awq")]
    assert awq.kv_cache_tokens > plain.kv_cache_tokens
    assert ("GET", f"/api/models/{AWQ_REPO}") in hub.requests  # huggingface_hub's model API, then config.json


@pytest.mark.parametrize("repo, quantization, words", [
    (PLAIN_REPO, "awq", "awq needs a checkpoint quantized with awq, and acme/qwen-7b's config.json has no "
                        "quantization_config (its weights are 16-bit): serve it with quantization none or fp8"),
    (PLAIN_REPO, "gptq_marlin", "gptq_marlin needs a checkpoint quantized with gptq"),
    (AWQ_REPO, "gptq", "gptq contradicts the checkpoint, whose config.json says it is quantized with awq: set "
                       "quantization none (vLLM then reads the checkpoint's method) or awq"),
    (AWQ_REPO, "fp8", "fp8 contradicts the checkpoint"),
])
def test_a_method_the_checkpoint_contradicts_is_refused_naming_the_field(hub, repo, quantization, words):
    p = plan(hub, repo, quantization)
    [problem] = [q for q in p.problems if q.field == "spec.model.quantization"]
    assert problem.message.startswith(words), problem.message


@pytest.mark.parametrize("repo, quantization", [(AWQ_REPO, "awq"), (AWQ_REPO, "awq_marlin"), (PLAIN_REPO, "fp8")])
def test_what_vllm_accepts_is_accepted(hub, repo, quantization):
    p = plan(hub, repo, quantization)
    assert p.fits, p.problems


def test_an_unknown_method_is_not_quoted(hub, tmp_path):
    config: dict[str, Any] = copy.deepcopy(AWQ)
    config["quantization_config"]["quant_method"] = "hqq-SECRET"
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    with HubServer({"acme/odd": d}) as odd:
        p = plan(odd, "acme/odd", "awq")
    [problem] = [q for q in p.problems if q.field == "spec.model.quantization"]
    assert "a method vLLM does not know here" in problem.message and "SECRET" not in problem.message
