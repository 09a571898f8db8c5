"""vLLM's own largest multimodal item for Qwen2-VL / Qwen2.5-VL, per max_model_len (no model files, no GPU).

Runs under the vLLM virtualenv's python. Reads from stdin a JSON object ``{"config": <config.json as a dict>,
"max_pixels": n, "min_pixels": n, "lengths": [max_model_len, ...]}`` and writes to stdout
``{"vllm_version": "0.32.0", "items": [{"image": n, "video": n}, ...], "batches": [...]}``: what
``Qwen2_5_VLProcessingInfo.get_mm_max_tokens_per_item(seq_len=length, mm_counts={"image": 1, "video": 1})``
returns, the per-modality sizes MultiModalBudget profiles the largest of (vllm/multimodal/encoder_budget.py); and
for each of the request's optional ``"batches"`` (``{"tokens", "batched", "seqs", "max_model_len"}``) the encoder
budget and how many items of that size vLLM profiles at once (``profiled_items``).

Two parts are stood in for, because the venv and the machine lack them, and only for that: transformers'
``image_processing_qwen2_vl`` module imports torchvision (not in the CPU venv), so it is replaced by a module that
runs that file's own ``smart_resize`` source and an image processor holding only the ``size`` the model's
preprocessor_config.json publishes (``min_pixels`` / ``max_pixels``, what vLLM reads from it); and the processing
context's model files (the Hub) are replaced by the config given. Everything vLLM computes from them is its own code.
"""

from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path


def _stand_in_image_processing_module() -> None:
    import transformers

    name = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
    source = (Path(transformers.__file__).parent / "models" / "qwen2_vl" / "image_processing_qwen2_vl.py").read_text()
    start = source.index("def smart_resize(")
    end = source.index("\n@", start)
    module = types.ModuleType(name)
    module.__dict__["math"] = math
    exec(source[start:end], module.__dict__)  # transformers' own function, without the torchvision import

    class Qwen2VLImageProcessor:
        def __init__(self, size: dict) -> None:
            self.size = size

    module.__dict__["Qwen2VLImageProcessor"] = Qwen2VLImageProcessor
    sys.modules[name] = module


def main() -> int:
    request = json.load(sys.stdin)
    real_stdout, sys.stdout = sys.stdout, sys.stderr  # vLLM's logs stay off the JSON
    _stand_in_image_processing_module()
    import vllm
    from transformers.models.qwen2_5_vl import Qwen2_5_VLConfig
    from vllm.model_executor.models.qwen2_5_vl import Qwen2_5_VLProcessingInfo

    config = Qwen2_5_VLConfig(**request["config"])
    image_processor = sys.modules["transformers.models.qwen2_vl.image_processing_qwen2_vl"].Qwen2VLImageProcessor(
        {"shortest_edge": request["min_pixels"], "longest_edge": request["max_pixels"]})
    info = Qwen2_5_VLProcessingInfo.__new__(Qwen2_5_VLProcessingInfo)
    info.get_hf_config = lambda *a, **k: config  # type: ignore[method-assign]
    info.get_image_processor = lambda *a, **k: image_processor  # type: ignore[method-assign]
    info._merge_and_resolve_mm_processor_kwargs = lambda kwargs: {}  # type: ignore[method-assign]  # no mm_processor_kwargs
    items = [dict(info.get_mm_max_tokens_per_item(seq_len=n, mm_counts={"image": 1, "video": 1}))
             for n in request["lengths"]]
    real_stdout.write(json.dumps({"vllm_version": vllm.__version__, "items": items,
                                  "batches": [profiled_items(**b) for b in request.get("batches", [])]}))
    return 0


def profiled_items(tokens: int, batched: int, seqs: int, max_model_len: int, limit: int = 999) -> dict:
    """vLLM's encoder budget and the number of items of `tokens` embeddings it profiles at once: a real
    SchedulerConfig, compute_mm_encoder_budget and MultiModalBudget._get_max_items (on an object holding the
    attributes that method reads: the budget, the limit, max_model_len and the scheduler's)."""
    from vllm.config import SchedulerConfig
    from vllm.multimodal.encoder_budget import MultiModalBudget
    from vllm.v1.core.encoder_cache_manager import compute_mm_encoder_budget

    scheduler = SchedulerConfig(max_num_batched_tokens=batched, max_num_seqs=seqs, max_model_len=max_model_len,
                                is_encoder_decoder=False)
    compute, cache = compute_mm_encoder_budget(scheduler, {"image": tokens})
    budget = types.SimpleNamespace(get_encoder_budget=lambda: min(compute, cache), mm_limits={"image": limit},
                                   max_model_len=max_model_len, scheduler_config=scheduler, max_num_reqs=seqs)
    _, per_batch = MultiModalBudget._get_max_items(budget, "image", tokens)  # type: ignore[arg-type]
    return {"budget": min(compute, cache), "items": per_batch}


if __name__ == "__main__":
    sys.exit(main())
