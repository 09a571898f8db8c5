"""The plan's LoRA step: spec.adapters (and what each adapter_config.json said) -> --enable-lora, --max-loras,
--max-cpu-loras, --max-lora-rank and the slots' memory per GPU, or the problems that refuse them."""

from __future__ import annotations

from typing import Optional

from .. import adapters as lora, api
from .memory import gib
from .plan_types import FlagDecision, Plan, Sizing


def plan_adapters(p: Plan, s: Sizing, facts: dict[str, lora.AdapterFacts]) -> None:
    """7a. spec.adapters: each adapter's rank (adapter_config.json, else the spec's), its base model checked against
    the served one, the slots and their rank, and the memory they take from the KV cache's share (s.lora)."""
    spec, e = p.spec, p.spec.engine
    for i, env in enumerate(e.env):
        if env.name == lora.RUNTIME_ENV:
            p.problem(f"spec.engine.env[{i}].name", f"{lora.RUNTIME_ENV} is set by the operator, only with "
                      "spec.adapters: it lets any client of the server load and unload adapters")
    if not spec.adapters:
        for value, name in ((e.max_loras, "maxLoras"), (e.max_lora_rank, "maxLoraRank")):
            if value is not None:
                p.problem(f"spec.engine.{name}", "sizes the LoRA adapters' slots: set it with spec.adapters only")
        return
    why = lora.unsupported(s.arch)
    if why:
        p.problem("spec.adapters", why)
        return
    _check_names(p)
    for a in spec.adapters:
        if a.revision:
            p.notes.append(f"warning: adapter {a.name}: revision {a.revision} is what the planner reads "
                           "adapter_config.json at; vLLM's runtime load takes no revision and downloads the repo's "
                           "default branch (pin a revision by putting that commit's files in the cache and naming "
                           "the path)")
    ranks = [rank for i, a in enumerate(spec.adapters)
             if (rank := _adapter_rank(p, i, facts.get(a.name))) is not None]
    if len(ranks) < len(spec.adapters):
        return
    rank = _slot_rank(p, max(ranks))
    if rank is None:
        return
    # Neither flag follows the number of adapters: a changed flag would restart every pod, and adding or removing
    # an adapter must not (the runtime endpoints do it).
    slots = e.max_loras or lora.DEFAULT_MAX_LORAS
    cpu = max(api.MAX_ADAPTERS, slots)
    layout = lora.LoRALayout(slots=slots, rank=rank, elem=s.elem)
    s.lora = layout.bytes_per_gpu(s.arch, p.tensor_parallel_size)
    p.decisions.append(FlagDecision("--enable-lora", "", f"spec.adapters: {len(spec.adapters)} LoRA adapter(s), "
                                    "loaded at runtime on every replica"))
    p.decisions.append(FlagDecision("--max-loras", str(slots), "pinned by engine.maxLoras" if e.max_loras else
                                    f"adapters one batch mixes, each in a GPU slot: {lora.DEFAULT_MAX_LORAS} whatever "
                                    "the number of adapters, so adding one restarts no pod", pinned=e.max_loras is not None))
    p.decisions.append(FlagDecision("--max-cpu-loras", str(cpu), f"the most adapters a spec holds ({api.MAX_ADAPTERS}): "
                                    "every adapter stays in host memory (none evicted and re-read between requests), "
                                    "and adding one changes no flag"))
    p.decisions.append(FlagDecision("--max-lora-rank", str(rank), "pinned by engine.maxLoraRank" if e.max_lora_rank
                                    else f"the smallest of the release's choices that holds the largest adapter's "
                                    f"rank ({max(ranks)}), at least vLLM's default {lora.MIN_DEFAULT_RANK} (adapters "
                                    "up to it come and go without a restart)", pinned=e.max_lora_rank is not None))
    p.notes.append(f"LoRA slots: {slots} slot(s) x rank {rank} over the {s.arch.num_layers} layers' qkv_proj, o_proj, "
                   f"gate_up_proj and down_proj, embed_tokens and lm_head = {gib(s.lora)} per GPU, allocated by vLLM "
                   "before the KV cache (vllm/lora/layers/*.py create_lora_weights), taken from the KV cache's share")


def _check_names(p: Plan) -> None:
    """Adapter names are unique and none is the base model's served name (a request could not tell them apart)."""
    base = p.spec.model.served_name or p.spec.model.name
    seen: set[str] = set()
    for i, a in enumerate(p.spec.adapters):
        if a.name in seen:
            p.problem(f"spec.adapters[{i}].name", f"{a.name} names two adapters: each needs its own name")
        if a.name == base:
            p.problem(f"spec.adapters[{i}].name", f"{a.name} is the base model's served name: a request naming it "
                      "would get the base model; give the adapter its own name")
        seen.add(a.name)


def _adapter_rank(p: Plan, i: int, facts: Optional[lora.AdapterFacts]) -> Optional[int]:
    """One adapter's rank to size the slots with; a problem (and None) when it is unknown or meant for another
    model."""
    a, where = p.spec.adapters[i], f"spec.adapters[{i}]"
    facts = facts or lora.AdapterFacts(error="not read (no lookup was made)")
    if facts.error is None:
        assert facts.rank is not None
        if lora.base_mismatch(facts.base_model, p.spec.model.name):
            p.problem(f"{where}.source", f"{a.name} was trained for {facts.base_model} (adapter_config.json "
                      f"base_model_name_or_path), not for the served {p.spec.model.name}: vLLM would apply it to the "
                      "wrong weights; serve it on a server of its base model")
            return None
        if a.rank is not None and a.rank != facts.rank:
            p.notes.append(f"warning: adapter {a.name}: adapter_config.json says rank {facts.rank}, spec says "
                           f"{a.rank}: the slots are sized for the larger")
        return max(facts.rank, a.rank or 0)
    if a.rank is not None:
        p.notes.append(f"adapter {a.name}: adapter_config.json {facts.error}; sized with spec.adapters rank {a.rank} "
                       "(its base model unchecked)")
        return a.rank
    p.problem(f"{where}.rank", f"adapter {a.name}: adapter_config.json {facts.error}, so its rank is unknown: set "
              "rank (adapter_config.json's r)")
    return None


def _slot_rank(p: Plan, largest: int) -> Optional[int]:
    """--max-lora-rank: the pinned one (checked), else the smallest of the image's release's choices >= largest."""
    snap = p.flags.snapshot if p.flags is not None else None
    info = snap.flags.get("--max-lora-rank") if snap is not None else None
    choices = lora.rank_choices(getattr(info, "choices", None))
    listed = ", ".join(map(str, choices))
    pinned = p.spec.engine.max_lora_rank
    if pinned is not None:
        if pinned not in choices:
            p.problem("spec.engine.maxLoraRank", f"{pinned} is not one of vLLM's choices for --max-lora-rank "
                      f"({listed})")
            return None
        if pinned < largest:
            p.problem("spec.engine.maxLoraRank", f"{pinned} is below the largest adapter's rank {largest}: vLLM "
                      f"refuses to load that adapter; use at least {lora.round_rank(largest, choices) or largest}")
            return None
        return pinned
    rank = lora.round_rank(max(largest, lora.MIN_DEFAULT_RANK), choices)
    if rank is None:
        p.problem("spec.adapters", f"an adapter's rank {largest} is above vLLM's largest --max-lora-rank "
                  f"({choices[-1]})")
    return rank
