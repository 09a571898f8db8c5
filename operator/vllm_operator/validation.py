"""What a VLLMServer's spec may not say, checked before anything is sized: one function per rule family.

Pure: spec (and the GPU selection, the model's architecture) in, `Problem`s out, each naming the field to change
and the alternative. Every check is linear in the spec's size (a tenant's spec is untrusted: bench/adversarial.py).
The planner runs them all (`check_spec`, `quantization_problems`, `hardware_problems`); the autoscaler runs
`check_spec` alone, to stop scaling a server whose spec became invalid.
"""

from __future__ import annotations

import difflib
import json
import re
import typing
from dataclasses import dataclass
from typing import Any, Optional

from . import api, vllm_flags
from .api import VLLMServerSpec, parse_quantity
from .catalog import Architecture
from .catalog.gpus import GPUSelection
from .urlpolicy import URLPolicy

#: The values spec.model.quantization may take.
QUANTIZATION_CHOICES = typing.get_args(api.Quantization)

#: Flags the planner derives or the pod needs fixed: extraArgs may not set them.
OWNED_FLAGS: dict[str, str] = {
    "--model": "spec.model.name",
    "--host": "the pod (probes and Services need 0.0.0.0)",
    "--port": "the pod (probes and Services need port 8000)",
    "--tensor-parallel-size": "spec.gpu.count",
    "-tp": "spec.gpu.count",
    "--max-model-len": "spec.engine.maxModelLen",
    "--gpu-memory-utilization": "spec.engine.gpuMemoryUtilization",
    "--max-num-seqs": "spec.engine.maxNumSeqs",
    "--max-num-batched-tokens": "spec.engine.maxNumBatchedTokens",
    "--kv-cache-dtype": "spec.engine.kvCacheDtype",
    "--enable-prefix-caching": "spec.engine.enablePrefixCaching",
    "--no-enable-prefix-caching": "spec.engine.enablePrefixCaching",
    "--enforce-eager": "spec.engine.enforceEager",
    "--no-enforce-eager": "spec.engine.enforceEager",
    "--served-model-name": "spec.model.servedName",
    "--quantization": "spec.model.quantization",
    "-q": "spec.model.quantization",
    "--dtype": "spec.model.dtype",
    "--revision": "spec.model.revision",
    "--download-dir": "spec.cache (HF_HOME)",
    "--chat-template": "spec.engine.chatTemplate (checked before it is applied)",
    "--shutdown-timeout": "spec.engine.shutdownTimeoutSeconds (the pod's grace period follows it)",
    "--max-num-queued-reqs": "spec.engine.maxNumQueuedReqs (checked against the autoscaler's target)",
    "--pipeline-parallel-size": "spec.nodes (pipeline stages across the nodes of a group)",
    "-pp": "spec.nodes (pipeline stages across the nodes of a group)",
    "--nnodes": "spec.nodes",
    "-n": "spec.nodes",
    "--node-rank": "spec.nodes (each pod's index in its LeaderWorkerSet group)",
    "-r": "spec.nodes (each pod's index in its LeaderWorkerSet group)",
    "--master-addr": "spec.nodes (the address of the group's leader)",
    "--master-port": "spec.nodes (the group's coordination port)",
    "--headless": "spec.nodes (a group's workers run headless)",
    "--enable-lora": "spec.adapters (planned and loaded at runtime: docs/adapters.md)",
    "--no-enable-lora": "spec.adapters (planned and loaded at runtime: docs/adapters.md)",
    "--max-loras": "spec.engine.maxLoras (with spec.adapters)",
    "--max-cpu-loras": "spec.adapters (every adapter stays in host memory)",
    "--max-lora-rank": "spec.engine.maxLoraRank (with spec.adapters)",
    "--lora-modules": "spec.adapters (loaded at runtime on every replica)",
}

#: Flags seen in blog posts and old docs that vLLM rejects, with what to do instead.
KNOWN_BAD_FLAGS: dict[str, str] = {
    "--swap-space": "was removed with the V0 engine; drop it",
    "--prefill-chunk-size": "does not exist; chunked prefill is sized by engine.maxNumBatchedTokens",
    "--gpu-memory-utilization-gpu0": "does not exist; use engine.gpuMemoryUtilization (one value for all GPUs)",
}

