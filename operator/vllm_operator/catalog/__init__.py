"""The catalog: facts about models and GPUs that the planner sizes vLLM with. Pure.

One job: answer "what is this model's architecture?" and "how much memory does this
GPU have?" from built-in data (``models.yaml``, ``gpus.yaml``) and a model's parsed
``config.json``. Fields nobody gave are derived where the arithmetic is unambiguous and
reported as estimated. Where the facts come from (the Hub, a configURL, the spec's overrides,
in order of precedence) is ``sources/model_facts.py``, the one step that does I/O. The YAML
files are read once.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any, Optional, Protocol, cast

import pydantic
import yaml

from ..api import ModelArchitecture

__all__ = [
    "GPUInfo",
    "GPUMatch",
    "ResolvedModel",
    "UnknownModelError",
    "architecture_from_config",
    "estimate_parameter_count",
    "gpu_families",
    "known_gpus",
    "known_models",
    "lookup_gpu",
    "match_gpu",
    "mig_profiles",
    "near_gpu_names",
    "lookup_model",
]

#: Architecture fields, snake_case, in ModelArchitecture order.
ARCH_FIELDS: tuple[str, ...] = tuple(ModelArchitecture.model_fields)
#: snake_case field -> the camelCase name users write under spec.model.architecture.
CAMEL: dict[str, str] = {
    name: (field.alias or name) for name, field in ModelArchitecture.model_fields.items()
}


# --------------------------------------------------------------------------- types
class Architecture(Protocol):
    """A ModelArchitecture with every field the planner sizes with set: what `ResolvedModel.complete` hands the
    planner (resolve_model raises UnknownModelError before one is missing)."""

    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    parameter_count: int
    num_experts: Optional[int]
    sliding_window: Optional[int]
    sliding_window_layers: Optional[int]
    kv_lora_rank: Optional[int]
    qk_rope_head_dim: Optional[int]
    encoder_only: Optional[bool]
    pooling: Optional[bool]
    vision_tokens_per_item: Optional[int]
    vision_patches_per_item: Optional[int]
    vision_video_frame_groups: Optional[int]
    vision_hidden_size: Optional[int]
    vision_intermediate_size: Optional[int]
    tie_word_embeddings: Optional[bool]
    torch_dtype: Optional[str]
    quantization: Optional[str]


#: What Architecture promises is set.
COMPLETE_FIELDS = ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "hidden_size",
                   "intermediate_size", "vocab_size", "max_position_embeddings", "parameter_count")


@dataclass(frozen=True)
class ResolvedModel:
    """A model architecture with every field the planner needs, and where it came from."""

    architecture: ModelArchitecture
    source: str
    estimated: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    """For the plan's notes: e.g. that config.json could not be fetched again and older facts stand in."""
    stored_weight_bytes: Optional[int] = None
    """The checkpoint's weights in bytes as stored, from the Hub's safetensors metadata (each dtype's count times its
    size): exact where the parameter count is not, for a quantized checkpoint whose elements pack several weights."""

    @property
    def complete(self) -> Architecture:
        """The architecture, checked to hold every field the planner sizes with."""
        missing = [k for k in COMPLETE_FIELDS if getattr(self.architecture, k) is None]
        if missing:
            raise ValueError(f"architecture of a resolved model lacks {', '.join(missing)}")
        return cast(Architecture, self.architecture)


class UnknownModelError(ValueError):
    """The model's architecture is not known well enough to plan for it."""

    def __init__(self, model: str, missing: list[str], detail: str = "") -> None:
        self.model = model
        self.missing = list(missing)
        fields = ", ".join(self.missing)
        message = (
            f"model {model!r} is not in the built-in catalog and its architecture is incomplete: "
            f"set {fields} under spec.model.architecture, or set spec.model.configURL to the "
            f"URL of the model's config.json"
        )
        if detail:
            message += f" ({detail})"
        super().__init__(message)


