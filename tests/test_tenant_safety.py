"""A tenant's spec cannot stop or mislead the operator: values out of any sane range end as a problem naming
the field, never an exception out of the planner (the rest of the tenant-safety suite lands with the fetch
helper on the tenant-safety branch)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vllm_operator import api, pipeline

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- quantities
@pytest.mark.parametrize("path", [("gpu", "memory"), ("gpu", "reservedMemory"), ("shmSize",), ("cache", "size"),
                                  ("resources", "requests", "memory"), ("resources", "limits", "cpu")])
@pytest.mark.parametrize("value", ["1e400", "1e-400", "1e1.5", "1e9999999", "9" * 400])
def test_a_quantity_out_of_range_is_a_problem_naming_the_field(path, value):
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    node = doc["spec"]
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    spec, errors = pipeline.parse_spec(doc["spec"])  # the operator's way; the current code raised OverflowError,
    assert spec is None                              # decimal.Overflow or decimal.InvalidOperation in the planner
    assert [e.split(":", 1)[0] for e in errors] == ["spec." + ".".join(path)]
    assert "out of range" in errors[0]
    [document] = pipeline.load_documents(yaml.safe_dump(doc))  # the CLI's
    assert [e.split(":", 1)[0] for e in document.errors] == ["spec." + ".".join(path)]


# --------------------------------------------------------------------------- values that become vLLM arguments
FLAG_LIKE = [("name", "spec.model.name"), ("servedName", "spec.model.servedName"), ("revision", "spec.model.revision")]


@pytest.mark.parametrize("key, field", FLAG_LIKE)
@pytest.mark.parametrize("value", ["--api-key=stolen", "-h", "--enable-auto-tool-choice"])
def test_a_value_that_becomes_an_argument_may_not_start_with_a_dash(key, field, value):
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["spec"]["model"][key] = value  # the current code passed "--api-key=stolen" to vLLM as a flag
    spec, errors = pipeline.parse_spec(doc["spec"])
    assert spec is None and errors == [f"{field}: must not start with '-': vLLM would read it as a flag "
                                       f"(got {value!r})"]
    [document] = pipeline.load_documents(yaml.safe_dump(doc))
    assert document.errors == errors


@pytest.mark.parametrize("key, field", FLAG_LIKE)
def test_the_planner_refuses_a_dash_in_a_spec_built_without_validation(key, field):
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    spec = api.VLLMServerSpec.model_validate(doc["spec"])
    attribute = {"name": "name", "servedName": "served_name", "revision": "revision"}[key]
    spec.model = spec.model.model_copy(update={attribute: "--api-key=stolen"})  # no validation
    plan = pipeline.plan_server("x", "ns", spec)
    assert f"{field}: '--api-key=stolen' starts with '-': vLLM would read it as a flag" in [
        str(p).split(", not as")[0] for p in plan.problems]
    assert not plan.fits, "nothing is applied"


def test_the_crd_refuses_a_leading_dash_too():
    from vllm_operator import crd
    model = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["model"]
    for key, _ in FLAG_LIKE:
        assert model["properties"][key]["pattern"] == "^[^-]"
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["spec"]["model"].update(name="org/a-b--c", servedName="x-", revision="v1.0-rc")
    assert pipeline.parse_spec(doc["spec"])[1] == []
