"""The catalog: facts about models and GPUs that the planner sizes vLLM with. Pure.

One job: answer "what is this model's architecture?" and "how much memory does this
GPU have?" from built-in data (``models.yaml``, ``gpus.yaml``) and a model's parsed
``config.json``. Fields nobody gave are derived where the arithmetic is unambiguous and
reported as estimated. Where the facts come from (the Hub, a configURL, the spec's overrides,
in order of precedence) is ``sources/model_facts.py``, the one step that does I/O. The YAML
files are read once.

The package: ``models`` (the model index, the types the planner sizes with, parameter estimates), ``config``
(config.json parsing) and ``gpus`` (the GPU table and how spec.gpu selects from it: node requirements, the
resource, the memory to plan with). Every name is importable from ``vllm_operator.catalog``.
"""

from .models import (
    ARCH_FIELDS, Architecture, CAMEL, COMPLETE_FIELDS, ResolvedModel, UnknownModelError, estimate_parameter_count,
    known_models, lookup_model,
)
from .config import (
    architecture_from_config, checkpoint_quantization, served_as_pooling, sliding_window_facts, vision_facts,
)
from .gpus import (
    GPUInfo, GPUMatch, LABEL_CONVENTIONS, gpu_families, known_gpus, lookup_gpu, match_gpu, mig_profiles,
    near_gpu_names,
)

__all__ = [
    "ARCH_FIELDS", "Architecture", "CAMEL", "COMPLETE_FIELDS", "ResolvedModel", "UnknownModelError",
    "estimate_parameter_count", "known_models", "lookup_model", "architecture_from_config", "checkpoint_quantization", "served_as_pooling",
    "sliding_window_facts", "vision_facts", "GPUInfo", "GPUMatch", "LABEL_CONVENTIONS", "gpu_families",
    "known_gpus", "lookup_gpu", "match_gpu", "mig_profiles", "near_gpu_names",
]
