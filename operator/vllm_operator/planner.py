"""Derive vLLM's flags from the model, the GPU and the workload, and explain each one.

Pure: spec + resolved model + GPU facts in, a `Plan` out; no I/O. The memory model
mirrors how vLLM sizes its KV cache (vllm/v1/worker/gpu_worker.py,
determine_available_memory): the budget is `gpu_memory_utilization x total memory`;
from it come the weights, the activation peak of a profiling forward pass over
`max_num_batched_tokens` tokens, non-torch memory (cuBLAS, NCCL) and, since vLLM 0.21,
the CUDA graphs it profiles before sizing the KV cache
(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, on by default); the rest is KV cache. vLLM
refuses to start when the GPU's free memory, taken after its own CUDA context exists,
is below the budget, so the derived utilization leaves that context, a margin and
gpu.reservedMemory outside. Every constant is in `ASSUMPTIONS`, with its source.
"""

from __future__ import annotations

import math
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from . import api, vllm_flags
from .api import VLLMServerSpec, parse_quantity
from .autoscaler.policy import TOLERANCE
from .catalog import ResolvedModel
from .gpus import GPUSelection, select_gpu
from .urlpolicy import URLPolicy

#: The values spec.model.quantization may take.
QUANTIZATION_CHOICES = typing.get_args(api.Quantization)

GiB = 2**30
MiB = 2**20

#: The planner's assumptions in one place (values in bytes unless said otherwise).
ASSUMPTIONS: dict[str, tuple[float, str]] = {
    "block_size": (16, "vLLM's default KV block size; KV capacity is counted in whole blocks"),
    "default_utilization": (0.92, "vLLM's default --gpu-memory-utilization (0.9 before 0.11)"),
    "non_torch_tp1": (
        0.35 * GiB,
        "non-torch memory (CUDA context, cuBLAS) vLLM measured for Llama-3.1-8B on an RTX 3090 (vllm issue 10517)",
    ),
    "nccl_per_gpu_tp": (
        2.1 * GiB,
        "NCCL and custom all-reduce buffers per GPU at TP>=2 (llm-d capacity planner accuracy report)",
    ),
    "cuda_graph_per_gpu": (
        0.75 * GiB,
        "CUDA graph pool per GPU; vLLM >= 0.21 profiles it and takes it from the KV cache, inside the "
        "utilization budget (gpu_worker.determine_available_memory, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1)",
    ),
    "cuda_context": (
        0.5 * GiB,
        "vLLM's own CUDA context, already allocated when it compares free memory with the budget at start "
        "(gpu_worker.init_device -> request_memory): it must fit outside the budget",
    ),
    "safety_margin": (0.25 * GiB, "slack per GPU between vLLM's budget and what the GPU has free"),
    "activation_hidden_factor": (
        7,
        "activation peak per batched token = (2 x intermediate / TP + 7 x hidden) x dtype bytes; fitted to vLLM's "
        "peak_torch_memory for Llama-3.1-8B at 20k and 29k batched tokens (vllm issue 10517: 2.07 and 2.99 GiB "
        "above the weights, i.e. ~6.4 x hidden), rounded up",
    ),
    "logits_bytes": (
        12,
        "bytes per logit of the sampler's dummy run over max_num_seqs rows x vocab (bf16 logits, their float32 copy, "
        "probabilities); it runs after the forward pass has freed its activations, so the peak is the larger of the "
        "two, not their sum (v1 gpu_model_runner.profile_run; the 10517 log shows no logits term at 20k/29k tokens)",
    ),
    "context_headroom": (0.90, "derived --max-model-len stays within 90% of the estimated KV tokens"),
    "quant_overhead": (1.03, "scales and zero points of 4-bit group quantization (group size 128)"),
    "load_bandwidth": (200e6, "conservative bytes/s to download or read weights at start"),
    "engine_init_seconds": (240, "engine start after weights: profiling, torch.compile, CUDA graphs"),
    "startup_floor_seconds": (600, "never give a model less than this to start"),
    "drain_tokens_per_second": (
        20,
        "decode speed of one request assumed when sizing --shutdown-timeout: a slow stream (a loaded GPU, a long "
        "context), so a p95 answer started just before SIGTERM still finishes",
    ),
    "drain_floor_seconds": (30, "never give in-flight requests less than this after SIGTERM (derived)"),
    "drain_ceiling_seconds": (600, "never hold a stopping pod (and a rollout) longer than this (derived)"),
    "prestop_seconds": (
        10,
        "the preStop sleep: the endpoints controller, kube-proxy and ingress controllers drop a terminating pod "
        "from the Services within a few seconds; vLLM keeps serving meanwhile and gets SIGTERM only after it",
    ),
    "shutdown_margin_seconds": (
        10,
        "after the drain vLLM stops its engine processes and frees GPU memory; the grace period leaves this long "
        "for it before the kubelet's SIGKILL",
    ),
}


def _a(name: str) -> float:
    return ASSUMPTIONS[name][0]


BYTES_PER_WEIGHT = {
    "none": None,  # the compute dtype
    "fp8": 1.0,
    "awq": 0.5,
    "awq_marlin": 0.5,
    "gptq": 0.5,
    "gptq_marlin": 0.5,
    "bitsandbytes": 0.5,
    "gguf": 0.6,  # ~4.8 bits for Q4_K_M, the common choice
    "compressed-tensors": 1.0,  # W8A8 is the common case; 4-bit checkpoints are smaller
}

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
}

#: Flags seen in blog posts and old docs that vLLM rejects, with what to do instead.
KNOWN_BAD_FLAGS: dict[str, str] = {
    "--swap-space": "was removed with the V0 engine; drop it",
    "--prefill-chunk-size": "does not exist; chunked prefill is sized by engine.maxNumBatchedTokens",
    "--gpu-memory-utilization-gpu0": "does not exist; use engine.gpuMemoryUtilization (one value for all GPUs)",
}

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
#: Flags the pod depends on (probes and Services): extraArgs may set them only with the escape-hatch
#: annotation api.ALLOW_UNSAFE_ARGS_ANNOTATION (docs/security.md).
UNSAFE_FLAGS = ("--host", "--port")
DEFAULT_PORT = api.VLLM_PORT
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