_NOT_PLANNED = "the plan (and the pod's GPU count and memory) does not count it"
#: Flags that change how many GPUs vLLM needs or how much memory it takes, which the planner does not size: in
#: extraArgs, `plan` would say "fits" for a pod that waits for GPUs it lacks or runs out of memory. Refused with
#: the reason and the field to use; one place for the wording (the planner may come to size some of them).
CAPACITY_FLAGS: dict[str, str] = {
    "--data-parallel-size": "runs that many engines, each on its own GPUs, while the pod gets spec.gpu.count GPUs. "
                            "Scale with spec.replicas or spec.autoscaling instead; data parallelism is not supported "
                            "through extraArgs",
    "--data-parallel-size-local": "runs that many engines in the pod, each on its own GPUs, while the pod gets "
                                  "spec.gpu.count GPUs. Scale with spec.replicas or spec.autoscaling instead",
    "--decode-context-parallel-size": "splits the KV cache over ranks the plan does not size; "
                                      "context parallelism is not supported through extraArgs",
    "--prefill-context-parallel-size": "adds ranks (and GPUs) the pod does not get; context parallelism is not "
                                       "supported through extraArgs",
    "--fully-sharded-loras": f"changes the memory LoRA adapters take: {_NOT_PLANNED}. Serve adapters through "
                             "spec.adapters (docs/adapters.md), which plans their slots",
    "--speculative-config": f"loads a draft model (or extra heads) and its KV cache on the same GPUs: "
                            f"{_NOT_PLANNED}. Speculative decoding is not supported through extraArgs",
    "--kv-transfer-config": f"adds a KV connector (disaggregated prefill, KV offload) with its own buffers: "
                            f"{_NOT_PLANNED}. It is not supported through extraArgs",
    "--kv-offloading-size": f"offloads the KV cache to the pod's memory: {_NOT_PLANNED}. KV offload is not supported "
                            "through extraArgs",
    "--kv-offloading-backend": f"offloads the KV cache: {_NOT_PLANNED}. KV offload is not supported through "
                               "extraArgs",
    "--cpu-offload-gb": f"moves weights to the pod's memory: {_NOT_PLANNED}. Choose a GPU with more memory, more "
                        "GPUs (spec.gpu.count) or a quantized checkpoint (spec.model.quantization) instead",
    "--cpu-offload-params": f"moves weights to the pod's memory: {_NOT_PLANNED}. Choose a GPU with more memory, "
                            "more GPUs (spec.gpu.count) or a quantized checkpoint (spec.model.quantization) instead",
    "--num-gpu-blocks-override": "replaces the KV cache size the plan derives; set "
                                 "spec.engine.gpuMemoryUtilization instead",
    "--kv-cache-memory-bytes": "replaces the KV cache size the plan derives; set spec.engine.gpuMemoryUtilization "
                               "instead",
}


def capacity_flag(flag: str, action: str = "") -> Optional[str]:
    """The CAPACITY_FLAGS entry that `flag` sets (also through another spelling: -pp, -dp), or None. Turning a
    feature off (--no-enable-lora, --disable-lora) changes nothing and is not refused."""
    normal = vllm_flags.normalise(flag)
    if normal.startswith(("--no-", "--disable-")):
        return None
    base = normal.split(".", 1)[0].rstrip("+") if "." in normal else normal  # --speculative-config.method
    for name in (base, flag, action):
        if name in CAPACITY_FLAGS:
            return name
    return None


#: spec.model.quantization values the API accepts but the pinned vLLM does not (ModelConfig refuses them at start).
UNSUPPORTED_QUANTIZATION: dict[str, str] = {
    "bitsandbytes": "bitsandbytes quantization was removed from vLLM; serve an AWQ, GPTQ or FP8 checkpoint instead",
    "gguf": "GGUF is no longer a vLLM quantization method; serve the original or an AWQ/GPTQ/FP8 checkpoint",
}

#: Values that are credentials whatever field they are in: Hugging Face, OpenAI/Anthropic-style, GitHub, AWS,
#: Slack and JWT tokens, PEM private keys, and URLs with a password. Searched in every string of a tenant's
#: spec, so in time linear in its length whatever it holds (bench/adversarial.py): a token's minimum length is
#: enough to find it ({16}, not {16,}); a JWT is looked for once per run of its characters, from the run's first
#: "eyJ", which has the most characters after it (from every "eyJ", 'eyJeyJ...' cost the square of its length);
#: a URL's scheme is taken from its last letter (from every letter, a run of them did); the possessive
#: quantifiers never give back what their class cannot contain anyway.
_CREDENTIAL_VALUE = re.compile(
    r"hf_[A-Za-z0-9]{16}|sk-[A-Za-z0-9_-]{16}|gh[pousr]_[A-Za-z0-9]{20}|github_pat_[A-Za-z0-9_]{20}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10}"
    r"|(?<![A-Za-z0-9_-])(?>[A-Za-z0-9_-]*?eyJ)[A-Za-z0-9_-]{8,}+\.eyJ[A-Za-z0-9_-]{8,}+\."
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----|[a-z][0-9+.-]*+://[^/\s:@]++:[^/\s@]++@")
#: Flags whose value is a credential: a literal one would sit in the spec (and in `ps` inside the pod).
CREDENTIAL_FLAGS: dict[str, str] = {
    "--api-key": "set engine.env [{name: VLLM_API_KEY, valueFrom: {secretKeyRef: {name: ..., key: ...}}}] "
                 "instead: vLLM reads the key from VLLM_API_KEY",
    "--hf-token": "set spec.hfTokenSecretRef instead: the operator passes the Secret's key as HF_TOKEN",
}
#: Flags of `vllm serve` that read a file named by their value (by their names in every release's snapshot:
#: --config, --*-file, --*-path, --*-certfile, --*-keyfile, --*-ca-certs, --*-plugin, and --generation-config, a
#: folder): what the file says would reach vLLM past these checks (--config splices its flags in, a chat template
#: or a logging config is code), so extraArgs may not set them. Not files: --root-path (a URL prefix),
#: --io-processor-plugin (a plugin's registered name).
_FILE_FLAG = re.compile(r"^--(config|[a-z0-9-]*-(file|path|certfile|keyfile|ca-certs|plugin))$")
_FILE_FLAGS_ALSO = frozenset({"--generation-config"})
_NOT_FILE_FLAGS = frozenset({"--root-path", "--io-processor-plugin"})


def reads_a_file(flag: str) -> bool:
    """Whether a (normalised) flag of `vllm serve` reads a file its value names."""
    return flag not in _NOT_FILE_FLAGS and (flag in _FILE_FLAGS_ALSO or bool(_FILE_FLAG.match(flag)))


#: Flags the pod depends on (probes and Services): extraArgs may set them only with the escape-hatch
#: annotation api.ALLOW_UNSAFE_ARGS_ANNOTATION (docs/security.md).
UNSAFE_FLAGS = ("--host", "--port")
_CREDENTIAL_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE_KEY)", re.I)
#: Environment the operator sets; engine.env may not override it.
OWNED_ENV = set(api.OWNED_ENV)
#: Environment the GPU device plugin owns: it names the GPUs allocated to the container (gpu.count of them);
#: engine.env may not set it.
DEVICE_PLUGIN_ENV: dict[str, str] = {
    "CUDA_VISIBLE_DEVICES": "the NVIDIA device plugin exposes exactly the spec.gpu.count GPUs allocated to the "
                            "container; renumbering or hiding them here makes vLLM start on fewer GPUs than it "
                            "shards over, or on none",
    "NVIDIA_VISIBLE_DEVICES": "the NVIDIA device plugin sets it to the GPUs allocated to the container; the NVIDIA "
                              "container runtime mounts whatever it names, so a value such as 'all' would hand the "
                              "server every GPU of the node, including those allocated to other pods",
}
MAX_NAME_LENGTH = api.MAX_NAME_LENGTH
#: The NVIDIA container toolkit reads every NVIDIA_* variable (NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES,
#: NVIDIA_MIG_CONFIG_DEVICES, NVIDIA_IMEX_CHANNELS, ...) to decide what of the node a container sees.
DEVICE_ENV_PREFIX = "NVIDIA_"


