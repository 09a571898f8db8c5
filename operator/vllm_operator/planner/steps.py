"""`plan_layout`: spec (its node count fixed) + resolved model + GPU facts in, a `Plan` out, in numbered steps (the spec's rules, tensor
parallelism, the memory budget, weights, batch, KV cache, max model length, engine flags, runner, pod,
release notes, queue cap, shutdown, overrides, args)."""

from __future__ import annotations

import math
from typing import Optional

from .. import adapters as lora, api, vllm_flags
from ..api import AUTOSCALING_TOLERANCE, VLLMServerSpec, parse_quantity
from ..catalog import Architecture, ResolvedModel
from ..catalog.gpus import GPUSelection, select_gpu
from ..urlpolicy import URLPolicy
from ..validation import (OWNED_FLAGS, UNSAFE_FLAGS, Problem, check_spec, flag_check, hardware_problems,
                          image_vllm_version, quantization_problems)
from .assumptions import GiB, assumption, profile_terms
from .memory import (
    _round_down, activation_bytes, dtype_bytes, gib, hybrid_kv_off, is_pooling, kv_bytes_per_token, kv_layout,
    loads_as_stored, mm_limits, non_torch_bytes, rotary_cache_bytes, runs_v2, tokens_in_flight, tp_shards_evenly,
    valid_tp_sizes, vision_item, vision_profile_bytes, weight_bytes, weights_quantization,
)
from .lora import plan_adapters
from .plan_types import DEFAULT_PORT, FlagDecision, Memory, Plan, Sizing
from .stages import nodes_that_fit, plan_stages, stage_weight_bytes


# --------------------------------------------------------------------------- planning
def resolve_gpu_memory(spec: VLLMServerSpec, gpu: GPUSelection) -> tuple[Optional[int], str]:
    """One GPU's (or MIG slice's) memory: gpu.memory, else the smallest the selected nodes can have."""
    if spec.gpu.memory is not None:
        return int(parse_quantity(spec.gpu.memory)), f"spec.gpu.memory {spec.gpu.memory}"
    return gpu.memory_bytes, gpu.memory_source


def plan_layout(
    name: str,
    namespace: str,
    spec: VLLMServerSpec,
    model: Optional[ResolvedModel],
    gpu: Optional[GPUSelection] = None,
    *,
    model_error: Optional[str] = None,
    model_error_field: str = "spec.model.architecture",
    default_prometheus_url: Optional[str] = None,
    allow_unsafe_args: bool = False,
    urls: Optional[URLPolicy] = None,
    adapter_facts: Optional[dict[str, lora.AdapterFacts]] = None,
    max_nodes: Optional[int] = None,
) -> Plan:
    """The plan of one layout (spec.nodes nodes). Pure; never raises on bad input.

    `allow_unsafe_args`: the VLLMServer carries api.ALLOW_UNSAFE_ARGS_ANNOTATION, so extraArgs may set
    --host/--port (the container port then follows --port). `urls`: the operator's URL settings (None: the
    offline CLI, which fetches nothing for anyone else). `adapter_facts`: each spec.adapters entry's
    adapter_config.json as the pipeline read it (by adapter name; a missing one was not read). `max_nodes`: the
    user's spec.maxNodes when choose_nodes tries this layout (its hints then name maxNodes).

    The named steps below run in order (numbered in their docstrings); each records its flags (`decisions`),
    notes and problems on the plan, and sizing stops at the first step that finds the server cannot run."""
    p = Plan(name=name, namespace=namespace, spec=spec, model=model, max_nodes=max_nodes,
             prometheus_url=spec.autoscaling.prometheus_url or default_prometheus_url, flags=flag_check(spec))
    check_inputs(p, gpu, model_error=model_error, model_error_field=model_error_field,
                 default_prometheus_url=default_prometheus_url, allow_unsafe_args=allow_unsafe_args, urls=urls)
    if model is None or p.gpu_memory is None:
        return p
    s = Sizing(arch=model.complete, elem=dtype_bytes(spec, model),
               terms=profile_terms(image_vllm_version(spec.image)))
    plan_tensor_parallel(p, s)
    if not plan_stages(p, s):
        return p
    if not plan_memory_budget(p, s):
        return p
    plan_weights(p, s)
    plan_batch(p, s)
    plan_adapters(p, s, adapter_facts or {})
    if not plan_kv_cache(p, s):
        return p
    plan_max_model_len(p, s)
    plan_engine_flags(p, s)
    plan_pod(p)
    plan_shutdown(p)
    check_release_flags(p)
    p.args = engine_args(p)
    return p


