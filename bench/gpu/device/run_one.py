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
                         ("runner_type", lambda: str(mc.runner_type))):
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