def device_env(name: str) -> bool:
    """Whether a variable of this name decides which devices a container sees (the device plugin's to set)."""
    return name in DEVICE_PLUGIN_ENV or name.startswith(DEVICE_ENV_PREFIX)


def device_env_prefix(prefix: str) -> bool:
    """Whether envFrom with this prefix can make such a variable from some key of its ConfigMap or Secret (an empty
    prefix can; NVIDIA_, NV or CUDA_ can; X cannot)."""
    return (prefix.startswith(DEVICE_ENV_PREFIX) or DEVICE_ENV_PREFIX.startswith(prefix)
            or any(name.startswith(prefix) for name in DEVICE_PLUGIN_ENV))
#: Extended resources of NVIDIA's device plugin (nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-...): only
#: spec.gpu requests them.
DEVICE_RESOURCE_PREFIX = "nvidia.com/"


@dataclass(frozen=True)
class Problem:
    """Something that stops the server from being deployed, with the field to change."""

    field: str
    message: str
    reason: str = api.REASON_INVALID_SPEC
    """The kind of problem (api.SPEC_REASONS): SpecValid's and Ready's reason when it is the first."""

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def credential_problems(spec: VLLMServerSpec) -> list[Problem]:
    """Every string in the spec that looks like a credential, by field path (the spec is readable by anyone
    who can read the VLLMServer, and it is copied into the pod template)."""
    problems: list[Problem] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(key, str) and _CREDENTIAL_VALUE.search(key):
                    problems.append(Problem(path, "a key looks like a credential in plaintext"))
                walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")
        elif isinstance(node, str) and _CREDENTIAL_VALUE.search(node):
            problems.append(Problem(path, "looks like a credential in plaintext; anyone who can read the VLLMServer "
                                    "can read it. Put it in a Secret and reference it: spec.hfTokenSecretRef for the "
                                    "Hugging Face token, engine.env[].valueFrom.secretKeyRef for anything else"))

    dumped = spec.model_dump(by_alias=True, exclude_none=True)
    dumped.get("engine", {}).pop("env", None)  # check_spec words it per variable
    walk(dumped, "spec")
    return problems


def flag_like_values(spec: VLLMServerSpec) -> list[Problem]:
    """Spec values that become vLLM arguments and start with '-': vLLM would read them as flags. The API's
    pattern refuses them already; this holds for a spec built without validation too (model_construct)."""
    values = (("spec.model.name", spec.model.name, "the model"),
              ("spec.model.servedName", spec.model.served_name, "--served-model-name's value"),
              ("spec.model.revision", spec.model.revision, "--revision's value"))
    return [Problem(where, f"{value!r} starts with '-': vLLM would read it as a flag, not as {what}")
            for where, value, what in values if value and value.startswith("-")]


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


@dataclass(frozen=True)
class FlagCheck:
    """Which vLLM release's flags check a server: the snapshot of the release its image's tag names (exact), or,
    for a release without one or an image whose tag names none, the nearest snapshot, loosely (vllm_flags)."""

    image: str
    release: Optional[str]
    """The release the image's tag names (None: it names none)."""
    snapshot: vllm_flags.Snapshot
    exact: bool
    unchecked: tuple[str, ...] = ()
    """extraArgs flags the snapshot does not know, passed to vLLM unchecked (loose only)."""

    def warning(self) -> Optional[str]:
        """Why the check was loose, for the plan's notes, the ExtraArgsUnchecked condition and the CLI."""
        if self.exact:
            return None
        have = vllm_flags.releases()
        known = f"vLLM {have[0]} to {have[-1]}" if len(have) > 1 else f"vLLM {have[0]}"
        what = (f"image {self.image} names no vLLM release in its tag" if self.release is None else
                f"image {self.image} runs vLLM {self.release}, which the operator has no flag snapshot of")
        out = (f"{what} (it has {known}'s), so extraArgs were checked loosely against vLLM {self.snapshot.version}'s "
               "flags: a flag or value only another release knows passes, derived flags and credentials stay "
               "refused")
        if self.unchecked:
            out += f"; passed unchecked: {', '.join(self.unchecked)}"
        if self.release is None:
            out += f". Name the release in the tag (vllm/vllm-openai:v{vllm_flags.VERSION}@sha256:...) for the " \
                   "strict check"
        return out


