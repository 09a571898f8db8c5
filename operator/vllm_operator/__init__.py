"""vllm-operator: one VLLMServer resource -> a right-sized, autoscaled vLLM service."""

__version__ = "0.1.0"