@dataclass(frozen=True)
class Problem:
    """Something that stops the server from being deployed, with the field to change."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass(frozen=True)
class FlagDecision:
    """One derived (or pinned) flag and why it has its value."""

    flag: str
    value: str
    why: str
    pinned: bool = False


@dataclass
class Memory:
    """Per-GPU memory breakdown, in bytes."""

    total: int
    reserved: int
    budget: int
    weights: int
    activation: int
    non_torch: int
    kv_cache: int
    cuda_graphs: int

    @property
    def free_after(self) -> int:
        """Memory outside vLLM's budget and the reservation (its CUDA context lives here)."""
        return self.total - self.budget - self.reserved


@dataclass
class Plan:
    """Everything derived for one VLLMServer."""

    name: str
    namespace: str
    spec: VLLMServerSpec
    model: Optional[ResolvedModel] = None
    gpu: GPUSelection = field(default_factory=GPUSelection)
    """spec.gpu resolved: the node requirements, the resource to request, the GPUs the pod can land on."""
    gpu_memory: Optional[int] = None
    gpu_source: str = ""
    tensor_parallel_size: int = 1
    args: list[str] = field(default_factory=list)
    decisions: list[FlagDecision] = field(default_factory=list)
    memory: Optional[Memory] = None
    kv_bytes_per_token: int = 0
    kv_cache_tokens: int = 0
    max_model_len: int = 0
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    gpu_memory_utilization: float = 0.0
    weight_bytes_total: int = 0
    shm_bytes: int = 0
    host_memory_bytes: int = 0
    cpu_request: int = 0
    startup_seconds: int = 0
    drain_seconds: int = 0
    """--shutdown-timeout: how long in-flight requests may finish after SIGTERM."""
    prestop_seconds: int = 0
    """The preStop sleep before SIGTERM, while the pod leaves the Services' endpoints."""
    termination_grace_seconds: int = 0
    """terminationGracePeriodSeconds: preStop sleep + shutdown timeout + teardown margin."""
    prometheus_url: Optional[str] = None
    """The Prometheus the autoscaler (source: Prometheus) or a KEDA ScaledObject queries."""
    port: int = DEFAULT_PORT
    """The port vLLM listens on in the pod: 8000 unless extraArgs sets --port under the escape hatch."""
    notes: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def max_concurrency(self) -> float:
        return self.kv_cache_tokens / self.max_model_len if self.max_model_len else 0.0

    def problem(self, field_path: str, message: str) -> None:
        self.problems.append(Problem(field_path, message))

    def estimates(self) -> dict[str, Any]:
        """The estimates in the API's camelCase shape (status.plan.estimates, plan -o json)."""
        m = self.memory
        return {
            "tensorParallelSize": self.tensor_parallel_size,
            "gpuMemoryBytes": self.gpu_memory,
            "weightBytesPerGpu": m.weights if m else None,
            "activationBytesPerGpu": m.activation if m else None,
            "overheadBytesPerGpu": (m.non_torch + m.cuda_graphs) if m else None,
            "kvCacheBytesPerGpu": m.kv_cache if m else None,
            "kvBytesPerToken": self.kv_bytes_per_token or None,
            "kvCacheTokens": self.kv_cache_tokens or None,
            "maxModelLen": self.max_model_len or None,
            "maxConcurrency": round(self.max_concurrency, 2) if self.max_model_len else None,
            "gpuMemoryUtilization": self.gpu_memory_utilization or None,
            "startupSeconds": self.startup_seconds or None,
        }

    def status(self) -> dict[str, Any]:
        """status.plan: args, estimates and the reasons, for `kubectl get -o yaml`."""
        return {
            "args": list(self.args),
            "estimates": {k: v for k, v in self.estimates().items() if v is not None},
            "notes": [f"{d.flag} {d.value}".strip() + f": {d.why}" for d in self.decisions] + list(self.notes),
            "modelSource": self.model.source if self.model else None,
        }


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


def kv_bytes_per_token(arch: api.ModelArchitecture, tp: int, kv_dtype: str, elem_bytes: int) -> int:
    """2 (K and V) x layers x max(1, kv_heads // TP) x head_dim x dtype bytes, per GPU."""
    kv_elem = 1 if kv_dtype.startswith("fp8") else elem_bytes
    kv_heads_per_gpu = max(1, arch.num_kv_heads // tp)
    return 2 * arch.num_layers * kv_heads_per_gpu * arch.head_dim * kv_elem


def weight_bytes(arch: api.ModelArchitecture, quantization: str, elem_bytes: int) -> int:
    """Bytes of all weights; quantization leaves the embeddings and lm_head in 16-bit."""
    params = arch.parameter_count
    per = BYTES_PER_WEIGHT[quantization]
    if per is None:
        return params * elem_bytes
    embed = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
    embed = min(embed, params)
    overhead = _a("quant_overhead") if per < 1 else 1.0
    return int((params - embed) * per * overhead + embed * elem_bytes)


def rotary_cache_bytes(arch: api.ModelArchitecture, elem_bytes: int) -> int:
    """The rotary embedding's cos/sin cache, max positions x head dim, on every GPU.

    vLLM counts it with the weights: 131072 x 128 x 2 bytes = 0.031 GiB is exactly the gap between
    Llama-3.1-8B's 8.03e9 x 2 bytes (14.957 GiB) and the 14.9888 GiB vLLM logged (vllm issue 10517).
    """
    return arch.max_position_embeddings * arch.head_dim * elem_bytes


def activation_bytes(arch: api.ModelArchitecture, tp: int, batched_tokens: int, max_num_seqs: int, elem_bytes: int) -> int:
    """Peak memory of vLLM's profiling run: the forward pass over `batched_tokens`, or the sampler's
    dummy run over `max_num_seqs` logits rows that follows it (holding only the hidden states), whichever is larger."""
    per_token = (2 * arch.intermediate_size / tp + _a("activation_hidden_factor") * arch.hidden_size) * elem_bytes
    forward = batched_tokens * per_token
    rows = min(max_num_seqs, batched_tokens)
    sampler = rows * arch.vocab_size * _a("logits_bytes") + batched_tokens * arch.hidden_size * elem_bytes
    return int(max(forward, sampler))


def _divisors(n: int, limit: int = 64) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def tp_shards_evenly(arch: api.ModelArchitecture, tp: int) -> bool:
    """Whether vLLM can shard the model over `tp` GPUs: TP divides the attention heads, and the KV
    heads split evenly (kv % tp) or are replicated evenly (tp % kv) (QKVParallelLinear's divide())."""
    if arch.num_attention_heads % tp:
        return False
    kv = arch.num_kv_heads
    return kv % tp == 0 if kv >= tp else tp % kv == 0


def valid_tp_sizes(arch: api.ModelArchitecture, limit: int = 16) -> list[int]:
    return [d for d in _divisors(arch.num_attention_heads, limit) if tp_shards_evenly(arch, d)]


# --------------------------------------------------------------------------- validation
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


def weights_quantization(spec: VLLMServerSpec, arch: api.ModelArchitecture) -> str:
    """The quantization the weights are sized with: the spec's, or with none the checkpoint's own."""
    checkpoint = arch.quantization
    if spec.model.quantization == "none" and checkpoint in BYTES_PER_WEIGHT and checkpoint != "none":
        return checkpoint
    return spec.model.quantization


def quantization_problems(spec: VLLMServerSpec, arch: api.ModelArchitecture) -> list[Problem]:
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
                        + (f" or {checkpoint}" if checkpoint != "other" else ""))]
    return []