def flag_check(spec: VLLMServerSpec) -> FlagCheck:
    """Pure: the release the image names and the flag snapshot that checks the server's args."""
    release = image_vllm_version(spec.image)
    snap, exact = vllm_flags.snapshot_for(release)
    unchecked = () if exact else tuple(unchecked_extra_args(list(spec.engine.extra_args), snap))
    return FlagCheck(image=spec.image, release=release, snapshot=snap, exact=exact, unchecked=unchecked)


def check_spec(name: str, spec: VLLMServerSpec, *, default_prometheus_url: Optional[str] = None,
               allow_unsafe_args: bool = False, urls: Optional[URLPolicy] = None,
               checked: Optional[FlagCheck] = None) -> list[Problem]:
    """Semantic checks the CRD schema cannot express, every rule family in turn. Pure. `urls`: the operator's URL
    settings (urlpolicy.py; spec.model.configURL is checked before it is fetched, in pipeline.plan_server);
    `checked`: the spec's flag_check when the caller has it already (the planner's Plan.flags)."""
    checked = checked or flag_check(spec)
    return [
        *name_problems(name),
        *autoscaling_problems(spec, default_prometheus_url, urls),
        *network_problems(spec),
        *cache_problems(spec),
        *node_problems(spec),
        *credential_problems(spec),
        *flag_like_values(spec),
        *env_problems(spec),
        *unsupported_quantization(spec, checked.snapshot),
        *attention_problems(spec, checked.snapshot, checked.exact),
        *resource_problems(spec),
        *toleration_problems(spec),
        *request_limit_problems(spec),
        *routing_problems(spec),
        *check_extra_args(spec.engine.extra_args, allow_unsafe=allow_unsafe_args, loose=not checked.exact,
                          snapshot=checked.snapshot),
    ]


def name_problems(name: str) -> list[Problem]:
    """metadata.name: the children's names and labels derive from it."""
    out = []
    if name[:1].isdigit():
        out.append(Problem("metadata.name", f"{name!r} starts with a digit; the client Service is named after the "
                           "server and Service names must start with a letter (DNS-1035)"))
    if len(name) > MAX_NAME_LENGTH:
        out.append(Problem("metadata.name", f"{len(name)} characters is too long: at most {MAX_NAME_LENGTH}, because "
                           "pod labels derived from it are limited to 63 characters"))
    return out


def autoscaling_problems(spec: VLLMServerSpec, default_prometheus_url: Optional[str],
                         urls: Optional[URLPolicy]) -> list[Problem]:
    """spec.autoscaling: bounds, the workload it needs, and the Prometheus it may query."""
    out = []
    add = lambda f, m: out.append(Problem(f, m))  # noqa: E731
    a = spec.autoscaling
    if a.max_replicas is not None and a.max_replicas < a.min_replicas:  # as the CRD's rule: enabled or not
        add("spec.autoscaling.maxReplicas", f"{a.max_replicas} is below minReplicas {a.min_replicas}")
    if not a.enabled:
        return out
    if spec.workload == "DaemonSet":
        add("spec.autoscaling.enabled", "autoscaling needs workload: StatefulSet; a DaemonSet runs one server per "
            "matching node, so its size follows the nodes (set autoscaling.enabled: false or workload: StatefulSet)")
    if a.max_replicas is None:
        add("spec.autoscaling.maxReplicas", "required when autoscaling is enabled")
    if a.source == "Prometheus" and a.mode == "Operator" and not (a.prometheus_url or default_prometheus_url):
        add("spec.autoscaling.prometheusURL", "source: Prometheus needs prometheusURL (or the operator's "
            "--prometheus-url default)")
    if a.prometheus_url and urls is not None and (why := urls.prometheus_problem(a.prometheus_url)):
        add("spec.autoscaling.prometheusURL", why)
    if a.mode == "KEDA" and not (a.prometheus_url or default_prometheus_url):
        add("spec.autoscaling.prometheusURL", "mode: KEDA needs prometheusURL (or the operator's "
            "--prometheus-url default): the ScaledObject's Prometheus trigger queries it")
    if a.min_replicas == 0:
        out += scale_to_zero_problems(spec)
    return out


def scale_to_zero_problems(spec: VLLMServerSpec) -> list[Problem]:
    """autoscaling.minReplicas 0 (as the CRD's rules): something must wake the server while no pod runs."""
    a = spec.autoscaling
    if a.max_replicas is not None and a.max_replicas < 1:
        return [Problem("spec.autoscaling.maxReplicas", "must be at least 1")]
    if a.mode == "HPA":
        return [Problem("spec.autoscaling.minReplicas", "a HorizontalPodAutoscaler cannot scale to zero "
                        "(Kubernetes' HPAScaleToZero gate is alpha): use mode Operator or KEDA for minReplicas 0")]
    if a.mode == "Operator" and not spec.routing.inference_pool.enabled:
        return [Problem("spec.autoscaling.minReplicas", "minReplicas 0 with mode Operator needs "
                        "routing.inferencePool.enabled: the endpoint picker's count of requests that found no pod "
                        "is what wakes a server at zero")]
    return []