@dataclass(frozen=True)
class GPUInfo:
    """One GPU product: its memory as CUDA reports it, and what it can do."""

    product: str
    memory_bytes: int
    compute_capability: str
    supports_fp8: bool
    memory_bandwidth_gbps: Optional[float]
    source: str
    #: True when memory_bytes is the marketed size, not a figure a real device reported.
    memory_estimated: bool = False
    note: str = ""
    aliases: tuple[str, ...] = ()
    #: GKE's cloud.google.com/gke-accelerator values for this product (none: GKE does not offer it).
    gke: tuple[str, ...] = ()
    #: Karpenter's karpenter.k8s.aws/instance-gpu-name on EKS (None: no EC2 instance has it).
    karpenter: Optional[str] = None
    #: karpenter.k8s.aws/instance-gpu-memory, where two products share one Karpenter GPU name.
    karpenter_memory_mib: Optional[int] = None
    #: MIG profile -> the slice's memory in bytes (capped at memory_bytes).
    mig: tuple[tuple[str, int], ...] = ()

    def mig_memory(self, profile: str) -> Optional[int]:
        """Memory of one MIG slice of this GPU, or None when the catalog has no such profile for it."""
        return dict(self.mig).get(profile.lower())

    def label_values(self, convention: str) -> tuple[str, ...]:
        """This product's node label values under a label convention (GFD, GKE, Karpenter)."""
        if convention == "GKE":
            return self.gke
        if convention == "Karpenter":
            return (self.karpenter,) if self.karpenter else ()
        return (self.product,)


@dataclass(frozen=True)
class GPUMatch:
    """What a gpu.product value names: one catalog product, or a family of them, and GFD's suffixes."""

    products: tuple[GPUInfo, ...]
    #: The family name when the value named several products (H100), else None.
    family: Optional[str] = None
    #: GFD's -SHARED suffix: the node's GPUs are time-sliced or shared through MPS.
    shared: bool = False
    #: The MIG profile of GFD's -MIG-<profile> suffix (MIG "single" strategy), else None.
    mig_profile: Optional[str] = None


# --------------------------------------------------------------------------- data
def _read_yaml(name: str) -> Any:
    text = resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
    return yaml.safe_load(text)


@functools.cache
def _model_index() -> tuple[dict[str, dict[str, Any]], dict[str, str], dict[str, list[str]]]:
    """(entries by canonical id, lowercased id/alias -> id, lowercased short name -> ids)."""
    data = _read_yaml("models.yaml") or {}
    entries: dict[str, dict[str, Any]] = dict(data.get("models") or {})
    by_name: dict[str, str] = {}
    by_short: dict[str, list[str]] = {}
    for model_id, entry in entries.items():
        for name in [model_id, *(entry.get("aliases") or [])]:
            key = str(name).strip().lower()
            if key in by_name and by_name[key] != model_id:
                raise ValueError(f"models.yaml: {name!r} names both {by_name[key]} and {model_id}")
            by_name[key] = model_id
            short = key.rsplit("/", 1)[-1]
            ids = by_short.setdefault(short, [])
            if model_id not in ids:
                ids.append(model_id)
    return entries, by_name, by_short


def _canonical_model_id(name: str) -> Optional[str]:
    _, by_name, by_short = _model_index()
    key = name.strip().rstrip("/").lower()
    if key in by_name:
        return by_name[key]
    if "/" not in key:
        ids = by_short.get(key, [])
        if len(ids) == 1:
            return ids[0]
    return None


def _entry_architecture(entry: dict[str, Any]) -> ModelArchitecture:
    return ModelArchitecture.model_validate({k: entry[k] for k in ARCH_FIELDS if entry.get(k) is not None})


def known_models() -> list[str]:
    """Hugging Face ids of every model in the built-in catalog."""
    return sorted(_model_index()[0])