def _capability(gpu: Any) -> int:
    major, _, minor = str(gpu.compute_capability).partition(".")
    return int(major) * 10 + int(minor or 0)


def hardware_problems(spec: VLLMServerSpec, gpu: GPUSelection) -> list[Problem]:
    """What the GPU's compute capability rules out, as vLLM gates it (vllm_flags.json, read from the release's
    own code: each quantization method's get_min_capability, CudaPlatform.check_if_supports_dtype). Checked
    against the oldest product the pods may land on; an unknown product (gpu.memory given) is not checked."""
    if not gpu.products:
        return []
    oldest = min(gpu.products, key=_capability)
    have, name = _capability(oldest), oldest.product
    out = []
    bf16 = vllm_flags.bfloat16_min_capability()
    if spec.model.dtype == "bfloat16" and have < bf16:
        out.append(Problem("spec.model.dtype", f"bfloat16 needs compute capability {bf16 / 10:.1f} in vLLM "
                           f"{vllm_flags.VERSION}; {name} has {have / 10:.1f}: use float16, or auto (vLLM then "
                           "runs a bfloat16 checkpoint as float16)"))
    method = spec.model.quantization
    need = vllm_flags.quantization_min_capability(method) if method != "none" else None
    if need is not None and have < need:
        usable = sorted(m for m in QUANTIZATION_CHOICES if m != "none" and m not in UNSUPPORTED_QUANTIZATION
                        and (vllm_flags.quantization_min_capability(m) or 1000) <= have)
        out.append(Problem("spec.model.quantization", f"{method} needs compute capability {need / 10:.1f} in vLLM "
                           f"{vllm_flags.VERSION}; {name} has {have / 10:.1f}: "
                           + (f"a checkpoint quantized with {', '.join(usable)} runs there" if usable
                              else "no quantization method of vLLM runs there")))
    return out


def check_spec(name: str, spec: VLLMServerSpec, *, default_prometheus_url: Optional[str] = None,
               allow_unsafe_args: bool = False, urls: Optional[URLPolicy] = None) -> list[Problem]:
    """Semantic checks the CRD schema cannot express. Pure. `urls`: the operator's URL settings (urlpolicy.py;
    spec.model.configURL is checked before it is fetched, in pipeline.plan_server)."""
    problems: list[Problem] = []
    add = lambda f, m: problems.append(Problem(f, m))  # noqa: E731

    if name[:1].isdigit():
        add("metadata.name", f"{name!r} starts with a digit; the client Service is named after the server and "
            "Service names must start with a letter (DNS-1035)")
    if len(name) > MAX_NAME_LENGTH:
        add("metadata.name", f"{len(name)} characters is too long: at most {MAX_NAME_LENGTH}, because pod labels derived "
            "from it are limited to 63 characters")
    a = spec.autoscaling
    if a.max_replicas is not None and a.max_replicas < a.min_replicas:  # as the CRD's rule: enabled or not
        add("spec.autoscaling.maxReplicas", f"{a.max_replicas} is below minReplicas {a.min_replicas}")
    if a.enabled:
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
    if spec.host_network and spec.workload != "DaemonSet":
        add("spec.hostNetwork", "only a DaemonSet may use the node's network (replicas of a StatefulSet would "
            "collide on port 8000)")
    if spec.cache is not None:
        c = spec.cache
        if c.claim_name and (c.size or c.storage_class_name):
            add("spec.cache", "set either claimName (an existing claim) or size/storageClassName (a new claim per "
                "replica), not both")
        elif not c.claim_name and not c.size:
            add("spec.cache", "set size (a new claim per replica) or claimName (an existing claim)")
        elif c.shared and not c.size:
            add("spec.cache.shared", "shared needs size (the claim the operator creates for every replica); a "
                "claimName is shared as it is")
        elif c.size and not c.shared and spec.workload == "DaemonSet":
            add("spec.cache.size", "a DaemonSet cannot create a claim per pod; set cache.shared (one ReadWriteMany "
                "claim for every node) or use cache.claimName (ReadWriteMany or ReadOnlyMany)")
    problems.extend(credential_problems(spec))
    problems.extend(flag_like_values(spec))
    for i, env in enumerate(spec.engine.env):
        where = f"spec.engine.env[{i}]"
        if env.name in DEVICE_PLUGIN_ENV:
            add(where, f"{env.name} may not be set: {DEVICE_PLUGIN_ENV[env.name]}. Choose the GPUs with spec.gpu "
                "(count, product)")
        elif env.name in OWNED_ENV:
            add(where, f"{env.name} is set by the operator; use hfTokenSecretRef for tokens and cache for HF_HOME")
        elif env.value_from is not None and env.value:
            add(where, f"{env.name}: set value or valueFrom, not both")
        elif _CREDENTIAL_VALUE.search(env.value) or (_CREDENTIAL_NAME.search(env.name) and env.value):
            add(where, f"{env.name} looks like a credential in plaintext; anyone who can read the VLLMServer can read "
                "it. Put it in a Secret and reference it with spec.hfTokenSecretRef (the Hugging Face token) or "
                "valueFrom.secretKeyRef")
    if spec.model.quantization in UNSUPPORTED_QUANTIZATION:
        add("spec.model.quantization", f"vLLM {vllm_flags.VERSION} has no quantization method "
            f"{spec.model.quantization!r} and would exit at start: "
            f"{UNSUPPORTED_QUANTIZATION[spec.model.quantization]}")
    gpu_resources = {k for k in [*spec.resources.requests, *spec.resources.limits]
                     if k == "nvidia.com/gpu" or k.startswith("nvidia.com/mig-") or k == spec.gpu.resource_name}
    for key in sorted(gpu_resources):
        add("spec.resources", f"{key} comes from spec.gpu (count, migProfile, resourceName); remove it from resources")
    sizes = [("spec.gpu.memory", spec.gpu.memory), ("spec.gpu.reservedMemory", spec.gpu.reserved_memory),
             ("spec.shmSize", spec.shm_size), ("spec.cache.size", spec.cache.size if spec.cache else None)]
    sizes += [(f"spec.resources.{side}.{k}", v) for side, values in (("requests", spec.resources.requests),
                                                                     ("limits", spec.resources.limits))
              for k, v in values.items()]
    for where, value in sizes:
        if value is not None and parse_quantity(value) < 0:
            add(where, f"{value} is negative")
    for i, t in enumerate(spec.tolerations):
        where = f"spec.tolerations[{i}]"
        if t.operator == "Exists" and t.value:
            add(f"{where}.value", "must be empty with operator: Exists")
        if not t.key and t.operator != "Exists":
            add(f"{where}.operator", "must be Exists when key is empty (a toleration of every taint)")
        if t.toleration_seconds is not None and t.effect != "NoExecute":
            add(f"{where}.tolerationSeconds", "applies to effect: NoExecute only")
        if t.value and not re.match(api.LABEL_VALUE_PATTERN, t.value) or (t.value and len(t.value) > 63):
            add(f"{where}.value", f"{t.value!r} is not a label value (at most 63 letters, digits, '-', '_' or '.')")
    for key in set(spec.resources.requests) & set(spec.resources.limits):
        if parse_quantity(spec.resources.requests[key]) > parse_quantity(spec.resources.limits[key]):
            add(f"spec.resources.requests.{key}", f"{spec.resources.requests[key]} is above the limit "
                f"{spec.resources.limits[key]}; Kubernetes refuses a request above its limit")
    for key, request in spec.resources.requests.items():
        if not overcommittable(key):
            limit = spec.resources.limits.get(key)
            if limit is None:
                add(f"spec.resources.requests.{key}", f"{key} cannot be overcommitted, so Kubernetes needs a limit "
                    f"equal to the request: set spec.resources.limits.{key} to {request} (or only the limit)")
            elif parse_quantity(request) != parse_quantity(limit):
                add(f"spec.resources.requests.{key}", f"{request} differs from the limit {limit}; {key} cannot be "
                    "overcommitted, so Kubernetes refuses a request other than the limit")
    problems.extend(check_extra_args(spec.engine.extra_args, allow_unsafe=allow_unsafe_args,
                                     loose=image_vllm_version(spec.image) not in (None, vllm_flags.VERSION)))
    return problems