def routing_problems(spec: VLLMServerSpec) -> list[Problem]:
    """spec.routing (as the CRD's rules): a route needs the pool it routes to, and a Gateway to attach to."""
    r, out = spec.routing, []
    if r.http_route.enabled and not r.inference_pool.enabled:
        out.append(Problem("spec.routing.httpRoute.enabled", "an HTTPRoute routes to the InferencePool: set "
                           "inferencePool.enabled"))
    if r.http_route.enabled and not r.http_route.gateway_name:
        out.append(Problem("spec.routing.httpRoute.gatewayName", "required when the route is enabled"))
    if r.inference_pool.enabled and spec.nodes > 1:
        out.append(Problem("spec.routing.inferencePool.enabled", "not with spec.nodes > 1 yet: the pool would select "
                           "a group's worker pods too, and only its leader serves requests (route to the server's "
                           "Service instead)"))
    return out


def network_problems(spec: VLLMServerSpec) -> list[Problem]:
    """spec.hostNetwork: only where one server runs per node."""
    if spec.host_network and spec.workload != "DaemonSet":
        return [Problem("spec.hostNetwork", "only a DaemonSet may use the node's network (replicas of a StatefulSet "
                        "would collide on port 8000)")]
    return []


def cache_problems(spec: VLLMServerSpec) -> list[Problem]:
    """spec.cache: an existing claim or a new one, per replica or shared, as the workload allows."""
    c = spec.cache
    if c is None:
        return []
    if c.claim_name and (c.size or c.storage_class_name):
        return [Problem("spec.cache", "set either claimName (an existing claim) or size/storageClassName (a new "
                        "claim per replica), not both")]
    if not c.claim_name and not c.size:
        return [Problem("spec.cache", "set size (a new claim per replica) or claimName (an existing claim)")]
    if c.shared and not c.size:
        return [Problem("spec.cache.shared", "shared needs size (the claim the operator creates for every replica); "
                        "a claimName is shared as it is")]
    if c.size and not c.shared and spec.workload == "DaemonSet":
        return [Problem("spec.cache.size", "a DaemonSet cannot create a claim per pod; set cache.shared (one "
                        "ReadWriteMany claim for every node) or use cache.claimName (ReadWriteMany or ReadOnlyMany)")]
    return []


def node_problems(spec: VLLMServerSpec) -> list[Problem]:
    """spec.nodes: a group of nodes is a LeaderWorkerSet of whole GPUs with no claim per pod (the CRD's rules)."""
    out = max_nodes_problems(spec)
    if spec.nodes == 1:
        return out
    if spec.workload != "StatefulSet":
        out.append(Problem("spec.nodes", "a server across nodes is a LeaderWorkerSet of groups (workload: "
                           "StatefulSet); a DaemonSet runs one single-node server per matching node"))
    if spec.gpu.mig_profile:
        out.append(Problem("spec.nodes", "vLLM cannot run across nodes on MIG slices: use whole GPUs (gpu.count) "
                           "or nodes: 1"))
    if spec.cache is not None and spec.cache.size and not spec.cache.shared:
        out.append(Problem("spec.cache.size", "a group of nodes gets no claim per pod: set cache.shared (one "
                           "ReadWriteMany claim every node mounts) or cache.claimName"))
    return out


def max_nodes_problems(spec: VLLMServerSpec) -> list[Problem]:
    """spec.maxNodes: the planner may choose a group, so what a group may not be is refused up front (the CRD's
    rules), and it excludes a fixed node count."""
    if spec.max_nodes is None:
        return []
    out = []
    if spec.nodes > 1:
        out.append(Problem("spec.maxNodes", "nodes and maxNodes exclude each other: nodes fixes the count, maxNodes "
                           "lets the planner choose the fewest nodes that fit, up to it"))
    if spec.workload != "StatefulSet":
        out.append(Problem("spec.maxNodes", "maxNodes may make the server a LeaderWorkerSet of groups (workload: "
                           "StatefulSet); a DaemonSet runs one single-node server per matching node"))
    if spec.gpu.mig_profile:
        out.append(Problem("spec.maxNodes", "vLLM cannot run across nodes on MIG slices: use whole GPUs (gpu.count) "
                           "or leave maxNodes out"))
    if spec.cache is not None and spec.cache.size and not spec.cache.shared:
        out.append(Problem("spec.cache.size", "maxNodes may choose a group of nodes, which gets no claim per pod: set "
                           "cache.shared (one ReadWriteMany claim every node mounts) or cache.claimName"))
    return out


