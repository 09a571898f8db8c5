"""One sizing row on the GPU machine: start real vLLM once (random weights of the real sizes, no tokenizer) and report
what it allocated, or why it refused.

Usage (GPU machine): python3 run_one.py ROW_JSON
ROW_JSON: {"id": ..., "model_dir": ..., "args": {vllm.LLM keyword arguments}}
Prints one line 'RESULT_JSON {...}' at the end; vLLM's own log goes to stdout/stderr (runner.py parses it).
"""
import json
import sys
import time
import traceback


#: A Qwen2-VL-family processor's image settings (its preprocessor_config.json on the Hub) and the special tokens
#: its prompts use, at the ids config.json names.
QWEN_VL_PREPROCESSOR = {"image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
                        "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "merge_size": 2,
                        "temporal_patch_size": 2, "do_resize": True, "do_rescale": True, "do_normalize": True,
                        "rescale_factor": 0.00392156862745098, "do_convert_rgb": True,
                        "image_mean": [0.48145466, 0.4578275, 0.40821073],
                        "image_std": [0.26862954, 0.26130258, 0.27577711]}
QWEN_VL_TOKENS = {"<|vision_start|>": "vision_start_token_id", "<|vision_end|>": "vision_end_token_id",
                  "<|vision_pad|>": "vision_token_id", "<|image_pad|>": "image_token_id",
                  "<|video_pad|>": "video_token_id"}


def lay_out_processor(row: dict) -> str:
    """A copy of the model's folder with a word-level tokenizer of its vocabulary (its image tokens at their ids)
    and the processor's config, so vLLM can build the dummy images of its profile."""
    import os
    import shutil
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from serve_one import tokenizer_files
    where = f"/root/models-with-processor/{row['model']}"
    shutil.copytree(row["model_dir"], where, dirs_exist_ok=True)
    config = json.load(open(os.path.join(where, "config.json")))
    vocab = (config.get("text_config") or {}).get("vocab_size") or config["vocab_size"]
    specials = {tok: config[key] for tok, key in QWEN_VL_TOKENS.items() if key in config}
    for name, text in tokenizer_files(vocab, specials).items():
        open(os.path.join(where, name), "w").write(text)
    json.dump(QWEN_VL_PREPROCESSOR, open(os.path.join(where, "preprocessor_config.json"), "w"))
    return where


def main() -> None:
    t0 = time.time()
    row = json.load(open(sys.argv[1]))
    res = {"id": row["id"], "ok": False}
    try:
        import torch
        import vllm
        from vllm import LLM
        res["vllm_version"] = vllm.__version__
        res["torch_version"] = torch.__version__
        kw = dict(model=row["model_dir"], load_format="dummy", skip_tokenizer_init=True, tensor_parallel_size=1,
                  seed=0)
        kw.update(row["args"])
        if row.get("processor"):  # a multimodal profile needs the model's processor: a tokenizer and its config
            kw.update(model=lay_out_processor(row), skip_tokenizer_init=False)
        res["llm_kwargs"] = kw
        llm = LLM(**kw)
        res["ok"] = True
        res["startup_s"] = round(time.time() - t0, 1)
        vc = llm.llm_engine.vllm_config
        cc, sc, mc = vc.cache_config, vc.scheduler_config, vc.model_config
        res.update(num_gpu_blocks=cc.num_gpu_blocks, block_size=cc.block_size, cache_dtype=str(cc.cache_dtype),
                   gpu_memory_utilization=cc.gpu_memory_utilization, max_num_seqs=sc.max_num_seqs,
                   max_num_batched_tokens=sc.max_num_batched_tokens, max_model_len=mc.max_model_len,
                   quantization=mc.quantization, enforce_eager=mc.enforce_eager)
        for key, get in (("compilation_mode", lambda: str(vc.compilation_config.mode)),
                         ("cudagraph_mode", lambda: str(vc.compilation_config.cudagraph_mode)),
                         ("use_v2_model_runner", lambda: bool(vc.use_v2_model_runner)),
                         ("async_scheduling", lambda: bool(sc.async_scheduling)),
                         ("runner_type", lambda: str(mc.runner_type)),
                         # --enable-lora's settings as vLLM took them (None without LoRA)
                         ("lora_config", lambda: None if vc.lora_config is None else {
                             k: getattr(vc.lora_config, k, None) for k in (
                                 "max_loras", "max_lora_rank", "max_cpu_loras", "lora_dtype",
                                 "fully_sharded_loras")})):
            try:
                res[key] = get()
            except Exception as e:  # an attribute this release lacks
                res[key] = f"unknown: {e}"
        if cc.num_gpu_blocks and cc.block_size:
            res["tokens_blocks_x_block_size"] = cc.num_gpu_blocks * cc.block_size
    except BaseException as e:  # a refusal is a result too
        res["error"] = f"{type(e).__name__}: {e}"[-3000:]
        res["traceback_tail"] = traceback.format_exc()[-4000:]
    res["wall_s"] = round(time.time() - t0, 1)
    print("RESULT_JSON " + json.dumps(res, default=str), flush=True)


if __name__ == "__main__":
    main()
