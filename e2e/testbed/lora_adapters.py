"""The tiny LoRA adapters of the test bed's tiny model (tools/make_tiny_adapters.py, built and cached by
tools/tiny-adapters.sh): where they are, and what each is."""

from __future__ import annotations

import subprocess
from pathlib import Path

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
