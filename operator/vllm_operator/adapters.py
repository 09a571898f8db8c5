"""LoRA adapters of a served model, the pure part: what an adapter_config.json says (rank, target modules, the base
model), the flags vLLM needs to serve spec.adapters (--enable-lora, --max-loras, --max-cpu-loras, --max-lora-rank),
the GPU memory of the LoRA slots, and the per-adapter status built from what the replicas' /v1/models listed.

The memory is what vLLM allocates when it starts with --enable-lora, before any adapter is loaded: every layer it
wraps for LoRA gets, per slot (--max-loras) and per output slice, a stacked A of max_lora_rank x input and a stacked
B of output x max_lora_rank in the LoRA dtype (the model's), sharded as the base layer is (vllm/lora/layers/
base_linear.py BaseLinearLayerWithLoRA.create_lora_weights; column_parallel_linear.py
MergedColumnParallelLinearWithLoRA.create_lora_weights for gate_up_proj's two slices and
MergedQKVParallelLinearWithLoRA for qkv_proj's three). vLLM wraps every linear layer of the model, whatever the
adapters target (lora/utils.py get_supported_lora_modules, model_manager.py _create_lora_modules): a dense
decoder's qkv_proj, o_proj (row parallel: A's input sharded), gate_up_proj and down_proj (row parallel) in every
layer, and embed_tokens and lm_head (vocab_parallel_embedding.py, logits_processor.py). The test
e2e/test_adapters_vllm.py sums the tensors the real vLLM 0.32 CPU engine allocated and compares.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from .catalog import Architecture

#: The flags spec.adapters derives (validation.OWNED_FLAGS refuses them in extraArgs).
FLAGS = ("--enable-lora", "--no-enable-lora", "--max-loras", "--max-cpu-loras", "--max-lora-rank")
#: The environment variable that opens vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter (vllm/envs.py); the
#: pods get it only when spec.adapters is set.
RUNTIME_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
#: Adapters in GPU slots by default (vLLM's own default --max-loras is 1; more slots let a batch mix adapters), the
#: same whatever the number of adapters so that adding one changes no flag.
DEFAULT_MAX_LORAS = 4
#: The largest vocabulary vLLM serves LoRA for (vllm/lora/layers/logits_processor.py create_lora_weights).
MAX_LORA_VOCAB = 258048
#: The smallest --max-lora-rank derived: vLLM's own default, so that the usual ranks (8, 16) need no larger slots.
MIN_DEFAULT_RANK = 16
#: --max-lora-rank's choices where a release's snapshot has none (vLLM 0.26 to 0.33 all list these).
DEFAULT_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
#: The last segment of a Hub id or a path (the model's bare name).
_BASE_ONLY = re.compile(r"[^/]+$")


@dataclass(frozen=True)
class AdapterFacts:
    """What adapter_config.json says of one adapter, or why it could not be read."""

    rank: Optional[int] = None
    target_modules: tuple[str, ...] = ()
    base_model: Optional[str] = None
    #: Why adapter_config.json was not read (a category: never the answer's bytes); None: read.
    error: Optional[str] = None


def parse_config(config: Any) -> AdapterFacts:
    """A PEFT adapter_config.json's facts, or AdapterFacts(error=...) when it is not a LoRA adapter's config."""
    if not isinstance(config, dict):
        return AdapterFacts(error="adapter_config.json is not a JSON object")
    peft_type = config.get("peft_type")
    if peft_type is not None and str(peft_type).upper() != "LORA":
        return AdapterFacts(error="adapter_config.json is not a LoRA adapter's (peft_type)")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= 4096:
        return AdapterFacts(error="adapter_config.json has no rank r between 1 and 4096")
    modules = config.get("target_modules")
    targets: tuple[str, ...] = ()
    if isinstance(modules, list):
        targets = tuple(str(m)[:64] for m in modules[:64] if isinstance(m, str))
    elif isinstance(modules, str):
        targets = (modules[:64],)
    base = config.get("base_model_name_or_path")
    return AdapterFacts(rank=rank, target_modules=targets, base_model=base[:512] if isinstance(base, str) else None)


def base_mismatch(base: Optional[str], model_name: str) -> bool:
    """Whether an adapter trained for `base` cannot be meant for the served model: both are Hub ids and the served
    model's name is neither the base's nor a variant of it (a quantized or re-published copy keeps the base's name
    and adds a suffix: Llama-3.1-8B-Instruct-AWQ). A path on either side says nothing: not refused."""
    if not base or base.startswith(("/", ".", "~")) or model_name.startswith(("/", ".", "~")):
        return False
    if base.count("/") != 1 or model_name.count("/") != 1:
        return False
    if base.lower() == model_name.lower():
        return False
    ours, theirs = _bare(model_name), _bare(base)
    return not (ours == theirs or ours.startswith(theirs + "-"))


def _bare(name: str) -> str:
    found = _BASE_ONLY.search(name.strip("/"))
    return (found.group(0) if found else name).lower()


def rank_choices(choices: Optional[Sequence[str]]) -> tuple[int, ...]:
    """The --max-lora-rank values a release's parser accepts (its snapshot's choices), ascending."""
    values = sorted(int(c) for c in choices or () if str(c).isdigit())
    return tuple(values) or DEFAULT_RANKS


def round_rank(rank: int, choices: Sequence[int]) -> Optional[int]:
    """The smallest allowed --max-lora-rank that holds `rank`; None when none does."""
    return next((c for c in sorted(choices) if c >= rank), None)


@dataclass(frozen=True)
class LoRALayout:
    """The LoRA slots of one GPU: how many adapters (slots), the rank each is sized for, the element size."""

    slots: int
    rank: int
    elem: int

    def layer_elements(self, arch: Architecture, tp: int) -> int:
        """A and B elements per slot and unit of rank in one decoder layer on one GPU (see the module's doc)."""
        hidden, heads, kv_heads, head = arch.hidden_size, arch.num_attention_heads, arch.num_kv_heads, arch.head_dim
        q_out = heads * head // tp
        kv_out = max(1, kv_heads // tp) * head
        qkv = 3 * hidden + q_out + 2 * kv_out  # three slices: A reads the whole input, B writes its shard
        o_proj = heads * head // tp + hidden  # row parallel: A reads the input shard, B writes the whole output
        gate_up = 2 * hidden + 2 * (arch.intermediate_size // tp)
        down = arch.intermediate_size // tp + hidden
        return qkv + o_proj + gate_up + down

    @staticmethod
    def vocab_elements(arch: Architecture) -> int:
        """A and B elements per slot and unit of rank of embed_tokens (A: vocab x rank, B: hidden x rank;
        vocab_parallel_embedding.py) and lm_head (A: rank x hidden, B: vocab x rank; logits_processor.py), which vLLM
        wraps, whole on every GPU, for a model class that declares them in embedding_modules (vLLM 0.26: Llama,
        Qwen3, Mixtral, Granite, ...; not Qwen2 nor Mistral). Counted for every model (the architecture facts hold no
        model class): for one that declares none the plan is larger by these (Qwen2.5-7B on an H200: docs/gpu-evidence.md)."""
        return 2 * (arch.vocab_size + arch.hidden_size)

    def bytes_per_gpu(self, arch: Architecture, tp: int) -> int:
        elements = arch.num_layers * self.layer_elements(arch, tp) + self.vocab_elements(arch)
        return elements * self.slots * self.rank * self.elem


def unsupported(arch: Architecture) -> Optional[str]:
    """Why the planner cannot size LoRA slots for this architecture (None: it can)."""
    if arch.num_experts:
        return ("LoRA on a mixture-of-experts model is not planned by the operator (vLLM wraps each expert's "
                "weights; their slots are not sized here)")
    if arch.kv_lora_rank:
        return "LoRA on a multi-head latent attention model (DeepSeek V2/V3, Kimi K2) is not planned by the operator"
    if arch.vocab_size > MAX_LORA_VOCAB:
        return (f"vLLM serves LoRA only for a vocabulary of at most {MAX_LORA_VOCAB} tokens (LogitsProcessorWithLoRA); "
                f"this model has {arch.vocab_size}")
    if arch.encoder_only:
        return "an encoder-only pooling model: the operator plans LoRA adapters for decoders only"
    return None


# --------------------------------------------------------------------------- status
@dataclass
class PodAdapters:
    """What one ready replica's vLLM lists (/v1/models) and what loading an adapter there last failed with."""

    pod: str
    listed: Optional[frozenset[str]] = None
    """The adapter names /v1/models listed (entries whose parent is the base model); None: not reached."""
    errors: dict[str, str] = field(default_factory=dict)
    """adapter name -> the last failure's category on this pod."""


def adapter_rows(names: Sequence[str], pods: Sequence[PodAdapters]) -> list[dict[str, Any]]:
    """status.adapters: per adapter, on how many reached replicas it is listed and the last error (named)."""
    reached = [p for p in pods if p.listed is not None]
    rows = []
    for name in names:
        loaded = sum(1 for p in reached if name in (p.listed or ()))
        error = next((f"{p.pod}: {p.errors[name]}" for p in pods if name in p.errors), None)
        row: dict[str, Any] = {"name": name, "loaded": loaded, "replicas": len(reached)}
        if error and loaded < len(reached):
            row["lastError"] = error
        rows.append(row)
    return rows


def served_models(base: str, rows: Sequence[dict[str, Any]]) -> list[str]:
    """The names a client may use: the base model's, and each adapter every reached replica serves."""
    return [base] + [r["name"] for r in rows if r["replicas"] and r["loaded"] == r["replicas"]]


def condition(rows: Sequence[dict[str, Any]]) -> tuple[str, str, str]:
    """AdaptersReady: (status, reason, message) from status.adapters."""
    if not rows:
        return "True", "NoAdapters", "no adapters in the spec"
    reached = max((r["replicas"] for r in rows), default=0)
    if not reached:
        return "Unknown", "NoReadyReplica", f"{len(rows)} adapter(s) wait for a ready replica to load them on"
    failing = [r for r in rows if r.get("lastError")]
    loading = [r for r in rows if r["loaded"] < r["replicas"] and not r.get("lastError")]
    if failing:
        names = ", ".join(f"{r['name']} ({r['lastError']})" for r in failing[:8])
        more = f" and {len(failing) - 8} more" if len(failing) > 8 else ""
        return "False", "AdapterLoadFailed", (f"{len(failing)} adapter(s) failed to load: {names}{more}; the model and "
                                              "the other adapters keep serving")
    if loading:
        names = ", ".join(r["name"] for r in loading[:8])
        return "False", "Loading", f"loading {names} on the ready replicas"
    return "True", "Loaded", f"{len(rows)} adapter(s) loaded on every ready replica ({reached})"
