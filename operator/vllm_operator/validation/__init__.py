"""What a VLLMServer's spec may not say, checked before anything is sized: one function per rule family.

Pure: spec (and the GPU selection, the model's architecture) in, `Problem`s out, each naming the field to change
and the alternative. Every check is linear in the spec's size (a tenant's spec is untrusted: bench/adversarial.py).
The planner runs them all (`check_spec`, `quantization_problems`, `hardware_problems`); the autoscaler runs
`check_spec` alone, to stop scaling a server whose spec became invalid.

The package: ``tables`` (the flags, environment and resources the spec may not set, with why; `Problem`),
``extra_args`` (which release's flag snapshot checks a server, `check_extra_args`), ``hardware`` (quantization
against the checkpoint, attention backends, compute capability), ``spec_rules`` (one function per rule family and
`check_spec`, which runs them). Every name is importable from ``vllm_operator.validation``.
"""

from .tables import (
    CAPACITY_FLAGS, CREDENTIAL_FLAGS, DEVICE_ENV_PREFIX, DEVICE_PLUGIN_ENV, DEVICE_RESOURCE_PREFIX, KNOWN_BAD_FLAGS,
    MAX_NAME_LENGTH, OWNED_ENV, OWNED_FLAGS, Problem, QUANTIZATION_CHOICES, UNSAFE_FLAGS, UNSUPPORTED_QUANTIZATION,
    _CREDENTIAL_VALUE, capacity_flag, device_env, device_env_prefix, reads_a_file,
)
from .extra_args import (
    FlagCheck, check_extra_args, flag_check, image_vllm_version, unchecked_extra_args,
)
from .hardware import (
    ATTENTION_BACKEND_ENV, ATTENTION_BACKEND_FLAG, ATTENTION_CONFIG_FLAG, PREQUANTIZED, attention_problems,
    chosen_attention_backends, hardware_problems, quantization_problems,
)
from .spec_rules import (
    above_limit_problems, autoscaling_problems, cache_problems, check_spec, credential_problems, env_problems,
    flag_like_values, name_problems, network_problems, node_problems, overcommittable, request_limit_problems,
    resource_problems, routing_problems, scale_to_zero_problems, toleration_problems, unsupported_quantization,
)

__all__ = [
    "QUANTIZATION_CHOICES", "OWNED_FLAGS", "KNOWN_BAD_FLAGS", "CAPACITY_FLAGS", "capacity_flag",
    "UNSUPPORTED_QUANTIZATION", "_CREDENTIAL_VALUE", "CREDENTIAL_FLAGS", "reads_a_file", "UNSAFE_FLAGS",
    "OWNED_ENV", "DEVICE_PLUGIN_ENV", "MAX_NAME_LENGTH", "DEVICE_ENV_PREFIX", "device_env", "device_env_prefix",
    "DEVICE_RESOURCE_PREFIX", "Problem", "FlagCheck", "flag_check", "image_vllm_version", "unchecked_extra_args",
    "check_extra_args", "PREQUANTIZED", "quantization_problems", "ATTENTION_BACKEND_FLAG", "ATTENTION_CONFIG_FLAG",
    "ATTENTION_BACKEND_ENV", "chosen_attention_backends", "attention_problems", "hardware_problems",
    "credential_problems", "flag_like_values", "check_spec", "name_problems", "autoscaling_problems",
    "scale_to_zero_problems", "routing_problems", "network_problems", "cache_problems", "node_problems",
    "env_problems", "unsupported_quantization", "resource_problems", "toleration_problems", "above_limit_problems",
    "request_limit_problems", "overcommittable",
]