def check_inputs(p: Plan, gpu: Optional[GPUSelection], *, model_error: Optional[str], model_error_field: str,
                 default_prometheus_url: Optional[str], allow_unsafe_args: bool, urls: Optional[URLPolicy]) -> None:
    """1. The spec's rules (validation/), the GPU selection and what its hardware rules out, the GPU memory to
    plan with, and the model's facts."""
    spec = p.spec
    p.problems.extend(check_spec(p.name, spec, default_prometheus_url=default_prometheus_url,
                                 allow_unsafe_args=allow_unsafe_args, urls=urls, checked=p.flags))
    if allow_unsafe_args:
        unsafe_overrides(p)
    p.nodes = spec.nodes
    if spec.nodes > 1 and spec.cross_node_parallelism == "Tensor":
        p.tensor_parallel_size = spec.gpu.count * spec.nodes
    else:
        p.tensor_parallel_size, p.pipeline_parallel_size = spec.gpu.count, spec.nodes
    p.gpu = gpu if gpu is not None else select_gpu(spec.gpu)
    p.problems.extend(Problem(where, message, reason) for where, message, reason in p.gpu.problems)
    p.notes.extend(p.gpu.notes)
    p.problems.extend(hardware_problems(spec, p.gpu, p.flags.snapshot if p.flags else None,
                                        mla=bool(p.model is not None and p.model.architecture.kv_lora_rank)))
    p.gpu_memory, p.gpu_source = resolve_gpu_memory(spec, p.gpu)
    if p.model is None:
        p.problem(model_error_field, model_error or f"no architecture for {spec.model.name}", api.REASON_MODEL_UNKNOWN)
    if p.gpu_memory is not None and p.gpu_memory < GiB:
        p.problem("spec.gpu.memory", f"{spec.gpu.memory} is less than 1Gi: not a GPU vLLM can serve from")
        p.gpu_memory = None


def plan_tensor_parallel(p: Plan, s: Sizing) -> None:
    """2. --tensor-parallel-size: gpu.count (times nodes with crossNodeParallelism Tensor), which must divide the
    attention heads and share the KV heads."""
    arch, tp = s.arch, p.tensor_parallel_size
    across = tp != p.spec.gpu.count
    where = "spec.nodes" if across else "spec.gpu.count"
    source = f"gpu.count x nodes ({p.spec.gpu.count} x {p.nodes}, crossNodeParallelism Tensor)" if across else "gpu.count"
    valid = ", ".join(str(d) for d in valid_tp_sizes(arch, 64 if across else 16))
    if arch.num_attention_heads % tp:
        p.problem(where, f"tensor parallelism over {tp} GPUs must divide the model's "
                  f"{arch.num_attention_heads} attention heads; use one of {valid}")
    elif not tp_shards_evenly(arch, tp):
        p.problem(where, f"{tp} GPUs cannot share the model's {arch.num_kv_heads} KV heads evenly "
                  f"(vLLM fails loading the weights); use one of {valid}")
    p.decisions.append(FlagDecision("--tensor-parallel-size", str(tp), f"{source}: shard the model over {tp} GPU(s) "
                                f"({arch.num_attention_heads} heads / {tp} = {arch.num_attention_heads / tp:g} per GPU)"))


def plan_memory_budget(p: Plan, s: Sizing) -> bool:
    """3. --gpu-memory-utilization: vLLM's budget, leaving its CUDA context, a margin and reservedMemory outside.
    False when nothing is left for vLLM."""
    spec, e = p.spec, p.spec.engine
    assert p.gpu_memory is not None
    total = p.gpu_memory
    reserved = int(parse_quantity(spec.gpu.reserved_memory))
    in_budget = s.terms.cuda_graphs_in_budget and not runs_v2(s.arch, s.terms)
    s.graphs = 0 if e.enforce_eager or not in_budget else int(s.terms.graphs_in_budget)
    # V2 captures its graphs after the KV cache, outside the budget: they must fit beside the CUDA context
    graphs_outside = s.terms.graphs_in_budget if runs_v2(s.arch, s.terms) and not e.enforce_eager else 0
    outside = assumption("cuda_context") + assumption("safety_margin") + graphs_outside
    ceiling = (total - reserved - outside) / total
    if graphs_outside:
        p.notes.append("Model Runner V2 captures its CUDA graphs after the KV cache, on top of "
                       "--gpu-memory-utilization: the server uses the budget plus the graphs (0.15 GiB for an 8B model "
                       f"on an H200) plus vLLM's CUDA context ({gib(assumption('cuda_context'))}): the derived utilization leaves "
                       f"{gib(graphs_outside)} for the graphs outside it besides the context and the margin")
    if e.gpu_memory_utilization is not None:
        util = e.gpu_memory_utilization
        if util > ceiling + 1e-9:
            p.problem("spec.engine.gpuMemoryUtilization", f"{util} asks for {gib(util * total)} of a {gib(total)} GPU, "
                      f"but reservedMemory ({gib(reserved)}), vLLM's CUDA context ({gib(assumption('cuda_context'))}) and a "
                      f"{gib(assumption('safety_margin'))} margin leave {gib(ceiling * total)}: vLLM would refuse to start "
                      f"(free memory below the budget). Use at most {math.floor(ceiling * 100) / 100:.2f}",
                      api.REASON_DOES_NOT_FIT)
        why = "pinned by engine.gpuMemoryUtilization"
    else:
        util = min(assumption("default_utilization"), math.floor(ceiling * 100) / 100)
        why = (f"vLLM's default {assumption('default_utilization')}" if util == assumption("default_utilization") else
               f"leaves {gib(reserved)} reserved + {gib(outside)} for vLLM's CUDA context and a margin free")
    if util <= 0:
        p.problem("spec.gpu.reservedMemory", f"reserving {gib(reserved)} of a {gib(total)} GPU leaves nothing for vLLM",
                  api.REASON_DOES_NOT_FIT)
        return False
    p.gpu_memory_utilization = util
    p.decisions.append(FlagDecision("--gpu-memory-utilization", repr(float(util)), f"{why}: budget {gib(util * total)} of "
                                f"{gib(total)} per GPU", pinned=e.gpu_memory_utilization is not None))
    s.budget = int(util * total)
    return True


