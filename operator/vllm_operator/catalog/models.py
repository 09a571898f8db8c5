"""The built-in model index (models.yaml, each entry with its source), the types a resolved model is handed
to the planner in, and the parameter count estimated from a model's shapes."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from typing import Any, Optional, Protocol, cast

import yaml

from ..api import ModelArchitecture


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
        found = f" ({detail})" if detail else ""
        message = (
            f"model {model!r} is not in the built-in catalog and its architecture is incomplete{found}: give its "
            f"config.json (spec.model.configURL, or for `plan` a local copy: --model-config PATH), look it up on "
            f"the Hub or a mirror (--hf-endpoint URL; not --offline), or set {fields} under spec.model.architecture"
        )
        super().__init__(message)


#: How to plan a model outside the catalog without the public Hub: the one place for these words.
HUB_ADVICE = ("Without the Hub: --offline with the model's config.json (plan --model-config PATH, or "
              "spec.model.configURL), or a mirror (--hf-endpoint URL, HF_ENDPOINT)")


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