def env_problems(spec: VLLMServerSpec) -> list[Problem]:
    """spec.engine.env: nothing the device plugin or the operator owns, no credential in plaintext."""
    out = []
    for i, env in enumerate(spec.engine.env):
        where = f"spec.engine.env[{i}]"
        if device_env(env.name):
            why = DEVICE_PLUGIN_ENV.get(env.name, DEVICE_PLUGIN_ENV["NVIDIA_VISIBLE_DEVICES"])
            out.append(Problem(where, f"{env.name} may not be set: {why}. Choose the GPUs "
                               "with spec.gpu (count, product)"))
        elif env.name in OWNED_ENV:
            out.append(Problem(where, f"{env.name} is set by the operator; use hfTokenSecretRef for tokens and cache "
                               "for HF_HOME"))
        elif env.value_from is not None and env.value:
            out.append(Problem(where, f"{env.name}: set value or valueFrom, not both"))
        elif _CREDENTIAL_VALUE.search(env.value) or (_CREDENTIAL_NAME.search(env.name) and env.value):
            out.append(Problem(where, f"{env.name} looks like a credential in plaintext; anyone who can read the "
                               "VLLMServer can read it. Put it in a Secret and reference it with spec.hfTokenSecretRef "
                               "(the Hugging Face token) or valueFrom.secretKeyRef"))
    return out


def unsupported_quantization(spec: VLLMServerSpec, snap: vllm_flags.Snapshot) -> list[Problem]:
    """spec.model.quantization values the API accepts but the image's vLLM does not have."""
    method = spec.model.quantization
    if method in UNSUPPORTED_QUANTIZATION:
        return [Problem("spec.model.quantization", f"vLLM {snap.version} has no quantization method "
                        f"{method!r} and would exit at start: {UNSUPPORTED_QUANTIZATION[method]}")]
    return []


def resource_problems(spec: VLLMServerSpec) -> list[Problem]:
    """spec.resources and the sizes elsewhere: no GPU resource by hand, no negative quantity."""
    out = []
    # Every NVIDIA device resource, not only the one spec.gpu names: nvidia.com/gpu.shared beside gpu.count would
    # hand the pod devices the plan, the quota's reading of spec.gpu and the admission policy never saw.
    gpu_resources = {k for k in [*spec.resources.requests, *spec.resources.limits]
                     if k.startswith(DEVICE_RESOURCE_PREFIX) or k == spec.gpu.resource_name}
    for key in sorted(gpu_resources):
        out.append(Problem("spec.resources", f"{key} comes from spec.gpu (count, migProfile, resourceName); remove it "
                           "from resources"))
    sizes = [("spec.gpu.memory", spec.gpu.memory), ("spec.gpu.reservedMemory", spec.gpu.reserved_memory),
             ("spec.shmSize", spec.shm_size), ("spec.cache.size", spec.cache.size if spec.cache else None)]
    sizes += [(f"spec.resources.{side}.{k}", v) for side, values in (("requests", spec.resources.requests),
                                                                     ("limits", spec.resources.limits))
              for k, v in values.items()]
    for where, value in sizes:
        if value is not None and parse_quantity(value) < 0:
            out.append(Problem(where, f"{value} is negative"))
    return out


def toleration_problems(spec: VLLMServerSpec) -> list[Problem]:
    """spec.tolerations: what the API server would refuse in the pod template."""
    out = []
    for i, t in enumerate(spec.tolerations):
        where = f"spec.tolerations[{i}]"
        if t.operator == "Exists" and t.value:
            out.append(Problem(f"{where}.value", "must be empty with operator: Exists"))
        if not t.key and t.operator != "Exists":
            out.append(Problem(f"{where}.operator", "must be Exists when key is empty (a toleration of every taint)"))
        if t.toleration_seconds is not None and t.effect != "NoExecute":
            out.append(Problem(f"{where}.tolerationSeconds", "applies to effect: NoExecute only"))
        if t.value and not re.match(api.LABEL_VALUE_PATTERN, t.value) or (t.value and len(t.value) > 63):
            out.append(Problem(f"{where}.value", f"{t.value!r} is not a label value (at most 63 letters, digits, "
                               "'-', '_' or '.')"))
    return out


def above_limit_problems(where: str, resources: api.ResourceOverrides) -> list[Problem]:
    """Requests above their limits in one container's resources (`where`: the field path of the resources)."""
    requests, limits = resources.requests, resources.limits
    return [Problem(f"{where}.requests.{key}", f"{requests[key]} is above the limit {limits[key]}; Kubernetes refuses "
                    "a request above its limit")
            for key in sorted(set(requests) & set(limits)) if parse_quantity(requests[key]) > parse_quantity(limits[key])]


def request_limit_problems(spec: VLLMServerSpec) -> list[Problem]:
    """spec.resources requests against limits, as Kubernetes checks them."""
    out = above_limit_problems("spec.resources", spec.resources)
    requests, limits = spec.resources.requests, spec.resources.limits
    for key, request in requests.items():
        if overcommittable(key):
            continue
        limit = limits.get(key)
        if limit is None:
            out.append(Problem(f"spec.resources.requests.{key}", f"{key} cannot be overcommitted, so Kubernetes needs "
                               f"a limit equal to the request: set spec.resources.limits.{key} to {request} (or only "
                               "the limit)"))
        elif parse_quantity(request) != parse_quantity(limit):
            out.append(Problem(f"spec.resources.requests.{key}", f"{request} differs from the limit {limit}; {key} "
                               "cannot be overcommitted, so Kubernetes refuses a request other than the limit"))
    return out


_IMAGE_VERSION = re.compile(r":v?(\d+\.\d+\.\d+(?:[.+-]?[0-9A-Za-z.]+)?)(?:@sha256:[0-9a-f]{64})?$")