_IMAGE_VERSION = re.compile(r":v?(\d+\.\d+\.\d+(?:[.+-]?[0-9A-Za-z.]+)?)(?:@sha256:[0-9a-f]{64})?$")


def image_vllm_version(image: str) -> Optional[str]:
    """The vLLM release an image's tag names (vllm/vllm-openai:v0.33.1 -> 0.33.1), or None when it names none. A
    build variant after '-' or '+' (v0.32.0-cu130) is the same release; rc1, dev, post are other ones."""
    found = _IMAGE_VERSION.search(image.strip())
    return re.split(r"[-+]", found.group(1))[0] if found else None


def unchecked_extra_args(extra: list[str]) -> list[str]:
    """The extraArgs flags the flag snapshot does not know (passed unchecked for another vLLM release)."""
    return [flag for flag in (token.partition("=")[0] for token in extra)
            if flag.startswith("--") and _snapshot_flag(flag)[2] is None]


def _snapshot_flag(flag: str) -> tuple[str, Optional[str], Optional[vllm_flags.FlagInfo]]:
    """(normalised flag, its JSON-valued parent for a dotted key such as --compilation-config.mode, what the
    snapshot's parser knows of it, or None)."""
    normal = vllm_flags.normalise(flag)
    # --compilation-config.mode 3 sets one key of a JSON-valued flag (FlexibleArgumentParser).
    dotted = normal.split(".", 1)[0].rstrip("+") if normal.startswith("--") and "." in normal else None
    return normal, dotted, vllm_flags.flags().get(dotted or normal)


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