def plan_weights(p: Plan, s: Sizing) -> None:
    """4. The weights per GPU, as the checkpoint stores them (its quantization_config decides); across nodes, the
    largest pipeline stage's share."""
    spec, arch = p.spec, (p.model.complete if p.model is not None else s.arch)
    p.problems.extend(quantization_problems(spec, arch))
    sized_as = weights_quantization(spec, arch)
    stored = p.model.stored_weight_bytes if p.model is not None and loads_as_stored(spec, arch) else None
    if stored:
        p.notes.append(f"weights sized as the checkpoint stores them ({arch.quantization}): {gib(stored)} by the Hub's "
                       "safetensors metadata (each dtype's count times its size); vLLM reads the method from the "
                       "checkpoint")
        p.weight_bytes_total = stored
    else:
        if sized_as != spec.model.quantization:
            p.notes.append(f"weights sized as the checkpoint stores them ({sized_as}, config.json "
                           "quantization_config); vLLM reads the method from the checkpoint")
        p.weight_bytes_total = weight_bytes(arch, sized_as, s.elem)
    p.stage_weight_bytes = stage_weight_bytes(p.weight_bytes_total, arch, p.pipeline_parallel_size,
                                              p.stage_layers or arch.num_layers, s.elem)
    s.weights = math.ceil(p.stage_weight_bytes / p.tensor_parallel_size) + rotary_cache_bytes(arch, s.elem)


def plan_batch(p: Plan, s: Sizing) -> None:
    """5. --max-num-seqs and --max-num-batched-tokens, before the activations: vLLM's profiling run batches
    max_num_batched_tokens tokens."""
    e, prof = p.spec.engine, p.spec.workload_profile
    assert p.gpu_memory is not None
    total = p.gpu_memory
    big_gpu = total >= 70 * GiB and not any("A100" in g.product.upper() for g in p.gpu.products)
    seqs_default, batched_default = (1024, 8192) if big_gpu else (256, 2048)
    if e.max_num_seqs is not None:
        seqs, seqs_why = e.max_num_seqs, "pinned by engine.maxNumSeqs"
    elif prof.target_concurrency:
        factor = {"latency": 1.0, "balanced": 1.25, "throughput": 2.0}[prof.priority]
        seqs = max(1, math.ceil(prof.target_concurrency * factor))
        seqs_why = (f"Little's law: targetConcurrency {prof.target_concurrency} requests in flight x {factor} "
                    f"({prof.priority}) so the target never queues inside vLLM")
    else:
        seqs, seqs_why = seqs_default, f"vLLM's default for a {gib(total)} GPU"
    if e.max_num_batched_tokens is not None:
        batched, batched_why = e.max_num_batched_tokens, "pinned by engine.maxNumBatchedTokens"
    else:
        batched = {"latency": min(batched_default, 1024) if not big_gpu else 2048, "balanced": batched_default,
                   "throughput": batched_default * 2 if big_gpu else 8192}[prof.priority]
        batched_why = {"latency": "small prefill chunks keep decode steps short (latency)",
                       "balanced": "vLLM's default chunked-prefill budget",
                       "throughput": "large prefill chunks for throughput"}[prof.priority]
        if prof.priority == "throughput" and prof.p95_prompt_tokens:
            batched = max(batched, min(prof.p95_prompt_tokens, 16384))
        if batched < seqs:
            batched, batched_why = seqs, f"raised to max-num-seqs ({seqs}): vLLM requires batched tokens >= seqs"
    if batched < seqs:
        p.problem("spec.engine.maxNumBatchedTokens", f"{batched} is below maxNumSeqs {seqs}; vLLM requires "
                  "max-num-batched-tokens >= max-num-seqs")
    longest = longest_model_len(p.spec, s.arch)
    if is_pooling(s.arch) and batched < longest:
        # vLLM chunks a pooling model's prefill only for LAST pooling (ModelConfig.is_chunked_prefill_supported);
        # otherwise it refuses max_num_batched_tokens < max_model_len, and config.json does not say which.
        if e.max_num_batched_tokens is None:
            batched, batched_why = longest, (f"raised to the longest max-model-len ({longest}): a pooling model's "
                                             "prompt is prefilled in one step unless it pools the last token")
        else:
            p.notes.append(f"warning: maxNumBatchedTokens {batched} is below the max-model-len this model may get "
                           f"({longest}); vLLM refuses that for a pooling model that pools by MEAN or CLS (no "
                           "chunked prefill), and accepts it for LAST pooling")
    s.seqs, s.seqs_why, s.batched, s.batched_why = seqs, seqs_why, batched, batched_why


def longest_model_len(spec: VLLMServerSpec, arch: Architecture) -> int:
    """The longest --max-model-len the plan may choose (the pinned one, or the profile's / the model's maximum): what
    sizes a step that comes before the length is chosen, at its largest."""
    limit = arch.max_position_embeddings
    return spec.engine.max_model_len or min(spec.workload_profile.max_context_tokens or limit, limit)