def image_vllm_version(image: str) -> Optional[str]:
    """The vLLM release an image's tag names (vllm/vllm-openai:v0.33.1 -> 0.33.1), or None when it names none. A
    build variant after '-' or '+' (v0.32.0-cu130) is the same release; rc1, dev, post are other ones."""
    found = _IMAGE_VERSION.search(image.strip())
    return re.split(r"[-+]", found.group(1))[0] if found else None


def unchecked_extra_args(extra: list[str], snap: Optional[vllm_flags.Snapshot] = None) -> list[str]:
    """The extraArgs flags the flag snapshot does not know (passed unchecked for another vLLM release)."""
    return [flag for flag in (token.partition("=")[0] for token in extra)
            if flag.startswith("--") and _snapshot_flag(flag, snap)[2] is None]


def _snapshot_flag(flag: str, snap: Optional[vllm_flags.Snapshot] = None
                   ) -> tuple[str, Optional[str], Optional[vllm_flags.FlagInfo]]:
    """(normalised flag, its JSON-valued parent for a dotted key such as --compilation-config.mode, what the
    snapshot's parser knows of it, or None). `snap`: the default release's when not given."""
    normal = vllm_flags.normalise(flag)
    # --compilation-config.mode 3 sets one key of a JSON-valued flag (FlexibleArgumentParser).
    dotted = normal.split(".", 1)[0].rstrip("+") if normal.startswith("--") and "." in normal else None
    return normal, dotted, (snap or vllm_flags.snapshot()).flags.get(dotted or normal)


def overcommittable(resource: str) -> bool:
    """Whether Kubernetes lets a request be below the limit: native resources (cpu, memory, ephemeral-storage,
    any *kubernetes.io/ name) but hugepages; extended resources (example.com/foo, devices) must be equal."""
    native = "/" not in resource or "kubernetes.io/" in resource
    return native and not resource.startswith("hugepages-")


_NUMBER = re.compile(r"^-\.?[0-9]")


def _is_value(token: str) -> bool:
    """What argparse takes as an option's value: not a flag (negative numbers are values)."""
    return not token.startswith("-") or bool(_NUMBER.match(token))


def _values(extra: list[str], i: int, info: Optional[vllm_flags.FlagInfo]) -> list[str]:
    """The values that follow a flag from extra[i]: one, or, for a flag with nargs "+" (`--allowed-media-domains
    a b`), all up to the next flag. An unknown flag (info None) is taken to have one."""
    end = i
    while end < len(extra) and _is_value(extra[end]) and (end == i or (info is not None and info.multiple)):
        end += 1
    return extra[i:end]


@dataclass(frozen=True)
class _ExtraFlag:
    """One flag token of extraArgs, parsed: the flag as written, its '=value' if any, and what the snapshot knows."""

    flag: str
    """The flag as written (-O3 reads as --optimization-level)."""
    eq: str
    """"=" when the value was written inline (--seed=1), else ""."""
    inline: str
    """The inline value ("" when none)."""
    normal: str
    """The flag normalised (vllm_flags.normalise)."""
    dotted: Optional[str]
    """The JSON-valued parent of a dotted key (--compilation-config.mode -> --compilation-config), or None."""
    info: Optional[vllm_flags.FlagInfo]
    """What the snapshot's parser knows of it; None: it does not know it."""
    action: Optional[str]
    """The operator-owned flag this is another option string of (-tp: --tensor-parallel-size), or None."""
    capacity: Optional[str]
    """The capacity flag it is (capacity_flag), or None."""


def _parse_extra_flag(token: str, snap: vllm_flags.Snapshot) -> _ExtraFlag:
    """The parse: one flag token of extraArgs read against the snapshot."""
    flag, eq, inline = token.partition("=")
    if flag.startswith("-O") and not flag.startswith("--") and flag != "-O":  # -O3: --optimization-level 3
        flag, eq, inline = "--optimization-level", "=", flag[2:].lstrip("=") or inline
    normal, dotted, info = _snapshot_flag(flag, snap)
    # Another spelling of a flag the operator owns sets the same value: -tp, --device-memory-utilization,
    # --disable-prefix-caching (0.33) are the action's other option strings.
    action = info.action if info is not None and info.action in OWNED_FLAGS else None
    capacity = capacity_flag(flag, info.action if info is not None else "")
    return _ExtraFlag(flag, eq, inline, normal, dotted, info, action, capacity)


def _names_owned(f: _ExtraFlag) -> bool:
    """Whether the flag, as written, normalised or as the parent of a dotted key, is one the operator owns."""
    return f.normal in OWNED_FLAGS or f.flag in OWNED_FLAGS or bool(f.dotted and f.dotted in OWNED_FLAGS)


def _left_to_its_release(f: _ExtraFlag) -> bool:
    """The per-release snapshot check, loose: whether only the image's own parser could judge the flag (unknown
    to the snapshot, or known bad in it) and nothing else refuses it (owned, capacity, credential, file)."""
    return f.capacity is None and (f.info is None or f.normal in KNOWN_BAD_FLAGS or f.flag in KNOWN_BAD_FLAGS) \
        and f.normal not in CREDENTIAL_FLAGS and not _names_owned(f) and not reads_a_file(f.normal)