def lookup_model(name: str) -> Optional[ModelArchitecture]:
    """The catalog's architecture for a model id or alias (case-insensitive).

    A bare name without an organisation ("Llama-3.1-8B-Instruct") matches when exactly
    one catalog model has that name.
    """
    model_id = _canonical_model_id(name)
    if model_id is None:
        return None
    return _entry_architecture(_model_index()[0][model_id])


def _catalog_source(name: str) -> Optional[str]:
    model_id = _canonical_model_id(name)
    if model_id is None:
        return None
    return str(_model_index()[0][model_id].get("source") or model_id)


# --------------------------------------------------------------------------- config.json
def _first(config: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        value = config.get(key)
        if value is not None:
            return value
    return None


def _positive_int(value: Any) -> Optional[int]:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and value > 0:
        return value
    return None


_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
           "half": "float16", "float32": "float32", "fp32": "float32", "float": "float32"}


def _out_of_range(err: pydantic.ValidationError) -> list[str]:
    """Each field and its bound, not pydantic's text: that quotes the values, which may come from a tenant's URL."""
    return [f"{CAMEL.get(str(e['loc'][0]), e['loc'][0])} ({e['msg'].lower()})" for e in err.errors()]


def architecture_from_config(config: dict[str, Any]) -> ModelArchitecture:
    """Read a Hugging Face config.json into a (partial) ModelArchitecture.

    Multimodal configs that nest the language model (``text_config``, as Gemma 3 and
    Mistral 3 do) are read from the nested part. Where config.json omits
    ``num_key_value_heads`` or ``head_dim``, the transformers defaults apply (all heads;
    hidden_size / num_attention_heads). ``parameter_count`` is never in config.json.
    """
    if not isinstance(config, dict):
        raise ValueError("not a JSON object")
    cfg = dict(config)
    for nested in ("text_config", "language_config", "llm_config"):
        inner = config.get(nested)
        if isinstance(inner, dict):
            cfg.update({k: v for k, v in inner.items() if v is not None})
            break

    num_layers = _positive_int(_first(cfg, "num_hidden_layers", "n_layer", "num_layers"))
    heads = _positive_int(_first(cfg, "num_attention_heads", "n_head", "n_heads"))
    hidden = _positive_int(_first(cfg, "hidden_size", "n_embd", "d_model"))
    kv_heads = _positive_int(_first(cfg, "num_key_value_heads", "num_kv_heads", "n_head_kv"))
    if kv_heads is None and heads is not None:
        kv_heads = heads
    head_dim = _positive_int(cfg.get("head_dim"))
    if head_dim is None and hidden and heads and hidden % heads == 0:
        head_dim = hidden // heads
    experts = _positive_int(_first(cfg, "num_local_experts", "num_experts", "n_routed_experts"))
    if experts is not None and experts < 2:
        experts = None
    intermediate = _positive_int(_first(cfg, "intermediate_size", "n_inner", "ffn_hidden_size"))
    moe_intermediate = _positive_int(cfg.get("moe_intermediate_size"))
    if experts is not None and moe_intermediate is not None:
        intermediate = moe_intermediate  # per-expert width: what the parameter estimate multiplies
    quantization = checkpoint_quantization(config)
    dtype_raw = _first(cfg, "torch_dtype", "dtype")
    dtype = _DTYPES.get(dtype_raw.lower()) if isinstance(dtype_raw, str) else None
    tie = cfg.get("tie_word_embeddings")

    window, window_layers = sliding_window_facts(cfg, num_layers)
    fields: dict[str, Any] = {
        "num_layers": num_layers,
        "num_attention_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "vocab_size": _positive_int(cfg.get("vocab_size")),
        "max_position_embeddings": _positive_int(
            _first(cfg, "max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
        ),
        "num_experts": experts,
        "tie_word_embeddings": tie if isinstance(tie, bool) else None,
        "sliding_window": window,
        "sliding_window_layers": window_layers,
        "encoder_only": True if str(cfg.get("model_type") or "").lower() in _ENCODER_ONLY else None,
        "pooling": True if served_as_pooling(config) else None,
        **vision_facts(config),
        "kv_lora_rank": _positive_int(cfg.get("kv_lora_rank")),
        "qk_rope_head_dim": _positive_int(cfg.get("qk_rope_head_dim")) if cfg.get("kv_lora_rank") else None,
        "torch_dtype": dtype,
        "quantization": quantization,
    }
    try:
        return ModelArchitecture.model_validate({k: v for k, v in fields.items() if v is not None})
    except pydantic.ValidationError as err:
        raise ValueError(f"out of range: {', '.join(_out_of_range(err))}") from None


#: Suffixes of config.json architectures vLLM 0.32 serves as generative models (config/model.py _SUFFIX_TO_DEFAULTS,
#: checked in its order: these come before the pooling ones and the catch-all "Model").
_GENERATIVE_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "ChatModel", "LMHeadModel")
#: ... and as pooling models (embed, classify, reward); "Model" (MistralModel, Qwen2Model) last, as vLLM has it.
_POOLING_SUFFIXES = ("ForTextEncoding", "EmbeddingModel", "ForSequenceClassification", "ForTokenClassification",
                     "ClassificationModel", "ForRewardModeling", "RewardModel", "Model")
