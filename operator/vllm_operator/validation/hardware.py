"""What the checkpoint and the GPU rule out: model.quantization against the checkpoint's own, the attention
backend extraArgs choose, and each one's compute capability as the image's vLLM release gates it."""

from __future__ import annotations

import difflib
import json
from typing import Any, Optional

from .. import vllm_flags
from ..api import VLLMServerSpec
from ..catalog import Architecture
from ..catalog.gpus import GPUSelection
from .extra_args import _is_value, flag_check
from .tables import QUANTIZATION_CHOICES, UNSUPPORTED_QUANTIZATION, Problem


#: model.quantization methods that need weights quantized beforehand -> the checkpoint method they read.
PREQUANTIZED = {"awq": "awq", "awq_marlin": "awq", "gptq": "gptq", "gptq_marlin": "gptq",
                "compressed-tensors": "compressed-tensors", "gguf": "gguf"}


def quantization_problems(spec: VLLMServerSpec, arch: Architecture) -> list[Problem]:
    """model.quantization against the checkpoint's own (known only from its config.json), as vLLM 0.32 checks
    them at start: a method that needs quantized weights on a 16-bit checkpoint, or another method than the
    checkpoint's (awq_marlin and gptq_marlin read awq and gptq checkpoints; fp8 also quantizes 16-bit weights as
    they load)."""
    checkpoint, wanted = arch.quantization, spec.model.quantization
    if checkpoint is None or wanted == "none":
        return []
    field = "spec.model.quantization"
    if checkpoint == "none":
        if wanted in PREQUANTIZED:
            return [Problem(field, f"{wanted} needs a checkpoint quantized with {PREQUANTIZED[wanted]}, and "
                            f"{spec.model.name}'s config.json has no quantization_config (its weights are 16-bit): "
                            "serve it with quantization none or fp8 (quantized as it loads), or name a "
                            f"{PREQUANTIZED[wanted].upper()} checkpoint")]
        return []
    if PREQUANTIZED.get(wanted, wanted) != checkpoint:
        said = "a method vLLM does not know here" if checkpoint == "other" else checkpoint
        return [Problem(field, f"{wanted} contradicts the checkpoint, whose config.json says it is quantized with "
                        f"{said}: set quantization none (vLLM then reads the checkpoint's method)"
                        + (f" or {checkpoint}" if checkpoint in QUANTIZATION_CHOICES else ""))]
    return []


def _capability(gpu: Any) -> int:
    major, _, minor = str(gpu.compute_capability).partition(".")
    return int(major) * 10 + int(minor or 0)


#: The flags that choose the attention backend (vllm/engine/arg_utils.py): --attention-backend NAME, and the
#: backend key of --attention-config (dotted, or in its JSON), which vLLM refuses together with the former.
ATTENTION_BACKEND_FLAG = "--attention-backend"
ATTENTION_CONFIG_FLAG = "--attention-config"
ATTENTION_BACKEND_ENV = "VLLM_ATTENTION_BACKEND"


def chosen_attention_backends(spec: VLLMServerSpec) -> list[tuple[str, str]]:
    """(field, backend name as vLLM reads it: upper case) for each place extraArgs choose an attention backend;
    "auto" (vLLM's own choice) is none. Linear in extraArgs."""
    extra, out = list(spec.engine.extra_args), []
    for i, token in enumerate(extra):
        flag, eq, inline = token.partition("=")
        flag = vllm_flags.normalise(flag)
        value = inline if eq else (extra[i + 1] if i + 1 < len(extra) and _is_value(extra[i + 1]) else None)
        if value is None:
            continue
        if flag == ATTENTION_BACKEND_FLAG or flag == f"{ATTENTION_CONFIG_FLAG}.backend":
            name: Any = value
        elif flag == ATTENTION_CONFIG_FLAG:
            try:
                config = json.loads(value)
            except ValueError:
                continue
            name = config.get("backend") if isinstance(config, dict) else None
        else:
            continue
        if isinstance(name, str) and name.lower() != "auto":
            out.append((f"spec.engine.extraArgs[{i + (0 if eq else 1)}]", name.upper()))
    return out


def attention_problems(spec: VLLMServerSpec, snap: vllm_flags.Snapshot, exact: bool = True) -> list[Problem]:
    """An attention backend vLLM does not have (its AttentionBackendEnum: vLLM refuses the name when it builds its
    config, after the parser let it through), and VLLM_ATTENTION_BACKEND where the release no longer reads it (the
    server would pick its own backend, silently). `exact`: the snapshot is the image's release's own; another
    release may know other names, so only the latter is checked otherwise."""
    out = []
    if snap.attention_backends and exact:
        for where, name in chosen_attention_backends(spec):
            if name not in snap.attention_backends:
                near = difflib.get_close_matches(name, list(snap.attention_backends), n=3)
                out.append(Problem(where, f"vLLM {snap.version} has no attention backend {name[:64]!r} and would exit "
                                   "at start: " + (f"did you mean {', '.join(near)}? " if near else "")
                                   + "Name one of its backends, or auto (vLLM picks the best one for the GPU)"))
    for i, env in enumerate(spec.engine.env):
        if env.name == ATTENTION_BACKEND_ENV and snap.attention_backends and not snap.attention_backend_env:
            out.append(Problem(f"spec.engine.env[{i}]", f"vLLM {snap.version} does not read {ATTENTION_BACKEND_ENV}: "
                               "the server would ignore it and pick its own backend. Choose one with extraArgs "
                               f"['{ATTENTION_BACKEND_FLAG}', NAME] instead"))
    return out


