"""The vLLM flag snapshots (operator/vllm_operator/vllm_releases/) without vLLM: every snapshot is a supported release,
every flag the planner derives is in it, the default release is the venv's and the default image's. The plans' args
through vLLM's own parser: e2e/test_vllm_parser.py.
"""

from __future__ import annotations

import re

import itertools
from pathlib import Path
from typing import Any, get_args


from vllm_operator import api, catalog, documents, pipeline, validation, vllm_flags
from vllm_operator.planner import Plan


ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
SWEEP_GPUS = [
    "NVIDIA-RTX-A2000-12GB",  # 12 GiB
    "Tesla-T4",  # 15 GiB
    "NVIDIA-L4",  # 22.5 GiB
    "NVIDIA-L40S",  # 44.5 GiB
    "NVIDIA-A100-SXM4-80GB",  # 79 GiB, A100: vLLM's small-GPU batch defaults
    "NVIDIA-H100-80GB-HBM3",  # 79 GiB
    "NVIDIA-H200",  # 140 GiB
]
SWEEP_TP = [1, 2, 4, 8]
SWEEP_QUANTIZATION = ["none", "awq", "fp8"]
SWEEP_PRIORITY = ["latency", "balanced", "throughput"]
SAMPLE = 500


def plan_of(spec: dict[str, Any], name: str = "sweep") -> Plan:
    return pipeline.plan_server(name, "default", api.VLLMServerSpec.model_validate(spec))


def kubelet_args(plan: Plan, rank: int = 0) -> list[str]:
    """The args vLLM gets in a pod: a group's $(LWS_*) references expanded as the kubelet does from the variables
    the LeaderWorkerSet controller sets (rank 0: the leader; another: a worker, which runs --headless)."""
    env = {"LWS_WORKER_INDEX": str(rank), "LWS_LEADER_ADDRESS": f"{plan.name}-0.{plan.name}.{plan.namespace}"}
    args = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in plan.args]
    return args + (["--headless"] if rank else [])


def pod_argvs(plans: list[Plan]) -> list[list[str]]:
    """Each plan's leader (or only pod) args, in order, then a worker's for each plan across nodes."""
    return [kubelet_args(p) for p in plans] + [kubelet_args(p, 1) for p in plans if p.nodes > 1]


def example_plans() -> list[Plan]:
    plans = []
    for path in EXAMPLES:
        [doc] = documents.load_documents(path.read_text())
        s = doc.server
        plans.append(pipeline.plan_server(s.metadata.name, s.metadata.namespace, s.spec))
    return plans


def sweep_specs() -> list[dict[str, Any]]:
    specs = []
    for model, gpu, tp, quantization, priority in itertools.product(
        catalog.known_models(), SWEEP_GPUS, SWEEP_TP, SWEEP_QUANTIZATION, SWEEP_PRIORITY
    ):
        specs.append({
            "model": {"name": model, "quantization": quantization},
            "gpu": {"count": tp, "product": gpu},
            "ipc": "Host" if tp > 1 else "SharedMemory",
            "workloadProfile": {"priority": priority},
        })
    return specs


