"""Log vLLM's memory terms in bytes (its own log rounds them to 0.01 GiB). Loaded by every Python process on the GPU
machine whose PYTHONPATH holds this folder (vLLM's engine core too); it changes nothing vLLM does: it wraps two
functions to print what they computed, as one 'VLLM_PROBE {json}' line each.

- Worker.determine_available_memory (vllm/v1/worker/gpu_worker.py): the requested budget, the initial free memory,
  the weights, the torch peak and non-torch increases, the CUDA-graph estimate and the KV bytes it returns.
  With LoRA (--enable-lora), the bytes of the LoRA slots' GPU tensors (every `*lora*` tensor of the model's modules,
  views counted once, by the module's class), which the weights figure includes: vLLM allocates them inside
  load_model's memory profiler (vllm/v1/worker/gpu/model_runner.py load_model -> load_lora_model).
- get_kv_cache_configs (vllm/v1/core/kv_cache_utils.py): the number of blocks and the groups (layers, spec type,
  block size, page bytes, sliding window) the pool was laid out in.
"""
import importlib.abc
import importlib.util
import json
import sys


def _say(kind, data):
    try:
        print("VLLM_PROBE " + json.dumps({"probe": kind, **data}, default=str), flush=True)
    except Exception:
        pass


def _lora_bytes(runner):
    """The LoRA slots' GPU bytes, by the wrapping module's class; None without LoRA."""
    if runner is None or getattr(runner, "lora_config", None) is None:
        return None
    import torch
    model = getattr(runner, "model", None)
    while model is not None and not isinstance(model, torch.nn.Module):  # a graph or compile wrapper
        model = getattr(model, "runnable", None) or getattr(model, "model", None)
    if model is None:
        return {"error": "no nn.Module found"}
    seen, by_class = set(), {}
    for _name, mod in model.named_modules():
        items = [(k, v) for k, v in vars(mod).items() if "lora" in k] + list(getattr(mod, "_buffers", {}).items())
        for key, val in items:
            if "lora" not in key:
                continue
            for t in (val if isinstance(val, (tuple, list)) else [val]):
                if isinstance(t, torch.Tensor) and t.is_cuda:
                    ptr = t.untyped_storage().data_ptr()
                    if ptr in seen:
                        continue
                    seen.add(ptr)
                    cls = type(mod).__name__
                    by_class[cls] = by_class.get(cls, 0) + t.untyped_storage().nbytes()
    return {"total": sum(by_class.values()), "by_class": by_class}


def _patch_worker(module):
    worker = getattr(module, "Worker", None)
    if worker is None or not hasattr(worker, "determine_available_memory"):
        return
    original = worker.determine_available_memory

    def determine_available_memory(self, *a, **kw):
        out = original(self, *a, **kw)
        snap = getattr(self, "init_snapshot", None)
        runner = getattr(self, "model_runner", None)
        _say("memory", {
            "returned_kv_bytes": out,
            "available_kv_cache_memory_bytes": getattr(self, "available_kv_cache_memory_bytes", None),
            "requested_memory": getattr(self, "requested_memory", None),
            "init_free_memory": getattr(snap, "free_memory", None),
            "total_memory": getattr(snap, "total_memory", None),
            "init_torch_memory": getattr(snap, "torch_memory", None),
            "init_non_torch_memory": getattr(snap, "non_torch_memory", None),
            "weights_memory": getattr(runner, "model_memory_usage", None),
            "torch_peak_increase": getattr(self, "peak_activation_memory", None),
            "non_torch_increase": getattr(self, "non_torch_memory", None),
            "cudagraph_memory_estimate": getattr(self, "cudagraph_memory_estimate", None),
            "model_runner": type(runner).__module__ if runner is not None else None,
        })
        try:
            lora = _lora_bytes(runner)
            if lora is not None:
                _say("lora", lora)
        except Exception as e:
            _say("lora", {"error": repr(e)})
        return out

    worker.determine_available_memory = determine_available_memory


def _patch_kv(module):
    original = getattr(module, "get_kv_cache_configs", None)
    if original is None:
        return

    def get_kv_cache_configs(*a, **kw):
        configs = original(*a, **kw)
        try:
            c = configs[0]
            groups = []
            for g in c.kv_cache_groups:
                spec = g.kv_cache_spec
                groups.append({"layers": len(g.layer_names), "spec": type(spec).__name__,
                               "block_size": getattr(spec, "block_size", None),
                               "page_size_bytes": getattr(spec, "page_size_bytes", None),
                               "sliding_window": getattr(spec, "sliding_window", None),
                               "dtype": str(getattr(spec, "dtype", ""))})
            _say("kv_cache_config", {"num_blocks": c.num_blocks, "groups": groups,
                                     "tensor_bytes": sum(t.size for t in c.kv_cache_tensors)})
        except Exception as e:
            _say("kv_cache_config", {"error": repr(e)})
        return configs

    module.get_kv_cache_configs = get_kv_cache_configs


_TARGETS = {"vllm.v1.worker.gpu_worker": _patch_worker, "vllm.v1.core.kv_cache_utils": _patch_kv}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _TARGETS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module, _exec=loader_exec, _name=name):
            _exec(module)
            try:
                _TARGETS[_name](module)
            except Exception as e:
                _say("patch_error", {"module": _name, "error": repr(e)})

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Finder())