def check_extra_args(extra: list[str], allow_unsafe: bool = False, loose: bool = False) -> list[Problem]:
    """Refuse flags vLLM does not have, flags the operator derives (--host/--port only with the escape-hatch
    annotation: `allow_unsafe`) and credentials as flag values (one problem per flag).

    `loose`: the image runs another vLLM release than the snapshot's: what only the snapshot's parser can tell
    (a flag it lacks or has removed, a value outside its choices) is not refused, since that release may differ;
    what the operator owns and credentials still are."""
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
        flag, eq, inline = token.partition("=")
        if flag.startswith("-O") and not flag.startswith("--") and flag != "-O":  # -O3: --optimization-level 3
            flag, eq, inline = "--optimization-level", "=", flag[2:].lstrip("=") or inline
        normal, dotted, info = _snapshot_flag(flag)
        refusal = None
        if loose and (info is None or normal in KNOWN_BAD_FLAGS or flag in KNOWN_BAD_FLAGS) \
                and normal not in CREDENTIAL_FLAGS and normal not in OWNED_FLAGS and flag not in OWNED_FLAGS \
                and not (dotted and dotted in OWNED_FLAGS):
            if not eq and i < len(extra) and _is_value(extra[i]):
                i += len(_values(extra, i, info))
            continue
        if normal in KNOWN_BAD_FLAGS or flag in KNOWN_BAD_FLAGS:
            refusal = f"{flag} {KNOWN_BAD_FLAGS.get(normal) or KNOWN_BAD_FLAGS[flag]}"
        elif normal in CREDENTIAL_FLAGS:
            refusal = (f"{flag} takes a credential, which must not be written in the spec (anyone who can read the "
                       f"VLLMServer could read it); {CREDENTIAL_FLAGS[normal]}")
        elif normal in UNSAFE_FLAGS and allow_unsafe:
            pass  # the escape hatch: the user owns the pod's address (docs/security.md)
        elif normal in UNSAFE_FLAGS:
            refusal = (f"{flag} is fixed by the operator: {OWNED_FLAGS[normal]}. To set it anyway, annotate the "
                       f"VLLMServer {api.ALLOW_UNSAFE_ARGS_ANNOTATION}: \"true\" (docs/security.md)")
        elif normal in OWNED_FLAGS or flag in OWNED_FLAGS or (dotted and dotted in OWNED_FLAGS):
            owner = OWNED_FLAGS.get(dotted or normal) or OWNED_FLAGS.get(flag)
            refusal = f"{flag} is derived by the operator; set {owner} instead"
        elif info is None:
            refusal = f"vLLM {vllm_flags.VERSION} has no flag {flag}: the server would exit with code 2 and crash-loop"
        if refusal:
            problems.append(Problem(where, refusal))
            # The refused flag's value(s) go with it; do not report them again as "not a flag".
            if not eq and (info is None or info.takes_value):
                i += len(_values(extra, i, info))
            continue
        assert info is not None
        if dotted:
            if not eq:
                if i < len(extra) and _is_value(extra[i]):
                    i += 1
                else:
                    problems.append(Problem(where, f"{flag} needs a value"))
            continue
        if eq:
            if not info.takes_value:
                problems.append(Problem(where, f"{flag} takes no value; write {flag} alone"))
            elif info.choices and inline not in info.choices and not loose:
                problems.append(Problem(where, f"{flag} {inline!r} is not one of {', '.join(info.choices)}"))
            continue
        values = _values(extra, i, info) if info.takes_value else []
        if values:
            i += len(values)
            for value in values:
                if info.choices and value not in info.choices and not loose:
                    problems.append(Problem(where, f"{flag} {value!r} is not one of {', '.join(info.choices)}"))
        elif info.takes_value and info.nargs_required:
            problems.append(Problem(where, f"{flag} needs a value"))
    return problems


# --------------------------------------------------------------------------- planning
def resolve_gpu_memory(spec: VLLMServerSpec, gpu: GPUSelection) -> tuple[Optional[int], str]:
    """One GPU's (or MIG slice's) memory: gpu.memory, else the smallest the selected nodes can have."""
    if spec.gpu.memory is not None:
        return int(parse_quantity(spec.gpu.memory)), f"spec.gpu.memory {spec.gpu.memory}"
    return gpu.memory_bytes, gpu.memory_source


