"""The tables the checks read: the flags extraArgs may not set and why (owned, known bad, capacity, credential,
file-reading, unsafe), the environment and resources only the operator or the device plugin sets, the credential
patterns; and `Problem`, what every check returns."""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass
from typing import Optional

from .. import api, vllm_flags


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