def plan_kv_cache(p: Plan, s: Sizing) -> bool:
    """6. The activation peak, the overheads and what is left for the KV cache, laid out as vLLM pools it
    (KVLayout). False when the model does not fit (with the smallest gpu.count that would)."""
    arch, tp, e, elem, terms = s.arch, p.tensor_parallel_size, p.spec.engine, s.elem, s.terms
    assert p.gpu_memory is not None
    total, reserved = p.gpu_memory, int(parse_quantity(p.spec.gpu.reserved_memory))
    budget, weights, graphs, batched, seqs = s.budget, s.weights, s.graphs, s.batched, s.seqs
    # A multimodal profile's video grows with --max-model-len, which is chosen after the KV cache: size it at the
    # longest length the plan may choose.
    longest = longest_model_len(p.spec, arch)
    limits = mm_limits(list(e.extra_args))
    activation = activation_bytes(arch, tp, batched, seqs, elem, terms, longest, limits)
    non_torch = non_torch_bytes(tp, terms)
    kv = budget - weights - activation - non_torch - graphs - s.lora
    p.memory = Memory(total=total, reserved=reserved, budget=budget, weights=weights, activation=activation,
                      non_torch=non_torch, kv_cache=max(kv, 0), cuda_graphs=graphs, lora=s.lora)
    kv_dtype = e.kv_cache_dtype or "auto"
    p.kv_bytes_per_token = kv_bytes_per_token(arch, tp, kv_dtype, elem)
    s.kv, s.kv_dtype = kv, kv_dtype
    if kv <= 0:
        rest = activation + non_torch + graphs + s.lora
        spread = nodes_that_fit(p, s, rest) if p.pipeline_parallel_size == p.nodes else None
        group = (f" ({p.nodes} nodes: the largest stage's {p.stage_layers} layers on each GPU)" if p.nodes > 1
                 else "")
        slots = (f" + the LoRA adapters' slots {gib(s.lora)} (spec.adapters: fewer engine.maxLoras or a lower "
                 "engine.maxLoraRank take less)") if s.lora else ""
        suggestions = _fit_suggestions(p, s, activation, longest, limits)
        if spread is not None:
            suggestions.insert(0, f"more nodes ({'maxNodes' if p.max_nodes else 'nodes'}: {spread}: pipeline "
                                  f"stages over {spread} nodes of "
                                  f"{p.spec.gpu.count} GPU(s): docs/multi-node.md)")
        p.problem("spec.gpu", f"the model does not fit{group}: weights {gib(weights)} + activations "
                  f"{gib(activation)} + overheads {gib(non_torch + graphs)}{slots} per GPU exceed the {gib(budget)} "
                  f"budget of a {gib(total)} GPU; what would fit: {'; '.join(suggestions)}",
                  api.REASON_DOES_NOT_FIT)
        return False
    block = int(assumption("block_size"))
    whole = hybrid_kv_off(p.spec) if arch.sliding_window and not arch.kv_lora_rank else None
    layout = kv_layout(arch, tp, kv_dtype, elem, hybrid=whole is None)
    in_flight = tokens_in_flight(batched, terms, is_pooling(arch))
    if whole:
        p.notes.append(f"{whole}: vLLM keeps every layer's KV whole (its hybrid KV cache manager off), so the "
                       f"model's windowed layers ({arch.sliding_window:,} tokens) are sized as full attention")
    model_limit = arch.max_position_embeddings
    # The longest request the pool holds (for all-global attention: every block's tokens), then, once the
    # length is chosen, what vLLM logs for it (sliding-window layers hold only their window of each request).
    p.kv_cache_tokens = (layout.longest_request(kv, in_flight) if layout.full_layers
                         else layout.tokens(kv, model_limit, in_flight))  # every layer slides: no longest request
    headroom = assumption("context_headroom")
    fit_limit = _round_down(min(layout.longest_request(kv * headroom, in_flight), headroom * p.kv_cache_tokens), block)
    if arch.encoder_only:  # no KV cache at all: the length is the model's, the memory beyond the forward pass unused
        p.kv_bytes_per_token = p.kv_cache_tokens = 0
        p.memory.kv_cache, fit_limit = 0, model_limit
        p.notes.append("encoder-only pooling model: vLLM keeps no KV cache for it (EncoderOnlyAttention) and runs no "
                       f"sampler; {gib(kv)} per GPU of the budget stay unused (a lower engine.gpuMemoryUtilization "
                       "leaves them to others)")
    profile_notes(p, s, longest, limits)
    s.layout, s.in_flight, s.fit_limit = layout, in_flight, fit_limit
    return True


def _fit_suggestions(p: Plan, s: Sizing, activation: int, longest: int, limits: dict[str, int]) -> list[str]:
    """What would close the gap of a model that does not fit, each only where it would: more GPUs (the smallest
    gpu.count that leaves room for a KV cache), a GPU with more memory, 4-bit or 8-bit weights; a smaller batch
    only where the activations, not the weights, overflow the budget."""
    arch, tp, budget, weights, graphs = s.arch, p.tensor_parallel_size, s.budget, s.weights, s.graphs
    fixed = non_torch_bytes(tp, s.terms) + graphs + s.lora
    out = []
    for t in (2, 4, 8, 16, 32, 64):
        if t <= tp or not tp_shards_evenly(arch, t):
            continue
        need = (math.ceil(p.stage_weight_bytes / t) + rotary_cache_bytes(arch, s.elem) + s.lora * tp // t
                + activation_bytes(arch, t, s.batched, s.seqs, s.elem, s.terms, longest, limits)
                + non_torch_bytes(t, s.terms) + graphs)
        if need < budget:
            out.append(f"more GPUs (gpu.count: {t} leaves room for the KV cache)")
            break
    share = budget / p.gpu_memory if p.gpu_memory else 0.9
    if share > 0:  # a utilisation that leaves no budget at all: no GPU size would help
        out.append(f"a GPU with more memory (over {gib(int((weights + activation + fixed) / share))} each at this "
                   f"count, before the KV cache)")
    if p.spec.model.quantization in (None, "none") and s.elem >= 2:
        out.append(f"a quantized checkpoint: 4-bit weights take about {gib(weights // 4)} here (model.quantization: "
                   f"awq_marlin, gptq_marlin), 8-bit about {gib(weights // 2)} (fp8)")
    if weights + fixed < budget:  # the activations tip it over: a smaller batch shrinks them
        out.append("or a smaller engine.maxNumBatchedTokens (the activation peak grows with it)")
    return out