# Specs that exercise the flags the sweep does not: pinned values, fp8 KV, no prefix caching, eager, dtype,
# revision, served name, extra flags the planner lets through.
VARIANTS = [
    {"engine": {"kvCacheDtype": "fp8"}},
    # an inline chat template as the --chat-template value (vLLM reads Jinja syntax as the template itself)
    {"engine": {"chatTemplate": "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"}},
    {"engine": {"kvCacheDtype": "fp8_e5m2", "enablePrefixCaching": False}},
    {"engine": {"enforceEager": True, "enablePrefixCaching": True}},
    {"engine": {"shutdownTimeoutSeconds": 0}},
    {"engine": {"shutdownTimeoutSeconds": 3600, "maxNumQueuedReqs": 512}},
    {"engine": {"gpuMemoryUtilization": 0.8551, "maxModelLen": 4096, "maxNumSeqs": 64, "maxNumBatchedTokens": 4096}},
    {"engine": {"extraArgs": ["--seed", "1", "--max-logprobs=5", "--disable-log-stats"]}},
    {"engine": {"extraArgs": ["--seed", "-1", "--scheduling-policy", "priority", "--uvicorn-log-level=warning"]}},
    {"engine": {"extraArgs": ["--compilation-config.mode", "3", "-O3", "--max_logprobs", "7"]}},
    {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "dtype": "float16", "revision": "main",
               "servedName": "llama"}},
    {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "dtype": "bfloat16"}, "workloadProfile": {
        "maxContextTokens": 32768, "p95PromptTokens": 3000, "p95OutputTokens": 800, "targetConcurrency": 40}},
    {"workloadProfile": {"priority": "throughput", "p95PromptTokens": 12000, "targetConcurrency": 300}},
]


def variant_plans() -> list[Plan]:
    base = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "gpu": {"count": 1, "product": "NVIDIA-L40S"}}
    plans = []
    for variant in VARIANTS:
        plans.append(plan_of({**base, **variant}))
    for quantization in get_args(api.Quantization):
        if quantization not in validation.UNSUPPORTED_QUANTIZATION:
            plans.append(plan_of({**base, "model": {"name": "Qwen/Qwen2.5-7B-Instruct",
                                                    "quantization": quantization}}))
    return plans


def _flag_value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _releases() -> list[str]:
    from tools.dump_vllm_flags import all_releases

    return all_releases()


def test_every_snapshot_is_a_supported_release():
    """No snapshot is left behind for a release the generator no longer makes, and none is missing."""
    assert list(vllm_flags.releases()) == _releases()


def snapshot_problems(args: list[str]) -> list[str]:
    """What vLLM's parser, as the default release's snapshot records it, would refuse in `vllm serve` args (after the model)."""
    known, problems, i = vllm_flags.flags(), [], 1
    while i < len(args):
        flag, eq, inline = args[i].partition("=")
        info = known.get(vllm_flags.normalise(flag))
        if info is None:
            problems.append(f"vLLM {vllm_flags.VERSION} has no flag {flag}")
            i += 1
            continue
        if eq:
            value, i = inline, i + 1
        elif info.takes_value and i + 1 < len(args) and not args[i + 1].startswith("--"):
            value, i = args[i + 1], i + 2
        else:
            value, i = None, i + 1
        if value is None and info.nargs_required:
            problems.append(f"{flag} needs a value")
        elif value is not None and not info.takes_value:
            problems.append(f"{flag} takes no value")
        elif value is not None and info.choices and value not in info.choices:
            problems.append(f"{flag} {value!r} is not one of {info.choices}")
    return problems


def test_every_flag_the_planner_derives_is_in_the_parser_snapshot():
    """Without vLLM: the operator's own flags (extraArgs aside, checked by check_extra_args) of every example,
    variant and fitting sweep plan are flags vLLM 0.32's parser has, with a value where it needs one."""
    plans = example_plans() + variant_plans() + [p for p in map(plan_of, sweep_specs()) if p.fits]
    derived: set[str] = set()
    for plan in plans:
        own = plan.args[:len(plan.args) - len(plan.spec.engine.extra_args)]
        assert snapshot_problems(own) == [], (plan.name, own)
        derived |= {a for a in own if a.startswith("--")}
    assert {"--shutdown-timeout", "--max-num-queued-reqs", "--max-model-len"} <= derived
    assert derived - {"--host", "--port", "--model"} <= set(validation.OWNED_FLAGS), "a derived flag extraArgs could set"


def test_the_default_release_is_the_venvs_and_the_default_images():
    from e2e.testbed import vllm_env

    assert vllm_env.VLLM_VERSION == vllm_flags.VERSION == validation.image_vllm_version(api.DEFAULT_IMAGE)