#: vLLM 0.32's registry decides before the suffixes: these end in "Model" but it registers them as generative
#: (_TEXT_GENERATION_MODELS, _MULTIMODAL_MODELS) ...
_GENERATIVE_ARCHS = ("ChatGLMModel", "MiDashengLMModel", "MossAudioModel", "Qwen2_5OmniModel", "UltravoxModel")
#: ... and these have no pooling suffix but it registers them as pooling models.
_POOLING_ARCHS = ("BertForMaskedLM", "RobertaForMaskedLM", "ColPaliForRetrieval", "JinaVLForRanking")


def served_as_pooling(config: dict[str, Any]) -> bool:
    """Whether vLLM 0.32's runner "auto" serves the config's first architecture as a pooling model: by its registry
    where a name's suffix would mislead (the two lists above, read off vllm.model_executor.models.registry), else by
    the suffix, as config/model.py does. vLLM also pools a *ForCausalLM checkpoint whose repository has a
    sentence-transformers modules.json (Qwen3-Embedding), which config.json does not show: without
    spec.model.architecture.pooling such a model is sized as generative (a sampler it does not run: more memory set
    aside than vLLM takes, never less)."""
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        return False
    name = archs[0][:200]
    if name in _GENERATIVE_ARCHS or name in _POOLING_ARCHS:
        return name in _POOLING_ARCHS
    for suffix in _GENERATIVE_SUFFIXES + _POOLING_SUFFIXES:
        if name.endswith(suffix):
            return suffix in _POOLING_SUFFIXES
    return False


#: The image processors' default largest image in pixels, where config.json does not say it: Qwen2-VL and Qwen2.5-VL
#: ship preprocessor_config.json with max_pixels 12845056 (16384 embeddings of 28 x 28 pixels: "the default range
#: for the number of visual tokens per image in the model is 4-16384", Qwen's model cards).
_QWEN_VL_MAX_PIXELS = 12845056
#: vLLM 0.32's most frames in the dummy video it profiles Qwen2-VL / Qwen2.5-VL with (qwen2_vl._MAX_FRAMES_PER_VIDEO);
#: each pair of frames (temporal_patch_size) is one image-sized group of embeddings.
_QWEN_VL_MAX_VIDEO_FRAMES = 14


