"""vLLM's own Llama 4 facts the planner sizes (no model files, no GPU): the image it profiles the vision tower with,
and what a chunked local attention layer keeps of a request.

Runs under the vLLM virtualenv's python. Reads from stdin ``{"config": <Llama 4 config.json as a dict>,
"in_flight": n, "lengths": [max_model_len, ...], "block_size": 16}`` and writes to stdout ``{"vllm_version",
"max_patches", "tiles", "embeddings_per_tile", "chunked_layers", "chunk_blocks": [...]}``:

- ``max_patches``: the image processor's default most tiles (transformers' ``Llama4ImageProcessor.max_patches``,
  which vLLM's ``Mllama4ProcessingInfo.get_max_num_tiles`` returns);
- ``tiles``: the tiles of the image vLLM profiles (``get_image_size_with_most_features``: max_patches tiles in a
  16:1 column) as transformers' ``find_supported_resolutions`` / ``get_best_fit`` cut it, plus the global tile vLLM
  adds to an image of more than one (``Mllama4MultiModalProcessor._call_hf_processor``: ``1 + r_h x r_w``, the one
  line restated here);
- ``embeddings_per_tile``: ``Mllama4ProcessingInfo.get_patch_per_chunk`` on the vision config;
- ``chunked_layers``: the layers vLLM's ``Llama4Attention`` gives the chunk (``no_rope_layers`` as transformers'
  ``Llama4TextConfig`` fills it);
- ``chunk_blocks``: ``ChunkedLocalAttentionSpec.max_admission_blocks_per_request`` for each length.

Stood in for, because the venv lacks torchvision and only for that: transformers' ``image_processing_llama4`` module
(which vLLM's mllama4 imports) imports torchvision, so it is replaced by a module running that file's own resolution
functions and an image processor holding the class body's ``max_patches``; the processing context's model files (the
Hub) are replaced by the config given.
"""

from __future__ import annotations

import json
import math
import re
import sys
import types
from collections import defaultdict
from functools import lru_cache
from pathlib import Path


def _processor_source() -> str:
    import transformers

    return (Path(transformers.__file__).parent / "models" / "llama4" / "image_processing_llama4.py").read_text()


def _resolution_functions(source: str) -> dict:
    import torch
    from transformers.image_utils import SizeDict

    namespace = {"math": math, "torch": torch, "SizeDict": SizeDict, "lru_cache": lru_cache,
                 "defaultdict": defaultdict}
    for name in ("get_factors", "get_max_res_without_distortion", "find_supported_resolutions", "get_best_fit"):
        at = source.index(f"def {name}(")
        start = at - len("@lru_cache(maxsize=1)\n") if source[:at].endswith("@lru_cache(maxsize=1)\n") else at
        end = re.search(r"\n(?=def |class |@)", source[at:])  # the next top-level definition
        exec(source[start:at + end.start()] if end else source[start:], namespace)
    return namespace


def _stand_in_image_processing_module(source: str) -> int:
    """transformers' image_processing_llama4 without its torchvision import: the file's own resolution functions,
    and an image processor holding the class body's max_patches. Returns max_patches."""
    name = "transformers.models.llama4.image_processing_llama4"
    module = types.ModuleType(name)
    module.__dict__.update(_resolution_functions(source))
    max_patches = int(re.search(r"^class Llama4ImageProcessor\b.*?^    max_patches = (\d+)$", source,
                                re.M | re.S).group(1))
    module.__dict__["Llama4ImageProcessor"] = type("Llama4ImageProcessor", (), {"max_patches": max_patches})
    sys.modules[name] = module
    return max_patches


def main() -> int:
    request = json.load(sys.stdin)
    real_stdout, sys.stdout = sys.stdout, sys.stderr  # vLLM's logs stay off the JSON
    max_patches = _stand_in_image_processing_module(_processor_source())
    import torch
    import vllm
    from transformers.image_utils import SizeDict
    from transformers.models.llama4 import Llama4Config, Llama4TextConfig
    from vllm.model_executor.models.mllama4 import Mllama4ProcessingInfo, find_supported_resolutions, get_best_fit
    from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec

    config = request["config"]
    hf_config = Llama4Config(**config)
    vision = hf_config.vision_config
    info = Mllama4ProcessingInfo.__new__(Mllama4ProcessingInfo)
    info.get_hf_config = lambda *a, **k: hf_config  # type: ignore[method-assign]
    info.get_max_num_tiles = lambda: max_patches  # type: ignore[method-assign]  # the processor's max_patches
    size = info.get_image_size_with_most_features()
    tile = vision.image_size
    resolutions = find_supported_resolutions(max_num_chunks=max_patches, patch_size=SizeDict(height=tile, width=tile))
    # as _call_hf_processor: get_best_fit on (height, width)
    best = get_best_fit((size.height, size.width), torch.tensor(resolutions), resize_to_max_canvas=False)
    r_h, r_w = int(best[0]) // tile, int(best[1]) // tile
    tiles = 1 if r_h * r_w == 1 else 1 + r_h * r_w
    text = Llama4TextConfig(**config["text_config"])
    spec = ChunkedLocalAttentionSpec(block_size=request["block_size"], num_kv_heads=text.num_key_value_heads,
                                     head_size=text.head_dim, dtype=torch.bfloat16,
                                     attention_chunk_size=text.attention_chunk_size)
    real_stdout.write(json.dumps({
        "vllm_version": vllm.__version__, "max_patches": max_patches, "tiles": tiles,
        "embeddings_per_tile": Mllama4ProcessingInfo.get_patch_per_chunk(vision),
        "chunked_layers": sum(1 for r in text.no_rope_layers if r != 0),
        "chunk_blocks": [spec.max_admission_blocks_per_request(request["in_flight"], n) for n in request["lengths"]],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
