"""A model's config.json, parsed: the architecture it gives, whether it is served for pooling, its vision
tower, sliding windows and the checkpoint's quantization. Pure: the bytes are fetched in sources/model_facts.py."""

from __future__ import annotations

from typing import Any, Optional

import pydantic

from ..api import ModelArchitecture
from .models import CAMEL


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
    cfg = _language_config(config)
    attention = _attention_fields(cfg)
    experts, intermediate = _feed_forward(cfg)
    quantization = checkpoint_quantization(config)
    dtype_raw = _first(cfg, "torch_dtype", "dtype")
    dtype = _DTYPES.get(dtype_raw.lower()) if isinstance(dtype_raw, str) else None
    tie = cfg.get("tie_word_embeddings")

    window, window_layers = sliding_window_facts(cfg, attention["num_layers"])
    fields: dict[str, Any] = {
        **attention,
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


def _language_config(config: dict[str, Any]) -> dict[str, Any]:
    """The config.json with its nested language model's keys (text_config, language_config, llm_config: the
    first present) over the top level's."""
    cfg = dict(config)
    for nested in ("text_config", "language_config", "llm_config"):
        inner = config.get(nested)
        if isinstance(inner, dict):
            cfg.update({k: v for k, v in inner.items() if v is not None})
            break
    return cfg


def _attention_fields(cfg: dict[str, Any]) -> dict[str, Optional[int]]:
    """The layers and the attention's shape (num_layers, num_attention_heads, num_kv_heads, head_dim,
    hidden_size), with transformers' defaults for KV heads (all heads) and head width (hidden / heads)."""
    num_layers = _positive_int(_first(cfg, "num_hidden_layers", "n_layer", "num_layers"))
    heads = _positive_int(_first(cfg, "num_attention_heads", "n_head", "n_heads"))
    hidden = _positive_int(_first(cfg, "hidden_size", "n_embd", "d_model"))
    kv_heads = _positive_int(_first(cfg, "num_key_value_heads", "num_kv_heads", "n_head_kv"))
    if kv_heads is None and heads is not None:
        kv_heads = heads
    head_dim = _positive_int(cfg.get("head_dim"))
    if head_dim is None and hidden and heads and hidden % heads == 0:
        head_dim = hidden // heads
    return {"num_layers": num_layers, "num_attention_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim,
            "hidden_size": hidden}


def _feed_forward(cfg: dict[str, Any]) -> tuple[Optional[int], Optional[int]]:
    """The experts (None below two) and the feed-forward width: per expert for a mixture of experts."""
    experts = _positive_int(_first(cfg, "num_local_experts", "num_experts", "n_routed_experts"))
    if experts is not None and experts < 2:
        experts = None
    intermediate = _positive_int(_first(cfg, "intermediate_size", "n_inner", "ffn_hidden_size"))
    moe_intermediate = _positive_int(cfg.get("moe_intermediate_size"))
    if experts is not None and moe_intermediate is not None:
        intermediate = moe_intermediate  # per-expert width: what the parameter estimate multiplies
    return experts, intermediate


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
#: Llama 4's image processor's default most tiles (preprocessor_config.json max_patches 16; config.json does not say
#: it). vLLM profiles the image with the most features, max_patches tiles in a 16:1 column
#: (Mllama4ProcessingInfo.get_image_size_with_most_features), which the processor cuts into 16 tiles plus the global
#: one it adds to any image of more than one tile.
_LLAMA4_MAX_TILES = 16
#: vLLM 0.32's most frames in the dummy video it profiles Qwen2-VL / Qwen2.5-VL with (qwen2_vl._MAX_FRAMES_PER_VIDEO);
#: each pair of frames (temporal_patch_size) is one image-sized group of embeddings.
_QWEN_VL_MAX_VIDEO_FRAMES = 14


def vision_facts(config: dict[str, Any]) -> dict[str, int]:
    """The vision tower's profiling shapes (ModelArchitecture.vision_*), for the towers whose item size config.json
    (and the model's published processor defaults) fix: Gemma 3's SigLIP (mm_tokens_per_image embeddings from
    (image_size / patch_size)^2 patches; pan-and-scan is off by default) and Qwen2-VL / Qwen2.5-VL (max_pixels /
    (patch_size x spatial_merge_size)^2 embeddings, spatial_merge_size^2 patches each; a video of up to 14 frames is
    vision_video_frame_groups pairs of them), and Mistral 3's Pixtral ((image_size / patch_size)^2 patches of the
    largest image, image_size square, as vLLM profiles it; (grid + 1) x grid embeddings after the spatial merge, a
    break token closing each row), and Llama 4's (16 + 1 tiles of the tallest image, each (image_size /
    patch_size)^2 patches and a class token, pixel-shuffled to 1 / pixel_shuffle_ratio^2 fewer embeddings). Other
    multimodal configs give {}: their tower's profiling peak is not sized (docs/sizing.md)."""
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
    elif model_type == "mistral3":
        size, merge = _positive_int(vision.get("image_size")), _positive_int(config.get("spatial_merge_size")) or 1
        side = size // patch if size and patch else 0
        tokens, patches = (side // merge + 1) * (side // merge) or None, side * side or None
        width, inner = _positive_int(vision.get("hidden_size")), _positive_int(vision.get("intermediate_size"))
    elif model_type == "llama4":
        size, ratio = _positive_int(vision.get("image_size")), vision.get("pixel_shuffle_ratio")
        per_tile = (size // patch) ** 2 if size and patch else 0
        shuffle = round(1 / ratio**2) if isinstance(ratio, (int, float)) and 0.01 <= ratio <= 1 else 0
        tiles = _LLAMA4_MAX_TILES + 1
        tokens = tiles * (per_tile // shuffle) if shuffle else None
        patches = tiles * (per_tile + 1) if per_tile else None
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

    Llama 4's chunked local attention (`attention_chunk_size` on the layers `no_rope_layers` marks 1; three of
    every four, no_rope_layer_interval 4, when the list is absent or empty, as transformers fills it) is a window
    of the chunk: vLLM's ChunkedLocalAttentionSpec keeps chunk + tokens in flight of a request, one block less
    than a SlidingWindowSpec of that window (measured on an H200: tests/data/gpu, c01).
    """
    chunk = _positive_int(cfg.get("attention_chunk_size"))
    if chunk is not None and num_layers:
        rope = cfg.get("no_rope_layers")
        if isinstance(rope, list) and len(rope) == num_layers:
            chunked = sum(1 for r in rope if r)
        else:
            interval = _positive_int(cfg.get("no_rope_layer_interval")) or 4
            chunked = num_layers - num_layers // interval
        return (chunk, chunked) if chunked else (None, None)
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
                  "compressed_tensors": "compressed-tensors", "bitsandbytes": "bitsandbytes", "gguf": "gguf",
                  "mxfp4": "mxfp4"}


def checkpoint_quantization(config: dict[str, Any]) -> str:
    """How a config.json says its weights are quantized ("none" without a quantization_config)."""
    qc = config.get("quantization_config")
    if qc is None and isinstance(config.get("text_config"), dict):
        qc = config["text_config"].get("quantization_config")
    if not isinstance(qc, dict):
        return "none"
    method = qc.get("quant_method")
    return _QUANT_METHODS.get(method.lower(), "other") if isinstance(method, str) else "other"