def profile_notes(p: Plan, s: Sizing, longest: int, limits: dict[str, int]) -> None:
    """What a multimodal or pooling model's profiling run adds or leaves out, for the plan's notes."""
    arch, tp, batched = s.arch, p.tensor_parallel_size, s.batched
    tower, embeddings = vision_profile_bytes(arch, tp, batched, s.elem, longest, s.terms, limits)
    if tower:
        item, _ = vision_item(arch, longest, s.terms, limits)
        video = (f" (a video, sized for {longest} tokens of context; --limit-mm-per-prompt '{{\"video\": 0}}' in "
                 "engine.extraArgs profiles an image instead)" if item > (arch.vision_tokens_per_item or 0) else "")
        assert p.memory is not None
        p.notes.append(f"multimodal: vLLM profiles the vision tower first, over {gib(tower)} of activations per GPU "
                       f"for {max(batched, item) // item} item(s) of {item} embeddings{video}; its encoder budget is "
                       f"max-num-batched-tokens {batched} or one item, and it holds their {gib(embeddings)} through "
                       f"the language model's run: the activation peak is {gib(p.memory.activation)}")
    if arch.pooling and not arch.encoder_only:
        p.notes.append("pooling model: vLLM keeps a KV cache for its prompts but decodes nothing, so its profile runs "
                       "a pooler instead of a sampler, and vLLM 0.32 schedules it without async scheduling")


def plan_max_model_len(p: Plan, s: Sizing) -> None:
    """7. --max-model-len: pinned, the profile's maximum or the model's own limit, within what the KV cache holds
    with a margin; a typical request must fit. Then the KV tokens vLLM logs for that length."""
    spec, e, prof, arch, kv = p.spec, p.spec.engine, p.spec.workload_profile, s.arch, s.kv
    model_limit, fit_limit = arch.max_position_embeddings, s.fit_limit
    if e.max_model_len is not None:
        length = e.max_model_len
        if length > model_limit:
            p.problem("spec.engine.maxModelLen", f"{length} is longer than {spec.model.name} supports "
                      f"({model_limit} tokens); vLLM refuses it. Use at most {model_limit}")
        elif length > fit_limit:
            p.problem("spec.engine.maxModelLen", f"{length} tokens do not fit the KV cache ({p.kv_cache_tokens} "
                      f"tokens, {gib(kv)} per GPU) with a {int(100 - assumption('context_headroom') * 100)}% margin; the largest "
                      f"length that fits is {fit_limit}. Lower maxModelLen, add GPUs, or use kvCacheDtype: fp8",
                      api.REASON_DOES_NOT_FIT)
        len_why = "pinned by engine.maxModelLen"
    else:
        requested = prof.max_context_tokens or model_limit
        if prof.max_context_tokens and requested > model_limit:
            p.problem("spec.workloadProfile.maxContextTokens", f"{requested} is longer than {spec.model.name} "
                      f"supports ({model_limit} tokens); use at most {model_limit}")
        length = min(requested, model_limit, fit_limit)
        capacity = _kv_capacity_words(p, s, length)
        if length == requested:
            len_why = "workloadProfile.maxContextTokens" if prof.max_context_tokens else "the model's own limit"
            len_why += (" (no KV cache: an encoder-only model)" if arch.encoder_only
                        else f", which fits the KV cache ({capacity})")
        else:
            len_why = (f"the KV cache holds {capacity}; {length} keeps a "
                       f"{int(100 - assumption('context_headroom') * 100)}% margin (wanted {requested})")
            if prof.max_context_tokens:
                p.notes.append(f"warning: maxContextTokens {requested} does not fit; serving at most {length} tokens. "
                               "Add GPUs or set engine.kvCacheDtype: fp8 to serve the full context")
        typical = (prof.p95_prompt_tokens or 0) + (prof.p95_output_tokens or 0)
        if length < max(typical, 16):
            # Blame what actually limits the length: the profile's own maximum, the model, or the KV cache.
            if typical > model_limit:
                p.problem("spec.workloadProfile.p95PromptTokens", f"a typical request (p95 prompt + output = "
                          f"{typical} tokens) is longer than {spec.model.name} supports ({model_limit} tokens)")
            elif prof.max_context_tokens and prof.max_context_tokens < typical:
                p.problem("spec.workloadProfile.maxContextTokens", f"{prof.max_context_tokens} is shorter than one "
                          f"typical request (p95PromptTokens + p95OutputTokens = {typical}); raise it or lower the "
                          "p95 figures")
            else:
                p.problem("spec.gpu", f"the KV cache ({p.kv_cache_tokens} tokens) cannot hold one typical request "
                          f"({typical} tokens); add GPUs or use a quantized model", api.REASON_DOES_NOT_FIT)
    p.max_model_len = length
    if length > 0 and not arch.encoder_only and s.layout is not None:
        p.kv_cache_tokens = s.layout.tokens(kv, length, s.in_flight)
    p.decisions.append(FlagDecision("--max-model-len", str(length), len_why, pinned=e.max_model_len is not None))