def _backends_for(snap: vllm_flags.Snapshot, have: int, kv: str) -> list[str]:
    """The backends vLLM picks from on compute capability `have` that run there (supports_compute_capability) and
    store a KV cache of `kv` there, in vLLM's order."""
    return [n for n in snap.attention_default_backends.get(have, ())
            if (b := snap.attention_backends.get(n)) is not None and b.capabilities is not None
            and have in b.capabilities and have in b.kv_cache_capabilities.get(kv, ())]


def _attention_hardware_problems(spec: VLLMServerSpec, snap: vllm_flags.Snapshot, have: int, name: str,
                                 mla: bool) -> list[Problem]:
    """The chosen attention backend and an FP8 KV cache against the GPU's compute capability, as the release's
    backend selection decides them (vllm_flags.Snapshot.attention_backends, read from its code)."""
    if not snap.attention_backends or have not in snap.attention_default_backends:
        return []  # a snapshot without the backends' gates, or a capability they were not evaluated on
    out, gpu_is = [], f"{name} (compute capability {have / 10:.1f})"
    kv = spec.engine.kv_cache_dtype or "auto"
    chosen = [(where, b, snap.attention_backends[b]) for where, b in chosen_attention_backends(spec)
              if b in snap.attention_backends]
    for where, backend, info in chosen:
        if info.capabilities is not None and have not in info.capabilities:
            runs = _backends_for(snap, have, "auto" if mla else kv)
            out.append(Problem(where, f"attention backend {backend} does not run on {gpu_is} in vLLM {snap.version} "
                               "(its supports_compute_capability): choose "
                               + (f"one that does, {', '.join(runs)}, or " if runs else "")
                               + "auto (vLLM picks the first backend that fits the model and the GPU)"))
    if kv == "auto" or mla:
        return out  # MLA models choose among other backends: their FP8 KV cache is not checked
    field = "spec.engine.kvCacheDtype"
    stores = snap.kv_cache_backends(kv, have)
    if stores is None:
        return out
    for where, backend, info in chosen:
        if info.capabilities is not None and have not in info.capabilities:
            continue  # refused above
        if snap.kv_cache_backends(kv, have, among=(backend,)) == []:
            its = [d for d in ("fp8", "fp8_e4m3", "fp8_e5m2") if snap.kv_cache_backends(d, have, among=(backend,))]
            out.append(Problem(field, f"{kv}: attention backend {backend} ({where}) stores no {kv} KV cache on "
                               f"{gpu_is} in vLLM {snap.version}: "
                               + (f"choose backend {', '.join(stores)} or auto (they store it), or " if stores else "")
                               + (f"use kvCacheDtype {' or '.join(its)} (it stores those) or auto" if its else
                                  "use kvCacheDtype auto (the KV cache in the model's dtype)")))
    if not chosen and not stores:
        others = [d for d in ("fp8", "fp8_e4m3", "fp8_e5m2") if d != kv and snap.kv_cache_backends(d, have)]
        from_cap = sorted({c for n in snap.attention_default_backends[have] if n in snap.attention_backends
                           for c in snap.attention_backends[n].kv_cache_capabilities.get(kv, ())})
        out.append(Problem(field, f"{kv}: none of the attention backends vLLM {snap.version} picks from on {gpu_is} "
                           f"stores an {kv} KV cache ({', '.join(snap.attention_default_backends[have])}), so the "
                           "server would exit at start"
                           + (f" (they do from compute capability {from_cap[0] / 10:.1f})" if from_cap else "")
                           + ": " + (f"use kvCacheDtype {' or '.join(others)}, or auto" if others else
                                     "use kvCacheDtype auto (the KV cache in the model's dtype)")))
    return out


def hardware_problems(spec: VLLMServerSpec, gpu: GPUSelection,
                      snap: Optional[vllm_flags.Snapshot] = None,
                      mla: bool = False) -> list[Problem]:
    """What the GPU's compute capability rules out, as the image's vLLM release gates it (its snapshot in
    vllm_releases/, read from that release's own code: each quantization method's get_min_capability,
    CudaPlatform.check_if_supports_dtype, each attention backend's supports_compute_capability and KV cache dtype
    predicates, CudaPlatform's backend order). Checked against the oldest product the pods may land on; an unknown
    product (gpu.memory given) is not checked. `mla`: the model uses multi-head latent attention (its FP8 KV cache
    is not checked: vLLM picks among other backends for it)."""
    if not gpu.products:
        return []
    snap = snap or flag_check(spec).snapshot
    oldest = min(gpu.products, key=_capability)
    have, name = _capability(oldest), oldest.product
    out = _attention_hardware_problems(spec, snap, have, name, mla)
    bf16 = snap.bfloat16_capability
    if spec.model.dtype == "bfloat16" and have < bf16:
        out.append(Problem("spec.model.dtype", f"bfloat16 needs compute capability {bf16 / 10:.1f} in vLLM "
                           f"{snap.version}; {name} has {have / 10:.1f}: use float16, or auto (vLLM then "
                           "runs a bfloat16 checkpoint as float16)"))
    method = spec.model.quantization
    need = snap.quantization_min_capability(method) if method != "none" else None
    if need is not None and have < need:
        usable = sorted(m for m in QUANTIZATION_CHOICES if m != "none" and m not in UNSUPPORTED_QUANTIZATION
                        and (snap.quantization_min_capability(m) or 1000) <= have)
        out.append(Problem("spec.model.quantization", f"{method} needs compute capability {need / 10:.1f} in vLLM "
                           f"{snap.version}; {name} has {have / 10:.1f}: "
                           + (f"a checkpoint quantized with {', '.join(usable)} runs there" if usable
                              else "no quantization method of vLLM runs there")))
    return out
