"""The memory math: bytes per weight and per KV token, the KV cache's layout (sliding windows, MLA), the
activation and vision-encoder peaks, non-torch memory, how tensor parallelism shards. Pure functions of the
architecture."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

from .. import vllm_flags
from ..api import VLLMServerSpec
from ..catalog import Architecture, ResolvedModel
from ..validation import PREQUANTIZED
from .assumptions import BYTES_PER_WEIGHT, GiB, ProfileTerms, assumption, profile_terms


# --------------------------------------------------------------------------- helpers
def gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def _round_down(n: float, step: int) -> int:
    return int(n // step * step)


def dtype_bytes(spec: VLLMServerSpec, model: ResolvedModel) -> int:
    """Bytes per element of weights/activations in the compute dtype."""
    dtype = spec.model.dtype
    if dtype == "auto":
        # vLLM's auto: the checkpoint's dtype, but float32 checkpoints run in 16-bit.
        return 2
    return 4 if dtype == "float32" else 2


def kv_bytes_per_token_per_layer(arch: Architecture, tp: int, kv_dtype: str, elem_bytes: int) -> int:
    """One token's KV in one layer on one GPU, as vLLM's KV cache specs size a page (vllm/v1/kv_cache_interface.py).

    Attention (FullAttentionSpec, SlidingWindowSpec): 2 (K and V) x max(1, kv_heads // TP) x head_dim x dtype
    bytes. Multi-head latent attention (MLAAttentionSpec, DeepSeek V2/V3, Kimi K2): one latent of kv_lora_rank +
    qk_rope_head_dim values, not per head and not split by TP (every GPU holds it whole)."""
    kv_elem = 1 if kv_dtype.startswith("fp8") else elem_bytes
    if arch.kv_lora_rank:
        return (arch.kv_lora_rank + (arch.qk_rope_head_dim or 0)) * kv_elem
    kv_heads_per_gpu = max(1, arch.num_kv_heads // tp)
    return 2 * kv_heads_per_gpu * arch.head_dim * kv_elem


def kv_bytes_per_token(arch: Architecture, tp: int, kv_dtype: str, elem_bytes: int) -> int:
    """One token's KV in every layer on one GPU (what a token costs while it is inside every window)."""
    return arch.num_layers * kv_bytes_per_token_per_layer(arch, tp, kv_dtype, elem_bytes)


@dataclass(frozen=True)
class KVLayout:
    """How vLLM pools one GPU's KV cache for a model (vllm/v1/core/kv_cache_utils.py).

    Layers are put into groups of one attention type and `group_size` layers each (full attention, sliding
    window; _get_kv_cache_groups_uniform_page_size: the smaller type's count, or the larger when it is under 1.5x
    the smaller, padding the last group). One block of the shared pool holds `block_size` tokens of every layer
    of one group, so it costs group_size pages, and a request takes blocks from every group: cdiv(length,
    block_size) from each full-attention group, and from each sliding group only what its window keeps
    (SlidingWindowSpec.max_admission_blocks_per_request: cdiv(min(window - 1 + tokens in flight, length),
    block_size) + 1). vLLM logs num_blocks / blocks_per_request(max_model_len) x max_model_len as "GPU KV cache
    size: N tokens" (get_kv_cache_capacity)."""

    page_bytes: int
    full_layers: int
    sliding_layers: int = 0
    sliding_window: int = 0
    block_size: int = 16

    @property
    def group_size(self) -> int:
        counts = [n for n in (self.full_layers, self.sliding_layers) if n]
        small, large = min(counts), max(counts)
        return large if large < small * 1.5 else small

    @property
    def groups(self) -> tuple[int, int]:
        """(full-attention groups, sliding-window groups)."""
        size = self.group_size
        return -(-self.full_layers // size), -(-self.sliding_layers // size)

    @property
    def bytes_per_block(self) -> int:
        return self.group_size * self.page_bytes

    def num_blocks(self, available_bytes: float) -> int:
        return max(0, int(available_bytes // self.bytes_per_block))

    def blocks_per_request(self, length: int, in_flight: int) -> int:
        full, sliding = self.groups
        blocks = full * -(-length // self.block_size)
        if sliding:
            kept = min(self.sliding_window - 1 + in_flight, length)
            blocks += sliding * (-(-kept // self.block_size) + 1)
        return blocks

    def tokens(self, available_bytes: float, length: int, in_flight: int) -> int:
        """vLLM's "GPU KV cache size: N tokens" for requests of `length` tokens."""
        return int(self.num_blocks(available_bytes) / self.blocks_per_request(length, in_flight) * length)

    def longest_request(self, available_bytes: float, in_flight: int) -> int:
        """The longest request (a whole number of blocks) whose blocks fit the pool: vLLM refuses a longer
        --max-model-len (check_enough_kv_cache_memory)."""
        blocks = self.num_blocks(available_bytes)
        full, sliding = self.groups
        if not full:  # every layer slides: any length fits once the window's blocks do
            fits = sliding * (-(-(self.sliding_window - 1 + in_flight) // self.block_size) + 1) <= blocks
            return 10**9 if fits else 0
        # The sliding groups' share saturates at the window, so take it at its largest (a length past the window).
        window_blocks = self.blocks_per_request(10**9, in_flight) - full * -(-10**9 // self.block_size)
        longest = (blocks - window_blocks) // full * self.block_size
        if longest <= self.sliding_window - 1 + in_flight:  # shorter than the window: every group grows with it
            longest = blocks // (full + sliding) * self.block_size
            while longest > 0 and self.blocks_per_request(longest, in_flight) > blocks:
                longest -= self.block_size
        return max(0, longest)


#: vLLM turns its hybrid KV cache manager off for chunked local attention (Llama 4) when this is 0
#: (config/vllm.py; default 1 in the releases the operator supports: an H200 row with it on, tests/data/gpu c01).
CHUNKED_HYBRID_ENV = "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE"


def hybrid_kv_off(spec: VLLMServerSpec) -> Optional[str]:
    """What in the spec makes vLLM keep every layer's KV whole (its hybrid KV cache manager off), or None:
    --disable-hybrid-kv-cache-manager in engine.extraArgs (the last of it and --no-disable-... wins), or
    VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE in engine.env with a value other than a non-zero integer (a
    valueFrom counts: the plan cannot read it). The variable only turns the manager off for chunked local
    attention; a sliding-window model keeps it, and is then sized as global: below what vLLM holds, never above."""
    off: Optional[str] = None
    for arg in spec.engine.extra_args:
        flag = vllm_flags.normalise(arg.partition("=")[0])
        if flag == "--disable-hybrid-kv-cache-manager":
            off = "--disable-hybrid-kv-cache-manager in engine.extraArgs"
        elif flag == "--no-disable-hybrid-kv-cache-manager":
            off = None
    if off:
        return off
    for env in spec.engine.env:
        if env.name == CHUNKED_HYBRID_ENV:
            try:
                on = env.value_from is None and int(env.value) != 0
            except ValueError:
                on = False
            if not on:
                return f"{CHUNKED_HYBRID_ENV} in engine.env"
    return None


def kv_layout(arch: Architecture, tp: int, kv_dtype: str, elem_bytes: int, hybrid: bool = True) -> KVLayout:
    """The model's KVLayout on one GPU: sliding-window layers (arch.sliding_window, sliding_window_layers) in
    their own groups, every other layer full attention; MLA pages from the latent width. Without vLLM's hybrid KV
    cache manager (`hybrid` False: hybrid_kv_off) every layer keeps its whole KV, as full attention."""
    page = int(assumption("block_size")) * kv_bytes_per_token_per_layer(arch, tp, kv_dtype, elem_bytes)
    sliding = 0
    if hybrid and arch.sliding_window and not arch.kv_lora_rank:
        sliding = min(arch.num_layers, arch.sliding_window_layers if arch.sliding_window_layers is not None
                      else arch.num_layers)
    return KVLayout(page_bytes=page, full_layers=arch.num_layers - sliding, sliding_layers=sliding,
                    sliding_window=(arch.sliding_window or 0) if sliding else 0, block_size=int(assumption("block_size")))


def tokens_in_flight(batched_tokens: int, terms: Optional[ProfileTerms] = None, pooling: bool = False) -> int:
    """Tokens scheduled but not yet settled, that a sliding window keeps beside its window
    (VllmConfig.max_in_flight_tokens): max_num_batched_tokens per concurrent batch (ProfileTerms). A pooling model
    has one batch in flight: vLLM 0.32 turns async scheduling off for the pooling runner (VllmConfig.__post_init__)."""
    return (1 if pooling else (terms or profile_terms()).concurrent_batches) * batched_tokens


def is_pooling(arch: Architecture) -> bool:
    """vLLM serves the model with its pooling runner: an encoder-only model, or a decoder marked pooling."""
    return bool(arch.encoder_only or arch.pooling)


def weight_bytes(arch: Architecture, quantization: str, elem_bytes: int) -> int:
    """Bytes of all weights; quantization leaves the embeddings and lm_head in 16-bit."""
    params = arch.parameter_count
    per = BYTES_PER_WEIGHT[quantization]
    if per is None:
        return params * elem_bytes
    if quantization == "mxfp4" and arch.num_experts:
        # MXFP4 checkpoints (gpt-oss) quantize the experts' three matrices only: their quantization_config's
        # modules_to_not_convert keeps attention, the router and the embeddings in 16-bit. With the kernels'
        # padding and scales (mxfp4_overhead) they come to the weights vLLM logged for gpt-oss on an H100.
        experts = min(arch.num_layers * arch.num_experts * 3 * arch.hidden_size * arch.intermediate_size, params)
        return int(experts * per * assumption("mxfp4_overhead") + (params - experts) * elem_bytes)
    embed = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
    embed = min(embed, params)
    overhead = assumption("quant_overhead") if per < 1 else 1.0
    return int((params - embed) * per * overhead + embed * elem_bytes)


def rotary_cache_bytes(arch: Architecture, elem_bytes: int) -> int:
    """The rotary embedding's cos/sin cache, max positions x head dim, on every GPU.

    vLLM counts it with the weights: 131072 x 128 x 2 bytes = 0.031 GiB is exactly the gap between
    Llama-3.1-8B's 8.03e9 x 2 bytes (14.957 GiB) and the 14.9888 GiB vLLM logged (vllm issue 10517).
    """
    return arch.max_position_embeddings * arch.head_dim * elem_bytes


def mm_limits(extra_args: list[str]) -> dict[str, int]:
    """--limit-mm-per-prompt from extraArgs, as vLLM 0.32 reads it: a JSON object ('{"image": 2, "video": 0}', a
    modality's value a count or {"count": n, ...}) or one modality per flag (--limit-mm-per-prompt.video 0). Only
    counts are read; what is not a count is left out (vLLM's own default for that modality applies)."""
    out: dict[str, int] = {}
    for i, arg in enumerate(extra_args):
        flag, eq, value = arg.partition("=")
        if not flag.startswith("--limit-mm-per-prompt"):
            continue
        if not eq:
            value = extra_args[i + 1] if i + 1 < len(extra_args) else ""
        modality = flag.removeprefix("--limit-mm-per-prompt")
        try:
            parsed = json.loads(value)
        except ValueError:
            continue
        items = {modality[1:]: parsed} if modality.startswith(".") else parsed if modality == "" else {}
        for name, limit in (items.items() if isinstance(items, dict) else ()):
            count = limit.get("count") if isinstance(limit, dict) else limit
            if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
                out[str(name)] = count
    return out


def vision_item(arch: Architecture, max_model_len: Optional[int], terms: Optional[ProfileTerms] = None,
                limits: Optional[dict[str, int]] = None) -> tuple[int, int]:
    """(embeddings, patches) of the multimodal item vLLM profiles the vision tower with: the largest one item of any
    allowed modality gives (MultiModalBudget.get_modality_with_max_tokens; --limit-mm-per-prompt 0 disallows one).
    An image is vision_tokens_per_item; a video (vision_video_frame_groups) as many image-sized groups of frames as
    max_model_len holds, at least one (Qwen2VLProcessingInfo.get_num_frames_with_most_features). (0, 0) without a
    vision tower's facts, or with every modality disallowed."""
    tokens, patches = arch.vision_tokens_per_item, arch.vision_patches_per_item
    limits = limits or {}
    images, videos = limits.get("image", 1) > 0, limits.get("video", 1) > 0
    groups = arch.vision_video_frame_groups if (terms or profile_terms()).videos_profiled else None
    if not (tokens and patches) or not (images or (groups and videos)):
        return 0, 0
    n = min(groups, max(1, max_model_len // tokens)) if groups and videos and max_model_len else 1
    return tokens * n, patches * n


def vision_profile_bytes(arch: Architecture, tp: int, batched_tokens: int, elem_bytes: int,
                         max_model_len: Optional[int] = None, terms: Optional[ProfileTerms] = None,
                         limits: Optional[dict[str, int]] = None) -> tuple[int, int]:
    """(the vision tower's peak, the embeddings it leaves in the encoder cache) in vLLM 0.32's multimodal profiling
    run (gpu_model_runner.profile_run), which comes before the language model's: 0, 0 for a model without
    ModelArchitecture.vision_* facts.

    vLLM's encoder budget is max(max_num_batched_tokens, embeddings of one item) (SchedulerConfig:
    encoder_cache_size and max_num_encoder_input_tokens are max_num_batched_tokens; compute_mm_encoder_budget), and
    it profiles budget // embeddings items of the largest one (vision_item) at once (MultiModalBudget._get_max_items;
    its other bound, max_num_seqs x items per prompt, only lowers that, so the count here is never below vLLM's). The
    tower's peak is its forward pass over every item's patches, sized per patch as the language model's forward pass
    is per token (ASSUMPTIONS activation_hidden_factor; the MLP split by TP, mm_encoder_tp_mode "weights"); the
    embeddings stay in the encoder cache until the profile ends."""
    tokens, patches = vision_item(arch, max_model_len, terms, limits)
    width, inner = arch.vision_hidden_size, arch.vision_intermediate_size
    if not (tokens and width and inner):
        return 0, 0
    items = max(1, max(batched_tokens, tokens) // tokens)
    per_patch = (2 * inner / tp + assumption("activation_hidden_factor") * width) * elem_bytes
    return int(items * patches * per_patch), items * tokens * arch.hidden_size * elem_bytes


def runs_v2(arch: Architecture, terms: Optional[ProfileTerms] = None) -> bool:
    """The release serves the model on Model Runner V2 with V2's memory profile (ProfileTerms.v2_runner): a
    generative model that is not a mixture of experts (vLLM 0.26 config/vllm.py _is_default_v2_model_runner_model;
    pooling and MoE models run on V1)."""
    return (terms or profile_terms()).v2_runner and not arch.num_experts and not is_pooling(arch)


def activation_bytes(arch: Architecture, tp: int, batched_tokens: int, max_num_seqs: int, elem_bytes: int,
                     terms: Optional[ProfileTerms] = None, max_model_len: Optional[int] = None,
                     limits: Optional[dict[str, int]] = None) -> int:
    """Peak memory of vLLM's profiling run: the forward pass over `batched_tokens`, or the sampler's
    dummy run over `max_num_seqs` logits rows that follows it (holding only the hidden states), whichever is larger;
    a pooling model (encoder-only, or a decoder marked pooling) runs its pooler instead of a sampler (no logits).
    The logits are the whole vocabulary on every GPU (the LM head's output is gathered before sampling), so TP does
    not divide them: llm-d's H100 logs show 4.84 GiB for Llama-3.3-70B at TP=2 against 4.76 for Llama-3.1-8B.
    A multimodal model's vision tower runs first; its embeddings are held through the rest (vision_profile_bytes; a
    video item grows with max_model_len), except on a V2 runner whose profile runs no encoder (vLLM 0.26)."""
    per_token = (2 * arch.intermediate_size / tp + assumption("activation_hidden_factor") * arch.hidden_size) * elem_bytes
    forward = batched_tokens * per_token
    language = forward
    terms = terms or profile_terms()
    if runs_v2(arch, terms):
        # V2's profile: its sampler skips top-k/top-p; a cold torch.compile holds one vocabulary x hidden matrix
        # (the embedding's size) at its peak, which is larger than the forward pass for small batches
        language = max(forward, arch.vocab_size * arch.hidden_size / tp * elem_bytes) + terms.v2_peak_margin
    elif not is_pooling(arch):
        rows = min(max_num_seqs, batched_tokens)
        logits = (terms or profile_terms()).logits_bytes
        sampler = rows * arch.vocab_size * logits + batched_tokens * arch.hidden_size * elem_bytes
        language = max(forward, sampler)
        if arch.num_experts:  # the fused-MoE workspace stays allocated through the sampler's run
            language += terms.moe_workspace_factor * batched_tokens * arch.hidden_size * elem_bytes
    if runs_v2(arch, terms) and not terms.v2_encoder_profiled:
        return int(language)  # the release's V2 profile runs no encoder (ProfileTerms.v2_encoder_profiled)
    tower, embeddings = vision_profile_bytes(arch, tp, batched_tokens, elem_bytes, max_model_len, terms, limits)
    return int(max(tower, embeddings + language))


def non_torch_bytes(tp: int, terms: Optional[ProfileTerms] = None) -> int:
    """Non-torch memory per GPU: the release's TP=1 figure, plus its TP overhead from two GPUs on."""
    terms = terms or profile_terms()
    return int(terms.non_torch + (terms.tp_overhead if tp > 1 else 0))


def _divisors(n: int, limit: int = 64) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def tp_shards_evenly(arch: Architecture, tp: int) -> bool:
    """Whether vLLM can shard the model over `tp` GPUs: TP divides the attention heads, and the KV
    heads split evenly (kv % tp) or are replicated evenly (tp % kv) (QKVParallelLinear's divide())."""
    if arch.num_attention_heads % tp:
        return False
    kv = arch.num_kv_heads
    return kv % tp == 0 if kv >= tp else tp % kv == 0


def valid_tp_sizes(arch: Architecture, limit: int = 16) -> list[int]:
    return [d for d in _divisors(arch.num_attention_heads, limit) if tp_shards_evenly(arch, d)]


def weights_quantization(spec: VLLMServerSpec, arch: Architecture) -> str:
    """The quantization the weights are sized with: the spec's, or with none the checkpoint's own."""
    checkpoint = arch.quantization
    if spec.model.quantization == "none" and checkpoint in BYTES_PER_WEIGHT and checkpoint != "none":
        return checkpoint
    return spec.model.quantization


def loads_as_stored(spec: VLLMServerSpec, arch: Architecture) -> bool:
    """vLLM loads a quantized checkpoint's weights as they are stored: with model.quantization none (it reads the
    method from the checkpoint) or the checkpoint's own method. A 16-bit checkpoint is not (fp8 quantizes it as it
    loads; a float32 one runs in 16 bits)."""
    checkpoint, wanted = arch.quantization, spec.model.quantization
    if checkpoint in (None, "none"):
        return False
    return wanted == "none" or PREQUANTIZED.get(wanted, wanted) == checkpoint
