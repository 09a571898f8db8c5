"""Build and check (postbuild.py): the pod template is built once per reconcile and per CLI run, the workload takes
that same template, and the verdicts are the path's before it (tests/unit/test_builders.py's golden renders,
tests/apiserver/test_plan_verdict.py's plan against apply)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import yaml

from e2e.testbed.memory_world import World
from vllm_operator import api, builders, cli, pipeline, postbuild, strategic_merge
from vllm_operator.conditions import condition

ROOT = Path(__file__).resolve().parents[2]
#: A single-node StatefulSet, one with a podTemplatePatch, a two-node LeaderWorkerSet, a DaemonSet.
EXAMPLES = ("llama-8b-single-gpu.yaml", "llama-8b-sidecar-patch.yaml", "llama-70b-two-nodes.yaml",
            "qwen-7b-daemonset.yaml")


@pytest.fixture
def calls(monkeypatch) -> dict[str, int]:
    """How often the pod template was built (builders.base_pod_template) and a patch applied to it."""
    counted = {"template": 0, "patch": 0}
    build, patch = builders.base_pod_template, strategic_merge.apply

    def counting_build(plan):
        counted["template"] += 1
        return build(plan)

    def counting_patch(original, change, path=""):
        counted["patch"] += 1
        return patch(original, change, path)

    # Where it is defined too (the builders package's own module), so a call from within the builders counts.
    for home in {builders, sys.modules[build.__module__]}:
        monkeypatch.setattr(home, "base_pod_template", counting_build)
    monkeypatch.setattr(strategic_merge, "apply", counting_patch)
    return counted


def has_patch(example: str) -> bool:
    return "podTemplatePatch" in yaml.safe_load((ROOT / "examples" / example).read_text())["spec"]


@pytest.mark.parametrize("example", EXAMPLES)
def test_one_reconcile_builds_the_pod_template_once(example, calls):
    world = World(example=example)
    world.kube.serves = lambda group_version: True  # LeaderWorkerSet installed
    status = world.reconcile()["status"]
    assert condition(status, "SpecValid")["status"] == "True", status
    assert [k for k, _, _ in world.kube.objects if k in ("StatefulSet", "DaemonSet", "LeaderWorkerSet")]
    assert calls == {"template": 1, "patch": 1 if has_patch(example) else 0}


@pytest.mark.parametrize("example", EXAMPLES)
def test_render_builds_the_pod_template_once(example, calls):
    args = cli.build_parser().parse_args(["render", str(ROOT / "examples" / example)])
    out, err = io.StringIO(), io.StringIO()
    assert args.func(args, out, err) == 0, err.getvalue()
    assert calls == {"template": 1, "patch": 1 if has_patch(example) else 0}


@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "examples").glob("*.yaml")))
def test_the_children_are_the_builders_own(example):
    """The workload takes the checked template: the same objects as builders.build_all builds on its own."""
    for doc in yaml.safe_load_all((ROOT / "examples" / example).read_text()):
        if not doc or doc.get("kind") != api.KIND:
            continue
        spec = api.VLLMServerSpec.model_validate(doc["spec"])
        owner = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": doc["metadata"]["name"],
                                                                               "uid": "u1"}}
        built = pipeline.build_server(doc["metadata"]["name"], "ns1", spec, owner=owner)
        plan = pipeline.plan_server(doc["metadata"]["name"], "ns1", spec)
        assert built.children == (builders.build_all(plan, owner) if plan.fits else [])
        assert [str(p) for p in built.plan.problems] == [str(p) for p in plan.problems]


def test_a_template_the_rules_refuse_is_never_built_into_children():
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-sidecar-patch.yaml").read_text())
    spec = api.VLLMServerSpec.model_validate({**doc["spec"], "podTemplatePatch": {"spec": "not a map"}})
    built = pipeline.build_server("srv", "ns1", spec)
    assert built.children == [] and built.oversized == []
    assert [p.field for p in built.plan.problems] == ["spec.podTemplatePatch"]


def test_the_size_is_checked_on_the_children_as_sent():
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    plan = pipeline.plan_server("srv", "ns1", api.VLLMServerSpec.model_validate(doc["spec"]))
    padded = postbuild.build_and_check(plan, prepare=lambda children: [
        {**o, "metadata": {**o["metadata"], "annotations": {"pad": "x" * builders.MAX_OBJECT_BYTES}}}
        for o in children])
    assert len(padded.oversized) == len(padded.children) > 0
