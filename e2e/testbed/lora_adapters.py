"""The tiny LoRA adapters of the test bed's tiny model (tools/make_tiny_adapters.py, built and cached by
tools/tiny-adapters.sh): where they are, and what each is."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from vllm_operator import adapters

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "tiny-adapters.sh"
#: name -> rank, as tools/make_tiny_adapters.py makes them.
RANKS = {"sql": 8, "chat": 16, "poem": 8, "wide": 64}

_dir: list[Path] = []


def adapters_dir(timeout: float = 1800) -> Path:
    """The directory holding one directory per tiny adapter (built on first use: a minute once vLLM's venv is)."""
    if not _dir:
        out = subprocess.run(["bash", str(SCRIPT)], check=True, capture_output=True, text=True, timeout=timeout)
        _dir.append(Path(out.stdout.strip().splitlines()[-1]))
    return _dir[0]


LORA_FLAGS = ("--enable-lora", "--max-loras", "--max-cpu-loras", "--max-lora-rank")


def pod_lora_launch(pod: Any) -> tuple[list[str], dict[str, str]]:
    """What a test-bed vLLM started for a rendered pod (a kubernetes V1Pod) takes from its vLLM container: the
    operator's LoRA flags among the args, and the runtime-loading variable of its environment (empty when the
    operator did not set it)."""
    container = pod.spec.containers[0]
    args, env = list(container.args or []), {e.name: e.value for e in container.env or [] if e.value}
    extra: list[str] = []
    for i, a in enumerate(args):
        if a == "--enable-lora":
            extra.append(a)
        elif a in LORA_FLAGS:
            extra += [a, args[i + 1]]
    return extra, ({adapters.RUNTIME_ENV: env[adapters.RUNTIME_ENV]} if adapters.RUNTIME_ENV in env else {})