def _owned_refusal(f: _ExtraFlag, allow_unsafe: bool) -> Optional[str]:
    """The owned flags: why the operator's own flag may not be set (None for --host/--port under the escape
    hatch, the annotation: `allow_unsafe`)."""
    if f.normal in UNSAFE_FLAGS:
        if allow_unsafe:
            return None  # the escape hatch: the user owns the pod's address (docs/security.md)
        return (f"{f.flag} is fixed by the operator: {OWNED_FLAGS[f.normal]}. To set it anyway, annotate the "
                f"VLLMServer {api.ALLOW_UNSAFE_ARGS_ANNOTATION}: \"true\" (docs/security.md)")
    owner = OWNED_FLAGS.get(f.dotted or f.normal) or OWNED_FLAGS.get(f.flag) or OWNED_FLAGS[f.action or ""]
    if f.action and f.action != f.normal:
        return f"{f.flag} is vLLM's other name for {f.action}, which is derived by the operator; set {owner} " \
               "instead"
    return f"{f.flag} is derived by the operator; set {owner} instead"


def _refusal(f: _ExtraFlag, snap: vllm_flags.Snapshot, allow_unsafe: bool) -> Optional[str]:
    """Why extraArgs may not carry the flag, first reason first (known bad, capacity, credential, owned, reads a
    file, unknown to the snapshot), or None when it may."""
    if f.normal in KNOWN_BAD_FLAGS or f.flag in KNOWN_BAD_FLAGS:
        return f"{f.flag} {KNOWN_BAD_FLAGS.get(f.normal) or KNOWN_BAD_FLAGS[f.flag]}"
    if f.capacity is not None:
        return f"{f.flag} {CAPACITY_FLAGS[f.capacity]}"
    if f.normal in CREDENTIAL_FLAGS:
        return (f"{f.flag} takes a credential, which must not be written in the spec (anyone who can read the "
                f"VLLMServer could read it); {CREDENTIAL_FLAGS[f.normal]}")
    if f.normal in UNSAFE_FLAGS or _names_owned(f) or f.action:
        return _owned_refusal(f, allow_unsafe)
    if reads_a_file(f.normal):
        return (f"{f.flag} reads a file, whose contents would reach vLLM past the operator's checks (--config "
                "splices its flags in); set the flags themselves in extraArgs, or the spec's fields")
    if f.info is None:
        return f"vLLM {snap.version} has no flag {f.flag}: the server would exit with code 2 and crash-loop"
    return None


def _value_problems(f: _ExtraFlag, info: vllm_flags.FlagInfo, extra: list[str], i: int, where: str,
                    loose: bool) -> tuple[int, list[Problem]]:
    """The value checks of an accepted flag whose values start at extra[i]: the index after them, and what is
    wrong (a value missing or not wanted, one outside the choices unless `loose`)."""
    problems: list[Problem] = []
    flag = f.flag
    if f.dotted:
        if not f.eq:
            if i < len(extra) and _is_value(extra[i]):
                i += 1
            else:
                problems.append(Problem(where, f"{flag} needs a value"))
        return i, problems
    if f.eq:
        if not info.takes_value:
            problems.append(Problem(where, f"{flag} takes no value; write {flag} alone"))
        elif info.choices and f.inline not in info.choices and not loose:
            problems.append(Problem(where, f"{flag} {f.inline!r} is not one of {', '.join(info.choices)}"))
        return i, problems
    values = _values(extra, i, info) if info.takes_value else []
    if values:
        i += len(values)
        for value in values:
            if info.choices and value not in info.choices and not loose:
                problems.append(Problem(where, f"{flag} {value!r} is not one of {', '.join(info.choices)}"))
    elif info.takes_value and info.nargs_required:
        problems.append(Problem(where, f"{flag} needs a value"))
    return i, problems


def check_extra_args(extra: list[str], allow_unsafe: bool = False, loose: bool = False,
                     snapshot: Optional[vllm_flags.Snapshot] = None) -> list[Problem]:
    """Refuse flags vLLM does not have, flags the operator derives (or another spelling of one, such as
    --device-memory-utilization for --gpu-memory-utilization; --host/--port only with the escape-hatch
    annotation: `allow_unsafe`) and credentials as flag values (one problem per flag).

    `snapshot`: the flags of the image's vLLM release (the default release's when not given). `loose`: the image
    runs a release without a snapshot of its own: what only its parser can tell (a flag the snapshot lacks or has
    removed, a value outside its choices) is not refused, since that release may differ; what the operator owns
    and credentials still are."""
    snap = snapshot or vllm_flags.snapshot()
    problems: list[Problem] = []
    i = 0
    while i < len(extra):
        token = extra[i]
        where = f"spec.engine.extraArgs[{i}]"
        i += 1
        if _is_value(token):
            problems.append(Problem(where, f"{token!r} is not a flag; extraArgs holds flags and their values, "
                                    "like ['--seed', '1']"))
            continue
        f = _parse_extra_flag(token, snap)
        if loose and _left_to_its_release(f):
            if not f.eq and i < len(extra) and _is_value(extra[i]):
                i += len(_values(extra, i, f.info))
            continue
        refusal = _refusal(f, snap, allow_unsafe)
        if refusal:
            problems.append(Problem(where, refusal))
            # The refused flag's value(s) go with it; do not report them again as "not a flag".
            if not f.eq and (f.info is None or f.info.takes_value):
                i += len(_values(extra, i, f.info))
            continue
        assert f.info is not None
        i, found = _value_problems(f, f.info, extra, i, where, loose)
        problems += found
    return problems


# --------------------------------------------------------------------------- planning