def plan(
    name: str,
    namespace: str,
    spec: VLLMServerSpec,
    model: Optional[ResolvedModel],
    gpu: Optional[GPUSelection] = None,
    *,
    model_error: Optional[str] = None,
    model_error_field: str = "spec.model.architecture",
    default_prometheus_url: Optional[str] = None,
    allow_unsafe_args: bool = False,
    urls: Optional[URLPolicy] = None,
) -> Plan:
    """Derive the vLLM args and estimates for one server. Pure; never raises on bad input.

    `gpu`: spec.gpu resolved by gpus.select_gpu (resolved here when not given).
    `allow_unsafe_args`: the VLLMServer carries api.ALLOW_UNSAFE_ARGS_ANNOTATION, so extraArgs may set
    --host/--port (the container port then follows --port). `urls`: the operator's URL settings (None: the
    offline CLI, which fetches nothing for anyone else)."""
    p = Plan(name=name, namespace=namespace, spec=spec, model=model,
             prometheus_url=spec.autoscaling.prometheus_url or default_prometheus_url)
    p.problems.extend(check_spec(name, spec, default_prometheus_url=default_prometheus_url,
                                 allow_unsafe_args=allow_unsafe_args, urls=urls))
    if allow_unsafe_args:
        unsafe_overrides(p)
    tp = p.tensor_parallel_size = spec.gpu.count
    p.gpu = gpu if gpu is not None else select_gpu(spec.gpu)
    p.problems.extend(Problem(where, message) for where, message in p.gpu.problems)
    p.notes.extend(p.gpu.notes)
    p.problems.extend(hardware_problems(spec, p.gpu))
    p.gpu_memory, p.gpu_source = resolve_gpu_memory(spec, p.gpu)
    if model is None:
        p.problem(model_error_field, model_error or f"no architecture for {spec.model.name}")
    if p.gpu_memory is not None and p.gpu_memory < GiB:
        p.problem("spec.gpu.memory", f"{spec.gpu.memory} is less than 1Gi: not a GPU vLLM can serve from")
        p.gpu_memory = None
    if model is None or p.gpu_memory is None:
        return p
    arch = model.architecture
    e = spec.engine
    prof = spec.workload_profile
    elem = dtype_bytes(spec, model)

    # ---- tensor parallelism
    valid = ", ".join(str(d) for d in valid_tp_sizes(arch))
    if arch.num_attention_heads % tp:
        p.problem("spec.gpu.count", f"tensor parallelism over {tp} GPUs must divide the model's "
                  f"{arch.num_attention_heads} attention heads; use one of {valid}")
    elif not tp_shards_evenly(arch, tp):
        p.problem("spec.gpu.count", f"{tp} GPUs cannot share the model's {arch.num_kv_heads} KV heads evenly "
                  f"(vLLM fails loading the weights); use one of {valid}")
    p.decisions.append(FlagDecision("--tensor-parallel-size", str(tp), f"gpu.count: shard the model over {tp} GPU(s) "
                                f"({arch.num_attention_heads} heads / {tp} = {arch.num_attention_heads / tp:g} per GPU)"))

    # ---- memory budget
    total = p.gpu_memory
    reserved = int(parse_quantity(spec.gpu.reserved_memory))
    graphs = 0 if e.enforce_eager else int(_a("cuda_graph_per_gpu"))
    outside = _a("cuda_context") + _a("safety_margin")
    ceiling = (total - reserved - outside) / total
    if e.gpu_memory_utilization is not None:
        util = e.gpu_memory_utilization
        if util > ceiling + 1e-9:
            p.problem("spec.engine.gpuMemoryUtilization", f"{util} asks for {gib(util * total)} of a {gib(total)} GPU, "
                      f"but reservedMemory ({gib(reserved)}), vLLM's CUDA context ({gib(_a('cuda_context'))}) and a "
                      f"{gib(_a('safety_margin'))} margin leave {gib(ceiling * total)}: vLLM would refuse to start "
                      f"(free memory below the budget). Use at most {math.floor(ceiling * 100) / 100:.2f}")
        why = "pinned by engine.gpuMemoryUtilization"
    else:
        util = min(_a("default_utilization"), math.floor(ceiling * 100) / 100)
        why = (f"vLLM's default {_a('default_utilization')}" if util == _a("default_utilization") else
               f"leaves {gib(reserved)} reserved + {gib(outside)} for vLLM's CUDA context and a margin free")
    if util <= 0:
        p.problem("spec.gpu.reservedMemory", f"reserving {gib(reserved)} of a {gib(total)} GPU leaves nothing for vLLM")
        return p
    p.gpu_memory_utilization = util
    p.decisions.append(FlagDecision("--gpu-memory-utilization", repr(float(util)), f"{why}: budget {gib(util * total)} of "
                                f"{gib(total)} per GPU", pinned=e.gpu_memory_utilization is not None))
    budget = int(util * total)

    # ---- weights
    p.problems.extend(quantization_problems(spec, arch))
    sized_as = weights_quantization(spec, arch)
    if sized_as != spec.model.quantization:
        p.notes.append(f"weights sized as the checkpoint stores them ({sized_as}, config.json quantization_config); "
                       "vLLM reads the method from the checkpoint")
    p.weight_bytes_total = weight_bytes(arch, sized_as, elem)
    weights = math.ceil(p.weight_bytes_total / tp) + rotary_cache_bytes(arch, elem)

    # ---- batch sizing (before activation: the profile run uses max_num_batched_tokens)
    big_gpu = total >= 70 * GiB and not any("A100" in g.product.upper() for g in p.gpu.products)
    seqs_default, batched_default = (1024, 8192) if big_gpu else (256, 2048)
    if e.max_num_seqs is not None:
        seqs, seqs_why = e.max_num_seqs, "pinned by engine.maxNumSeqs"
    elif prof.target_concurrency:
        factor = {"latency": 1.0, "balanced": 1.25, "throughput": 2.0}[prof.priority]
        seqs = max(1, math.ceil(prof.target_concurrency * factor))
        seqs_why = (f"Little's law: targetConcurrency {prof.target_concurrency} requests in flight x {factor} "
                    f"({prof.priority}) so the target never queues inside vLLM")
    else:
        seqs, seqs_why = seqs_default, f"vLLM's default for a {gib(total)} GPU"
    if e.max_num_batched_tokens is not None:
        batched, batched_why = e.max_num_batched_tokens, "pinned by engine.maxNumBatchedTokens"
    else:
        batched = {"latency": min(batched_default, 1024) if not big_gpu else 2048, "balanced": batched_default,
                   "throughput": batched_default * 2 if big_gpu else 8192}[prof.priority]
        batched_why = {"latency": "small prefill chunks keep decode steps short (latency)",
                       "balanced": "vLLM's default chunked-prefill budget",
                       "throughput": "large prefill chunks for throughput"}[prof.priority]
        if prof.priority == "throughput" and prof.p95_prompt_tokens:
            batched = max(batched, min(prof.p95_prompt_tokens, 16384))
        if batched < seqs:
            batched, batched_why = seqs, f"raised to max-num-seqs ({seqs}): vLLM requires batched tokens >= seqs"
    if batched < seqs:
        p.problem("spec.engine.maxNumBatchedTokens", f"{batched} is below maxNumSeqs {seqs}; vLLM requires "
                  "max-num-batched-tokens >= max-num-seqs")

    # ---- activation, overheads, KV
    activation = activation_bytes(arch, tp, batched, seqs, elem)
    non_torch = int(_a("non_torch_tp1") + (_a("nccl_per_gpu_tp") if tp > 1 else 0))
    kv = budget - weights - activation - non_torch - graphs
    p.memory = Memory(total=total, reserved=reserved, budget=budget, weights=weights, activation=activation,
                      non_torch=non_torch, kv_cache=max(kv, 0), cuda_graphs=graphs)
    kv_dtype = e.kv_cache_dtype or "auto"
    p.kv_bytes_per_token = kv_bytes_per_token(arch, tp, kv_dtype, elem)
    if kv <= 0:
        hint = "use a bigger GPU"
        for t in (2, 4, 8, 16, 32, 64):
            if t <= tp or not tp_shards_evenly(arch, t):
                continue
            need = (math.ceil(p.weight_bytes_total / t) + rotary_cache_bytes(arch, elem)
                    + activation_bytes(arch, t, batched, seqs, elem) + int(_a("non_torch_tp1") + _a("nccl_per_gpu_tp"))
                    + graphs)
            if need < budget:
                hint = f"use more GPUs (gpu.count: {t} leaves room for the KV cache)"
                break
        p.problem("spec.gpu", f"the model does not fit: weights {gib(weights)} + activations {gib(activation)} + "
                  f"overheads {gib(non_torch + graphs)} per GPU exceed the {gib(budget)} budget of a {gib(total)} GPU; "
                  f"{hint}, a quantized model (model.quantization), or a smaller maxNumBatchedTokens")
        return p
    block = int(_a("block_size"))
    p.kv_cache_tokens = _round_down(kv / p.kv_bytes_per_token, block)

    # ---- max model len
    model_limit = arch.max_position_embeddings
    fit_limit = _round_down(p.kv_cache_tokens * _a("context_headroom"), block)
    if e.max_model_len is not None:
        length = e.max_model_len
        if length > model_limit:
            p.problem("spec.engine.maxModelLen", f"{length} is longer than {spec.model.name} supports "
                      f"({model_limit} tokens); vLLM refuses it. Use at most {model_limit}")
        elif length > fit_limit:
            p.problem("spec.engine.maxModelLen", f"{length} tokens do not fit the KV cache ({p.kv_cache_tokens} "
                      f"tokens, {gib(kv)} per GPU) with a {int(100 - _a('context_headroom') * 100)}% margin; the largest "
                      f"length that fits is {fit_limit}. Lower maxModelLen, add GPUs, or use kvCacheDtype: fp8")
        len_why = "pinned by engine.maxModelLen"
    else:
        requested = prof.max_context_tokens or model_limit
        if prof.max_context_tokens and requested > model_limit:
            p.problem("spec.workloadProfile.maxContextTokens", f"{requested} is longer than {spec.model.name} "
                      f"supports ({model_limit} tokens); use at most {model_limit}")
        length = min(requested, model_limit, fit_limit)
        if length == requested:
            len_why = "workloadProfile.maxContextTokens" if prof.max_context_tokens else "the model's own limit"
            len_why += f", which fits the KV cache ({p.kv_cache_tokens} tokens)"
        else:
            len_why = (f"the KV cache holds {p.kv_cache_tokens} tokens; {length} keeps a "
                       f"{int(100 - _a('context_headroom') * 100)}% margin (wanted {requested})")
            if prof.max_context_tokens:
                p.notes.append(f"warning: maxContextTokens {requested} does not fit; serving at most {length} tokens. "
                               "Add GPUs or set engine.kvCacheDtype: fp8 to serve the full context")
        typical = (prof.p95_prompt_tokens or 0) + (prof.p95_output_tokens or 0)
        if length < max(typical, 16):
            # Blame what actually limits the length: the profile's own maximum, the model, or the KV cache.
            if typical > model_limit:
                p.problem("spec.workloadProfile.p95PromptTokens", f"a typical request (p95 prompt + output = "
                          f"{typical} tokens) is longer than {spec.model.name} supports ({model_limit} tokens)")
            elif prof.max_context_tokens and prof.max_context_tokens < typical:
                p.problem("spec.workloadProfile.maxContextTokens", f"{prof.max_context_tokens} is shorter than one "
                          f"typical request (p95PromptTokens + p95OutputTokens = {typical}); raise it or lower the "
                          "p95 figures")
            else:
                p.problem("spec.gpu", f"the KV cache ({p.kv_cache_tokens} tokens) cannot hold one typical request "
                          f"({typical} tokens); add GPUs or use a quantized model")
    p.max_model_len = length
    p.decisions.append(FlagDecision("--max-model-len", str(length), len_why, pinned=e.max_model_len is not None))

    # cap seqs by what the KV cache can hold for typical requests
    if e.max_num_seqs is None:
        typical = (prof.p95_prompt_tokens or 0) + (prof.p95_output_tokens or 0)
        if typical:
            cap = max(1, p.kv_cache_tokens // typical)
            if cap < seqs:
                seqs, seqs_why = cap, f"the KV cache holds {cap} requests of p95 prompt+output ({typical} tokens)"
    p.max_num_seqs, p.max_num_batched_tokens = seqs, batched
    p.decisions.append(FlagDecision("--max-num-seqs", str(seqs), seqs_why, pinned=e.max_num_seqs is not None))
    p.decisions.append(FlagDecision("--max-num-batched-tokens", str(batched), batched_why,
                                pinned=e.max_num_batched_tokens is not None))
    check_queue_cap(p)
    if kv_dtype != "auto":
        p.decisions.append(FlagDecision("--kv-cache-dtype", kv_dtype, f"pinned: {p.kv_bytes_per_token} bytes/token per GPU",
                                    pinned=True))
    prefix = True if e.enable_prefix_caching is None else e.enable_prefix_caching
    p.decisions.append(FlagDecision("--enable-prefix-caching" if prefix else "--no-enable-prefix-caching", "",
                                "pinned" if e.enable_prefix_caching is not None else
                                "reuse KV of shared prefixes (system prompts, chat history)",
                                pinned=e.enable_prefix_caching is not None))
    if e.enforce_eager:
        p.decisions.append(FlagDecision("--enforce-eager", "", "pinned: no CUDA graphs (less memory, slower decode)",
                                    pinned=True))

    # ---- pod sizing
    if spec.ipc == "SharedMemory":
        if spec.shm_size is not None:
            p.shm_bytes = int(parse_quantity(spec.shm_size))
            if tp > 1 and p.shm_bytes < GiB:
                p.problem("spec.shmSize", f"{spec.shm_size} of /dev/shm is too small for tensor parallelism over {tp} "
                          "GPUs (NCCL fails with 'Bus error'); use at least 1Gi, or ipc: Host")
        else:
            p.shm_bytes = 2 * GiB if tp == 1 else 4 * GiB * tp
            p.notes.append(f"/dev/shm {gib(p.shm_bytes)} in memory: room for NCCL between {tp} GPU worker(s)")
    else:
        p.notes.append("ipc: Host: NCCL uses the host's shared memory (the pod gets hostIPC: true)")
    p.host_memory_bytes = max(8 * GiB, math.ceil((p.weight_bytes_total / 2 + 4 * GiB) / GiB) * GiB)
    p.cpu_request = max(4, 2 * tp + 2)
    p.startup_seconds = int(max(_a("startup_floor_seconds"),
                                p.weight_bytes_total / _a("load_bandwidth") + _a("engine_init_seconds")))
    if spec.startup_seconds is not None:
        p.notes.append(f"startup probe budget {spec.startup_seconds} s from spec.startupSeconds (derived: "
                       f"{p.startup_seconds} s)")
        p.startup_seconds = spec.startup_seconds
    if api.downloads_in_init_container(spec.model):
        p.notes.append(f"the weights download in the init container 'download' before vLLM starts (no probe "
                       f"deadline: a slow link is never killed); the startup probe's {p.startup_seconds} s cover "
                       f"reading {gib(p.weight_bytes_total)} from the cache and the engine's start")
    else:
        p.notes.append(f"vLLM downloads or reads the weights itself: the startup probe's {p.startup_seconds} s cover "
                       f"{gib(p.weight_bytes_total)} at {_a('load_bandwidth') / 1e6:.0f} MB/s and the engine's start")
    plan_shutdown(p)
    version = image_vllm_version(spec.image)
    if version is not None and version != vllm_flags.VERSION:
        unchecked = unchecked_extra_args(list(spec.engine.extra_args))
        p.notes.append(f"image {spec.image} runs vLLM {version}; the operator's flag snapshot is vLLM "
                       f"{vllm_flags.VERSION}'s, so extraArgs are checked loosely"
                       + (f" ({', '.join(unchecked)} passed unchecked)" if unchecked else "")
                       + f" and the derived flags are {vllm_flags.VERSION}'s")
    elif spec.image.split("@", 1)[0] != api.DEFAULT_IMAGE:  # the default release pinned by digest is the default
        p.notes.append(f"image {spec.image} is not the default; flags were checked against vLLM {vllm_flags.VERSION}")
    p.args = engine_args(p)
    return p


def min_queue_cap(max_num_seqs: int, target_waiting: float) -> int:
    """The smallest --max-num-queued-reqs with which the autoscaler can still scale up. vLLM counts running
    and waiting requests against the cap (SchedulerConfig.max_num_queued_reqs), so with max_num_seqs running
    at most cap - max_num_seqs wait; the autoscaler (and an HPA, with the same default tolerance) scales up
    only when more than target x (1 + tolerance) wait per replica."""
    return max_num_seqs + math.floor(target_waiting * (1 + TOLERANCE) + 1e-9) + 1


def check_queue_cap(p: Plan) -> None:
    """engine.maxNumQueuedReqs: emitted as pinned; refused when an autoscaler would never see its target."""
    e, a = p.spec.engine, p.spec.autoscaling
    cap = e.max_num_queued_reqs
    if cap is None:
        return
    seqs = p.max_num_seqs
    p.decisions.append(FlagDecision("--max-num-queued-reqs", str(cap), f"pinned by engine.maxNumQueuedReqs: past {cap} "
                                "requests (running and waiting) vLLM answers 503 and clients retry elsewhere",
                                pinned=True))
    if a.enabled:
        need = min_queue_cap(seqs, a.target_waiting_per_replica)
        if cap < need:
            p.problem("spec.engine.maxNumQueuedReqs",
                      f"{cap} requests per server, {seqs} of them running (max-num-seqs), leave room for at most "
                      f"{max(cap - seqs, 0)} waiting; the autoscaler scales up only when more than "
                      f"{a.target_waiting_per_replica * (1 + TOLERANCE):g} wait per replica (targetWaitingPerReplica "
                      f"{a.target_waiting_per_replica:g} and its {TOLERANCE:.0%} tolerance), so it would never scale "
                      f"up and vLLM would answer 503 instead. Use at least {need}, or lower targetWaitingPerReplica")
    elif cap < seqs:
        p.notes.append(f"warning: engine.maxNumQueuedReqs {cap} is below --max-num-seqs {seqs}: vLLM never runs more "
                       f"than {cap} requests at once")


def plan_shutdown(p: Plan) -> None:
    """--shutdown-timeout and the pod's termination timeline: the preStop sleep (the pod leaves the Services'
    endpoints while vLLM still serves), then SIGTERM and the drain (vLLM takes no new request and lets the
    in-flight ones finish, up to the timeout), then vLLM's teardown; terminationGracePeriodSeconds covers all
    three, so the kubelet's SIGKILL never cuts a drain short."""
    e, prof = p.spec.engine, p.spec.workload_profile
    speed = _a("drain_tokens_per_second")
    if e.shutdown_timeout_seconds is not None:
        p.drain_seconds, why = e.shutdown_timeout_seconds, "pinned by engine.shutdownTimeoutSeconds"
        if e.shutdown_timeout_seconds == 0:
            why += ": vLLM aborts every in-flight request on SIGTERM"
    else:
        tokens = prof.p95_output_tokens or 512
        source = "workloadProfile.p95OutputTokens" if prof.p95_output_tokens else "an assumed p95 output"
        needed = math.ceil(tokens / speed)
        floor, ceiling = int(_a("drain_floor_seconds")), int(_a("drain_ceiling_seconds"))
        p.drain_seconds = min(ceiling, max(floor, needed))
        clipped = (f", raised to the {floor} s floor" if needed < floor else
                   f", cut to the {ceiling} s ceiling" if needed > ceiling else "")
        why = (f"{source} {tokens} tokens at {speed:g} tokens/s = {needed} s{clipped}: a request started just "
               "before SIGTERM finishes instead of being aborted")
    p.decisions.append(FlagDecision("--shutdown-timeout", str(p.drain_seconds), why,
                                pinned=e.shutdown_timeout_seconds is not None))
    p.prestop_seconds = int(_a("prestop_seconds"))
    margin = int(_a("shutdown_margin_seconds"))
    p.termination_grace_seconds = p.prestop_seconds + p.drain_seconds + margin
    p.notes.append(f"terminationGracePeriodSeconds {p.termination_grace_seconds} = preStop sleep {p.prestop_seconds} s "
                   f"(the pod leaves the Services' endpoints while vLLM still serves) + --shutdown-timeout "
                   f"{p.drain_seconds} s (in-flight requests finish) + {margin} s for vLLM's teardown")


def unsafe_overrides(p: Plan) -> None:
    """--host/--port in extraArgs under the escape hatch: vLLM takes the last occurrence, so they win over the
    operator's; the container port (and with it the probes, the Services' target and a host network's port)
    follows --port, and a note says what the user took over."""
    extra = p.spec.engine.extra_args
    for i, token in enumerate(extra):
        flag, eq, inline = token.partition("=")
        if vllm_flags.normalise(flag) not in UNSAFE_FLAGS:
            continue
        value = inline if eq else (extra[i + 1] if i + 1 < len(extra) else "")
        if vllm_flags.normalise(flag) == "--port":
            if not (value.isdigit() and 1 <= int(value) <= 65535):
                p.problem(f"spec.engine.extraArgs[{i}]", f"--port needs a port number (1-65535), got {value!r}")
                continue
            p.port = int(value)
        p.notes.append(f"warning: extraArgs sets {flag} {value} ({api.ALLOW_UNSAFE_ARGS_ANNOTATION}); the container "
                       f"port is {p.port}: probes and Services follow it, but a --host the pod IP does not reach "
                       "fails every probe")


def engine_args(p: Plan) -> list[str]:
    """The container args after `vllm serve`: model first, then flags in a stable order."""
    spec = p.spec
    args = [spec.model.name, "--host", "0.0.0.0", "--port", str(DEFAULT_PORT)]
    args += ["--served-model-name", spec.model.served_name or spec.model.name]
    if spec.model.revision:
        args += ["--revision", spec.model.revision]
    if spec.model.dtype != "auto":
        args += ["--dtype", spec.model.dtype]
    if spec.model.quantization != "none":
        args += ["--quantization", spec.model.quantization]
    for d in p.decisions:
        args += [d.flag, d.value] if d.value else [d.flag]
    if spec.engine.chat_template:
        # vLLM reads a value that is no file's path and holds Jinja syntax as the template itself.
        args += ["--chat-template", spec.engine.chat_template]
    args += list(spec.engine.extra_args)
    return args