def vision_facts(config: dict[str, Any]) -> dict[str, int]:
    """The vision tower's profiling shapes (ModelArchitecture.vision_*), for the towers whose item size config.json
    (and the model's published processor defaults) fix: Gemma 3's SigLIP (mm_tokens_per_image embeddings from
    (image_size / patch_size)^2 patches; pan-and-scan is off by default) and Qwen2-VL / Qwen2.5-VL (max_pixels /
    (patch_size x spatial_merge_size)^2 embeddings, spatial_merge_size^2 patches each; a video of up to 14 frames is
    vision_video_frame_groups pairs of them). Other multimodal configs give {}: their tower's profiling peak is not
    sized (docs/sizing.md)."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return {}
    model_type = str(config.get("model_type") or "").lower()
    patch = _positive_int(vision.get("patch_size"))
    extra: dict[str, int] = {}
    if model_type == "gemma3":
        tokens, size = _positive_int(config.get("mm_tokens_per_image")), _positive_int(vision.get("image_size"))
        patches = (size // patch) ** 2 if size and patch else None
        width, inner = _positive_int(vision.get("hidden_size")), _positive_int(vision.get("intermediate_size"))
    elif model_type in ("qwen2_vl", "qwen2_5_vl"):
        merge = _positive_int(vision.get("spatial_merge_size"))
        tokens = _QWEN_VL_MAX_PIXELS // (patch * merge) ** 2 if patch and merge else None
        patches = tokens * merge**2 if tokens and merge else None
        temporal = _positive_int(vision.get("temporal_patch_size")) or 2
        extra["vision_video_frame_groups"] = max(1, _QWEN_VL_MAX_VIDEO_FRAMES // temporal)
        if model_type == "qwen2_vl":  # embed_dim and mlp_ratio; its hidden_size is the language model's
            width = _positive_int(vision.get("embed_dim"))
            ratio = vision.get("mlp_ratio")
            inner = int(width * ratio) if width and isinstance(ratio, (int, float)) and 0 < ratio <= 64 else None
        else:
            width, inner = _positive_int(vision.get("hidden_size")), _positive_int(vision.get("intermediate_size"))
    else:
        return {}
    if not (tokens and patches and width and inner):
        return {}
    return {"vision_tokens_per_item": tokens, "vision_patches_per_item": patches, "vision_hidden_size": width,
            "vision_intermediate_size": inner, **extra}


#: model_type values of encoder-only models, whose attention vLLM serves with EncoderOnlyAttention: no KV cache.
_ENCODER_ONLY = ("bert", "roberta", "xlm-roberta", "modernbert", "distilbert", "nomic_bert", "electra")
#: model_type values whose every layer attends within config.json's sliding_window (vLLM builds a SlidingWindowSpec
#: for each layer): Mistral 7B v0.1 and Mixtral write a window; v0.3 writes null, which leaves them all-global.
_ALL_LAYERS_SLIDE = ("mistral", "mixtral")
#: The largest layer_types list read (a model has at most ModelArchitecture's 1024 layers).
_MAX_LAYER_TYPES = 1024


def sliding_window_facts(cfg: dict[str, Any], num_layers: Optional[int]) -> tuple[Optional[int], Optional[int]]:
    """(sliding_window, how many layers use it) as vLLM reads them, or (None, None) for all-global attention.

    Only where the model positively uses the window: `layer_types` (gpt-oss, Gemma 3, recent configs), Gemma 3's
    `sliding_window_pattern` (every pattern-th layer is global), Gemma 2 (every other layer slides from the
    first), Mistral/Mixtral (every layer). A window with `use_sliding_window: false` (Qwen2/Qwen3) is unused. Any
    other config is sized as all-global attention: more KV per token than vLLM needs, never less.
    """
    window = _positive_int(cfg.get("sliding_window"))
    if window is None or cfg.get("use_sliding_window") is False:
        return None, None
    types = cfg.get("layer_types")
    if isinstance(types, list) and 0 < len(types) <= _MAX_LAYER_TYPES:
        sliding = sum(1 for t in types if t == "sliding_attention")
        return (window, sliding) if sliding else (None, None)
    model_type = str(cfg.get("model_type") or "").lower()
    pattern = _positive_int(cfg.get("sliding_window_pattern"))
    if num_layers is None:
        return None, None
    if model_type.startswith("gemma3") and pattern:
        return window, num_layers - num_layers // pattern
    if model_type == "gemma2":
        return window, (num_layers + 1) // 2
    if model_type in _ALL_LAYERS_SLIDE:
        return window, num_layers
    return None, None


#: quantization_config.quant_method as the Hub's configs write it -> ModelArchitecture.quantization. Anything else is
#: "other": a fetched value is never echoed into a status.
_QUANT_METHODS = {"awq": "awq", "gptq": "gptq", "fp8": "fp8", "compressed-tensors": "compressed-tensors",
                  "compressed_tensors": "compressed-tensors", "bitsandbytes": "bitsandbytes", "gguf": "gguf"}


def checkpoint_quantization(config: dict[str, Any]) -> str:
    """How a config.json says its weights are quantized ("none" without a quantization_config)."""
    qc = config.get("quantization_config")
    if qc is None and isinstance(config.get("text_config"), dict):
        qc = config["text_config"].get("quantization_config")
    if not isinstance(qc, dict):
        return "none"
    method = qc.get("quant_method")
    return _QUANT_METHODS.get(method.lower(), "other") if isinstance(method, str) else "other"


# --------------------------------------------------------------------------- estimates
def estimate_parameter_count(
    *,
    num_layers: int,
    num_attention_heads: int,
    num_kv_heads: int,
    head_dim: int,
    hidden_size: int,
    intermediate_size: int,
    vocab_size: int,
    num_experts: Optional[int] = None,
    tie_word_embeddings: Optional[bool] = None,
) -> int:
    """Parameters of a gated-MLP decoder from its shapes (biases, routers and vision towers ignored).

    Embeddings (doubled unless tied) + per layer: q and o projections, k and v projections,
    three MLP matrices per expert, two norms; plus the final norm.
    """
    embeddings = vocab_size * hidden_size * (1 if tie_word_embeddings else 2)
    attention = 2 * hidden_size * num_attention_heads * head_dim + 2 * hidden_size * num_kv_heads * head_dim
    mlp = 3 * hidden_size * intermediate_size * (num_experts or 1)
    return embeddings + num_layers * (attention + mlp + 2 * hidden_size) + hidden_size


def _estimate(fields: dict[str, Any]) -> int:
    known: dict[str, Any] = {
        k: fields.get(k) for k in (
            "num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "hidden_size",
            "intermediate_size", "vocab_size", "num_experts", "tie_word_embeddings",
        )
    }
    return estimate_parameter_count(**known)


# --------------------------------------------------------------------------- GPUs
#: The node label conventions a GPU can be selected by (spec.gpu.labelConvention).
LABEL_CONVENTIONS: tuple[str, ...] = ("GFD", "GKE", "Karpenter")
_GPU_PREFIXES = ("nvidia-", "tesla-", "geforce-")
_SHARED_SUFFIX = "-shared"  # GFD's rename of nvidia.com/gpu.product under time-slicing or MPS
_MIG_SUFFIX = re.compile(r"^(?P<gpu>.+)-mig-(?P<profile>[1-9]g\.[0-9]+gb)$")  # GFD's MIG "single" strategy


def _gpu_words(name: str) -> str:
    """Lower case, spaces and underscores as dashes: how GFD writes an NVML name, case aside."""
    return "-".join(name.strip().lower().replace("_", " ").replace("-", " ").split())


def _strip_prefixes(key: str) -> str:
    stripped = True
    while stripped:
        stripped = False
        for prefix in _GPU_PREFIXES:
            if key.startswith(prefix) and len(key) > len(prefix):
                key = key[len(prefix):]
                stripped = True
    return key


def _gpu_key(product: str) -> str:
    """The lookup key of a product or alias: its words without vendor prefixes."""
    return _strip_prefixes(_gpu_words(product))


def _split_suffixes(name: str) -> tuple[str, bool, Optional[str]]:
    """(words without GFD's suffixes, -SHARED seen, MIG profile of a -MIG-<profile> suffix)."""
    words = _gpu_words(name)
    shared = words.endswith(_SHARED_SUFFIX) and len(words) > len(_SHARED_SUFFIX)
    if shared:
        words = words[: -len(_SHARED_SUFFIX)]
    mig = _MIG_SUFFIX.match(words)
    if mig:
        return mig.group("gpu"), shared, mig.group("profile")
    return words, shared, None


@dataclass(frozen=True)
class _GPUIndex:
    gpus: tuple[GPUInfo, ...]
    by_key: dict[str, GPUInfo]  # product and alias keys
    families: dict[str, tuple[str, tuple[GPUInfo, ...]]]  # key -> (name as written, products)
    by_label: dict[str, dict[str, tuple[GPUInfo, ...]]]  # convention -> lower-cased label value -> products


def _gpu_info(entry: dict[str, Any]) -> GPUInfo:
    cc = str(entry["compute_capability"])
    major, minor = (int(part) for part in cc.split("."))
    memory = int(entry.get("memory_bytes") or int(entry["memory_mib"]) * 2**20)
    mig = tuple(sorted((str(profile).lower(), min(memory, int(mib) * 2**20))
                       for profile, mib in (entry.get("mig_mib") or {}).items()))
    return GPUInfo(
        product=entry["product"],
        memory_bytes=memory,
        compute_capability=cc,
        supports_fp8=bool(entry.get("supports_fp8", (major, minor) >= (8, 9))),
        memory_bandwidth_gbps=(float(entry["memory_bandwidth_gbps"])
                               if entry.get("memory_bandwidth_gbps") is not None else None),
        source=str(entry["source"]),
        memory_estimated=bool(entry.get("memory_estimated", False)),
        note=str(entry.get("note") or "").strip(),
        aliases=tuple(str(a) for a in entry.get("aliases") or ()),
        gke=tuple(str(v) for v in entry.get("gke") or ()),
        karpenter=str(entry["karpenter"]) if entry.get("karpenter") else None,
        karpenter_memory_mib=int(entry["karpenter_memory_mib"]) if entry.get("karpenter_memory_mib") else None,
        mig=mig,
    )


@functools.cache
def _gpu_index() -> _GPUIndex:
    data = _read_yaml("gpus.yaml") or {}
    gpus = tuple(_gpu_info(entry) for entry in data.get("gpus") or [])
    by_key: dict[str, GPUInfo] = {}
    aliases: set[str] = set()
    for info in gpus:
        for name in (info.product, *info.aliases):
            key = _gpu_key(name)
            if key in by_key and by_key[key] is not info:
                raise ValueError(f"gpus.yaml: {name!r} names both {by_key[key].product} and {info.product}")
            by_key[key] = info
            if name != info.product:
                aliases.add(key)
    by_product = {info.product: info for info in gpus}
    families: dict[str, tuple[str, tuple[GPUInfo, ...]]] = {}
    for family, members in (data.get("families") or {}).items():
        key = _gpu_key(str(family))
        # A family may share its key with a product (H200, NVIDIA-H200): the exact label means the product.
        if key in aliases:
            raise ValueError(f"gpus.yaml: family {family!r} is also an alias of {by_key[key].product}")
        unknown = [m for m in members if m not in by_product]
        if unknown or len(members) < 2:
            raise ValueError(f"gpus.yaml: family {family!r} needs two or more catalog products (unknown: {unknown})")
        families[key] = (str(family), tuple(by_product[m] for m in members))
    by_label: dict[str, dict[str, tuple[GPUInfo, ...]]] = {"GFD": {_gpu_words(i.product): (i,) for i in gpus}}
    for convention in ("GKE", "Karpenter"):
        values: dict[str, tuple[GPUInfo, ...]] = {}
        for info in gpus:
            for value in info.label_values(convention):
                values[value.lower()] = values.get(value.lower(), ()) + (info,)
        by_label[convention] = values
    return _GPUIndex(gpus, by_key, families, by_label)


def match_gpu(name: str, convention: str = "GFD") -> Optional[GPUMatch]:
    """What a gpu.product value names, or None when the catalog does not know it.

    Accepted, case-insensitively, with spaces, dashes and underscores alike, in this order: a GFD
    product label (NVIDIA-L4; NVIDIA-H200 is that product, H200 the family of it and the H200 NVL),
    a value of the label convention in use (GKE's nvidia-tesla-a100, Karpenter's a10g), with any
    convention a GKE accelerator name, a family (H100: every H100 product), an alias (L4), and last
    any of these with the dashes left out (L40-S, RTX6000-Ada). GFD's "-SHARED" and
    "-MIG-<profile>" suffixes are recognised and reported.
    """
    if not name or not name.strip():
        return None
    index = _gpu_index()
    words, shared, mig = _split_suffixes(name)
    for conv in dict.fromkeys(("GFD", convention, "GKE")):
        products = index.by_label.get(conv, {}).get(words)
        if products:
            family = name.strip() if len(products) > 1 else None
            return GPUMatch(products, family, shared, mig)
    key = _strip_prefixes(words)
    if key in index.families:
        family, products = index.families[key]
        return GPUMatch(products, family, shared, mig)
    if key in index.by_key:
        return GPUMatch((index.by_key[key],), None, shared, mig)
    # Last, dashes ignored (L40-S, A100-80-GB, RTX6000-Ada), where that names one product or family.
    compact = key.replace("-", "")
    found: set[tuple[Optional[str], tuple[GPUInfo, ...]]] = {
        (family, products) for k, (family, products) in index.families.items() if k.replace("-", "") == compact}
    found |= {(None, (info,)) for k, info in index.by_key.items() if k.replace("-", "") == compact}
    if len(found) == 1:
        family, products = found.pop()
        return GPUMatch(products, family, shared, mig)
    return None


def lookup_gpu(product: str) -> Optional[GPUInfo]:
    """The catalog entry for one GPU product (nvidia.com/gpu.product value or alias), or None.

    Case-insensitive; spaces and dashes are interchangeable; "NVIDIA-", "Tesla-" and
    "GeForce-" prefixes and GFD's "-SHARED" suffix are ignored. A family (H100) and a MIG
    slice (GFD's -MIG-1g.5gb) are not one GPU and return None: see match_gpu.
    """
    match = match_gpu(product)
    if match is None or match.family is not None or match.mig_profile is not None:
        return None
    return match.products[0]


def known_gpus() -> list[GPUInfo]:
    """Every GPU in the built-in catalog."""
    return list(_gpu_index().gpus)


def gpu_families() -> dict[str, tuple[GPUInfo, ...]]:
    """Family name (as gpus.yaml writes it) -> the products it selects."""
    return {name: products for name, products in _gpu_index().families.values()}


def mig_profiles() -> dict[str, tuple[GPUInfo, ...]]:
    """Every MIG profile the catalog knows -> the GPUs that have it."""
    profiles: dict[str, tuple[GPUInfo, ...]] = {}
    for info in _gpu_index().gpus:
        for profile, _ in info.mig:
            profiles[profile] = profiles.get(profile, ()) + (info,)
    return dict(sorted(profiles.items()))


def near_gpu_names(name: str, n: int = 3) -> list[str]:
    """Catalog names close to an unknown gpu.product (difflib over products, aliases and families).

    Each suggestion is what to write: a product's GFD label (also for an alias that matched) or a
    family's name. A name that starts with a known family or product ("H100-SXM5-94GB") suggests it too.
    """
    index = _gpu_index()
    words, _, _ = _split_suffixes(name)
    key = _strip_prefixes(words)
    shown: dict[str, str] = {k: info.product for k, info in index.by_key.items()}
    shown.update({k: family for k, (family, _) in index.families.items()})
    close = difflib.get_close_matches(key, list(shown), n=2 * n, cutoff=0.7)
    head = key.split("-", 1)[0]
    if head in shown and head != key:
        close.insert(0, head)
    return list(dict.fromkeys(shown[k] for k in close))[:n]