def _kv_capacity_words(p: Plan, s: Sizing, length: int) -> str:
    """The KV cache's size in a flag's reason: the one figure the plan reports as its capacity (the tokens vLLM
    logs at this length). Where sliding-window layers keep only their window of each request, one request may be
    longer than that figure, which the reason says in words rather than with a second figure."""
    if length <= 0 or s.layout is None:
        return f"{p.kv_cache_tokens:,} tokens"
    logged = s.layout.tokens(s.kv, length, s.in_flight)
    if logged == p.kv_cache_tokens:
        return f"{logged:,} tokens"
    return f"{logged:,} tokens; its sliding-window (or chunked) layers keep only their window of each request"


def plan_engine_flags(p: Plan, s: Sizing) -> None:
    """8. The batch flags (max-num-seqs capped by what the KV cache holds for typical requests), the queue cap,
    the KV cache dtype, prefix caching and eager mode."""
    e, prof = p.spec.engine, p.spec.workload_profile
    seqs, seqs_why, batched, batched_why, kv_dtype = s.seqs, s.seqs_why, s.batched, s.batched_why, s.kv_dtype
    if e.max_num_seqs is None:
        typical = (prof.p95_prompt_tokens or 0) + (prof.p95_output_tokens or 0)
        if typical and not s.arch.encoder_only:
            cap = max(1, p.kv_cache_tokens // typical)
            if cap < seqs:
                seqs, seqs_why = cap, f"the KV cache holds {cap} requests of p95 prompt+output ({typical} tokens)"
    p.max_num_seqs, p.max_num_batched_tokens = seqs, batched
    p.decisions.append(FlagDecision("--max-num-seqs", str(seqs), seqs_why, pinned=e.max_num_seqs is not None))
    p.decisions.append(FlagDecision("--max-num-batched-tokens", str(batched), batched_why,
                                pinned=e.max_num_batched_tokens is not None))
    check_queue_cap(p)
    if kv_dtype != "auto":
        p.decisions.append(FlagDecision("--kv-cache-dtype", kv_dtype, f"pinned: {p.kv_bytes_per_token} bytes/token per GPU",
                                    pinned=True))
    if e.enable_prefix_caching is None and is_pooling(s.arch):
        p.notes.append("prefix caching left to vLLM: it enables it for a pooling model only when the model's pooling "
                       "type allows (LAST pooling); forced on, vLLM warns that the model may crash or answer wrongly")
    else:
        prefix = True if e.enable_prefix_caching is None else e.enable_prefix_caching
        p.decisions.append(FlagDecision("--enable-prefix-caching" if prefix else "--no-enable-prefix-caching", "",
                                        "pinned" if e.enable_prefix_caching is not None else
                                        "reuse KV of shared prefixes (system prompts, chat history)",
                                        pinned=e.enable_prefix_caching is not None))
    if e.enforce_eager:
        p.decisions.append(FlagDecision("--enforce-eager", "", "pinned: no CUDA graphs (less memory, slower decode)",
                                    pinned=True))
    plan_runner(p, s)


def plan_runner(p: Plan, s: Sizing) -> None:
    """--runner pooling for a decoder marked pooling (spec.model.architecture.pooling, or its config.json
    architecture's name): the plan sized it without a sampler, so vLLM must not run it as a generative model."""
    if not s.arch.pooling or s.arch.encoder_only:
        return
    extra = list(p.spec.engine.extra_args)
    runner = next((a.split("=", 1)[1] if "=" in a else (extra[i + 1] if i + 1 < len(extra) else "")
                   for i, a in enumerate(extra) if a.split("=", 1)[0] == "--runner"), None)
    if runner is None and "--convert" not in {a.split("=", 1)[0] for a in extra}:
        p.decisions.append(FlagDecision("--runner", "pooling", "architecture.pooling: served as a pooling model "
                                        "(embeddings, scores), sized without a sampler"))
    elif runner is not None and runner != "pooling":  # "auto" pools a *ForCausalLM only with a modules.json
        p.problem("spec.model.architecture.pooling", "the model is sized as a pooling model (no sampler), but "
                  "extraArgs run it with --runner other than pooling: drop that --runner, or set pooling: false")


def plan_pod(p: Plan) -> None:
    """9. The pod around vLLM: /dev/shm or host IPC, host memory and CPU, the startup probe's budget."""
    spec, tp = p.spec, p.spec.gpu.count  # the GPU workers of one pod (one node of a group)
    if spec.ipc == "SharedMemory":
        if spec.shm_size is not None:
            p.shm_bytes = int(parse_quantity(spec.shm_size))
            if tp > 1 and p.shm_bytes < GiB:
                p.problem("spec.shmSize", f"{spec.shm_size} of /dev/shm is too small for tensor parallelism over {tp} "
                          "GPUs (NCCL fails with 'Bus error'); use at least 1Gi, or ipc: Host")
        else:
            p.shm_bytes = 2 * GiB if tp == 1 else 4 * GiB * tp
            p.notes.append(f"/dev/shm {gib(p.shm_bytes)} in memory: room for NCCL between {tp} GPU worker(s)")
    else:
        p.notes.append("ipc: Host: NCCL uses the host's shared memory (the pod gets hostIPC: true)")
    # A pod of a group loads only its stage's weights (stage_weight_bytes: all of them on one node).
    loads = p.stage_weight_bytes or p.weight_bytes_total
    p.host_memory_bytes = max(8 * GiB, math.ceil((loads / 2 + 4 * GiB) / GiB) * GiB)
    p.cpu_request = max(4, 2 * tp + 2)
    p.startup_seconds = int(max(assumption("startup_floor_seconds"),
                                loads / assumption("load_bandwidth") + assumption("engine_init_seconds")))
    if spec.startup_seconds is not None:
        p.notes.append(f"startup probe budget {spec.startup_seconds} s from spec.startupSeconds (derived: "
                       f"{p.startup_seconds} s)")
        p.startup_seconds = spec.startup_seconds
    if api.downloads_in_init_container(spec.model):
        p.notes.append(f"the weights download in the init container 'download' before vLLM starts (no probe "
                       f"deadline: a slow link is never killed); the startup probe's {p.startup_seconds} s cover "
                       f"reading {gib(loads)} from the cache and the engine's start")
    else:
        p.notes.append(f"vLLM downloads or reads the weights itself: the startup probe's {p.startup_seconds} s cover "
                       f"{gib(loads)} at {assumption('load_bandwidth') / 1e6:.0f} MB/s and the engine's start")


def check_release_flags(p: Plan) -> None:
    """11. What the image's vLLM release means for the args: the loose check's warning, and each flag the plan would
    emit that the release's parser lacks. engine_args leaves such a flag out (vLLM would exit with code 2 on it);
    when the spec asked for it (a pinned value) that is a problem naming the field, the flag and the release,
    since serving without it would ignore the spec; when the planner derived it, vLLM's own default applies
    and a warning says what is lost."""
    check = p.flags
    assert check is not None
    snap = check.snapshot
    if (warning := check.warning()) is not None:
        p.notes.append(f"warning: {warning}")
    elif check.release != vllm_flags.VERSION:
        p.notes.append(f"image {p.spec.image} runs vLLM {check.release}: flags checked against and derived for "
                       "its own parser's snapshot")
    for flag, pinned, why in _planned_flags(p):
        if flag in snap.flags:
            continue
        owner = OWNED_FLAGS.get(flag, "")
        has = [r for r in vllm_flags.releases() if flag in vllm_flags.snapshot(r).flags]
        others = f"vLLM {', '.join(has)}" if has else "no vLLM release the operator knows"
        if pinned or not owner.startswith("spec."):
            where = owner.split(" ", 1)[0] if owner.startswith("spec.") else "spec.image"
            p.problem(where, f"vLLM {snap.version} (the image's release) has no {flag}, which "
                      f"{'this field asks for' if where != 'spec.image' else 'the pod needs'}: "
                      f"{'remove it or ' if where != 'spec.image' else ''}use an image of {others}")
        else:
            p.notes.append(f"warning: vLLM {snap.version} has no {flag}: not passed, vLLM's own default applies "
                           f"instead of the derived value ({why}); {others} has it")


def _planned_flags(p: Plan) -> list[tuple[str, bool, str]]:
    """(flag, pinned by the spec, why) for every flag engine_args may emit but extraArgs."""
    spec = p.spec
    out = [("--host", False, ""), ("--port", False, ""), ("--served-model-name", spec.model.served_name is not None, "")]
    if spec.model.revision:
        out.append(("--revision", True, ""))
    if spec.model.dtype != "auto":
        out.append(("--dtype", True, ""))
    if spec.model.quantization != "none":
        out.append(("--quantization", True, ""))
    out += [(d.flag, d.pinned, d.why) for d in p.decisions]
    if spec.engine.chat_template:
        out.append(("--chat-template", True, ""))
    return out


def min_queue_cap(max_num_seqs: int, target_waiting: float) -> int:
    """The smallest --max-num-queued-reqs with which the autoscaler can still scale up. vLLM counts running
    and waiting requests against the cap (SchedulerConfig.max_num_queued_reqs), so with max_num_seqs running
    at most cap - max_num_seqs wait; the autoscaler (and an HPA, with the same default tolerance) scales up
    only when more than target x (1 + tolerance) wait per replica."""
    return max_num_seqs + math.floor(target_waiting * (1 + AUTOSCALING_TOLERANCE) + 1e-9) + 1


def check_queue_cap(p: Plan) -> None:
    """engine.maxNumQueuedReqs: emitted as pinned; refused when an autoscaler would never see its target."""
    e, a = p.spec.engine, p.spec.autoscaling
    cap = e.max_num_queued_reqs
    if cap is None:
        return
    seqs = p.max_num_seqs
    p.decisions.append(FlagDecision("--max-num-queued-reqs", str(cap), f"pinned by engine.maxNumQueuedReqs: past {cap} "
                                "requests (running and waiting) vLLM answers 503 and clients retry elsewhere",
                                pinned=True))
    if a.enabled:
        need = min_queue_cap(seqs, a.target_waiting_per_replica)
        if cap < need:
            p.problem("spec.engine.maxNumQueuedReqs",
                      f"{cap} requests per server, {seqs} of them running (max-num-seqs), leave room for at most "
                      f"{max(cap - seqs, 0)} waiting; the autoscaler scales up only when more than "
                      f"{a.target_waiting_per_replica * (1 + AUTOSCALING_TOLERANCE):g} wait per replica "
                      f"(targetWaitingPerReplica {a.target_waiting_per_replica:g} and its "
                      f"{AUTOSCALING_TOLERANCE:.0%} tolerance), so it would never scale "
                      f"up and vLLM would answer 503 instead. Use at least {need}, or lower targetWaitingPerReplica")
    elif cap < seqs:
        p.notes.append(f"warning: engine.maxNumQueuedReqs {cap} is below --max-num-seqs {seqs}: vLLM never runs more "
                       f"than {cap} requests at once")


def plan_shutdown(p: Plan) -> None:
    """10. --shutdown-timeout and the pod's termination timeline: the preStop sleep (the pod leaves the Services'
    endpoints while vLLM still serves), then SIGTERM and the drain (vLLM takes no new request and lets the
    in-flight ones finish, up to the timeout), then vLLM's teardown; terminationGracePeriodSeconds covers all
    three, so the kubelet's SIGKILL never cuts a drain short."""
    e, prof = p.spec.engine, p.spec.workload_profile
    speed = assumption("drain_tokens_per_second")
    if e.shutdown_timeout_seconds is not None:
        p.drain_seconds, why = e.shutdown_timeout_seconds, "pinned by engine.shutdownTimeoutSeconds"
        if e.shutdown_timeout_seconds == 0:
            why += ": vLLM aborts every in-flight request on SIGTERM"
    else:
        tokens = prof.p95_output_tokens or 512
        source = "workloadProfile.p95OutputTokens" if prof.p95_output_tokens else "an assumed p95 output"
        needed = math.ceil(tokens / speed)
        floor, ceiling = int(assumption("drain_floor_seconds")), int(assumption("drain_ceiling_seconds"))
        p.drain_seconds = min(ceiling, max(floor, needed))
        clipped = (f", raised to the {floor} s floor" if needed < floor else
                   f", cut to the {ceiling} s ceiling" if needed > ceiling else "")
        why = (f"{source} {tokens} tokens at {speed:g} tokens/s = {needed} s{clipped}: a request started just "
               "before SIGTERM finishes instead of being aborted")
    p.decisions.append(FlagDecision("--shutdown-timeout", str(p.drain_seconds), why,
                                pinned=e.shutdown_timeout_seconds is not None))
    p.prestop_seconds = int(assumption("prestop_seconds"))
    margin = int(assumption("shutdown_margin_seconds"))
    p.termination_grace_seconds = p.prestop_seconds + p.drain_seconds + margin
    p.notes.append(f"terminationGracePeriodSeconds {p.termination_grace_seconds} = preStop sleep {p.prestop_seconds} s "
                   f"(the pod leaves the Services' endpoints while vLLM still serves) + --shutdown-timeout "
                   f"{p.drain_seconds} s (in-flight requests finish) + {margin} s for vLLM's teardown")


def unsafe_overrides(p: Plan) -> None:
    """--host/--port in extraArgs under the escape hatch: vLLM takes the last occurrence, so they win over the
    operator's; the container port (and with it the probes, the Services' target and a host network's port)
    follows --port, and a note says what the user took over."""
    extra = p.spec.engine.extra_args
    for i, token in enumerate(extra):
        flag, eq, inline = token.partition("=")
        if vllm_flags.normalise(flag) not in UNSAFE_FLAGS:
            continue
        value = inline if eq else (extra[i + 1] if i + 1 < len(extra) else "")
        if vllm_flags.normalise(flag) == "--port":
            if not (value.isdigit() and 1 <= int(value) <= 65535):
                p.problem(f"spec.engine.extraArgs[{i}]", f"--port needs a port number (1-65535), got {value!r}")
                continue
            p.port = int(value)
        p.notes.append(f"warning: extraArgs sets {flag} {value} ({api.ALLOW_UNSAFE_ARGS_ANNOTATION}); the container "
                       f"port is {p.port}: probes and Services follow it, but a --host the pod IP does not reach "
                       "fails every probe")


def engine_args(p: Plan) -> list[str]:
    """The container args after `vllm serve`: model first, then flags in a stable order; only flags the image's
    vLLM release has (check_release_flags says what was left out), extraArgs as they are."""
    spec = p.spec
    known = (p.flags.snapshot if p.flags is not None else vllm_flags.snapshot()).flags
    args = [spec.model.name]

    def emit(flag: str, *value: str) -> None:
        if flag in known:
            args.extend((flag, *value))

    emit("--host", "0.0.0.0")
    emit("--port", str(DEFAULT_PORT))
    emit("--served-model-name", spec.model.served_name or spec.model.name)
    if spec.model.revision:
        emit("--revision", spec.model.revision)
    if spec.model.dtype != "auto":
        emit("--dtype", spec.model.dtype)
    if spec.model.quantization != "none":
        emit("--quantization", spec.model.quantization)
    for d in p.decisions:
        emit(d.flag, *([d.value] if d.value else []))
    if spec.engine.chat_template:
        # vLLM reads a value that is no file's path and holds Jinja syntax as the template itself.
        emit("--chat-template", spec.engine.chat_template)
    args += list(spec.engine.extra_args)
    return args
