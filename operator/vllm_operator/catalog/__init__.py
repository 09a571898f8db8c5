"""The catalog: facts about models and GPUs that the planner sizes vLLM with.

One job: answer "what is this model's architecture?" and "how much memory does this
GPU have?" -- from built-in data (``models.yaml``, ``gpus.yaml``), a model's
``config.json`` (a URL, a local directory, or the Hugging Face Hub with its safetensors
metadata: ``hub.py``), and the ``spec.model.architecture`` overrides, in that order of
precedence. Fields nobody gave are derived where the arithmetic is unambiguous and reported
as estimated.

Pure apart from :func:`fetch_config` and ``hub.lookup`` (which the caller can replace, and :class:`ConfigCache`
can keep answers of) and :func:`read_config_file`, which only the offline CLI uses: in the
operator a config.json comes over http(s) or not at all, since the operator's own files are
none of a tenant's business. Nothing here touches the network at import time, and the YAML
files are read once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import difflib
import functools
import os
import re
import threading
import time
import urllib.parse
from collections import OrderedDict
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable, Optional, Protocol, Union, cast

import pydantic
import yaml

from .. import fetch as net
from .. import hub
from ..api import ModelArchitecture, ModelSpec

__all__ = [
    "GPUInfo",
    "GPUMatch",
    "ResolvedModel",
    "ConfigCache",
    "UnknownModelError",
    "architecture_from_config",
    "estimate_parameter_count",
    "fetch_config",
    "hf_config_url",
    "gpu_families",
    "known_gpus",
    "known_models",
    "lookup_gpu",
    "match_gpu",
    "mig_profiles",
    "near_gpu_names",
    "lookup_model",
    "read_config_file",
    "resolve_model",
]

#: Architecture fields, snake_case, in ModelArchitecture order.
ARCH_FIELDS: tuple[str, ...] = tuple(ModelArchitecture.model_fields)
#: snake_case field -> the camelCase name users write under spec.model.architecture.
CAMEL: dict[str, str] = {
    name: (field.alias or name) for name, field in ModelArchitecture.model_fields.items()
}
#: The largest config.json read. Real ones are under 100 KB (most under 10 KB; the long ones list
#: id2label maps or quantization ignore lists), so 1 MiB is ten times that, and parsing 1 MiB of the
#: worst JSON for memory (empty objects) peaks at tens of MB, where 16 MiB of it peaked at 454 MiB RSS.
MAX_CONFIG_BYTES = 2**20


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


def _out_of_range(err: pydantic.ValidationError) -> list[str]:
    """Each field and its bound, not pydantic's text: that quotes the values, which may come from a tenant's URL."""
    return [f"{CAMEL.get(str(e['loc'][0]), e['loc'][0])} ({e['msg'].lower()})" for e in err.errors()]


def fetch_config(url: str, *, timeout: float = 5.0) -> dict[str, Any]:
    """A config.json from an http(s) URL, within `timeout` seconds in all (ValueError with a category else).

    Through vllm_operator.fetch: no redirect, a total deadline, MAX_CONFIG_BYTES, and errors that quote nothing
    the server sent, since the URL is a tenant's (spec.model.configURL) and the operator's network is not."""
    try:
        body = net.get(url, seconds=timeout, max_bytes=MAX_CONFIG_BYTES, accept="application/json",
                         use_proxy=True)
    except net.FetchError as err:
        raise ValueError(f"could not fetch config.json from {url}: {err}") from None
    return _config_object(body, url)


def read_config_file(path: str) -> dict[str, Any]:
    """A config.json from a file or a directory holding one: for the offline CLI only (the operator never
    reads its own files for a tenant)."""
    path = path[len("file://"):] if path.startswith("file://") else path
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise ValueError(f"could not read config.json at {path}: {err.strerror or err}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(f"config.json at {path}: {net.too_large(MAX_CONFIG_BYTES)}")
    return _config_object(raw, path)


def _config_object(raw: bytes, where: str) -> dict[str, Any]:
    try:
        data = net.load_json(raw)
    except net.FetchError as err:
        raise ValueError(f"config.json at {where}: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config.json at {where}: not a JSON object")
    return data


class ConfigCache:
    """The architecture each config.json gave, per (URL, revision), so that a reconcile does not fetch it again.

    Facts are kept `ttl` seconds. When a refetch fails, the last good facts stand in, with a note (a Hub
    outage must not turn running servers invalid), and a failed URL is tried again after `retry` seconds,
    not at every reconcile (one that answers slowly would cost a deadline each time). The `max_entries`
    most recently used are kept: the URLs are the tenants' to choose."""

    @dataclass(frozen=True)
    class _Entry:
        architecture: Any = None
        fetched_at: float = 0.0
        error: Optional[str] = None
        failed_at: float = 0.0

    def __init__(self, ttl: float = 600.0, retry: float = 60.0, max_entries: int = 1024,
                 clock: Callable[[], float] = time.time):
        self.ttl, self.retry, self.max_entries, self._clock = ttl, retry, max_entries, clock
        self._entries: OrderedDict[tuple[str, Optional[str]], ConfigCache._Entry] = OrderedDict()
        self._lock = threading.Lock()

    def facts(self, url: str, revision: Optional[str], load: Callable[[], Any]) -> tuple[Any, str]:
        """What `load` gave (an architecture, or the Hub's facts) and, when it is the last good one standing in, a
        note saying so. ValueError
        when no fetch of this URL has succeeded (the same one again until the retry is due)."""
        key, now = (url, revision), self._clock()
        entry = self._get(key)
        if entry.architecture is not None and now - entry.fetched_at < self.ttl:
            return entry.architecture, ""
        if entry.error is None or now - entry.failed_at >= self.retry:
            try:
                architecture = load()
            except ValueError as err:
                entry = self._put(key, dataclasses.replace(entry, error=str(err), failed_at=now))
            else:
                self._put(key, self._Entry(architecture, now))
                return architecture, ""
        if entry.architecture is None:
            raise ValueError(entry.error)
        fetched = dt.datetime.fromtimestamp(entry.fetched_at, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return entry.architecture, f"warning: {entry.error}; planned with the facts it gave at {fetched}"

    def _get(self, key: tuple[str, Optional[str]]) -> "ConfigCache._Entry":
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
        return entry or self._Entry()

    def _put(self, key: tuple[str, Optional[str]], entry: "ConfigCache._Entry") -> "ConfigCache._Entry":
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return entry


def hf_config_url(model_name: str, revision: Optional[str], endpoint: str) -> str:
    """The URL of a model's config.json on a Hugging Face compatible endpoint."""
    rev = urllib.parse.quote(revision or "main", safe="")
    return f"{endpoint.rstrip('/')}/{model_name.strip('/')}/resolve/{rev}/config.json"


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


# --------------------------------------------------------------------------- resolve
def _given(arch: Optional[ModelArchitecture]) -> dict[str, Any]:
    if arch is None:
        return {}
    return {k: getattr(arch, k) for k in ARCH_FIELDS if getattr(arch, k) is not None}


def resolve_model(
    model: ModelSpec,
    *,
    hf_endpoint: Optional[str] = None,
    fetch: Callable[[str], dict[str, Any]] = fetch_config,
    local_files: bool = False,
    cache: Optional[ConfigCache] = None,
    hub_lookup: Callable[..., hub.HubFacts] = hub.lookup,
    hf_token: Union[str, bool, None] = False,
) -> ResolvedModel:
    """Combine catalog, config.json and spec into a complete architecture.

    Precedence, lowest to highest: the catalog entry; the config.json (from
    ``spec.model.configURL``, from the model directory when ``name`` is a local
    directory and `local_files` allows it (the CLI), or from the Hub at ``hf_endpoint`` when the
    model is not in the catalog, with the exact parameter count of its safetensors metadata
    (`hub_lookup`, sending `hf_token`: hub.lookup's token); each field given under
    ``spec.model.architecture``.
    Then the derivable fields are filled and listed in ``estimated``. Raises
    UnknownModelError when the result is still too incomplete to plan with, and
    ValueError when an explicitly requested config.json cannot be read. `cache` keeps
    fetched facts (ConfigCache) and may answer with older ones and a note.
    """
    fields: dict[str, Any] = {}
    sources: list[str] = []  # lowest precedence first
    fetch_problem = ""
    notes: tuple[str, ...] = ()
    stored_weight_bytes: Optional[int] = None

    catalog = lookup_model(model.name)
    if catalog is not None:
        fields.update(_given(catalog))
        sources.append(f"catalog ({_catalog_source(model.name)})")

    config_location, explicit = _config_location(model, hf_endpoint, catalog is not None, local_files)
    from_hub = config_location is not None and not explicit and hf_endpoint is not None
    if config_location is not None:
        try:
            if from_hub:
                assert hf_endpoint is not None
                from_the_hub, note = _hub_architecture(model, hf_endpoint, hub_lookup, hf_token, cache)
                from_config, stored_weight_bytes = from_the_hub.architecture, from_the_hub.stored_weight_bytes
            else:
                from_config, note = _config_architecture(config_location, model.revision, fetch, local_files, cache)
        except ValueError as err:
            if explicit:
                raise
            fetch_problem = str(err)
        else:
            fields.update(_given(from_config))
            sources.append(f"Hub ({config_location}: config.json, safetensors metadata)" if from_hub
                           else f"config.json ({config_location})")
            notes = (note,) if note else ()

    spec_fields = _given(model.architecture)
    if spec_fields:
        fields.update(spec_fields)
        sources.append("spec")

    estimated: list[str] = []
    heads = fields.get("num_attention_heads")
    if heads and not fields.get("num_kv_heads"):
        fields["num_kv_heads"] = heads
        estimated.append("num_kv_heads")
    if heads and fields.get("hidden_size") and not fields.get("head_dim") and fields["hidden_size"] % heads == 0:
        fields["head_dim"] = fields["hidden_size"] // heads
        estimated.append("head_dim")
    if heads and fields.get("head_dim") and not fields.get("hidden_size"):
        fields["hidden_size"] = heads * fields["head_dim"]
        estimated.append("hidden_size")

    missing = [CAMEL[k] for k in ("num_layers", "num_attention_heads", "hidden_size", "max_position_embeddings")
               if not fields.get(k)]
    if heads and fields.get("hidden_size") and not fields.get("head_dim"):
        missing.append(CAMEL["head_dim"])  # hidden_size is not a multiple of the head count
    if not fields.get("vocab_size") and (fields.get("parameter_count") or fields.get("intermediate_size")):
        missing.append(CAMEL["vocab_size"])
    elif not fields.get("parameter_count") and not (fields.get("vocab_size") and fields.get("intermediate_size")):
        absent = [CAMEL[k] for k in ("vocab_size", "intermediate_size") if not fields.get(k)]
        missing.append(f"{' and '.join(absent)} (or {CAMEL['parameter_count']})")
    if missing:
        if "num_kv_heads" in estimated or not heads:
            missing.append(f"{CAMEL['num_kv_heads']} (optional; defaults to {CAMEL['num_attention_heads']})")
        raise UnknownModelError(model.name, missing, fetch_problem)

    if from_hub and fields.get("parameter_count") and not (model.architecture and model.architecture.parameter_count):
        notes = (*notes, _exact_count_note(fields))
    if not fields.get("parameter_count"):
        fields["parameter_count"] = _estimate(fields)
        estimated.append("parameter_count")
    elif not fields.get("intermediate_size"):
        # Back-solve the MLP width from the parameter count (used for activation estimates only).
        without_mlp = _estimate({**fields, "intermediate_size": 0})
        per_unit = 3 * fields["hidden_size"] * fields["num_layers"] * (fields.get("num_experts") or 1)
        width = (fields["parameter_count"] - without_mlp) // per_unit
        if width < 1:
            raise UnknownModelError(model.name, [CAMEL["intermediate_size"]],
                                    "parameterCount is too small for the other shapes")
        fields["intermediate_size"] = width
        estimated.append("intermediate_size")
    if not fields.get("torch_dtype"):
        fields["torch_dtype"] = "bfloat16"
        estimated.append("torch_dtype")

    if not sources:
        source = "spec"
    elif sources[-1] == "spec" and len(sources) > 1:
        source = "spec over " + " over ".join(reversed(sources[:-1]))
    else:
        source = " over ".join(reversed(sources))
    try:
        architecture = ModelArchitecture.model_validate(fields)
    except pydantic.ValidationError as err:  # an estimate beyond the API's bounds: the spec has to give it
        raise UnknownModelError(model.name, _out_of_range(err), "estimated beyond the API's bounds") from None
    if model.architecture and model.architecture.parameter_count:
        stored_weight_bytes = None  # the spec's count is what the spec wants sized
    return ResolvedModel(architecture=architecture, source=source, estimated=tuple(estimated), notes=notes,
                         stored_weight_bytes=stored_weight_bytes)


def _config_location(model: ModelSpec, hf_endpoint: Optional[str], in_catalog: bool,
                     local_files: bool) -> tuple[Optional[str], bool]:
    """Where the model's config.json is, if anywhere, and whether the spec named it (a failure is then the
    spec's to fix; a Hugging Face endpoint's is only a detail of an incomplete architecture)."""
    if model.config_url:
        return model.config_url, True
    if local_files and os.path.isdir(model.name):
        return model.name, True
    if hf_endpoint and not in_catalog:
        return f"{hf_endpoint.rstrip('/')}/{model.name.strip('/')}", False
    return None, True


#: safetensors dtypes the Hub counts -> the config.json dtype they are (for a config.json without torch_dtype).
_SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


@dataclass(frozen=True)
class _HubArchitecture:
    architecture: ModelArchitecture
    stored_weight_bytes: Optional[int]


def _hub_architecture(model: ModelSpec, endpoint: str, lookup: Callable[..., hub.HubFacts],
                      token: Union[str, bool, None], cache: Optional[ConfigCache]) -> tuple[_HubArchitecture, str]:
    """The architecture the Hub gives (config.json and the safetensors metadata), and a note when older facts stand
    in for it. The Hub's parameter count is the checkpoint's exact one when its weights are stored unpacked (16 or
    32 bits, fp8): a 4-bit checkpoint's count is of packed elements (an AWQ int32 holds eight weights), so there
    the shapes' estimate stays."""

    def load() -> _HubArchitecture:
        try:
            facts = lookup(model.name, model.revision, endpoint=endpoint, token=token)
        except hub.HubError as err:
            raise ValueError(f"the Hub at {endpoint}: {err}") from None
        architecture = _facts(facts.config, f"{endpoint}/{model.name}")
        update: dict[str, Any] = {}
        if facts.total and architecture.quantization in ("none", "fp8"):
            update["parameter_count"] = facts.total
        if architecture.torch_dtype is None and facts.parameters:
            dominant = max(facts.parameters, key=facts.parameters.__getitem__)
            update["torch_dtype"] = _SAFETENSORS_DTYPES.get(dominant)
        try:
            return _HubArchitecture(ModelArchitecture.model_validate({**_given(architecture), **_given_values(update)}),
                                    facts.stored_bytes)
        except pydantic.ValidationError as err:
            raise ValueError(f"the Hub at {endpoint}: out of range: {', '.join(_out_of_range(err))}") from None

    key = f"hub:{endpoint.rstrip('/')}/{model.name}"
    return cache.facts(key, model.revision, load) if cache is not None else (load(), "")


def _given_values(update: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in update.items() if v is not None}


def _exact_count_note(fields: dict[str, Any]) -> str:
    """The Hub's exact count beside what the shapes give: the planner sized the weights with the exact one."""
    exact = fields["parameter_count"]
    shapes = ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "hidden_size", "intermediate_size",
              "vocab_size")
    if not all(fields.get(k) for k in shapes):
        return f"weights sized with the Hub's exact parameter count {exact:,} (safetensors metadata)"
    derived = _estimate(fields)
    return (f"weights sized with the Hub's exact parameter count {exact:,} (safetensors metadata); config.json's "
            f"shapes give {derived:,} ({(derived - exact) / exact:+.2%})")


def _config_architecture(location: str, revision: Optional[str], fetch: Callable[[str], dict[str, Any]],
                         local_files: bool, cache: Optional[ConfigCache]) -> tuple[ModelArchitecture, str]:
    """The architecture a config.json gives, and a note when older facts stand in for it."""
    if local_files and urllib.parse.urlsplit(location).scheme.lower() not in ("http", "https"):
        return _facts(read_config_file(location), location), ""

    def load() -> ModelArchitecture:
        return _facts(fetch(location), location)

    return cache.facts(location, revision, load) if cache is not None else (load(), "")


def _facts(config: dict[str, Any], location: str) -> ModelArchitecture:
    try:
        return architecture_from_config(config)
    except ValueError as err:
        raise ValueError(f"config.json at {location}: {err}") from None


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
